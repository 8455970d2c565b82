"""The BERT encoder and its heads, written to be read top to bottom.

Architecture as in Devlin et al. (2019) and Google's reference code: learned word + segment + position
embeddings, post-LayerNorm encoder layers with bidirectional multi-head self-attention and a GELU
feed-forward block, a pooler (dense + tanh over [CLS]), and the pretraining heads (masked LM with the
decoder tied to the word embeddings, and next sentence prediction).  Module and parameter names are those
of Hugging Face ``modeling_bert.py``, so that state dicts interchange with transformers without a mapping
table (``bert.encoder.layer.0.attention.self.query.weight``, ``cls.predictions.bias``, ...).

This file holds the maths; the fast kernels live in :mod:`bertforge.ops`, one file each, each tested equal
to the plain computation.

Departures from the BERT paper, Google's reference code and transformers, all of them in one place.

The model:

* Attention runs through ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels where available); the maths is the paper's softmax(QK^T / sqrt(d)) V.  On CUDA, a padded batch's
  attention runs variable-length over nested jagged tensors (each sequence's real tokens only).  On the CPU
  in training with dropout, where SDPA has no dropout, our own maths runs instead, one sequence at a time
  over its real tokens when padding makes enough of a long batch.  All of them, and the choice among them,
  in :mod:`bertforge.ops.attention`.
* Q, K and V are computed by one matmul over the concatenated weights (fewer, larger kernels).  The
  parameters stay three ``nn.Linear`` named query/key/value, so checkpoints keep transformers' names.
* Padding is removed before every token-wise computation (projections, feed-forward, LayerNorm) and put
  back only for attention (:mod:`bertforge.ops.padding`).  The values at non-pad positions are the same;
  ``last_hidden_state`` holds zeros at pad positions where transformers holds (meaningless) computed values.
* Sparse masked-LM prediction: when MLM ``labels`` are given, the transform and the 30k-way vocabulary
  projection run only at the labelled positions (~15% of tokens), and ``prediction_logits`` holds those
  rows only, in row-major order of ``labels != -100``.  The loss equals the dense computation.  Pass
  ``dense_logits=True`` for transformers' (B, T, V) logits with labels.
* ``hidden_act="gelu"`` is the exact erf GELU of BERT and transformers; ``"gelu_new"`` the tanh form.
* NSP label 0 = IsNext, 1 = NotNext, as in Google's and transformers' checkpoints.
* Question answering: the start and end logits at pad positions are the lowest float, so padding takes no
  part in the softmax of the loss or of any probability; a sequence's loss is the same batched with padding
  or alone.  transformers leaves pad positions in the softmax (their logits equal the head's bias), so its
  loss depends on the padding of the batch; its logits at real positions are ours.
* On the CPU, dropout masks come from 16-bit random numbers (:mod:`bertforge.ops.dropout`): the drop
  probability is ``p`` rounded to a multiple of 1/65536.  In CPU training (pretraining and fine-tuning) each
  sequence's masks come from a generator of its own, keyed by (seed, step, the sequence's index, the dropout site), so that
  a run's result does not depend on the number of processes or accumulation steps.  The embeddings' dropout
  applies to real tokens only (padding is removed before it).
* The last encoder layer of the training objective (:meth:`BertForPreTraining.pretraining_loss`) computes its
  queries, attention output, output projection and feed-forward block only at [CLS] and the masked tokens,
  the only ones that reach the loss (every token is still a key and a value: :meth:`BertLayer.forward_rows`);
  the vocabulary projection and its cross-entropy are fused (:mod:`bertforge.ops.cross_entropy`).  Losses
  and gradients are unchanged.
* While ``torch.compile`` traces (``--compile``) the pretraining objective, padding stays in (the padded
  layout with a key mask) and the last layer runs at every position: unpadding and the row selection have
  data-dependent shapes, which split the compiled objective into many graphs (18 for a 2-layer model,
  against 2 this way).  The masked-LM head stays sparse; the values are the same.  (ELECTRA's discriminator
  and the fine-tuning heads keep unpadding, compiled in pieces.)
* On the CPU, fp32 projections over 1,024 rows or more run through torch's oneDNN linear kernel instead of
  MKL's GEMM (faster on the development machine; :mod:`bertforge.ops.linear`); the values are the same up
  to float rounding order.

The pretraining data (:mod:`bertforge.data`), against Google's ``create_pretraining_data.py``:

* The short-sequence target (probability ``short_seq_prob``) is drawn for every instance; Google draws it
  once per document, so that one book in ten yields only short sequences.
* IsNext stays at 50%: when the chunk for segment A holds a single sentence and IsNext was drawn, the
  document's next sentence becomes segment B (Google forces NotNext there, which skews the labels).  Only
  at the very end of a document does a one-sentence chunk fall back to NotNext.
* Masks (and instances) are drawn afresh every epoch (dynamic masking, as RoBERTa), instead of
  ``dupe_factor`` static copies.
* A "random token" replacement is drawn from the non-special tokens (Google draws from the whole
  vocabulary, [CLS] and [PAD] included).
* Sentences longer than 256 tokens are cut into pieces of 256 tokens when the corpus is cached.

Training (:mod:`bertforge.engine`, :mod:`bertforge.pretrain`): AdamW (decoupled weight decay, none on biases
and LayerNorm weights) instead of BERT's Adam with L2 folded in; linear warmup then linear decay to zero, by
steps or by the time budget; the MLM loss is averaged over the masked tokens of the whole global batch; a
step whose loss or gradient norm is not finite stops the run before the optimizer applies it.

The default recipe (``--recipe budget``, :data:`bertforge.config.RECIPES`) departs from BERT's settings for
short runs on one machine, after cramming (Geiping & Goldstein, 2023), RoBERTa and MosaicBERT, each change
measured (benchmarks/README.md, "The budget recipe"): masked LM only (no NSP), 30% of the tokens masked
instead of 15% (80/10/10 as BERT), no dropout during pretraining (the
saved ``config.json`` keeps the model's 0.1, so fine-tuning uses dropout), peak learning rate 1e-3 instead of
1e-4, Adam beta2 0.98 instead of 0.999, gradient clipping at 0.5 instead of 1.0, and a new model's starting
values: position embeddings from the Transformer's sines and cosines (:func:`sinusoidal_positions_`) and the
first layer's heads 0 and 1 looking at the previous and the next token (:func:`local_attention_heads_`; token
and segment embeddings start at zero in the (up to 32) columns those heads read), where BERT starts every weight
at random and leaves the most-frequent-token plateau only after thousands of steps.  ``--recipe bert``
restores BERT's.  The architecture is BERT's under either recipe: only starting values differ.

ELECTRA (``--objective electra``, :mod:`bertforge.electra`): its own departures are listed there.

The demo (:mod:`bertforge.demo`) pretrains in two stages, masked LM alone and then masked LM with NSP,
where BERT trains both from the first step: with NSP from the start its tiny model learned no word meaning
in the demo's budget (the figures are in that module's docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import checkpoint
from .config import BertConfig
from .ops import Dropout, Linear, LogitBuffer, Padding, gather_rows, linear_cross_entropy_sum, row_attention, self_attention

ACT2FN = {
    "gelu": F.gelu,  # exact: x * Phi(x), as BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


# ------------------------------------------------------------------------------------------------ outputs
@dataclass
class BaseModelOutput:
    last_hidden_state: torch.Tensor  # (B, T, C)
    pooler_output: torch.Tensor | None = None  # (B, C)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None = None  # mlm_loss + nsp_loss, each present when its labels are given
    prediction_logits: torch.Tensor | None = None  # (B, T, V), or (N_labelled, V) when sparse
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


@dataclass
class MaskedLMOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, V), or (N_labelled, V) when sparse


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, num_labels)


@dataclass
class QuestionAnsweringOutput:
    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)


# ------------------------------------------------------------------------------------------------ encoder
# Token-wise modules take x as (N, C) rows of real tokens, or (B, T, C) when the batch has no padding;
# ``padding`` (bertforge.ops.Padding) says which, and where each row sits in the (B, T) batch.
class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        C = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, C, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, C)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, C)
        self.LayerNorm = nn.LayerNorm(C, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings), persistent=False)

    def forward(self, input_ids, token_type_ids=None, position_ids=None, padding: Padding | None = None):
        """(B, T, C); with ``padding``, the real tokens' rows (N, C) (dropout over real tokens only)."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = self.position_ids[:T]  # (T,)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, C)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = self.LayerNorm(x)
        if padding is None:
            return self.dropout(x)
        return self.dropout(padding.unpad(x), padding)  # (N, C)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        C = config.hidden_size
        self.n_head = config.num_attention_heads
        self.query = nn.Linear(C, C)  # the three run as one matmul (bertforge.ops.attention)
        self.key = nn.Linear(C, C)
        self.value = nn.Linear(C, C)
        self.dropout_p = config.attention_probs_dropout_prob

    def _projections(self):
        return [(m.weight, m.bias) for m in (self.query, self.key, self.value)]

    def forward(self, x: torch.Tensor, padding: Padding) -> torch.Tensor:
        """softmax(Q K^T / sqrt(hs)) V for every token, heads concatenated: same shape as ``x``."""
        p = self.dropout_p if self.training else 0.0
        return self_attention(x, *self._projections(), self.n_head, padding, p)

    def forward_rows(self, x: torch.Tensor, x_rows: torch.Tensor, rows: torch.Tensor, padding: Padding) -> torch.Tensor:
        """The same for ``rows`` of the flat rows ``x`` (N, C) only (``x_rows`` (M, C)): (M, C)."""
        p = self.dropout_p if self.training else 0.0
        return row_attention(x, x_rows, rows, *self._projections(), self.n_head, padding, p)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual, layout=None):
        return self.LayerNorm(self.dropout(self.dense(h), layout) + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x, padding):
        return self.output(self.self(x, padding), x, padding)

    def forward_rows(self, x, rows, padding):
        x_rows = gather_rows(x, rows)  # (M, C)
        return self.output(self.self.forward_rows(x, x_rows, rows, padding), x_rows, padding.select(rows))


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))  # (..., 4C)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual, layout=None):
        return self.LayerNorm(self.dropout(self.dense(h), layout) + residual)  # post-LN


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, padding):
        a = self.attention(x, padding)
        return self.output(self.intermediate(a), a, padding)

    def forward_rows(self, x, rows, padding):
        """The layer's output (M, C) at ``rows`` (sorted) of the flat rows ``x`` (N, C) only: queries, output
        projection and feed-forward block run there; attention still reads every token."""
        a = self.attention.forward_rows(x, rows, padding)
        return self.output(self.intermediate(a), a, padding.select(rows))


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, padding):
        for layer in self.layer:
            x = layer(x, padding)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden):  # (B, T, C) -> (B, C), from [CLS]
        return self.activation(self.dense(hidden[:, 0]))


