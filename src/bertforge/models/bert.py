"""The BERT encoder and its heads, written to be read top to bottom against transformers' ``modeling_bert.py``.

Architecture as in Devlin et al. (2019) and Google's reference code: learned word + segment + position
embeddings, post-LayerNorm encoder layers with bidirectional multi-head self-attention and a GELU
feed-forward block, a pooler (dense + tanh over [CLS]), and the pretraining heads (masked LM with the
decoder tied to the word embeddings, and next sentence prediction).  Module and parameter names are
transformers', so that state dicts interchange without a mapping table.  The fast kernels live in
:mod:`bertforge.ops` (each tested equal to the plain computation), start values beyond BERT's in
:mod:`bertforge.models.initialization`, the FLOP count in :mod:`bertforge.models.flops`.

Departures of the model from the paper, Google's code and transformers (the data's are listed in
:mod:`bertforge.data`, ELECTRA's in :mod:`bertforge.models.electra`):

* Attention runs through ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels where
  available), variable-length over nested jagged tensors for a padded batch on CUDA; on the CPU in training
  with dropout, which SDPA lacks there, through our own maths, one sequence at a time when padding makes
  enough of a long batch (:mod:`bertforge.ops.attention`).  The maths is the paper's.
* Q, K and V come from one matmul over the concatenated weights; the parameters stay three ``nn.Linear``.
* Padding is removed before every token-wise computation and put back only for attention
  (:mod:`bertforge.ops.layout`); ``last_hidden_state`` holds zeros at pad positions (transformers:
  meaningless computed values).
* Sparse masked LM: with ``labels``, the head runs only at the labelled positions and the logits are those
  rows, in row-major order of ``labels != -100``; the loss is the dense one (``dense_logits=True``:
  transformers' (B, T, V) logits).
* ``hidden_act="gelu"`` is the exact erf GELU of BERT and transformers; ``"gelu_new"`` the tanh form.
  NSP label 0 = IsNext, 1 = NotNext, as in Google's and transformers' checkpoints.
* Question answering: the start and end logits at pad positions are the lowest float, so padding takes no
  part in any softmax and a sequence's loss does not depend on the padding of its batch (transformers'
  does); the logits at real positions are transformers'.
* Token classification runs its classifier on the real tokens only: its logits at pad positions are zeros
  (transformers': computed values that no loss reads).
* On the CPU, dropout masks come from 16-bit random numbers (``p`` rounded to a multiple of 1/65536), and
  in training each sequence's masks from a generator keyed by (seed, step, the sequence's index, the
  dropout site), so that a run does not depend on the number of processes or accumulation steps
  (:mod:`bertforge.ops.dropout`).  The embeddings' dropout applies to real tokens only.
* The pretraining step (:func:`bertforge.ops.rows.pretraining_losses`) runs the last layer only at [CLS]
  and the masked tokens (every token still a key and a value), with the vocabulary projection fused into
  its cross-entropy; under ``--compile`` the padded layout and the whole last layer instead.  Losses and
  gradients are unchanged (:mod:`bertforge.ops.rows`).
* On the CPU, large fp32 projections run through torch's oneDNN linear kernel instead of MKL's GEMM
  (:mod:`bertforge.ops.linear`); the values are the same up to float rounding order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError, require_type, shown
from ..ops import Dropout, Layout, Linear, self_attention, tracing
from ..ops.rows import pretraining_losses
from .base import (BaseModelOutput, MaskedLMOutput, ModelConfigJson, PreTrainedModel, PreTrainingOutput,
                   QuestionAnsweringOutput, SequenceClassifierOutput, TokenClassifierOutput, check_preset, span_output)
from .registry import Family, register

ACT2FN = {
    "gelu": F.gelu,  # exact: x * Phi(x), as BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


# ------------------------------------------------------------------------------------------------ config
# name -> (layers, hidden, heads); intermediate = 4 x hidden.  tiny/mini/small/medium are the sizes of
# Turc et al. (2019) "Well-Read Students Learn Better"; base is BERT-base.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}

@dataclass
class BertConfig(ModelConfigJson):
    """The BERT architecture.  Field names are transformers' so that ``config.json`` interchanges."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # Keys of a config.json we do not interpret (transformers_version, use_cache, ...), kept so that a
    # directory we load and save again loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type, display_name = "bert", "BERT"
    dropout_fields = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size")
    fractions = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
    positives = ("layer_norm_eps", "initializer_range")

    def __post_init__(self) -> None:
        # the one place where an architecture (a preset, a config.json) is checked before a model is built of it
        self.check_fields()
        if not 0 <= require_type(self.pad_token_id, int, "pad_token_id") < self.vocab_size:
            raise UserError(f"pad_token_id {self.pad_token_id} must be a token id below vocab_size {self.vocab_size}")
        if self.hidden_act not in ACT2FN:
            raise UserError(f"unsupported hidden_act {shown(self.hidden_act)}; expected one of {tuple(ACT2FN)}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size: tiny (2 layers/128), mini (4/256), small (4/512), medium (8/512), base (12/768)."""
        layers, hidden, heads = check_preset(name, PRESETS)
        kw: dict[str, Any] = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        kw.update(overrides)
        return cls(**kw)

    def encoder_flops(self, seq_len: int) -> int:
        """The encoder's forward FLOPs per token (:func:`bertforge.models.flops.flops_per_token`)."""
        C, Ff = self.hidden_size, self.intermediate_size
        return self.num_hidden_layers * (2 * (4 * C * C + 2 * C * Ff) + 2 * 2 * seq_len * C)

    # ----------------------------------------------------------------------------------------- json
    def to_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        d = self.fields_dict()
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        if architectures:
            d["architectures"] = list(architectures)
        return d

    @classmethod
    def read_fields(cls, d: dict[str, Any]) -> dict[str, Any]:
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(f"position_embedding_type {shown(d['position_embedding_type'])} is not supported")
        if d.get("is_decoder"):
            raise UserError("is_decoder=True (a causal BERT) is not supported")
        return super().read_fields(d)


# ------------------------------------------------------------------------------------------------ encoder
# Token-wise modules take x as (N, C) rows of real tokens, or (B, T, C) when the batch has no padding;
# ``layout`` (bertforge.ops.Layout) says which, where each row sits in the (B, T) batch, and (in training)
# the keys of each sequence's dropout masks.
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

    def forward(self, input_ids, token_type_ids=None, position_ids=None, layout: Layout | None = None):
        """(B, T, C); with ``layout``, the real tokens' rows (N, C) (dropout over real tokens only)."""
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = self.position_ids[:T]  # (T,)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, C)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        x = self.LayerNorm(x)
        if layout is None:
            return self.dropout(x)
        return self.dropout(layout.unpad(x), layout)  # (N, C)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        C = config.hidden_size
        self.n_head = config.num_attention_heads
        self.query = nn.Linear(C, C)  # the three run as one matmul (bertforge.ops.attention)
        self.key = nn.Linear(C, C)
        self.value = nn.Linear(C, C)
        self.dropout_p = config.attention_probs_dropout_prob

    def projections(self):
        return [(m.weight, m.bias) for m in (self.query, self.key, self.value)]

    def forward(self, x: torch.Tensor, layout: Layout) -> torch.Tensor:
        """softmax(Q K^T / sqrt(hs)) V for every token, heads concatenated: same shape as ``x``."""
        p = self.dropout_p if self.training else 0.0
        return self_attention(x, *self.projections(), self.n_head, layout, p)


class BertSelfOutput(nn.Module):
    """dense (``width`` -> hidden, default hidden) + dropout, added to the residual, LayerNorm: after attention,
    and (:class:`BertOutput`) after the feed-forward block."""

    def __init__(self, config: BertConfig, width: int | None = None):
        super().__init__()
        self.dense = Linear(config.hidden_size if width is None else width, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual, layout=None):
        return self.LayerNorm(self.dropout(self.dense(h), layout) + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x, layout):
        return self.output(self.self(x, layout), x, layout)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.intermediate_act_fn(self.dense(x))  # (..., 4C)


class BertOutput(BertSelfOutput):  # the same block over the feed-forward's width (transformers' name)
    def __init__(self, config: BertConfig):
        super().__init__(config, config.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, layout):
        a = self.attention(x, layout)
        return self.output(self.intermediate(a), a, layout)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, layout):
        for layer in self.layer:
            x = layer(x, layout)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden):  # (B, T, C) -> (B, C), from [CLS]
        return self.activation(self.dense(hidden[:, 0]))


