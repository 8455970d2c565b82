"""ModernBERT, a second encoder family, written to be read top to bottom against transformers'
``models/modernbert/modeling_modernbert.py`` (and ``configuration_modernbert.py``).

Architecture as in Warner et al. (2024), "Smarter, Better, Faster, Longer" (ModernBERT): token embeddings only (no
positions, no token types) + LayerNorm + dropout; pre-LayerNorm encoder layers without biases (the first layer's
``attn_norm`` an identity, since the embeddings end in a norm); rotary position embeddings on Q and K, with one
theta for global layers and another for local ones; global attention every ``global_attn_every_n_layers`` layers
(layer i is global when ``i % n == 0``), sliding-window attention elsewhere, a token seeing the keys within
``local_attention // 2`` positions either side (both ends included); a GeGLU feed-forward block (``Wi`` projects to
twice the intermediate width, split into input and gate, ``act(input) * gate``, ``Wo`` back); a final LayerNorm.
The heads run a prediction head (dense -> activation -> norm) before their output layer; the masked-LM decoder is
tied to the token embeddings and has its own bias.  Module and parameter names are transformers', so that state
dicts interchange without a mapping table (the rotary frequencies are no parameters and no buffers: they are
recomputed).

Departures from transformers (5.x; the maths is meant to be the same):

* Padding is removed before every token-wise computation (embeddings, norms, projections, feed-forward) and put back
  only for attention, as bertforge's BERT (:class:`bertforge.ops.Layout`); transformers runs them over the padded
  batch (its flash-attention path unpads too).
* Attention is plain PyTorch: ``F.scaled_dot_product_attention`` over the padded (B, T) batch with an additive mask
  (0 where a key is seen, the dtype's lowest value where not); no flash or flex kernels, no variable-length
  attention, no fused rotary kernel.  A local layer on a sequence longer than three half windows attends by blocks
  (:func:`banded_attention`: each block of half-window queries sees the keys around it only), so that the masked-out
  part of a long sequence is never computed nor held.  A query whose window holds only padding (a pad token far from
  the real ones) attends uniformly to masked keys instead of producing NaN; its output is meaningless, as every pad
  position's output is (transformers' too).
* ``last_hidden_state`` holds zeros at pad positions, as our BERT (transformers' paths compute values there).
* Position ids default to ``0..T-1`` whatever the padding, as transformers': right padding is assumed.
  ``token_type_ids`` is accepted and ignored, so that the callers of a BERT call either family alike.
* The rotary cos/sin are computed from the theta in float32 at every forward, not cached in buffers, so that casting
  the model to half precision does not round the frequencies.
* Sequence classification: one label -> mean squared error, more -> cross-entropy (transformers also infers a
  multi-label ``problem_type`` from float labels; not supported here).  ``classifier_pooling`` "cls" takes position
  0, as transformers' sequence classification does (its multiple-choice head takes the first real token instead).
* ``ModernBertConfig`` reads both config.json dialects, transformers 4.x (``global_attn_every_n_layers``,
  ``global_rope_theta``, ``local_rope_theta``) and 5.x (``layer_types``, ``rope_parameters``, and ``sliding_window``
  = half of ``local_attention`` when present), and writes the 5.x one.  Only the "default" rotary type is supported
  (no ``rope_scaling``).
* Dropout (0 in every released config, in our presets and in pretraining unless ``--dropout`` asks) is keyed by
  sequence in CPU training, as BERT's (:mod:`bertforge.ops.dropout`): each sequence's masks come from its own
  generator, so that a run gives the same result on any number of processes.  Then attention dropout runs its own
  softmax (SDPA's draws from torch's generator), a local layer always by blocks (its masks drawn for the blocks of a
  sequence's real tokens, whatever the batch's padded length), and the token heads' dropout over the real tokens.
  While ``torch.compile`` traces (``--compile``) there are no keys, as for BERT.
* Pretraining's loss (:meth:`ModernBertForMaskedLM.masked_lm_loss`) runs the last layer for the masked rows only
  (they alone are queries; every token stays a key and a value), and the decoder fused with the cross-entropy
  (:func:`bertforge.ops.linear_cross_entropy_sum`), as our BERT does: the loss and its gradients are the dense ones.
* Presets (:meth:`ModernBertConfig.preset`): BERT's sizes with an intermediate width of 1.5 x hidden (ModernBERT-base's
  ratio), and ``modernbert-base``.  Question answering masks padding out of the span logits, as our BERT does.
* Not here yet: a multiple choice head, ``inputs_embeds``, hidden states or attentions as outputs, gradient
  checkpointing, and the per-sequence (CPU) and variable-length (CUDA) attention kernels of :mod:`bertforge.ops`.

Where it is used: ``bertforge pretrain --arch modernbert`` (masked LM, :mod:`bertforge.objectives.mlm`), and a
folder whose config.json says ``model_type: modernbert`` is read by :func:`bertforge.models.for_folder`, so that
fine-tuning (classify, ner, squad, embed), ``evaluate`` (mlm, classify, ner, squad) and prediction (the pipelines
and ``bertforge predict``: fill-mask, classify, ner, qa, embed) take it as they take a BERT folder."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError, shown
from ..ops import Dropout, Layout, head_buffer, linear_cross_entropy_sum, tracing
from ..ops.windowed import Band, apply_rotary, attention, banded_attention, rotary_cos_sin, window_masks
from .base import (BaseModelOutput, MaskedLMOutput, ModelConfigJson, PreTrainedModel, QuestionAnsweringOutput,
                   SequenceClassifierOutput, TokenClassifierOutput, check_preset, span_output)
from .bert import ACT2FN as BERT_ACT2FN, PRESETS
from .registry import Family, register

ACT2FN = {**BERT_ACT2FN, "silu": F.silu}  # (exact erf GELU, transformers' "gelu": ModernBERT's activation)

GLOBAL, LOCAL = "full_attention", "sliding_attention"  # transformers 5.x's layer types
# every size of BERT's presets (intermediate 1.5 x hidden, its GeGLU input projection twice that), and
# ModernBERT-base's own shape
MODERN_PRESETS: dict[str, tuple[int, int, int]] = {**PRESETS, "modernbert-base": (22, 768, 12)}


# ------------------------------------------------------------------------------------------------ config
@dataclass
class ModernBertConfig(ModelConfigJson):
    """The ModernBERT architecture; defaults are ModernBERT-base's.  Field names are transformers'.

    ``layer_types`` is the truth about which layer is global; when absent (a 4.x config.json, or a config
    built in code) it is derived from ``global_attn_every_n_layers``.  ``local_attention`` is the whole
    window (128: 64 tokens either side)."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    eos_token_id: int = 50282
    bos_token_id: int = 50281
    cls_token_id: int = 50281
    sep_token_id: int = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    global_attn_every_n_layers: int = 3  # 4.x's name; 5.x writes layer_types only
    global_rope_theta: float = 160_000.0  # 4.x's name; 5.x: rope_parameters["full_attention"]["rope_theta"]
    local_rope_theta: float = 10_000.0  # 4.x's name; 5.x: rope_parameters["sliding_attention"]["rope_theta"]
    local_attention: int = 128
    layer_types: list[str] | None = None
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    sparse_prediction: bool = False
    sparse_pred_ignore_index: int = -100
    tie_word_embeddings: bool = True
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # keys of a config.json we do not interpret (transformers_version, dtype, ...), written back unchanged
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    model_type, display_name = "modernbert", "ModernBERT"
    dropout_fields = ("mlp_dropout", "attention_dropout")
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "max_position_embeddings", "global_attn_every_n_layers", "local_attention")
    fractions = ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout")
    positives = ("initializer_range", "norm_eps")

    def __post_init__(self) -> None:
        self.check_fields()
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise UserError("rotary embeddings need an even head size (hidden_size / num_attention_heads)")
        if self.layer_types is None:
            n = self.global_attn_every_n_layers
            self.layer_types = [GLOBAL if i % n == 0 else LOCAL for i in range(self.num_hidden_layers)]
        self.layer_types = list(self.layer_types)
        if len(self.layer_types) != self.num_hidden_layers or not set(self.layer_types) <= {GLOBAL, LOCAL}:
            raise UserError(f"layer_types must list {GLOBAL!r} or {LOCAL!r} for each of the "
                            f"{self.num_hidden_layers} layers, not {shown(self.layer_types)}")
        if self.local_attention < 2:  # 4.x and 5.x both halve it, rounding down: 129 reads as 128
            raise UserError(f"local_attention (the whole window) must be at least 2, not {shown(self.local_attention)}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise UserError(f"classifier_pooling must be 'cls' or 'mean', not {shown(self.classifier_pooling)}")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACT2FN:
                raise UserError(f"unsupported {name} {shown(getattr(self, name))}; expected one of {tuple(ACT2FN)}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """A named size (:data:`MODERN_PRESETS`): BERT's layers, hidden size and heads for
        tiny to base, ModernBERT-base's for modernbert-base; the intermediate width 1.5 x hidden (the GeGLU input
        projection twice that), ModernBERT-base's ratio.  ``overrides``: the vocabulary's size and special ids."""
        layers, hidden, heads = check_preset(name, MODERN_PRESETS)
        kw: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                  intermediate_size=hidden * 3 // 2)
        return cls(**{**kw, **overrides})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def sliding_window(self) -> int:
        """Half the window: a local layer's token sees keys at distance <= this (5.x's name)."""
        return self.local_attention // 2

    def adopt_special_ids(self, ids) -> None:
        self.pad_token_id, self.cls_token_id, self.sep_token_id = ids.pad, ids.cls, ids.sep
        self.bos_token_id, self.eos_token_id = ids.cls, ids.sep

    def encoder_flops(self, seq_len: int) -> int:
        """The encoder's forward FLOPs per token: a GeGLU's input projection is 2 x the intermediate width, and a
        local layer's token attends to its window's keys only."""
        C, Ff = self.hidden_size, self.intermediate_size
        seen = [seq_len if t == GLOBAL else min(seq_len, 2 * self.sliding_window + 1) for t in self.layer_types]
        return sum(2 * (4 * C * C + 3 * C * Ff) + 2 * 2 * n * C for n in seen)

    def rope_theta(self, layer_type: str) -> float:
        return self.global_rope_theta if layer_type == GLOBAL else self.local_rope_theta

    # ----------------------------------------------------------------------------------------- json
    def to_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """transformers 5.x's dialect: ``layer_types`` and ``rope_parameters``, none of the 4.x names."""
        d = self.fields_dict(skip=("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"))
        d["rope_parameters"] = {
            GLOBAL: {"rope_theta": self.global_rope_theta, "rope_type": "default"},
            LOCAL: {"rope_theta": self.local_rope_theta, "rope_type": "default"},
        }
        d["model_type"] = "modernbert"
        if architectures:
            d["architectures"] = list(architectures)
        return d

    @classmethod
    def read_fields(cls, d: dict[str, Any]) -> dict[str, Any]:
        """Either dialect.  Where a 5.x file has both, ``rope_parameters`` wins over the 4.x thetas and
        ``sliding_window`` over ``local_attention`` (as transformers 5.x reads them, we believe)."""
        if d.pop("rope_scaling", None):
            raise UserError("rope_scaling is not supported (only the default rotary embeddings)")
        kw = super().read_fields(d)
        # 4.x: a local_rope_theta of null meant "the global theta" for local layers too
        if "local_rope_theta" in kw and kw["local_rope_theta"] is None:
            kw["local_rope_theta"] = kw.get("global_rope_theta", cls.global_rope_theta)
        rope = d.pop("rope_parameters", None)
        if rope is not None:
            for layer_type, name in ((GLOBAL, "global_rope_theta"), (LOCAL, "local_rope_theta")):
                params = rope.get(layer_type) or {}
                if params.get("rope_type", params.get("type", "default")) != "default":
                    raise UserError(f"rope_type {shown(params.get('rope_type'))} of {layer_type} is not "
                                    "supported (only 'default')")
                if params.get("rope_theta") is not None:
                    kw[name] = float(params["rope_theta"])
        window = d.pop("sliding_window", None)
        if window is not None:
            kw["local_attention"] = 2 * int(window)
        return kw


