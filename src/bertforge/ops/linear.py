"""``F.linear`` through oneDNN's fp32 kernel on the CPU, for the encoder's large token-by-hidden projections.

Departure (listed in :mod:`bertforge.models.bert`): on the CPU, fp32 projections over ``DNN_MIN_ROWS`` rows or
more run through torch's oneDNN linear kernel (the one torch.compile's CPU backend emits); the values are
those of ``F.linear`` up to float rounding order.  Everywhere else this is ``F.linear``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layout import tracing

DNN_MIN_ROWS = 1024  # below this many rows oneDNN's setup outweighs its gain over MKL's GEMM (F.linear's)


@functools.cache
def dnn_linear_op():
    """torch's oneDNN fp32 linear kernel, or None where this build lacks it or it disagrees with
    ``F.linear`` on a small check.  For the encoder's token-by-hidden shapes it can beat MKL's GEMM;
    ``bertforge bench`` measures the whole step on a given machine."""
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


@functools.cache
def dnn_bf16() -> bool:
    """Whether oneDNN has a bf16 linear kernel on this CPU: it needs AVX-512 (emulated bf16 products) or
    native bf16; on an AVX2-only CPU it refuses bf16 inputs, and MKL's GEMM (``F.linear``) takes them."""
    return dnn_linear_op() is not None and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def dnn_matmul_t(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T (+ b)`` through oneDNN, or plain torch where :func:`dnn_linear_op` is None or oneDNN has no
    kernel for a bf16 input on this CPU."""
    op = dnn_linear_op()
    if op is None or (x.dtype == torch.bfloat16 and not dnn_bf16()):
        return F.linear(x, w, b)
    return op(x, w, b, "none", [], "")


class _Linear(torch.autograd.Function):
    """``F.linear`` on 2-D fp32 CPU tensors with the forward and the input gradient through oneDNN; the
    weight gradient stays with MKL, which is the faster for that shape (tokens as the reduced dimension)."""

    @staticmethod
    def forward(ctx, x, w, b):  # x (N, Cin), w (Cout, Cin) -> (N, Cout)
        ctx.save_for_backward(x, w)
        return dnn_matmul_t(x, w, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):  # g (N, Cout)
        x, w = ctx.saved_tensors
        gx = dnn_matmul_t(g, w.t()) if ctx.needs_input_grad[0] else None  # (N, Cin)
        gw = g.t() @ x if ctx.needs_input_grad[1] else None  # (Cout, Cin)
        gb = g.sum(0) if ctx.needs_input_grad[2] else None  # False without a bias
        return gx, gw, gb


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, w, b)``; on the CPU in fp32, for inputs of at least ``DNN_MIN_ROWS`` rows, through
    oneDNN's kernel when torch has it (same values up to float rounding order; tested)."""
    C = x.shape[-1]
    if (
        tracing()  # inductor lowers this op only for frozen (constant) weights; first: no guard on the shape
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or w.dtype != torch.float32
        or x.numel() < DNN_MIN_ROWS * C
        or torch.is_autocast_enabled("cpu")
        or dnn_linear_op() is None
    ):
        return F.linear(x, w, b)
    return _Linear.apply(x.reshape(-1, C), w, b).view(*x.shape[:-1], w.shape[0])


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and names) whose forward is :func:`linear`."""

    def forward(self, x):
        return linear(x, self.weight, self.bias)
