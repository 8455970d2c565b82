"""The BERT encoder and its heads, written to be read top to bottom.

Architecture as in Devlin et al. (2019) and Google's reference code: learned word + segment + position
embeddings, post-LayerNorm encoder layers with bidirectional multi-head self-attention and a GELU
feed-forward block, a pooler (dense + tanh over [CLS]), and the pretraining heads (masked LM with the
decoder tied to the word embeddings, and next sentence prediction).  Module and parameter names are those
of Hugging Face ``modeling_bert.py``, so that state dicts interchange with transformers without a mapping
table (``bert.encoder.layer.0.attention.self.query.weight``, ``cls.predictions.bias``, ...).

Departures from the BERT paper, Google's reference code and transformers, all of them in one place.

The model:

* Attention runs through ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels where available); the maths is the paper's softmax(QK^T / sqrt(d)) V.  On CUDA, a padded batch's
  attention runs variable-length over nested jagged tensors (each sequence's real tokens only).
* Q, K and V are computed by one matmul over the concatenated weights (fewer, larger kernels).  The
  parameters stay three ``nn.Linear`` named query/key/value, so checkpoints keep transformers' names.
* Padding is removed before every token-wise computation (projections, feed-forward, LayerNorm) and put
  back only for attention.  The values at non-pad positions are the same; ``last_hidden_state`` holds
  zeros at pad positions where transformers holds (meaningless) computed values.
* Sparse masked-LM prediction: when MLM ``labels`` are given, the transform and the 30k-way vocabulary
  projection run only at the labelled positions (~15% of tokens), and ``prediction_logits`` holds those
  rows only, in row-major order of ``labels != -100``.  The loss equals the dense computation.  Pass
  ``dense_logits=True`` for transformers' (B, T, V) logits with labels.
* ``hidden_act="gelu"`` is the exact erf GELU of BERT and transformers; ``"gelu_new"`` the tanh form.
* NSP label 0 = IsNext, 1 = NotNext, as in Google's and transformers' checkpoints.
* On the CPU, dropout masks come from 16-bit random numbers (:func:`dropout`): the drop probability is ``p``
  rounded to a multiple of 1/65536, and attention dropout runs outside SDPA (whose CPU kernels lack it).
* The last encoder layer of the training objective (:meth:`BertForPreTraining.pretraining_loss`) computes its
  queries, attention output, output projection and feed-forward block only at [CLS] and the masked tokens,
  the only ones that reach the loss (every token is still a key and a value); the vocabulary projection and
  its cross-entropy are fused.  Losses and gradients are unchanged.
* On the CPU, fp32 projections over 1,024 rows or more run through torch's oneDNN linear kernel instead of
  MKL's GEMM (faster on the development machine); the values are the same up to float rounding order.

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

Training (:mod:`bertforge.pretrain`, :mod:`bertforge.engine`): AdamW (decoupled weight decay, none on biases
and LayerNorm weights) instead of BERT's Adam with L2 folded in; linear warmup then linear decay to zero, by
steps or by the time budget; the MLM loss is averaged over the masked tokens of the whole global batch.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import BertConfig

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


# ------------------------------------------------------------------------------------------------ dropout
def dropout_mask(shape, p: float, device, dtype=torch.float32) -> torch.Tensor:
    """Inverted dropout's multiplier: 1/(1-p) with probability 1 - p (p rounded to 1/65536), else 0, from
    torch's generator.  A float mask, because multiplying by it is several times faster on the CPU than
    ``torch.where`` with a boolean one, and comparing straight into a float tensor is faster than producing
    booleans."""
    n = math.prod(shape)
    bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
    b16 = bits.view(torch.int16)[:n].view(shape)
    mask = torch.ge(b16, round(p * 65536) - 32768, out=torch.empty(shape, dtype=dtype, device=device))
    return mask.mul_(1.0 / (1.0 - p))


class _Dropout16(torch.autograd.Function):
    """Inverted dropout whose mask comes from 16-bit random numbers: 64 random bits per RNG call serve four
    elements, several times faster than ``bernoulli_`` on the CPU (where mask generation costs more than the
    whole GELU).  The drop probability is ``p`` rounded to a multiple of 1/65536; the RNG is torch's global
    generator, so seeding, checkpointing and resuming work as for ``nn.Dropout``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float):
        mask = dropout_mask(x.shape, p, x.device, x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout`` semantics; on the CPU with the faster mask generation of :class:`_Dropout16`."""
    if not training or p == 0.0:
        return x
    if x.device.type == "cpu":
        return _Dropout16.apply(x, p)
    return F.dropout(x, p, True)


class Dropout(nn.Dropout):
    def forward(self, x):
        return dropout(x, self.p, self.training)


# ------------------------------------------------------------------------------------------------ CPU GEMMs
_DNN_MIN_ROWS = 1024  # below this many rows MKL's GEMM (F.linear's) was as fast or faster here


@functools.cache
def _dnn_linear_op():
    """torch's oneDNN fp32 linear kernel (the one torch.compile's CPU backend emits), or None where this
    build lacks it or it disagrees with ``F.linear`` on a small check.  For the token-by-hidden shapes of
    the encoder it ran 5-25% faster than MKL's GEMM on the development machine (AMD EPYC, AVX2)."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        if not torch.backends.mkldnn.is_available():
            return None
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(s, generator=g) for s in ((37, 19), (23, 19), (23,)))
        xt, wt = x.t().contiguous().t(), w.t().contiguous().t()  # the strided views backward passes
        agree = all(
            torch.allclose(op(a, v, b, "none", [], ""), F.linear(a, v, b), rtol=1e-5, atol=1e-5)
            for a, v in ((x, w), (xt, wt))
        )
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return op if agree else None


