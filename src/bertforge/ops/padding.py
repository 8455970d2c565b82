"""Where the real tokens of a padded batch are, so that token-wise layers run on real tokens only.

Departure (listed in :mod:`bertforge.model`): padding is removed before every token-wise computation
(projections, feed-forward, LayerNorm) and put back only for attention; on CUDA a padded batch's attention
runs variable-length over nested jagged tensors instead, and in CPU training with dropout one sequence at a
time over its real rows (see :mod:`bertforge.ops.attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Devices whose attention over a padded batch runs on the real tokens only (variable-length attention through
# nested jagged tensors: SDPA's flash / memory-efficient varlen kernels on CUDA).  On the CPU nested SDPA
# falls back to a per-sequence loop, slower than the masked (B, T) layout; the tests add "cpu" to check it.
VARLEN_DEVICES = {"cuda"}


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


class Padding:
    """Where the real tokens of a (B, T) batch are.

    ``indices`` is None when the batch has no padding (then everything stays (B, T, C)).
    ``attn_mask`` is the boolean (B, 1, 1, T) key mask for SDPA (True = attend), or None.
    ``offsets`` (B+1,) delimit each sequence's real tokens among the N rows when attention runs
    variable-length (see ``VARLEN_DEVICES``; every sequence needs a real token), else None.
    ``lengths`` lists each sequence's real tokens (consecutive among the N rows) on the CPU, else None.
    """

    def __init__(self, attention_mask: torch.Tensor | None, B: int, T: int, keys=None):
        self.B, self.T = B, T
        self.indices = None
        self.attn_mask = None
        self.offsets, self.max_len = None, T
        self.lengths = None  # on the CPU, with padding: each sequence's number of real tokens (list)
        self.keys, self.counts = keys, [T] * B  # dropout keys and each sequence's real tokens (with keys)
        if attention_mask is None:
            return
        keep = attention_mask.bool()  # (B, T)
        # Host syncs on CUDA (here and in nonzero); on the CPU they are free and save the padded FLOPs.
        if bool(keep.all()):
            return
        lengths = keep.sum(1)  # (B,) each sequence's real tokens, consecutive rows among the N (any padding side)
        if keys is not None:  # keyed masks are laid out per sequence: its real tokens must come first
            if not bool((keep == (torch.arange(T, device=keep.device) < lengths[:, None])).all()):
                raise ValueError("dropout keyed by sequence needs right-padded batches")
            self.counts = lengths.tolist()
        if keep.device.type == "cpu":
            self.lengths = self.counts if keys is not None else lengths.tolist()
        self.attn_mask = keep[:, None, None, :]  # (B, 1, 1, T)
        self.indices = keep.reshape(-1).nonzero().squeeze(1)  # (N,)
        if keep.device.type in VARLEN_DEVICES:
            shortest, longest = torch.stack(torch.aminmax(lengths)).tolist()
            if shortest > 0:
                self.offsets, self.max_len = F.pad(lengths.cumsum(0), (1, 0)), longest  # (B+1,)

    @classmethod
    def key_masked(cls, attention_mask: torch.Tensor | None, B: int, T: int) -> Padding:
        """The padded (B, T) layout with the key mask alone, padding left in: no data-dependent shapes and no
        host syncs, for code that ``torch.compile`` traces (outputs at pad positions are then computed)."""
        padding = cls(None, B, T)
        if attention_mask is not None:
            padding.attn_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        return padding

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

    def flat(self) -> Padding:
        """The same batch with its rows always flat, (N, C) or (B*T, C) without padding, so that single rows
        can be selected (the rows-only last layer); its ``unpad``/``pad`` map (B, T, C) <-> flat rows."""
        return self if self.indices is not None else _FlatPadding(self)

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat positions (indices into the B*T tokens, all real) -> their rows among the flat rows."""
        if self.indices is None:
            return positions
        lookup = torch.full((self.B * self.T,), -1, dtype=torch.long, device=positions.device)
        lookup[self.indices] = torch.arange(len(self.indices), device=positions.device)
        return lookup[positions]

    def positions_of(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows among the flat rows -> flat positions in the (B*T) batch."""
        return rows if self.indices is None else self.indices[rows]

    def select(self, rows: torch.Tensor) -> RowSelection:
        """The layout of ``rows`` (sorted indices among the flat rows), for keyed dropout over them."""
        if self.keys is None:
            return RowSelection(None, [])
        seq = torch.div(self.positions_of(rows), self.T, rounding_mode="floor")
        return RowSelection(self.keys, torch.bincount(seq, minlength=self.B).tolist())


class RowSelection:
    """Rows of some sequences (``counts[b]`` consecutive rows of sequence b), with the batch's dropout keys."""

    def __init__(self, keys, counts: list[int]):
        self.keys, self.counts = keys, counts


class _FlatPadding(Padding):
    """A batch without padding, carried as (B*T, C) rows so that rows can be selected in the last layer."""

    def __init__(self, base: Padding):
        super().__init__(None, base.B, base.T)
        self.attn_mask, self.keys, self.counts = base.attn_mask, base.keys, base.counts

    def unpad(self, x):  # (B, T, C) -> (B*T, C)
        return x.reshape(self.B * self.T, -1)

    def pad(self, x):  # (B*T, C) -> (B, T, C)
        return x.view(self.B, self.T, -1)