# ------------------------------------------------------------------------------------------------ encoder
def LayerNorm(config: ModernBertConfig) -> nn.LayerNorm:  # noqa: N802 - a factory read as a module
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = LayerNorm(config)
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids, layout=None):  # (B, T) -> (B, T, C), or (N,) -> (N, C) real tokens
        return self.drop(self.norm(self.tok_embeddings(input_ids)), layout)


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_idx: int):
        super().__init__()
        C = config.hidden_size
        self.n_head = config.num_attention_heads
        self.head_dim = config.head_dim
        self.Wqkv = nn.Linear(C, 3 * C, bias=config.attention_bias)  # rows: Q (all heads), K, V
        self.Wo = nn.Linear(C, C, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        self.out_drop = Dropout(config.attention_dropout)  # transformers: Identity when 0 (no parameters)

    def forward(self, x, cos, sin, mask, layout: Layout):
        """softmax(Q K^T / sqrt(hs) + mask) V with rotated Q and K, heads concatenated, then Wo: the rows of ``x``,
        (N, C) real tokens or (B, T, C) without padding (``layout``); only attention sees the padded batch."""
        qkv = layout.pad(self.Wqkv(x))  # (B, T, 3C)
        B, T, C = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
        qkv = qkv.view(B, T, 3, self.n_head, self.head_dim)  # (B, T, 3, H, hs)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))  # 3 x (B, H, T, hs)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.dropout_p if self.training else 0.0
        keys = layout.keys if p > 0 else None  # each sequence's real tokens: layout.counts
        if isinstance(mask, Band):  # a local layer on a long sequence: each query's window only
            y = banded_attention(q, k, v, mask, p, None if keys is None else (keys, layout.counts))  # (B, H, T, hs)
        else:
            keyed = None if keys is None else (keys, layout.counts, layout.counts)
            y = attention(q, k, v, mask, p, keyed)  # (B, H, T, hs)
        y = layout.unpad(y.transpose(1, 2).reshape(B, T, C))  # (N, C) or (B, T, C)
        return self.out_drop(self.Wo(y), layout)

    def rows(self, x, keep, cos, sin, mask, selection: Layout):
        """What ``forward`` gives at the rows ``keep`` (B, T) selects, (N, C) in row-major order, with only those
        rows as queries (every token is still a key and a value): the last layer of pretraining's fast path.
        ``selection`` holds the dropout keys and how many of the rows each sequence has (``counts``); keyed
        dropout draws its masks for those rows, so in training with keys the result is ``forward``'s in
        distribution, not value."""
        B, T, C = x.shape
        H, hs = self.n_head, self.head_dim
        w, b = self.Wqkv.weight, self.Wqkv.bias
        kv = F.linear(x, w[C:], None if b is None else b[C:]).view(B, T, 2, H, hs)  # K, V of every token
        k, v = (t.transpose(1, 2) for t in kv.unbind(dim=2))  # 2 x (B, H, T, hs)
        k = apply_rotary(k, cos, sin)
        bi, ti = keep.nonzero(as_tuple=True)  # (N,): the rows' sequences and positions
        R = int(keep.sum(1).max())  # the queries go in a (B, R) grid, each sequence's first
        slots = bi * R + (keep.cumsum(1) - 1)[bi, ti]  # (N,)
        pos = ti.new_zeros(B * R).index_copy(0, slots, ti).view(B, R)  # each query's position (0 in the gaps)
        q = F.linear(x[bi, ti], w[:C], None if b is None else b[:C])  # (N, C)
        q = q.new_zeros(B * R, C).index_copy(0, slots, q).view(B, R, H, hs).transpose(1, 2)  # (B, H, R, hs)
        q = apply_rotary(q, cos[0, pos], sin[0, pos])  # the queries' own angles (B, R, hs)
        if isinstance(mask, Band):
            mask = mask.rows(pos, T, q.dtype)  # (B, 1, R, T)
        elif mask is not None and mask.shape[-2] > 1:  # a local layer's (B or 1, 1, T, T): the queries' rows
            mask = mask.expand(B, -1, -1, -1)[torch.arange(B, device=x.device)[:, None], 0, pos][:, None]  # (B,1,R,T)
        p = self.dropout_p if self.training else 0.0
        keyed = None
        if p > 0 and selection.keys is not None:  # sequence b's queries: its first slots; its keys: the real tokens
            keyed = (selection.keys, selection.counts, selection.batch.counts)
        y = attention(q, k, v, mask, p, keyed)  # (B, H, R, hs)
        y = y.transpose(1, 2).reshape(B * R, C)[slots]  # (N, C)
        return self.out_drop(self.Wo(y), selection)


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(drop(act(input) * gate)), input and gate the two halves of Wi's output."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        C, I = config.hidden_size, config.intermediate_size  # noqa: E741
        self.Wi = nn.Linear(C, 2 * I, bias=config.mlp_bias)
        self.act = ACT2FN[config.hidden_activation]
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(I, C, bias=config.mlp_bias)

    def forward(self, x, layout=None):  # (N, C) real tokens, or (B, T, C)
        inp, gate = self.Wi(x).chunk(2, dim=-1)  # 2 x (N, I)
        return self.Wo(self.drop(self.act(inp) * gate, layout))  # (N, C)


class ModernBertEncoderLayer(nn.Module):
    def __init__(self, config: ModernBertConfig, layer_idx: int):
        super().__init__()
        # the embeddings end in a norm, so the first layer does not norm again
        self.attn_norm = nn.Identity() if layer_idx == 0 else LayerNorm(config)
        self.attn = ModernBertAttention(config, layer_idx)
        self.mlp_norm = LayerNorm(config)
        self.mlp = ModernBertMLP(config)
        self.attention_type = config.layer_types[layer_idx]

    def forward(self, x, cos, sin, mask, layout):  # pre-LN: x + f(norm(x)), twice; (N, C) or (B, T, C)
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, layout)
        return x + self.mlp(self.mlp_norm(x), layout)

    def rows(self, x, keep, cos, sin, mask, selection):  # (B, T, C) -> (N, C): the rows ``keep`` selects
        y = x[keep] + self.attn.rows(self.attn_norm(x), keep, cos, sin, mask, selection)
        return y + self.mlp(self.mlp_norm(y), selection)