def _dnn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return _dnn_linear_op()(x, w, b, "none", [], "")  # x @ w.T + b; only once _dnn_linear_op() is not None


class _Linear(torch.autograd.Function):
    """``F.linear`` on 2-D fp32 CPU tensors with the forward and the input gradient through oneDNN; the
    weight gradient stays with MKL, which was faster for that shape (tokens as the reduced dimension)."""

    @staticmethod
    def forward(ctx, x, w, b):  # x (N, Cin), w (Cout, Cin) -> (N, Cout)
        ctx.save_for_backward(x, w)
        return _dnn(x, w, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):  # g (N, Cout)
        x, w = ctx.saved_tensors
        gx = _dnn(g, w.t(), None) if ctx.needs_input_grad[0] else None  # (N, Cin)
        gw = g.t() @ x if ctx.needs_input_grad[1] else None  # (Cout, Cin)
        gb = g.sum(0) if ctx.needs_input_grad[2] else None  # False without a bias
        return gx, gw, gb


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``; on the CPU in fp32, for inputs of at least ``_DNN_MIN_ROWS`` rows, through
    oneDNN's kernel when torch has it (same values up to float rounding order; tested)."""
    C = x.shape[-1]
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or w.dtype != torch.float32
        or x.numel() < _DNN_MIN_ROWS * C
        or torch.is_autocast_enabled("cpu")
        or torch.compiler.is_compiling()  # inductor lowers this op only for frozen (constant) weights
        or _dnn_linear_op() is None
    ):
        return F.linear(x, w, b)
    return _Linear.apply(x.reshape(-1, C), w, b).view(*x.shape[:-1], w.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and names) whose forward is :func:`linear`."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)


# ------------------------------------------------------------------------------------------------ padding
class _GatherRows(torch.autograd.Function):
    """``x.index_select(0, rows)`` for unique ``rows``, whose backward writes the gradient rows back with
    ``index_copy`` (no accumulation needed) instead of ``index_select``'s much slower ``scatter_add``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, rows: torch.Tensor):
        ctx.save_for_backward(rows)
        ctx.n = x.shape[0]
        return x.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad):
        (rows,) = ctx.saved_tensors
        return grad.new_zeros((ctx.n,) + grad.shape[1:]).index_copy_(0, rows, grad), None


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (unique indices) of a 2-D tensor."""
    if torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_compiling():
        return _GatherRows.apply(x, rows)
    return x.index_select(0, rows)


# Devices whose attention over a padded batch runs on the real tokens only (variable-length attention through
# nested jagged tensors: SDPA's flash / memory-efficient varlen kernels on CUDA).  On the CPU nested SDPA
# falls back to a per-sequence loop, slower than the masked (B, T) layout; the tests add "cpu" to check it.
VARLEN_DEVICES = {"cuda"}


