"""Dropout with cheaper masks on the CPU, and masks keyed by sequence.

Departures (listed in :mod:`bertforge.models.bert`): on the CPU the mask comes from 16-bit random numbers, so the
drop probability is ``p`` rounded to a multiple of 1/65536.  On other devices this is ``F.dropout``.

In CPU training (pretraining and fine-tuning) each sequence's masks come from a generator of its own, keyed
by (seed, step, the sequence's index in the epoch or the training set, the dropout site) (:class:`DropoutKeys`):
the masks of a sequence do not depend on which other sequences share its micro-batch, so a run's result does
not depend on the number of processes or accumulation steps.  Without keys, masks come from torch's global
generator.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layout import tracing


def dropout_mask(shape, p: float, device, dtype=torch.float32,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout's multiplier: 1/(1-p) with probability 1 - p (p rounded to 1/65536), else 0, from
    torch's generator.  A float mask, because multiplying by it is several times faster on the CPU than
    ``torch.where`` with a boolean one, and comparing straight into a float tensor is faster than producing
    booleans.  While ``torch.compile`` traces, a plain uniform draw (the 64-bit view does not trace)."""
    if tracing():
        keep = torch.rand(shape, device=device, dtype=dtype) >= p  # (the keyless draw: no keys while tracing)
        return keep.to(dtype) * (1.0 / (1.0 - p))
    n = math.prod(shape)
    bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device, generator=generator)
    b16 = bits.view(torch.int16)[:n].view(shape)  # four 16-bit numbers from each 64-bit draw
    mask = torch.ge(b16, round(p * 65536) - 32768, out=torch.empty(shape, dtype=dtype, device=device))
    return mask.mul_(1.0 / (1.0 - p))


class _Dropout16(torch.autograd.Function):
    """Inverted dropout whose mask comes from :func:`dropout_mask`: 64 random bits per RNG call serve four
    elements, several times faster than ``bernoulli_`` on the CPU (where mask generation costs more than the
    whole GELU).  The RNG is torch's global generator, so seeding, checkpointing and resuming work as for
    ``nn.Dropout``."""

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
    """``F.dropout`` semantics; on the CPU with the faster mask generation of :func:`dropout_mask`."""
    if not training or p == 0.0:
        return x
    if x.device.type == "cpu" and not tracing():  # (a custom autograd kernel does not trace)
        return _Dropout16.apply(x, p)
    return F.dropout(x, p, True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose forward is :func:`dropout`; given a ``layout``
    (:class:`~bertforge.ops.layout.Layout`) with keys, with masks keyed by sequence."""

    def forward(self, x, layout=None):
        keys = layout.keys if layout is not None else None  # None while torch.compile traces
        if keys is not None and self.training and self.p > 0:
            return keyed_dropout(x.reshape(-1, x.shape[-1]), self.p, keys, layout.counts).view(x.shape)
        return dropout(x, self.p, self.training)


# ------------------------------------------------------------------------------------------------ keyed masks
class DropoutKeys:
    """The keys of one micro-batch's dropout masks: (seed, step) of the run, the index of each of its
    sequences in the epoch, and a counter of dropout sites that every forward pass visits in the same order.

    ``counts``-style layouts describe how a tensor's rows belong to the sequences (see :func:`keyed_dropout`).
    """

    def __init__(self, seed: int, step: int, sequences: Sequence[int]):
        self.seed, self.step, self.sequences = int(seed), int(step), [int(s) for s in sequences]
        self.site = 0

    def generators(self) -> list[torch.Generator]:
        """A fresh generator per sequence for the next dropout site."""
        self.site += 1
        gens = []
        for s in self.sequences:
            digest = hashlib.blake2b(f"{self.seed}/{self.step}/{s}/{self.site}".encode(), digest_size=8).digest()
            gens.append(torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1))
        return gens


def batch_keys(batch: dict, seed: int | None, step: int) -> DropoutKeys | None:
    """The keys of a training batch's masks: on the CPU, given a ``seed`` and the batch's ``sequence_ids``
    (each sequence's index in the epoch or the training set); else None (torch's global generator)."""
    ids = batch.get("sequence_ids")
    if seed is None or ids is None or batch["input_ids"].device.type != "cpu":
        return None
    return DropoutKeys(seed, step, ids.tolist())


def keyed_dropout(x: torch.Tensor, p: float, keys: DropoutKeys, counts: Sequence[int]) -> torch.Tensor:
    """Dropout of rows ``x`` (N, C) that belong to the sequences of ``keys``, ``counts[b]`` consecutive rows
    each, with each sequence's mask from its own generator."""
    C = x.shape[-1]
    masks = [dropout_mask((n, C), p, "cpu", x.dtype, g) for n, g in zip(counts, keys.generators()) if n]
    return x * torch.cat(masks).to(x.device) if masks else x


def keyed_attention_dropout(att: torch.Tensor, p: float, keys: DropoutKeys, rows: Sequence[int],
                            cols: Sequence[int]) -> torch.Tensor:
    """Dropout of attention probabilities (B, nh, Tq, Tk), sequence b's real queries and keys being its first
    ``rows[b]`` and ``cols[b]``; each sequence's mask from its own generator, the padding's left at zero."""
    B, nh = att.shape[:2]
    mask = att.new_zeros(att.shape)
    for b, (r, c, g) in enumerate(zip(rows, cols, keys.generators())):
        if r and c:
            mask[b, :, :r, :c] = dropout_mask((nh, r, c), p, "cpu", att.dtype, g)
    return att * mask
