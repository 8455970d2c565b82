"""Model FLOPs per token, for the model FLOP utilisation that runs and ``bertforge bench`` report."""

from __future__ import annotations

from .config import BertConfig


def flops_per_token(config: BertConfig, seq_len: int, mlm_fraction: float | None = 0.15, train: bool = True) -> float:
    """Model FLOPs per token: 2 per multiply-add in every matmul (x3 with the backward pass).

    Counts the encoder's projections and feed-forward, the attention scores and mixing, and the MLM head
    (transform + vocabulary projection) at ``mlm_fraction`` of the tokens (None: no MLM head).
    """
    C, L, Ff, V = config.hidden_size, config.num_hidden_layers, config.intermediate_size, config.vocab_size
    per_layer = 2 * (4 * C * C + 2 * C * Ff) + 2 * 2 * seq_len * C
    total = L * per_layer
    if hasattr(config, "layer_types"):  # ModernBERT: GeGLU (3 C x Ff), a local layer's keys only its window
        seen = [seq_len if t == "full_attention" else min(seq_len, 2 * config.sliding_window + 1)
                for t in config.layer_types]
        total = sum(2 * (4 * C * C + 3 * C * Ff) + 2 * 2 * n * C for n in seen)
    if mlm_fraction:
        total += mlm_fraction * 2 * (C * C + C * V)
    return total * (3 if train else 1)
