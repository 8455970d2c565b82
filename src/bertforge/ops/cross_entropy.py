"""The masked-LM loss fused with its vocabulary projection, on the CPU.

Departure (listed in :mod:`bertforge.models.bert`): ``F.cross_entropy(F.linear(h, W, b), y, reduction="sum")``
computed without separate logit, log-probability and gradient buffers; loss and gradients are unchanged.  Under
bf16 autocast the three matmuls run in bf16 (as autocast would run the projection) and the softmax, its
statistics and the loss in fp32.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from .layout import tracing
from .linear import dnn_matmul_t


class LogitBuffer:
    """Memory for the fused loss's (V, N) logits, kept from one training step to the next for their masked-LM
    head (:func:`head_buffer`): a fresh buffer of a 30k vocabulary by the masked tokens each step costs more
    in page faults than the softmax itself.  While one forward pass's logits await their backward pass the
    buffer is taken, and another forward pass (evaluation inside a step, a second graph) gets fresh memory."""

    def __init__(self):
        self._buf: torch.Tensor | None = None
        self._holder = None  # weak reference to the forward pass whose logits occupy the buffer

    def take(self, ctx, V: int, N: int, like: torch.Tensor) -> torch.Tensor:
        n = V * N
        if self._holder is not None and self._holder() is not None:  # another graph's logits await backward
            return like.new_empty((V, N))
        buf = self._buf
        if buf is None or buf.numel() < n or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buf = like.new_empty(n + n // 4)  # room for the masked count to vary
        self._holder = weakref.ref(ctx)  # released by the backward pass, or when the graph is dropped
        return buf[:n].view(V, N)

    def release(self, ctx) -> None:
        if self._holder is not None and self._holder() is ctx:
            self._holder = None

    def __deepcopy__(self, memo):  # a copied model gets its own (empty) buffer
        return LogitBuffer()

    def __reduce__(self):  # a pickled model carries no logits (nor a weak reference)
        return (LogitBuffer, ())


class _LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of ``h @ W.T + b`` against ``y``: the logits are laid out (V, N) (the faster
    GEMM for these shapes), turned into softmax in place during the backward pass, and the one-hot subtracted there.
    ``low`` (bf16, or None for fp32): the dtype of the matmuls; the softmax is fp32 either way.
    It cannot be backpropagated twice."""

    @staticmethod
    def forward(ctx, h, W, b, y, buffer: LogitBuffer | None, low: torch.dtype | None):
        V, N = W.shape[0], h.shape[0]
        zt = buffer.take(ctx, V, N, b) if buffer is not None else b.new_empty((V, N))  # fp32, as the bias
        ctx.buffer, ctx.h_dtype = buffer, h.dtype
        if low is None:
            torch.addmm(b[:, None], W, h.t(), out=zt)  # (V, N) logits
        else:
            h, W = h.to(low), W.to(low)  # what the backward multiplies with, too
            zt.copy_(torch.addmm(b[:, None].to(low), W, h.t()))  # (V, N) logits, bf16 products, fp32 from here
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
        gb = p.sum(1)  # (V,)
        if W.dtype != p.dtype:
            p = p.to(W.dtype)  # the products in bf16; each gradient returned in its input's dtype
        gW = dnn_matmul_t(p, h.t())  # (V, C) = p @ h; oneDNN is the faster for this shape
        grads = (p.t() @ W).to(ctx.h_dtype), gW.to(gb.dtype), gb, None, None, None
        if ctx.buffer is not None:
            ctx.buffer.release(ctx)
        return grads


def linear_cross_entropy_sum(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor, y: torch.Tensor,
                             buffer: LogitBuffer | None = None) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, W, b), y, reduction="sum")``; fused on the CPU in training (fp32, or the
    fp32 weights of a bf16 autocast), its logits in ``buffer`` when one is given (see :class:`LogitBuffer`)."""
    if h.device.type == "cpu" and torch.is_grad_enabled() and W.dtype == b.dtype == torch.float32 and not tracing():
        low = None
        if torch.is_autocast_enabled("cpu"):
            low = torch.get_autocast_dtype("cpu")
        elif h.dtype != torch.float32:
            low = h.dtype
        if low in (None, torch.bfloat16):
            with torch.autocast("cpu", enabled=False):  # the dtypes are chosen above
                return _LinearCrossEntropy.apply(h, W, b, y, buffer, low)
    return F.cross_entropy(F.linear(h, W, b).float(), y, reduction="sum")


_HEAD_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def head_buffer(head) -> LogitBuffer | None:
    """The :class:`LogitBuffer` of a masked-LM head (any object), kept while the head lives: a copied or
    another model's head has its own.  None while ``torch.compile`` traces (the fused loss is not traced, and
    a guard on a weak dictionary's entries fails once the collector drops one)."""
    if tracing():
        return None
    buffer = _HEAD_BUFFERS.get(head)
    if buffer is None:
        buffer = _HEAD_BUFFERS[head] = LogitBuffer()
    return buffer
