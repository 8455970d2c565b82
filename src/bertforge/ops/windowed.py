"""Attention over a window of positions, with rotary angles (the layers of a family with local and global
attention, in :mod:`bertforge.models`): the rotary angles, the additive masks of global and local layers, and banded
attention, which computes a long sequence's windows only (each block of half-window queries against the keys
around it), tested equal to the dense masked computation."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import attention_with_dropout
from .dropout import dropout_mask
from .layout import in_export


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float):
    """cos and sin (B or 1, T, hs) of the rotation angles position * theta^(-2i/hs), each frequency twice
    (the two halves of a head are the pairs rotated together)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids.device)
                               / head_dim)  # (hs/2,)
    angles = position_ids[..., None].float() * inv_freq  # (B, T, hs/2)
    angles = torch.cat((angles, angles), dim=-1)  # (B, T, hs)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, hs) queries or keys by the angles of ``cos``/``sin`` (B, T, hs), in float32."""
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, hs)
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # the second half moved first, negated
    return (xf * cos + rotated * sin).to(x.dtype)


def additive(seen: torch.Tensor, dtype) -> torch.Tensor:
    """0 where ``seen``, else the dtype's lowest value (not -inf: a row that sees nothing gives no NaN)."""
    return torch.where(seen, torch.zeros((), dtype=dtype, device=seen.device),
                       torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=seen.device))


@dataclass
class Band:
    """A local layer's mask on a sequence longer than three half windows, kept as what it says (the real tokens,
    the half window) so that :func:`banded_attention` computes each query's window and nothing else."""

    real: torch.Tensor | None  # (B, T) bool; None: every token is real
    window: int

    def rows(self, pos: torch.Tensor, T: int, dtype) -> torch.Tensor:
        """The additive mask (B, 1, R, T) of the queries at positions ``pos`` (B, R)."""
        seen = (pos[..., None] - torch.arange(T, device=pos.device)).abs() <= self.window  # (B, R, T)
        if self.real is not None:
            seen = seen & self.real[:, None, :]
        return additive(seen, dtype)[:, None]


def window_masks(attention_mask: torch.Tensor | None, T: int, window: int, dtype, device, banded: bool = False):
    """(the global layers' mask: additive (B, 1, 1, T) or None, the local layers': additive (B or 1, 1, T, T), or a
    :class:`Band` when T > 3 * window or ``banded``).  A key is seen when it is a real token, and by a local layer
    only within ``window`` positions of the query (both ends included)."""
    real = None if attention_mask is None else attention_mask.to(device=device, dtype=torch.bool)  # (B, T)
    # an exported graph takes the dense masks, one graph for every length: asked first, so that tracing does not
    # compare the symbolic length (a guard the exporter would then have to drop with a second trace)
    if not in_export() and (T > 3 * window or banded):  # the window is a small part: attend by blocks
        local = Band(real, window)
    else:
        pos = torch.arange(T, device=device)
        near = ((pos[:, None] - pos[None, :]).abs() <= window)[None, None]  # (1, 1, T, T), query x key
        local = additive(near if real is None else near & real[:, None, None, :], dtype)  # (B or 1, 1, T, T)
    if in_export() and real is not None:  # ONNX's Attention operator takes a mask per query, not broadcast
        B = real.shape[0]
        return additive(real[:, None, None, :], dtype).expand(B, 1, T, T), local.expand(B, 1, T, T)
    return None if real is None else additive(real[:, None, None, :], dtype), local


def attention(q, k, v, mask, p: float, keyed=None) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + mask) v, (B, H, Tq, hs), with dropout ``p`` on the probabilities: SDPA's, or
    with ``keyed`` = (keys, real queries, real keys of each sequence) each sequence's mask from its own
    generator (:func:`~bertforge.ops.dropout.keyed_attention_dropout`)."""
    if keyed is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
    return attention_with_dropout(q * q.shape[-1] ** -0.5, k, v, mask, p, keyed)  # (BERT's too)


def banded_attention(q, k, v, band: Band, p: float, keyed=None) -> torch.Tensor:
    """Sliding-window attention (B, H, T, hs) that never computes the masked-out part: the queries in blocks of
    w (the half window), each block seeing the 3w keys around it, the exact window and the padding masked
    within them.  Equal to the dense masked attention at every query that sees a real key.  With ``keyed`` =
    (keys, real tokens of each sequence), each sequence's dropout mask of its blocks (the blocks that hold its
    real queries) from its own generator: the same whatever the batch's padded length."""
    B, H, T, hs = q.shape
    w = band.window
    nb = -(-T // w)  # blocks of w queries
    extra = nb * w - T  # queries padded to whole blocks

    def blocks(t, size, before, after):  # (B, H, T, hs) -> (B*nb, H, size, hs): 4-D, as the fused kernels take
        t = F.pad(t, (0, 0, before, after)).unfold(2, size, w)  # (B, H, nb, hs, size)
        return t.permute(0, 2, 1, 4, 3).reshape(B * nb, H, size, hs)

    qb = blocks(q, w, 0, extra)  # (B*nb, H, w, hs)
    kb, vb = blocks(k, 3 * w, w, w + extra), blocks(v, 3 * w, w, w + extra)  # (B*nb, H, 3w, hs)
    a = torch.arange(w, device=q.device)[:, None]  # a query's place in its block
    c = torch.arange(3 * w, device=q.device)  # a key's place among its block's keys: position block*w - w + c
    key_pos = torch.arange(nb, device=q.device)[:, None, None] * w - w + c  # (nb, 1, 3w)
    seen = ((a + w - c).abs() <= w) & (key_pos >= 0) & (key_pos < T)  # (nb, w, 3w)
    if band.real is not None:
        real = band.real.new_zeros(B, nb * w + 2 * w)
        real[:, w : w + T] = band.real
        seen = seen & real.unfold(1, 3 * w, w)[:, :, None, :]  # (B, nb, w, 3w)
    mask = additive(seen.expand(B, nb, w, 3 * w).reshape(B * nb, 1, w, 3 * w), q.dtype)
    if keyed is None:
        y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, dropout_p=p)  # (B*nb, H, w, hs)
    else:
        att = ((qb @ kb.transpose(-2, -1)) * hs**-0.5 + mask).softmax(-1)  # (B*nb, H, w, 3w)
        drop = att.new_zeros(B, nb, H, w, 3 * w)
        for b, (n, g) in enumerate(zip(keyed[1], keyed[0].generators())):
            if n:
                m = -(-n // w)  # the blocks of its real queries
                drop[b, :m] = dropout_mask((m, H, w, 3 * w), p, "cpu", att.dtype, g)
        y = (att * drop.view(B * nb, H, w, 3 * w)) @ vb  # (B*nb, H, w, hs)
    return y.view(B, nb, H, w, hs).transpose(1, 2).reshape(B, H, nb * w, hs)[:, :, :T]  # (B, H, T, hs)
