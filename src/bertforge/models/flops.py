"""Model FLOPs per token, for the model FLOP utilisation that runs and ``bertforge bench`` report."""

from __future__ import annotations

from typing import Any


def flops_per_token(config: Any, seq_len: int, mlm_fraction: float | None = 0.15, train: bool = True) -> float:
    """Model FLOPs per token: 2 per multiply-add in every matmul (x3 with the backward pass).

    Counts the encoder's projections and feed-forward, the attention scores and mixing, and the MLM head
    (transform + vocabulary projection) at ``mlm_fraction`` of the tokens (None: no MLM head).
    """
    C, V = config.hidden_size, config.vocab_size
    total = config.encoder_flops(seq_len)  # each family's layers (forward, per token)
    if mlm_fraction:
        total += mlm_fraction * 2 * (C * C + C * V)
    return total * (3 if train else 1)