class Padding:
    """Where the real tokens of a (B, T) batch are, to run token-wise layers on real tokens only.

    ``indices`` is None when the batch has no padding (then everything stays (B, T, C)).
    ``attn_mask`` is the boolean (B, 1, 1, T) key mask for SDPA (True = attend), or None.
    ``offsets`` (B+1,) delimit each sequence's real tokens among the N rows when attention runs
    variable-length (see ``VARLEN_DEVICES``; every sequence needs a real token), else None.
    """

    def __init__(self, attention_mask: torch.Tensor | None, B: int, T: int):
        self.B, self.T = B, T
        self.indices = None
        self.attn_mask = None
        self.offsets, self.max_len = None, T
        if attention_mask is None:
            return
        keep = attention_mask.bool()  # (B, T)
        # Host syncs on CUDA (here and in nonzero); on the CPU they are free and save the padded FLOPs.
        if bool(keep.all()):
            return
        self.attn_mask = keep[:, None, None, :]  # (B, 1, 1, T)
        self.indices = keep.reshape(-1).nonzero().squeeze(1)  # (N,)
        if keep.device.type in VARLEN_DEVICES:
            lengths = keep.sum(1)  # (B,)
            shortest, longest = torch.stack(torch.aminmax(lengths)).tolist()
            if shortest > 0:
                self.offsets, self.max_len = F.pad(lengths.cumsum(0), (1, 0)), longest  # (B+1,)

    def jagged(self, t: torch.Tensor) -> torch.Tensor:
        """(N, nh, hs) rows of real tokens -> nested (B, nh, j, hs), j each sequence's length."""
        return torch.nested.nested_tensor_from_jagged(t, self.offsets, max_seqlen=self.max_len).transpose(1, 2)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, C) -> (N, C) real tokens; identity without padding."""
        if self.indices is None:
            return x
        return gather_rows(x.reshape(self.B * self.T, -1), self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C) -> (B, T, C) with zeros at pad positions; identity without padding."""
        if self.indices is None:
            return x
        out = x.new_zeros(self.B * self.T, x.shape[-1])
        return out.index_copy(0, self.indices, x).view(self.B, self.T, -1)


class _FlatPadding(Padding):
    """A batch without padding, carried as (B*T, C) rows so that rows can be selected in the last layer."""

    def __init__(self, base: Padding, B: int, T: int):
        super().__init__(None, B, T)
        self.attn_mask = base.attn_mask

    def unpad(self, x):  # (B, T, C) -> (B*T, C)
        return x.reshape(self.B * self.T, -1)

    def pad(self, x):  # (B*T, C) -> (B, T, C)
        return x.view(self.B, self.T, -1)


# ------------------------------------------------------------------------------------------------ encoder
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

    def forward(self, input_ids, token_type_ids=None, position_ids=None):
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = self.position_ids[:T]  # (T,)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)  # (B, T, C)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