# ------------------------------------------------------------------------------------------------ base
class ModernBertPreTrainedModel(PreTrainedModel):
    """ModernBERT's initialisation (transformers' truncated normals) and names
    (:class:`~bertforge.models.base.PreTrainedModel` loads, saves and ties)."""

    config: ModernBertConfig
    config_class = ModernBertConfig
    base_model_prefix = "model"  # the encoder's attribute in task models, and its prefix in their checkpoints
    encoder_prefixes = ("embeddings.", "layers.", "final_norm.")  # a bare encoder's names, without the prefix
    embeddings_name = "tok_embeddings"

    def _init_weights(self, module: nn.Module) -> None:
        cfg = self.config
        cutoff = cfg.initializer_cutoff_factor if cfg.initializer_cutoff_factor is not None else 3.0
        stds = {
            "in": cfg.initializer_range,
            "out": cfg.initializer_range / math.sqrt(2.0 * cfg.num_hidden_layers),
            "embedding": cfg.initializer_range,
            "final_out": cfg.hidden_size ** -0.5,
        }

        def init(m: nn.Module, std: float) -> None:
            nn.init.trunc_normal_(m.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ModernBertEmbeddings):
            init(module.tok_embeddings, stds["embedding"])
        elif isinstance(module, ModernBertMLP):
            init(module.Wi, stds["in"])
            init(module.Wo, stds["out"])
        elif isinstance(module, ModernBertAttention):
            init(module.Wqkv, stds["in"])
            init(module.Wo, stds["out"])
        elif isinstance(module, ModernBertPredictionHead):
            init(module.dense, stds["out"])
        elif isinstance(module, ModernBertForMaskedLM):
            # with tying this re-draws the shared token embeddings too (transformers' order; unverified)
            init(module.decoder, stds["out"])
        elif isinstance(module, _ModernBertClassifier):
            init(module.classifier, stds["final_out"])

    def init_weights(self) -> None:
        self.tie_weights()
        self.apply(self._init_weights)  # children before parents, as transformers'

    def initialisation_said(self) -> str:
        return "ModernBERT's initialisation (truncated normals)"

    def grow_output_layer(self, rows) -> None:
        old = getattr(self, "decoder", None)
        if old is not None:  # the decoder carries the bias
            n = self.get_input_embeddings().num_embeddings
            new = nn.Linear(old.in_features, n, bias=old.bias is not None).to(old.weight)
            new.weight.copy_(rows(old.weight))
            if old.bias is not None:
                new.bias.copy_(rows(old.bias))
            self.decoder = new

    def tied_decoder(self) -> nn.Linear | None:
        decoder = getattr(self, "decoder", None)
        return decoder if decoder is not None and self.config.tie_word_embeddings else None

    def tied_keys(self) -> set[str]:
        """State-dict keys that are views of another parameter: left out when saving, as transformers does."""
        return {"decoder.weight"} if getattr(self, "decoder", None) is not None and self.config.tie_word_embeddings \
            else set()


