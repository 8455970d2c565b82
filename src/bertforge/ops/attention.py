"""Multi-head self-attention kernels, and the one place that picks among them.

The maths is the paper's ``softmax(Q K^T / sqrt(hs)) V`` with dropout on the probabilities.  Which code
computes it is decided in one place, :func:`pick_kernel`:

* ``F.scaled_dot_product_attention`` (flash / memory-efficient / math kernels) wherever it can, including
  variable-length attention over nested jagged tensors when a padded batch runs on CUDA
  (:class:`~bertforge.ops.layout.Layout` says when);
* our own maths on the CPU in training with dropout, since SDPA's CPU kernels have no dropout: over a padded
  batch one sequence at a time over its real tokens (:func:`sequence_attention`), when padding would make
  enough of the (B, T, T) work in a batch long enough (``SEQUENCE_ATTENTION_*``; no scores, softmax or
  dropout at pad positions), else on the padded layout (the key mask applied in place).  Either way the
  softmax scale is folded into the query projection and the dropout multiplier carries 1/(1-p) (every pass
  over the scores costs more than the matmuls there).  Without dropout SDPA's batched CPU kernel beats a
  loop over sequences by far (one fused kernel against a call per sequence), so inference keeps the padded
  layout.

:func:`self_attention` runs the projections and the attention for every token; :func:`row_attention` only
for some query rows (the rows-only last layer of pretraining), every token still a key and a value.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .dropout import dropout_mask, keyed_attention_dropout
from .linear import linear
from .layout import Layout, gather_rows


# A padded CPU batch runs attention one sequence at a time (no work on padding) when padding would make at
# least this fraction of the padded (B, T, T) score work, and its sequences reach SEQUENCE_ATTENTION_MIN_T
# tokens; below either the loop's per-sequence overhead outweighs the saving (short sequences, narrow models).
SEQUENCE_ATTENTION_WASTE = 0.1
SEQUENCE_ATTENTION_MIN_T = 64


def pick_kernel(device: torch.device, p: float, layout: Layout | None = None) -> str:
    """Which code computes attention: ``"seq"`` (on the CPU with dropout, a padded batch one sequence at a
    time over its real tokens, our maths), ``"own"`` (our maths on the padded layout, on the CPU with
    dropout, which SDPA's CPU kernels lack), ``"varlen"`` (SDPA over nested jagged tensors of each
    sequence's real tokens, where ``layout`` runs variable-length: CUDA), or ``"sdpa"`` (SDPA on the padded
    (B, T) layout with a key mask)."""
    cpu = device.type == "cpu"
    lengths = getattr(layout, "lengths", None)  # None while torch.compile traces
    if p > 0.0 and cpu:
        per_sequence = (
            lengths is not None and layout.T >= SEQUENCE_ATTENTION_MIN_T
            and 1.0 - sum(n * n for n in lengths) / (layout.B * layout.T**2) >= SEQUENCE_ATTENTION_WASTE)
        return "seq" if per_sequence else "own"
    if layout is not None and layout.offsets is not None:
        return "varlen"
    return "sdpa"


def attention_with_dropout(q, k, v, key_mask, p: float, keyed=None) -> torch.Tensor:
    """softmax(q k^T) with dropout ``p`` on the probabilities, times v: (B, nh, T, hs).  ``q`` comes already
    scaled by 1/sqrt(hs).  ``key_mask``: boolean (True: attend), or additive (added to the scores).  ``keyed`` =
    (keys, real queries, real keys per sequence) draws each sequence's mask from its own generator
    (:func:`~bertforge.ops.dropout.keyed_attention_dropout`)."""
    att = q @ k.transpose(-2, -1)  # (B, nh, Tq, Tk)
    if key_mask is not None and key_mask.dtype == torch.bool:
        att.masked_fill_(~key_mask, float("-inf"))
    elif key_mask is not None:
        att += key_mask
    att = att.softmax(-1)
    if p == 0.0:
        return att @ v
    if keyed is not None and keyed[0] is not None:
        return keyed_attention_dropout(att, p, *keyed) @ v
    return (att * dropout_mask(att.shape, p, att.device, att.dtype)) @ v


class _SequenceAttention(torch.autograd.Function):
    """Attention with dropout over each sequence's real rows, one sequence at a time, as one autograd node: the
    forward writes every sequence's output into one (N, C) tensor and the backward every gradient into one
    (N, 3C) tensor, where per-sequence autograd would add a node, a copy and an allocation per operation and
    sequence.  Keeps each sequence's probabilities and dropout mask for the backward (as autograd would)."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, lengths: list[int], n_head: int, p: float, gens):
        N, C = qkv.shape[0], qkv.shape[1] // 3
        hs = C // n_head
        y = qkv.new_empty(N, C)
        probs, masks, start = [], [], 0
        for b, n in enumerate(lengths):
            q, k, v = qkv[start : start + n].view(n, 3, n_head, hs).permute(1, 2, 0, 3)  # 3 x (nh, n, hs)
            att = (q @ k.transpose(1, 2)).softmax(-1)  # (nh, n, n); q comes pre-scaled
            mask = dropout_mask(att.shape, p, att.device, att.dtype, gens[b] if gens else None)
            y[start : start + n].view(n, n_head, hs).copy_((att * mask @ v).transpose(0, 1))  # (n, nh, hs)
            probs.append(att), masks.append(mask)
            start += n
        ctx.save_for_backward(qkv)
        ctx.probs, ctx.masks, ctx.lengths, ctx.n_head = probs, masks, lengths, n_head
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (qkv,) = ctx.saved_tensors
        dy = dy.contiguous()
        C = qkv.shape[1] // 3
        nh = ctx.n_head
        hs = C // nh
        dqkv = torch.empty_like(qkv)
        start = 0
        for n, att, mask in zip(ctx.lengths, ctx.probs, ctx.masks):
            q, k, v = qkv[start : start + n].view(n, 3, nh, hs).permute(1, 2, 0, 3)  # 3 x (nh, n, hs)
            dq, dk, dv = dqkv[start : start + n].view(n, 3, nh, hs).permute(1, 2, 0, 3)  # where their gradients go
            dyb = dy[start : start + n].view(n, nh, hs).transpose(0, 1)  # (nh, n, hs)
            dv.copy_((att * mask).transpose(1, 2) @ dyb)
            g = (dyb @ v.transpose(1, 2)).mul_(mask)  # (nh, n, n): the gradient of the probabilities
            ds = torch._softmax_backward_data(g, att, -1, att.dtype)  # of the scores
            dq.copy_(ds @ k)
            dk.copy_(ds.transpose(1, 2) @ q)
            start += n
        ctx.probs = ctx.masks = None
        return dqkv, None, None, None, None