# ------------------------------------------------------------------------------------------------ base
class BertPreTrainedModel(PreTrainedModel):
    """BERT's initialisation and names (:class:`~bertforge.models.base.PreTrainedModel` loads, saves and ties)."""

    config: BertConfig
    config_class = BertConfig
    base_model_prefix = "bert"  # the encoder's attribute in task models, and its prefix in their checkpoints
    encoder_prefixes = ("embeddings.", "encoder.", "pooler.")  # a bare encoder's names, without the prefix
    embeddings_name = "word_embeddings"

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

    def initialisation_said(self) -> str:
        return (f"BERT's initialisation (dense weights normal with std {self.config.initializer_range:g}, LayerNorm "
                "weights 1, biases 0)")

    def pretraining_losses(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                           dropout_keys=None):
        """(summed masked-LM loss, summed NSP loss or None): pretraining's fast path
        (:func:`bertforge.ops.rows.pretraining_losses`), for the models with a masked-LM head."""
        return pretraining_losses(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label,
                                  dropout_keys=dropout_keys)

    def grow_output_layer(self, rows) -> None:
        head = getattr(getattr(self, "cls", None), "predictions", None)
        if head is not None:  # the decoder is bias-free and tied (a new one, tied again): the bias is the head's own
            head.bias = nn.Parameter(rows(head.bias))
            emb = self.get_input_embeddings()
            head.decoder = nn.Linear(emb.embedding_dim, emb.num_embeddings, bias=False).to(emb.weight)

    def tied_decoder(self) -> nn.Linear | None:
        cls = getattr(self, "cls", None)
        if cls is None or not hasattr(cls, "predictions"):
            return None
        if self.config.extra.get("tie_word_embeddings") is False:  # (its own decoder would be lost, unread)
            raise UserError("this BERT's config.json unties the masked-LM decoder from the token embeddings "
                            "(tie_word_embeddings: false), which bertforge's BERT always ties")
        return cls.predictions.decoder