# ------------------------------------------------------------------------------------------------ base
class BertPreTrainedModel(nn.Module):
    """Weight initialisation, tying, and loading/saving of Hugging Face model directories."""

    config: BertConfig
    base_model_prefix = "bert"  # the encoder's attribute in task models, and its prefix in their checkpoints
    # parameter-name prefixes of the task head: missing from a checkpoint, they are freshly initialised
    head_prefixes: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    def init_weights(self) -> None:
        self.apply(self._init_weights)
        self.tie_weights()

    def set_dropout(self, p: float) -> None:
        """Use dropout ``p`` (hidden and attention) from now on, leaving ``config`` (what is saved) as it is:
        pretraining without dropout still saves the model's own dropout for fine-tuning."""
        for m in self.modules():
            if isinstance(m, Dropout):
                m.p = p
            if isinstance(m, BertSelfAttention):
                m.dropout_p = p

    def tie_weights(self) -> None:
        """Tie the MLM decoder to the word embeddings (no-op for models without an MLM head)."""
        cls = getattr(self, "cls", None)
        if cls is not None and hasattr(cls, "predictions"):
            cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    @property
    def base_model(self) -> BertModel:
        return getattr(self, self.base_model_prefix, self)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, path, config: BertConfig | None = None, reinit_head: bool = False, **kw):
        """Load a model directory (ours or transformers', with or without the ``bert.`` prefix); see
        :func:`bertforge.checkpoint.load_pretrained`."""
        return checkpoint.load_pretrained(cls, path, config=config, reinit_head=reinit_head, **kw)

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (and tokenizer files) atomically to ``path``."""
        checkpoint.save_pretrained(self, path, tokenizer=tokenizer)


class BertModel(BertPreTrainedModel):
    """The bare encoder: ``forward(input_ids, attention_mask, token_type_ids)`` gives ``last_hidden_state``
    (B, T, C) and ``pooler_output`` (B, C).  Loads any BERT checkpoint, with or without the ``bert.`` prefix."""

    head_prefixes = ("pooler.",)

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                dropout_keys=None) -> BaseModelOutput:
        """``dropout_keys`` (:class:`~bertforge.ops.dropout.DropoutKeys`): dropout masks keyed by sequence."""
        padding = self._padding(input_ids, attention_mask, dropout_keys)
        x = self.embed(input_ids, token_type_ids, position_ids, padding)  # (N, C), or (B, T, C) without padding
        x = self.encoder(x, padding)  # (N, C) or (B, T, C)
        x = padding.pad(x)  # (B, T, C)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BaseModelOutput(last_hidden_state=x, pooler_output=pooled)

    def hidden_at(self, positions, input_ids, attention_mask=None, token_type_ids=None, dropout_keys=None) -> torch.Tensor:
        """Final hidden states at flat positions (indices into the B*T tokens, repeats allowed), shape (M, C).

        The last layer runs only at ``positions`` (:meth:`BertLayer.forward_rows`): in pretraining only [CLS]
        and the masked tokens reach the loss, so this skips most of it.  Values equal ``forward`` there.
        """
        if torch.compiler.is_compiling():  # the whole last layer: selecting its rows needs data-dependent shapes
            padding = self._padding(input_ids, attention_mask, key_masked=True)  # padding left in
            x = self.encoder(self.embed(input_ids, token_type_ids, None, padding), padding)  # (B, T, C)
            return x.reshape(-1, x.shape[-1])[positions]  # (M, C)
        positions, inverse = torch.unique(positions, return_inverse=True)  # the row gathers need unique rows
        padding = self._padding(input_ids, attention_mask, dropout_keys).flat()
        rows = padding.rows_of(positions)  # (M',) indices among the flat rows, sorted
        x = self.embed(input_ids, token_type_ids, None, padding)  # (N, C) flat rows
        *layers, last = self.encoder.layer
        for layer in layers:
            x = layer(x, padding)
        return last.forward_rows(x, rows, padding)[inverse]  # (M, C) in the order of ``positions``

    def embed(self, input_ids, token_type_ids=None, position_ids=None, padding: Padding | None = None) -> torch.Tensor:
        """The encoder's input: the embeddings (ELECTRA's generator projects them to its width)."""
        return self.embeddings(input_ids, token_type_ids, position_ids, padding)

    def _padding(self, input_ids, attention_mask, dropout_keys=None, key_masked: bool = False) -> Padding:
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings {self.config.max_position_embeddings}")
        if key_masked:
            return Padding.key_masked(attention_mask, B, T)
        return Padding(attention_mask, B, T, dropout_keys if self.training else None)


# ------------------------------------------------------------------------------------------------ heads
class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)  # tied to word embeddings
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # output-only bias, per token
        self.logit_buffer = LogitBuffer()  # memory the fused training loss reuses from step to step

    def forward(self, x):  # (..., C) -> (..., V)
        return F.linear(self.transform(x), self.decoder.weight, self.bias)

    def loss_sum(self, h, labels):
        """Summed cross-entropy of the predictions at hidden states ``h`` (M, C) against ``labels`` (M,)."""
        return linear_cross_entropy_sum(self.transform(h), self.decoder.weight, self.bias, labels, self.logit_buffer)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _mlm_logits(head, seq: torch.Tensor, labels, dense_logits: bool, reduction: str):
    """MLM logits and loss of ``head`` (hidden states -> vocabulary logits: :class:`BertLMPredictionHead`, or
    ELECTRA's generator's); with labels and not dense_logits, only at labelled positions (sparse)."""
    if labels is None:
        return head(seq), None  # (B, T, V)
    if dense_logits:
        logits = head(seq)  # (B, T, V)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction=reduction)
        return logits, loss
    sel = labels.reshape(-1) != -100  # (B*T,)
    logits = head(seq.reshape(-1, seq.shape[-1])[sel])  # (N, V)
    return logits, F.cross_entropy(logits, labels.reshape(-1)[sel], reduction=reduction)


class BertForPreTraining(BertPreTrainedModel):
    """The encoder with BERT's two pretraining heads: masked-LM ``prediction_logits`` and next-sentence
    ``seq_relationship_logits`` (0 = IsNext); losses when ``labels`` / ``next_sentence_label`` are given."""

    head_prefixes = ("cls.", "bert.pooler.")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        labels=None,
        next_sentence_label=None,
        dense_logits: bool = False,
        loss_reduction: str = "mean",
    ) -> PreTrainingOutput:
        """``loss_reduction="sum"`` returns summed losses, for a caller that normalises over a global batch."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits, mlm_loss = _mlm_logits(self.cls.predictions, out.last_hidden_state, labels, dense_logits, loss_reduction)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label.reshape(-1), reduction=loss_reduction)
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(losses) if losses else None
        return PreTrainingOutput(loss, logits, nsp_logits, mlm_loss, nsp_loss)

    def pretraining_loss(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                         dropout_keys=None):
        """(summed MLM loss, summed NSP loss or None): the training step's fast path, no logits kept."""
        B, T = input_ids.shape
        flat = labels.reshape(-1)
        masked = (flat != -100).nonzero().squeeze(1)  # (N,) flat positions of the masked tokens
        cls_pos = torch.arange(B, device=input_ids.device) * T  # (B,) the [CLS] tokens
        positions = torch.cat([cls_pos, masked])
        h = self.bert.hidden_at(positions, input_ids, attention_mask, token_type_ids, dropout_keys)  # (B+N, C)
        mlm = self.cls.predictions.loss_sum(h[B:], flat[masked])
        nsp = None
        if next_sentence_label is not None:
            pooled = self.bert.pooler.activation(self.bert.pooler.dense(h[:B]))  # (B, C)
            nsp = F.cross_entropy(self.cls.seq_relationship(pooled), next_sentence_label.reshape(-1), reduction="sum")
        return mlm, nsp