def sequence_attention(qkv: torch.Tensor, lengths, n_head: int, p: float, keys=None) -> torch.Tensor:
    """Attention with dropout ``p`` over each sequence's real tokens alone, one sequence at a time: ``qkv``
    (N, 3C) holds the query (pre-scaled), key and value rows of the sequences' real tokens, ``lengths[b]``
    consecutive rows each; (N, C).  Each sequence's mask comes from its generator in ``keys`` (the masks
    :func:`~bertforge.ops.dropout.keyed_attention_dropout` draws), else from torch's generator."""
    gens = keys.generators() if keys is not None else None
    kept = [n for n in lengths if n]  # a sequence without real tokens has no rows (and, keyed, no mask)
    if gens is not None and len(kept) < len(lengths):
        gens = [g for g, n in zip(gens, lengths) if n]
    return _SequenceAttention.apply(qkv, kept, n_head, p, gens)


def attend(kernel: str, q, k, v, key_mask, p: float, keyed=None) -> torch.Tensor:
    """Attention of (B, nh, Tq, hs) queries over (B, nh, Tk, hs) keys and values (nested for ``"varlen"``)
    by ``kernel`` (:func:`pick_kernel`); for ``"own"``, ``q`` comes pre-scaled."""
    if kernel == "own":
        return attention_with_dropout(q, k, v, key_mask, p, keyed)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)


def _scaled_query(wq, bq, hs: int, own: bool):
    if not own:
        return wq, bq
    s = 1.0 / math.sqrt(hs)  # folded into the projection: no pass over the scores
    return wq * s, bq * s