class BertModel(BertPreTrainedModel):
    """The bare encoder: ``forward(input_ids, attention_mask, token_type_ids)`` gives ``last_hidden_state``
    (B, T, C) and ``pooler_output`` (B, C).  Loads any BERT checkpoint, with or without the ``bert.`` prefix."""

    role = "encoder"
    head_weight = "embeddings.word_embeddings.weight"  # what a folder that holds an encoder stores

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
        layout = self.layout(input_ids, attention_mask, dropout_keys)
        x = self.embed(input_ids, token_type_ids, position_ids, layout)  # (N, C), or (B, T, C) without padding
        x = self.encoder(x, layout)  # (N, C) or (B, T, C)
        x = layout.pad(x)  # (B, T, C)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BaseModelOutput(last_hidden_state=x, pooler_output=pooled)

    def embed(self, input_ids, token_type_ids=None, position_ids=None, layout: Layout | None = None):
        """The encoder's input: the embeddings (ELECTRA's generator projects them to its width)."""
        return self.embeddings(input_ids, token_type_ids, position_ids, layout)

    def layout(self, input_ids, attention_mask, dropout_keys=None, key_masked: bool = False) -> Layout:
        """Where the batch's real tokens are, with the dropout keys in training (``key_masked``: the padded
        layout, padding left in, for code that ``torch.compile`` traces)."""
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        if key_masked or tracing():
            return Layout.key_masked(attention_mask, B, T)
        return Layout(attention_mask, B, T, dropout_keys if self.training else None)


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

    def forward(self, x):  # (..., C) -> (..., V)
        return F.linear(self.transform(x), self.decoder.weight, self.bias)


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
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                               reduction=reduction)
        return logits, loss
    sel = labels.reshape(-1) != -100  # (B*T,)
    logits = head(seq.reshape(-1, seq.shape[-1])[sel])  # (N, V)
    return logits, F.cross_entropy(logits, labels.reshape(-1)[sel], reduction=reduction)