class BertForMaskedLM(BertPreTrainedModel):
    """The encoder with the masked-LM head only (``logits`` (B, T, V); a loss when ``labels`` are given)."""

    head_prefixes = ("cls.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None, dense_logits=False,
        loss_reduction: str = "mean",
    ) -> MaskedLMOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits, loss = _mlm_logits(self.cls.predictions, out.last_hidden_state, labels, dense_logits, loss_reduction)
        return MaskedLMOutput(loss, logits)

    def pretraining_loss(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                         dropout_keys=None):
        """(summed MLM loss, None): the training step's fast path (no NSP head)."""
        flat = labels.reshape(-1)
        masked = (flat != -100).nonzero().squeeze(1)
        h = self.bert.hidden_at(masked, input_ids, attention_mask, token_type_ids, dropout_keys)  # (N, C)
        return self.cls.predictions.loss_sum(h, flat[masked]), None


class BertForSequenceClassification(BertPreTrainedModel):
    """The encoder with a classifier over the pooled [CLS] state: ``logits`` (B, num_labels), the labels named
    by ``config.id2label``; cross-entropy with ``labels`` (mean squared error with one label)."""

    head_prefixes = ("classifier.", "bert.pooler.")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                dropout_keys=None):
        pooled = self.bert(input_ids, attention_mask, token_type_ids, position_ids, dropout_keys).pooler_output  # (B, C)
        one_row_each = SimpleNamespace(keys=dropout_keys, counts=[1] * pooled.shape[0])
        logits = self.classifier(self.dropout(pooled, one_row_each))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits, labels.reshape(-1))
        return SequenceClassifierOutput(loss, logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    """The encoder with a span head: ``start_logits`` and ``end_logits`` (B, T) for extractive question
    answering; a loss with ``start_positions`` / ``end_positions``."""

    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None, end_positions=None,
        dropout_keys=None,
    ) -> QuestionAnsweringOutput:
        seq = self.bert(input_ids, attention_mask, token_type_ids, position_ids, dropout_keys).last_hidden_state
        start_logits, end_logits = self.qa_outputs(seq).unbind(-1)  # 2 x (B, T)
        if attention_mask is not None:  # padding is no answer: out of the softmax, in the loss and in any probability
            pad = ~attention_mask.bool()
            lowest = torch.finfo(start_logits.dtype).min
            start_logits, end_logits = start_logits.masked_fill(pad, lowest), end_logits.masked_fill(pad, lowest)
        loss = None
        if start_positions is not None and end_positions is not None:
            # as transformers: positions outside the input are clamped to T and ignored
            T = start_logits.shape[1]
            s = start_positions.reshape(-1).clamp(0, T)
            e = end_positions.reshape(-1).clamp(0, T)
            loss = (F.cross_entropy(start_logits, s, ignore_index=T) + F.cross_entropy(end_logits, e, ignore_index=T)) / 2
        return QuestionAnsweringOutput(loss, start_logits.contiguous(), end_logits.contiguous())