class ModernBertModel(ModernBertPreTrainedModel):
    """The bare encoder: ``forward(input_ids, attention_mask)`` gives ``last_hidden_state`` (B, T, C)."""

    role = "encoder"

    head_weight = "embeddings.tok_embeddings.weight"

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = LayerNorm(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                dropout_keys=None) -> BaseModelOutput:
        """``token_type_ids`` is taken and ignored (ModernBERT has none: pairs are told apart by [SEP]), so
        that the callers of a BERT call either family alike.  ``dropout_keys``
        (:class:`~bertforge.ops.dropout.DropoutKeys`): in training, dropout masks keyed by sequence."""
        T = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device)[None]  # (1, T), whatever the padding
        x, layout = self.embed(input_ids, attention_mask, dropout_keys)  # (N, C) real tokens, or (B, T, C)
        masks = self._masks(attention_mask, T, x, layout)
        rotary = self._rotary(position_ids, x.dtype)
        for layer in self.layers:
            cos, sin = rotary[layer.attention_type]
            x = layer(x, cos, sin, masks[layer.attention_type], layout)  # (N, C) or (B, T, C)
        return BaseModelOutput(last_hidden_state=layout.pad(self.final_norm(x)))  # (B, T, C), zeros at padding

    def embed(self, input_ids, attention_mask, dropout_keys=None) -> tuple[torch.Tensor, Layout]:
        """The embeddings of the real tokens (N, C), or of every token (B, T, C) when there is no padding (or
        ``torch.compile`` traces: then the padded batch throughout), and the batch's layout."""
        layout = self.layout(input_ids, attention_mask, dropout_keys)
        ids = input_ids if layout.indices is None else input_ids.reshape(-1)[layout.indices]  # (B, T) or (N,)
        return self.embeddings(ids, layout), layout

    def layout(self, input_ids, attention_mask, dropout_keys=None) -> Layout:
        """Where the batch's real tokens are, with the dropout keys in training; while ``torch.compile`` or an
        export traces, the padded batch (the attention masks of :meth:`_masks` keep the padding out)."""
        B, T = input_ids.shape
        return Layout(None if tracing() else attention_mask, B, T, dropout_keys if self.training else None)

    def _masks(self, attention_mask, T: int, x: torch.Tensor, layout: Layout) -> dict:
        # keyed attention dropout draws a local layer's masks by blocks, whatever T: the same for a sequence
        # in any batch
        keyed = layout.keys is not None and any(layer.attn.dropout_p > 0 for layer in self.layers)
        global_mask, local_mask = window_masks(attention_mask, T, self.config.sliding_window, x.dtype, x.device,
                                               banded=keyed)
        return {GLOBAL: global_mask, LOCAL: local_mask}

    def _rotary(self, position_ids, dtype) -> dict:
        """layer type -> (cos, sin) (B or 1, T, hs) of its theta."""
        return {t: tuple(c.to(dtype) for c in rotary_cos_sin(position_ids, self.config.head_dim,
                                                            self.config.rope_theta(t)))
                for t in set(self.config.layer_types)}

    def masked_rows(self, input_ids, attention_mask, keep, dropout_keys=None) -> torch.Tensor:
        """The final states (N, C) of the rows ``keep`` (B, T) selects, row-major, equal to ``forward``'s there
        (without dropout), with the last layer run for those rows only (pretraining's fast path: only masked
        tokens are scored)."""
        B, T = input_ids.shape
        x, layout = self.embed(input_ids, attention_mask, dropout_keys)  # (N, C) or (B, T, C)
        masks = self._masks(attention_mask, T, x, layout)
        selection = Layout(None, B, T, layout.keys)  # the selected rows: keys, and how many each sequence has
        selection.batch = layout
        if layout.keys is not None:
            selection.counts = keep.sum(1).tolist()
        rotary = self._rotary(torch.arange(T, device=x.device)[None], x.dtype)
        *first, last = self.layers
        for layer in first:
            x = layer(x, *rotary[layer.attention_type], masks[layer.attention_type], layout)  # (N, C) or (B, T, C)
        x = layout.pad(x)  # (B, T, C): every token is a key and a value of the last layer
        return self.final_norm(last.rows(x, keep, *rotary[last.attention_type], masks[last.attention_type],
                                         selection))