def attention_with_dropout(q, k, v, key_mask, p: float) -> torch.Tensor:
    """softmax(q k^T) with dropout ``p`` on the probabilities, times v: (B, nh, T, hs).  ``q`` comes already
    scaled by 1/sqrt(hs) (folded into the query weights by the caller).

    Every pass over the (B, nh, T, T) scores costs more than the matmuls at long lengths on the CPU, so the
    key mask is applied in place and the dropout mask carries the 1/(1-p) itself (one multiplication).
    """
    att = q @ k.transpose(-2, -1)  # (B, nh, T, T)
    if key_mask is not None:
        att.masked_fill_(~key_mask, float("-inf"))
    att = att.softmax(-1)
    if p == 0.0:
        return att @ v
    return (att * dropout_mask(att.shape, p, att.device, att.dtype)) @ v


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        C = config.hidden_size
        self.n_head = config.num_attention_heads
        self.query = Linear(C, C)
        self.key = Linear(C, C)
        self.value = Linear(C, C)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, padding: Padding, rows=None, x_rows=None) -> torch.Tensor:
        """Attention output for every row of ``x`` (N, C); with ``rows`` (and ``x_rows``, those rows of ``x``)
        only for those rows (M, C): every token is still a key and a value, but only those rows are queries.
        """
        # x: (N, C) real tokens, or (B, T, C) without padding
        C = x.shape[-1]
        nh, hs = self.n_head, C // self.n_head
        p = self.dropout_p if self.training else 0.0
        own = p > 0.0 and x.device.type == "cpu"  # SDPA's CPU kernels have no dropout: our maths instead
        wq, bq = self.query.weight, self.query.bias
        if own:  # the softmax scale folded into the query projection
            wq, bq = wq * (1.0 / math.sqrt(hs)), bq * (1.0 / math.sqrt(hs))
        if rows is None:
            w = torch.cat([wq, self.key.weight, self.value.weight])  # (3C, C)
            b = torch.cat([bq, self.key.bias, self.value.bias])  # (3C,)
            if padding.offsets is not None and not own:  # variable-length: only real tokens, no (B, T) layout
                qkv = linear(x, w, b).view(-1, 3, nh, hs)  # (N, 3, nh, hs)
                q, k, v = (padding.jagged(t.contiguous()) for t in qkv.unbind(1))  # nested (B, nh, j, hs)
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # nested (B, nh, j, hs)
                return y.transpose(1, 2).values().reshape(-1, C)  # (N, C)
            qkv = padding.pad(linear(x, w, b))  # (B, T, 3C)
            B, T = qkv.shape[:2]
            qkv = qkv.view(B, T, 3, nh, hs).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
            q, k, v = qkv.contiguous() if own else qkv  # one copy, so that the batched matmuls need none
            y = self._attend(q, k, v, padding.attn_mask, p, own)  # (B, nh, T, hs)
            return padding.unpad(y.transpose(1, 2).reshape(B, T, C))
        w = torch.cat([self.key.weight, self.value.weight])  # (2C, C)
        b = torch.cat([self.key.bias, self.value.bias])  # (2C,)
        kv = padding.pad(linear(x, w, b))  # (B, T, 2C)
        B, T = kv.shape[:2]
        kv = kv.view(B, T, 2, nh, hs).permute(2, 0, 3, 1, 4)  # (2, B, nh, T, hs)
        k, v = kv.contiguous() if own else kv
        slots, R = query_slots(rows, padding)  # queries grouped by sequence in a (B, R) grid
        q = linear(x_rows, wq, bq)  # (M, C)
        q = q.new_zeros(B * R, C).index_copy(0, slots, q).view(B, R, nh, hs).transpose(1, 2)  # (B, nh, R, hs)
        y = self._attend(q.contiguous() if own else q, k, v, padding.attn_mask, p, own)  # (B, nh, R, hs)
        return gather_rows(y.transpose(1, 2).reshape(B * R, C), slots)  # (M, C)

    @staticmethod
    def _attend(q, k, v, key_mask, p: float, own: bool) -> torch.Tensor:
        if own:
            return attention_with_dropout(q, k, v, key_mask, p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)