def self_attention(x, q_proj, k_proj, v_proj, n_head: int, layout: Layout, p: float) -> torch.Tensor:
    """Attention output for every row of ``x``: (N, C) real tokens, or (B, T, C) without padding.

    ``*_proj`` are the (weight, bias) of the query, key and value projections, run as one matmul.
    """
    C = x.shape[-1]
    hs = C // n_head
    kernel = pick_kernel(x.device, p, layout)
    own = kernel in ("own", "seq")
    wq, bq = _scaled_query(*q_proj, hs, own)
    w = torch.cat([wq, k_proj[0], v_proj[0]])  # (3C, C)
    b = torch.cat([bq, k_proj[1], v_proj[1]])  # (3C,)
    if kernel == "seq":  # real tokens only, one sequence at a time
        return sequence_attention(linear(x, w, b), layout.lengths, n_head, p, layout.keys)  # (N, C)
    if kernel == "varlen":  # only real tokens, no (B, T) layout
        qkv = linear(x, w, b).view(-1, 3, n_head, hs)  # (N, 3, nh, hs)
        q, k, v = (layout.jagged(t.contiguous()) for t in qkv.unbind(1))  # nested (B, nh, j, hs)
        y = attend(kernel, q, k, v, None, p)  # nested (B, nh, j, hs)
        return y.transpose(1, 2).values().reshape(-1, C)  # (N, C)
    qkv = layout.pad(linear(x, w, b))  # (B, T, 3C)
    B, T = qkv.shape[:2]
    qkv = qkv.view(B, T, 3, n_head, hs).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
    q, k, v = qkv.contiguous() if own else qkv  # one copy, so that the batched matmuls need none
    y = attend(kernel, q, k, v, layout.attn_mask, p, (layout.keys, layout.counts, layout.counts))  # (B, nh, T, hs)
    return layout.unpad(y.transpose(1, 2).reshape(B, T, C))


def row_attention(x, x_rows, q_proj, k_proj, v_proj, n_head: int, selection: Layout, p: float) -> torch.Tensor:
    """Attention output (M, C) for the rows of ``selection`` (:meth:`Layout.select`: indices into the flat
    rows ``x`` (N, C); ``x_rows`` those rows) only: they are the only queries, every token is still a key and a
    value."""
    layout = selection.batch
    C = x.shape[-1]
    hs = C // n_head
    kernel = pick_kernel(x.device, p)  # queries in a (B, R) grid: never variable-length or per sequence
    own = kernel == "own"
    w = torch.cat([k_proj[0], v_proj[0]])  # (2C, C)
    b = torch.cat([k_proj[1], v_proj[1]])  # (2C,)
    kv = layout.pad(linear(x, w, b))  # (B, T, 2C)
    B, T = kv.shape[:2]
    kv = kv.view(B, T, 2, n_head, hs).permute(2, 0, 3, 1, 4)  # (2, B, nh, T, hs)
    k, v = kv.contiguous() if own else kv
    slots, R = query_slots(selection.rows, layout)  # queries grouped by sequence in a (B, R) grid
    q = linear(x_rows, *_scaled_query(*q_proj, hs, own))  # (M, C)
    q = q.new_zeros(B * R, C).index_copy(0, slots, q).view(B, R, n_head, hs).transpose(1, 2)  # (B, nh, R, hs)
    keyed = (layout.keys, selection.counts, layout.counts)  # sequence b's queries: its first slots
    y = attend(kernel, q.contiguous() if own else q, k, v, layout.attn_mask, p, keyed)  # (B, nh, R, hs)
    return gather_rows(y.transpose(1, 2).reshape(B * R, C), slots)  # (M, C)


def query_slots(rows: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, int]:
    """Where each of ``rows`` (indices of real tokens) goes in a (B, R) grid of queries grouped by sequence,
    R being the most rows any one sequence has: (M,) flat slots b * R + rank, and R."""
    pos = layout.positions_of(rows)  # (M,) flat positions in (B*T)
    b = torch.div(pos, layout.T, rounding_mode="floor")  # (M,) sequence of each row
    counts = torch.bincount(b, minlength=layout.B)  # (B,)
    R = max(int(counts.max()), 1) if len(counts) else 1
    order = torch.argsort(b, stable=True)
    starts = torch.cumsum(counts, 0) - counts  # (B,) first index of each sequence in sorted order
    rank = torch.empty_like(b)
    rank[order] = torch.arange(len(b), device=b.device) - starts[b[order]]
    return b * R + rank, R