# ------------------------------------------------------------------------------------------------ heads
class ModernBertPredictionHead(nn.Module):
    """dense -> activation -> norm, before the decoder or a classifier (``classifier_bias`` is this dense's)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACT2FN[config.classifier_activation]
        self.norm = LayerNorm(config)

    def forward(self, x):  # (..., C) -> (..., C)
        return self.norm(self.act(self.dense(x)))


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """The encoder with the masked-LM head: ``logits`` (B, T, V); a loss when ``labels`` are given.  With
    ``config.sparse_prediction`` and labels, the logits are only the labelled positions' (N, V), in
    row-major order, as transformers'."""

    role = "masked_lm"

    head_prefixes = ("head.", "decoder.")
    head_weight = "head.dense.weight"  # what a folder that can fill masks stores

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)  # tied, own bias
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, dense_logits: bool | None = None, loss_reduction: str = "mean",
                dropout_keys=None) -> MaskedLMOutput:
        """``dense_logits`` False (with labels): the labelled rows' logits only, True: every position's, None:
        as ``config.sparse_prediction`` says; ``loss_reduction="sum"``: a summed loss, for a caller that
        normalises over a global batch."""
        x = self.model(input_ids, attention_mask, position_ids=position_ids,
                       dropout_keys=dropout_keys).last_hidden_state  # (B, T, C)
        sparse = not dense_logits if dense_logits is not None else self.config.sparse_prediction
        if labels is not None and sparse:
            labels = labels.reshape(-1)
            keep = labels != self.config.sparse_pred_ignore_index  # (B*T,)
            x, labels = x.reshape(-1, x.shape[-1])[keep], labels[keep]  # (N, C), (N,)
        logits = self.decoder(self.head(x))  # (B, T, V) or (N, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                   ignore_index=-100, reduction=loss_reduction)
        return MaskedLMOutput(loss, logits)

    def pretraining_losses(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                           dropout_keys=None):
        """(summed masked-LM loss, None): no next sentence prediction in this family."""
        return self.masked_lm_loss(input_ids, attention_mask, labels, dropout_keys), None

    def masked_lm_loss(self, input_ids, attention_mask, labels, dropout_keys=None) -> torch.Tensor:
        """Pretraining's loss: the cross-entropy summed over the labelled tokens, the last layer, the head and
        the decoder run on those rows only (transformers' ``sparse_prediction`` runs the last two so)."""
        keep = labels != -100  # (B, T)
        if not keep.any():  # nothing to score: the whole encoder still runs, so that every weight takes part
            x = self.model(input_ids, attention_mask, dropout_keys=dropout_keys).last_hidden_state[keep]  # (0, C)
            return F.cross_entropy(self.decoder(self.head(x)).float(), labels[keep], reduction="sum")
        # (N, C): the last layer for those rows only
        h = self.head(self.model.masked_rows(input_ids, attention_mask, keep, dropout_keys))
        if self.decoder.bias is None:
            return F.cross_entropy(self.decoder(h).float(), labels[keep], reduction="sum")
        # the decoder fused with the loss (bertforge.ops): no (N, V) logits, log-probabilities and gradients apart
        return linear_cross_entropy_sum(h, self.decoder.weight, self.decoder.bias, labels[keep], head_buffer(self))


