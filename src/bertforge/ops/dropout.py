"""Dropout with cheaper masks on the CPU.

Departure (listed in :mod:`bertforge.model`): on the CPU the mask comes from 16-bit random numbers, so the
drop probability is ``p`` rounded to a multiple of 1/65536.  On other devices this is ``F.dropout``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def dropout_mask(shape, p: float, device, dtype=torch.float32) -> torch.Tensor:
    """Inverted dropout's multiplier: 1/(1-p) with probability 1 - p (p rounded to 1/65536), else 0, from
    torch's generator.  A float mask, because multiplying by it is several times faster on the CPU than
    ``torch.where`` with a boolean one, and comparing straight into a float tensor is faster than producing
    booleans."""
    n = math.prod(shape)
    bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=device)
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
    if x.device.type == "cpu":
        return _Dropout16.apply(x, p)
    return F.dropout(x, p, True)


class Dropout(nn.Dropout):
    """``nn.Dropout`` whose forward is :func:`dropout`."""

    def forward(self, x):
        return dropout(x, self.p, self.training)