def query_slots(rows: torch.Tensor, padding: Padding) -> tuple[torch.Tensor, int]:
    """Where each of ``rows`` (indices of real tokens) goes in a (B, R) grid of queries grouped by sequence,
    R being the most rows any one sequence has: (M,) flat slots b * R + rank, and R."""
    pos = rows if padding.indices is None else padding.indices[rows]  # (M,) flat positions in (B*T)
    b = torch.div(pos, padding.T, rounding_mode="floor")  # (M,) sequence of each row
    counts = torch.bincount(b, minlength=padding.B)  # (B,)
    R = max(int(counts.max()), 1) if len(counts) else 1
    order = torch.argsort(b, stable=True)
    starts = torch.cumsum(counts, 0) - counts  # (B,) first index of each sequence in sorted order
    rank = torch.empty_like(b)
    rank[order] = torch.arange(len(b), device=b.device) - starts[b[order]]
    return b * R + rank, R


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, h, residual):
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x, padding):
        return self.output(self.self(x, padding), x)


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

    def forward(self, h, residual):
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, padding, rows=None):
        """``rows``: compute the layer's output only for these rows of ``x`` (queries, output projection,
        feed-forward block); attention still reads every token as a key and a value."""
        if rows is None:
            a = self.attention.self(x, padding)
        else:
            x_rows = gather_rows(x.reshape(-1, x.shape[-1]), rows)  # (M, C)
            a = self.attention.self(x, padding, rows, x_rows)  # (M, C)
            x = x_rows
        x = self.attention.output(a, x)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x, padding, last_rows=None):
        for i, layer in enumerate(self.layer):
            x = layer(x, padding, last_rows if i == len(self.layer) - 1 else None)
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

    def tie_weights(self) -> None:
        """Tie the MLM decoder to the word embeddings (no-op for models without an MLM head)."""
        cls = getattr(self, "cls", None)
        if cls is not None and hasattr(cls, "predictions"):
            cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    @property
    def base_model(self) -> BertModel:
        return self if isinstance(self, BertModel) else self.bert

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # loading and saving live in checkpoint.py; these are the familiar entry points
    @classmethod
    def from_pretrained(cls, path, config: BertConfig | None = None, reinit_head: bool = False, **kw):
        """Load a model directory (ours or transformers', with or without the ``bert.`` prefix)."""
        from .checkpoint import load_pretrained

        return load_pretrained(cls, path, config=config, reinit_head=reinit_head, **kw)

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (and tokenizer files) atomically to ``path``."""
        from .checkpoint import save_pretrained

        save_pretrained(self, path, tokenizer=tokenizer)


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None) -> BaseModelOutput:
        B, T = input_ids.shape
        padding = self._padding(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, C)
        x = self.encoder(padding.unpad(x), padding)  # (N, C) or (B, T, C)
        x = padding.pad(x)  # (B, T, C)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BaseModelOutput(last_hidden_state=x, pooler_output=pooled)

    def hidden_at(self, positions, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """Final hidden states at flat positions (indices into the B*T tokens, repeats allowed), shape (M, C).

        The last layer reads every token as a key and a value, but computes its queries, attention output,
        output projection and feed-forward block only at ``positions``: in pretraining only [CLS] and the
        masked tokens reach the loss, so this skips most of the last layer.  Values equal ``forward`` at
        those positions.
        """
        B, T = input_ids.shape
        positions, inverse = torch.unique(positions, return_inverse=True)  # the row gathers need unique rows
        padding = self._padding(input_ids, attention_mask)
        if padding.indices is not None:  # flat position -> row among the real tokens
            lookup = torch.full((B * T,), -1, dtype=torch.long, device=input_ids.device)
            lookup[padding.indices] = torch.arange(len(padding.indices), device=input_ids.device)
            rows = lookup[positions]
        else:
            rows = positions
        x = self.embeddings(input_ids, token_type_ids)
        x = padding.unpad(x)
        if x.dim() == 3:
            x = x.reshape(B * T, -1)
            padding = _FlatPadding(padding, B, T)
        return self.encoder(x, padding, last_rows=rows)[inverse]  # (M, C) in the order of ``positions``

    def _padding(self, input_ids, attention_mask) -> Padding:
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings {self.config.max_position_embeddings}")
        return Padding(attention_mask, B, T)


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


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``h @ W.T + b`` against ``y``, without keeping separate logit, log-prob and
    gradient buffers: the logits are laid out (V, N) (the faster GEMM here), turned into softmax in place
    during the backward pass, and the one-hot subtracted there.  Loss and gradients equal
    ``F.cross_entropy(F.linear(h, W, b), y, reduction="sum")``; it cannot be backpropagated twice.

    The (V, N) buffer (75 MB for a 30k vocabulary and 600 masked tokens) is kept for the next step while no
    other forward pass holds it: a fresh one each step costs more in page faults than the softmax itself."""

    _buffer: torch.Tensor | None = None  # flat, reused between steps
    _holder = None  # weak reference to the forward pass whose logits occupy the buffer until its backward

    @staticmethod
    def _logits(ctx, V: int, N: int, like: torch.Tensor) -> torch.Tensor:
        cls, n = _LinearCrossEntropy, V * N
        if cls._holder is not None and cls._holder() is not None:  # another graph's logits await backward
            return like.new_empty((V, N))
        buf = cls._buffer
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = cls._buffer = like.new_empty(n + n // 4)  # room for the masked count to vary
        cls._holder = weakref.ref(ctx)  # released by the backward pass, or when the graph is dropped
        return buf[:n].view(V, N)

    @staticmethod
    def forward(ctx, h, W, b, y):
        zt = _LinearCrossEntropy._logits(ctx, W.shape[0], h.shape[0], h)
        torch.addmm(b[:, None], W, h.t(), out=zt)  # (V, N) logits
        zy = zt.gather(0, y[None, :]).squeeze(0)  # (N,) logit of the target
        m = zt.amax(0)  # (N,)
        e = zt.sub_(m).exp_()  # (V, N) exp(z - max), in place
        s = e.sum(0)  # (N,)
        loss = (m + s.log() - zy).sum()
        ctx.save_for_backward(h, W, e, s, y)
        return loss

    @staticmethod
    def backward(ctx, g):
        h, W, e, s, y = ctx.saved_tensors
        p = e.mul_(g / s)  # g * softmax, in place: (V, N)
        p[y, torch.arange(len(y), device=y.device)] -= g
        # (V, C) weight gradient: oneDNN ran ~20% faster than MKL for this shape here
        gW = p @ h if _dnn_linear_op() is None else _dnn(p, h.t(), None)
        grads = p.t() @ W, gW, p.sum(1), None
        holder = _LinearCrossEntropy._holder
        if holder is not None and holder() is ctx:
            _LinearCrossEntropy._holder = None
        return grads


def linear_cross_entropy_sum(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, W, b), y, reduction="sum")``, fused on the CPU (see above)."""
    if h.device.type == "cpu" and torch.is_grad_enabled() and h.dtype == torch.float32 and not torch.compiler.is_compiling():
        return _LinearCrossEntropy.apply(h, W, b, y)
    return F.cross_entropy(F.linear(h, W, b).float(), y, reduction="sum")


def _mlm_logits(head: BertLMPredictionHead, seq: torch.Tensor, labels, dense_logits: bool, reduction: str):
    """MLM logits and loss; with labels and not dense_logits, only at labelled positions (sparse)."""
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

    def pretraining_loss(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None):
        """(summed MLM loss, summed NSP loss or None): the training engine's fast path, no logits kept."""
        B, T = input_ids.shape
        flat = labels.reshape(-1)
        masked = (flat != -100).nonzero().squeeze(1)  # (N,) flat positions of the masked tokens
        cls_pos = torch.arange(B, device=input_ids.device) * T  # (B,) the [CLS] tokens
        h = self.bert.hidden_at(torch.cat([cls_pos, masked]), input_ids, attention_mask, token_type_ids)  # (B+N, C)
        head = self.cls.predictions
        mlm = linear_cross_entropy_sum(head.transform(h[B:]), head.decoder.weight, head.bias, flat[masked])
        nsp = None
        if next_sentence_label is not None:
            pooled = self.bert.pooler.activation(self.bert.pooler.dense(h[:B]))  # (B, C)
            nsp = F.cross_entropy(self.cls.seq_relationship(pooled), next_sentence_label.reshape(-1), reduction="sum")
        return mlm, nsp


class BertForMaskedLM(BertPreTrainedModel):
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

    def pretraining_loss(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None):
        """(summed MLM loss, None): the training engine's fast path (no NSP head)."""
        flat = labels.reshape(-1)
        masked = (flat != -100).nonzero().squeeze(1)
        h = self.bert.hidden_at(masked, input_ids, attention_mask, token_type_ids)  # (N, C)
        head = self.cls.predictions
        return linear_cross_entropy_sum(head.transform(h), head.decoder.weight, head.bias, flat[masked]), None


class BertForSequenceClassification(BertPreTrainedModel):
    head_prefixes = ("classifier.", "bert.pooler.")

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None):
        pooled = self.bert(input_ids, attention_mask, token_type_ids, position_ids).pooler_output
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                loss = F.cross_entropy(logits, labels.reshape(-1))
        return SequenceClassifierOutput(loss, logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None, end_positions=None
    ) -> QuestionAnsweringOutput:
        seq = self.bert(input_ids, attention_mask, token_type_ids, position_ids).last_hidden_state
        start_logits, end_logits = self.qa_outputs(seq).unbind(-1)  # 2 x (B, T)
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