MODEL_CLASSES = {
    c.__name__: c
    for c in (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification, BertForQuestionAnswering)
}


def sinusoid_frequencies(C: int) -> torch.Tensor:
    """The Transformer's frequencies, 10000^(-2f/C) radian per position, of columns 2f (sin) and 2f+1 (cos): (C/2,)."""
    return torch.exp(torch.arange(0, C, 2, dtype=torch.float64) * (-math.log(10000.0) / C))


def sinusoidal_positions_(model: nn.Module) -> None:
    """Start every position-embedding table of ``model`` from the Transformer's sines and cosines (Vaswani et
    al., 2017) at the standard deviation of the model's other initial weights.  They stay learned parameters:
    only their starting point differs from BERT's random one.  With random positions, each of the T positions
    must learn on its own how it relates to its neighbours, and attention stays uniform for a long time (a
    mini BERT after 30 minutes here: every head within 0.7 nats of uniform, none looking at the next or the
    previous token); with sinusoids, an offset is one linear map shared by all positions."""
    for m in model.modules():
        if isinstance(m, BertEmbeddings):
            w = m.position_embeddings.weight  # (P, C)
            P, C = w.shape
            pos = torch.arange(P, dtype=torch.float64).unsqueeze(1)  # (P, 1)
            freq = sinusoid_frequencies(C)  # (C/2,)
            table = torch.zeros(P, C, dtype=torch.float64)
            table[:, 0::2] = torch.sin(pos * freq)
            table[:, 1::2] = torch.cos(pos * freq)[:, : C // 2]
            with torch.no_grad():
                w.copy_(table / table.std() * model.config.initializer_range)


def local_attention_heads_(model: nn.Module, offsets: tuple[int, ...] = (-1, 1), pairs: int = 16,
                           scale: float = 3.0) -> list[int]:
    """Start the first layer's heads 0, 1, ... of every encoder in ``model`` as heads that look at the token at
    each of ``offsets`` (by default the previous and the next one), read from sinusoidal position embeddings
    (call :func:`sinusoidal_positions_` first).  Returns the embedding columns the heads read.

    Why: with BERT's random start, every head attends uniformly for thousands of steps and the masked LM
    predicts from a bag of the sequence's words (the "unigram plateau"; a mini here leaves it after about
    2,500 steps of 32 x 128 tokens, when heads that look at a neighbour appear).  Gopalani & Hu (2025,
    "What happens during the loss plateau?") show that the plateau is the time it takes to learn the
    attention map and that starting attention at the right map removes it.  Here the map is the simplest
    one a language has: the neighbours.

    How: ``pairs`` (sin, cos) columns of the position table, at frequencies spread from 1 to 0.1 radian per
    position, are given to positions alone (token and segment embeddings start at zero there).  Head h's key
    reads those columns; its query reads them rotated by ``offsets[h]`` positions, so that q_i . k_j is
    ``scale``^2 times a sum of cos(w (i + offset - j)), largest at j = i + offset (with the defaults, a mini
    puts about two thirds of its attention there at the start, a sixth on each side of it).  A one-head
    encoder gets the first offset only.  An encoder that projects its embeddings to another width (ELECTRA's
    generator) has its projection start by copying those columns into its first hidden units (at most
    half of its units; the others keep the tokens).  Everything
    stays a learned parameter of the same BERT: only the starting values differ; values and outputs keep
    their random start."""
    emb = next(m for m in model.modules() if isinstance(m, BertEmbeddings))  # ELECTRA: shared by both encoders
    E = emb.position_embeddings.weight.shape[1]
    pairs = max(1, min(pairs, E // 8))
    # the pairs whose frequency 10000^(-2f/E) lies in [0.1, 1], evenly spread (f = E/8 is 0.1 rad/position)
    fs = [round(k * (E // 8) / pairs) for k in range(pairs)]
    freq = sinusoid_frequencies(E)[fs].tolist()  # those of sinusoidal_positions_' columns
    cols = [c for f in fs for c in (2 * f, 2 * f + 1)]  # sin, cos columns of sinusoidal_positions_' table
    with torch.no_grad():
        emb.word_embeddings.weight[:, cols] = 0
        emb.token_type_embeddings.weight[:, cols] = 0
        for enc in [m for m in model.modules() if hasattr(m, "encoder") and hasattr(m, "embeddings")]:
            att = enc.encoder.layer[0].attention.self
            C, nh = att.query.weight.shape[1], att.n_head
            hs = C // nh
            proj = getattr(enc, "embeddings_project", None)
            n = max(1, min(pairs, hs // 2, C // 4 if proj is not None else pairs))  # pairs this encoder's heads read
            rs = [round(k * pairs / n) for k in range(n)]  # evenly spread over the frequencies
            read = [c for r in rs for c in (cols[2 * r], cols[2 * r + 1])]
            if proj is not None:  # (C, E): hidden unit k starts as column read[k] (at most half the units)
                units = list(range(len(read)))
                proj.weight[units] = 0
                proj.weight[units, read] = 1
                proj.bias[units] = 0
                read = units
            for h, off in enumerate(offsets[:nh]):
                wq = torch.zeros(hs, C, dtype=torch.float64)
                wk = torch.zeros(hs, C, dtype=torch.float64)
                for i, r in enumerate(rs):
                    s, c = read[2 * i], read[2 * i + 1]
                    a = off * freq[r]  # rotating (sin wi, cos wi) by a gives (sin w(i+off), cos w(i+off))
                    wk[2 * i, s] = wk[2 * i + 1, c] = 1.0
                    wq[2 * i, s], wq[2 * i, c] = math.cos(a), math.sin(a)
                    wq[2 * i + 1, c], wq[2 * i + 1, s] = math.cos(a), -math.sin(a)
                rows = slice(h * hs, (h + 1) * hs)
                att.query.weight[rows] = (scale * wq).to(att.query.weight.dtype)
                att.key.weight[rows] = (scale * wk).to(att.key.weight.dtype)
                att.query.bias[rows] = 0
                att.key.bias[rows] = 0
    return cols


def flops_per_token(config: BertConfig, seq_len: int, mlm_fraction: float | None = 0.15, train: bool = True) -> float:
    """Model FLOPs per token: 2 per multiply-add in every matmul (x3 with the backward pass).

    Counts the encoder's projections and feed-forward, the attention scores and mixing, and the MLM head
    (transform + vocabulary projection) at ``mlm_fraction`` of the tokens (None: no MLM head).
    """
    C, L, Ff, V = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    per_layer = 2 * (4 * C * C + 2 * C * Ff) + 2 * 2 * seq_len * C
    total = L * per_layer
    if mlm_fraction:
        total += mlm_fraction * 2 * (C * C + C * V)
    return total * (3 if train else 1)


__all__ = [
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForQuestionAnswering",
    "MODEL_CLASSES",
    "flops_per_token",
]