class _ModernBertClassifier(ModernBertPreTrainedModel):
    """The encoder, then head -> dropout -> classifier (with a bias, whatever ``classifier_bias``)."""

    head_prefixes = ("head.", "classifier.")
    head_weight = "classifier.weight"

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def dropped(self, h: torch.Tensor, attention_mask, dropout_keys) -> torch.Tensor:
        """The head's output (B, T, C) after dropout: keyed by sequence, over the real tokens, given keys in
        training (the padding's rows then zero: no loss reads them)."""
        if dropout_keys is None or not self.training or self.drop.p == 0:
            return self.drop(h)
        layout = Layout(attention_mask, *h.shape[:2], dropout_keys)
        return layout.pad(self.drop(layout.unpad(h), layout))


class ModernBertForSequenceClassification(_ModernBertClassifier):
    """Pooling (``classifier_pooling``: the state at position 0, or the mean over real tokens), then head ->
    dropout -> classifier: ``logits`` (B, num_labels); cross-entropy with ``labels`` (mean squared error
    with one label)."""

    role = "sequence_classification"

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, dropout_keys=None) -> SequenceClassifierOutput:
        x = self.model(input_ids, attention_mask, position_ids=position_ids,
                       dropout_keys=dropout_keys).last_hidden_state  # (B, T, C)
        if self.config.classifier_pooling == "cls":
            pooled = x[:, 0]  # (B, C)
        else:
            if attention_mask is None:
                attention_mask = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device)
            m = attention_mask.to(x.dtype)[..., None]  # (B, T, 1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1)  # (B, C)
        keys = dropout_keys if self.training else None  # one row of each sequence
        B = pooled.shape[0]  # (not len(): a traced batch size stays symbolic)
        logits = self.classifier(self.drop(self.head(pooled), Layout.one_row_each(keys, B)))  # (B, labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.float().reshape(-1))
            else:
                loss = F.cross_entropy(logits, labels.reshape(-1))
        return SequenceClassifierOutput(loss, logits)