class BertForPreTraining(BertPreTrainedModel):
    """The encoder with BERT's two pretraining heads: masked-LM ``prediction_logits`` and next-sentence
    ``seq_relationship_logits`` (0 = IsNext); losses when ``labels`` / ``next_sentence_label`` are given."""

    role = "pretraining"
    head_weight = "cls.seq_relationship.weight"  # what a folder that can tell next sentences stores

    head_prefixes = ("cls.", "bert.pooler.")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                next_sentence_label=None, dense_logits=False, loss_reduction: str = "mean") -> PreTrainingOutput:
        """``loss_reduction="sum"`` returns summed losses, for a caller that normalises over a global batch."""
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        seq = out.last_hidden_state  # (B, T, C)
        logits, mlm_loss = _mlm_logits(self.cls.predictions, seq, labels, dense_logits, loss_reduction)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label.reshape(-1), reduction=loss_reduction)
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(losses) if losses else None
        return PreTrainingOutput(loss, logits, nsp_logits, mlm_loss, nsp_loss)


class BertForMaskedLM(BertPreTrainedModel):
    """The encoder with the masked-LM head only (``logits`` (B, T, V); a loss when ``labels`` are given)."""

    role = "masked_lm"

    head_prefixes = ("cls.",)
    head_weight = "cls.predictions.transform.dense.weight"  # what a folder that can fill masks stores

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                dense_logits=False, loss_reduction: str = "mean") -> MaskedLMOutput:
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids)
        logits, loss = _mlm_logits(self.cls.predictions, out.last_hidden_state, labels, dense_logits, loss_reduction)
        return MaskedLMOutput(loss, logits)


class BertForSequenceClassification(BertPreTrainedModel):
    """The encoder with a classifier over the pooled [CLS] state: ``logits`` (B, num_labels), the labels named
    by ``config.id2label``; cross-entropy with ``labels`` (mean squared error with one label)."""

    role = "sequence_classification"
    head_weight = "classifier.weight"

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
        pooled = self.bert(input_ids, attention_mask, token_type_ids, position_ids, dropout_keys).pooler_output
        B = pooled.shape[0]  # (not len(): a traced batch size stays symbolic)
        logits = self.classifier(self.dropout(pooled, Layout.one_row_each(dropout_keys, B)))  # (B, labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits, labels.reshape(-1))
        return SequenceClassifierOutput(loss, logits)


class BertForTokenClassification(BertPreTrainedModel):
    """The encoder with a classifier over every token: ``logits`` (B, T, num_labels), the labels named by
    ``config.id2label``; cross-entropy over the tokens whose ``labels`` are not -100."""

    role = "token_classification"
    head_weight = "classifier.weight"

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                dropout_keys=None) -> TokenClassifierOutput:
        B, T = input_ids.shape
        layout = self.bert.layout(input_ids, attention_mask, dropout_keys)
        x = self.bert.encoder(self.bert.embed(input_ids, token_type_ids, position_ids, layout), layout)  # (N, C)
        logits = layout.pad(self.classifier(self.dropout(x, layout)))  # (B, T, labels), zeros at padding
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(B * T, -1), labels.reshape(-1), ignore_index=-100)
        return TokenClassifierOutput(loss, logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    """The encoder with a span head: ``start_logits`` and ``end_logits`` (B, T) for extractive question
    answering; a loss with ``start_positions`` / ``end_positions``."""

    role = "question_answering"
    head_weight = "qa_outputs.weight"
    head_prefixes = ("qa_outputs.",)

    @staticmethod
    def other_head(config: BertConfig) -> str | None:
        """None: BERT's span head has weights of its own (``qa_outputs``), which no other task's head shares."""
        return None

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None,
                end_positions=None, dropout_keys=None) -> QuestionAnsweringOutput:
        seq = self.bert(input_ids, attention_mask, token_type_ids, position_ids, dropout_keys).last_hidden_state
        start_logits, end_logits = self.qa_outputs(seq).unbind(-1)  # 2 x (B, T)
        return span_output(start_logits, end_logits, attention_mask, start_positions, end_positions)


register(Family(
    name="bert", label="BERT", config_class=BertConfig, summary="BERT's architecture",
    heads={c.role: c for c in (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                               BertForTokenClassification, BertForQuestionAnswering)},
    presets=PRESETS, objectives=("mlm", "electra"), next_sentence=True, position_table=True,
    pretraining_dropout=None))

__all__ = ["BertConfig", "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering"]