class ModernBertForTokenClassification(_ModernBertClassifier):
    """head -> dropout -> classifier over every token: ``logits`` (B, T, num_labels); cross-entropy over
    the tokens whose ``labels`` are not -100."""

    role = "token_classification"

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, dropout_keys=None) -> TokenClassifierOutput:
        x = self.model(input_ids, attention_mask, position_ids=position_ids,
                       dropout_keys=dropout_keys).last_hidden_state  # (B, T, C)
        logits = self.classifier(self.dropped(self.head(x), attention_mask, dropout_keys))  # (B, T, labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
        return TokenClassifierOutput(loss, logits)


class ModernBertForQuestionAnswering(_ModernBertClassifier):
    """head -> dropout -> classifier (2 outputs) over every token: ``start_logits`` and ``end_logits`` (B, T);
    a loss with ``start_positions`` / ``end_positions``.  As bertforge's BERT, padding is no answer: its logits
    are the dtype's lowest, out of the loss's softmax (transformers leaves them computed)."""

    role = "question_answering"

    @staticmethod
    def other_head(config: ModernBertConfig) -> str | None:
        """What a folder's ``classifier`` is when it is another task's (a sentence or token classifier's, as its
        config.json says), not a span head; None when it is one (:func:`holds_span_head`)."""
        return None if holds_span_head(config) else (config.extra.get("architectures") or ["a classifier"])[0]

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, start_positions=None,
                end_positions=None, dropout_keys=None) -> QuestionAnsweringOutput:
        x = self.model(input_ids, attention_mask, position_ids=position_ids,
                       dropout_keys=dropout_keys).last_hidden_state  # (B, T, C)
        h = self.dropped(self.head(x), attention_mask, dropout_keys)  # (B, T, C)
        start_logits, end_logits = self.classifier(h).unbind(-1)  # 2 x (B, T)
        return span_output(start_logits, end_logits, attention_mask, start_positions, end_positions)


def holds_span_head(config: ModernBertConfig) -> bool:
    """Whether a ModernBERT folder's ``classifier`` is a span head (its config.json names a question-answering
    model, or nothing and 2 labels), not a sentence or token classifier's of the same name."""
    named = config.extra.get("architectures") or []
    return any(str(a).endswith("ForQuestionAnswering") for a in named) or (not named and config.num_labels == 2)


register(Family(
    name="modernbert", label="ModernBERT", config_class=ModernBertConfig,
    summary="rotary positions, GeGLU, pre-LayerNorm without biases, local and global attention; masked LM only",
    heads={c.role: c for c in (ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
                               ModernBertForTokenClassification, ModernBertForQuestionAnswering)},
    presets=MODERN_PRESETS, objectives=("mlm",), next_sentence=False, position_table=False,
    pretraining_dropout=0.0,  # (none unless --dropout asks, as its recipe)
    inputs=("input_ids", "attention_mask")))  # pairs are told apart by [SEP]: no token types

__all__ = ["ModernBertConfig", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
           "ModernBertForTokenClassification", "ModernBertForQuestionAnswering"]
