"""The layout of a batch: where its real tokens are, and whose dropout masks they take.

Departure (listed in :mod:`bertforge.models.bert`): padding is removed before every token-wise computation
(projections, feed-forward, LayerNorm) and put back only for attention (whose kernels, some of them over the
real tokens only, are :mod:`bertforge.ops.attention`'s).

Every module of the encoder takes one :class:`Layout`: the padding (or none), the dropout keys of the
batch's sequences (:class:`~bertforge.ops.dropout.DropoutKeys`), and for a selection of rows (the rows-only
last layer, the pooled [CLS] states) those rows and how many belong to each sequence.

``--compile``: :func:`tracing` is the one place that asks whether ``torch.compile`` is tracing.  A layout
built while it traces has no dropout keys and no per-sequence lengths (the keyed masks and the per-sequence
attention loop over Python lists), and the custom autograd kernels of :mod:`bertforge.ops` give way to their
plain torch form, which it can trace.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

# Devices whose attention over a padded batch runs on the real tokens only (variable-length attention through
# nested jagged tensors: SDPA's flash / memory-efficient varlen kernels on CUDA).  On the CPU nested SDPA
# falls back to a per-sequence loop, slower than the masked (B, T) layout; the tests add "cpu" to check it.
VARLEN_DEVICES = {"cuda"}


_exporting = False


@contextlib.contextmanager
def exporting():
    """While a model is traced for export (``bertforge export onnx``): :func:`tracing` says so, whichever tracer
    runs (``torch.export`` in non-strict mode is not ``torch.compile``)."""
    global _exporting
    was, _exporting = _exporting, True
    try:
        yield
    finally:
        _exporting = was


def in_export() -> bool:
    """Whether an export traces the code that runs (:func:`exporting`): a graph for any batch and length."""
    return _exporting


def tracing() -> bool:
    """Whether ``torch.compile`` (``--compile``) or an export (:func:`exporting`) is tracing the code that runs:
    then no data-dependent shapes, no Python lists of per-sequence values and no custom autograd kernels."""
    return _exporting or torch.compiler.is_compiling()


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
    if torch.is_grad_enabled() and x.requires_grad and not tracing():
        return _GatherRows.apply(x, rows)
    return x.index_select(0, rows)


class Layout:
    """Where the real tokens of a (B, T) batch are, and the keys of their dropout masks.

    ``indices`` is None when the batch has no padding (then everything stays (B, T, C)).
    ``attn_mask`` is the boolean (B, 1, 1, T) key mask for SDPA (True = attend), or None.
    ``offsets`` (B+1,) delimit each sequence's real tokens among the N rows when attention runs
    variable-length (see ``VARLEN_DEVICES``; every sequence needs a real token), else None.
    ``lengths`` lists each sequence's real tokens (consecutive among the N rows) on the CPU, else None.
    ``keys`` are the dropout keys (None: torch's generator); ``counts[b]`` the rows of sequence b in the
    tensors this layout describes (consecutive; used with keys).  A selection of rows (:meth:`select`) also
    has ``rows`` (indices among the batch's flat rows) and ``batch``, the layout of the whole batch.
    """

    rows: torch.Tensor | None = None
    batch: Layout | None = None

    def __init__(self, attention_mask: torch.Tensor | None, B: int, T: int, keys=None):
        self.B, self.T = B, T
        self.indices = None
        self.attn_mask = None
        self.offsets, self.max_len = None, T
        self.lengths = None  # on the CPU, with padding: each sequence's number of real tokens (list)
        traced = tracing()
        # (a Python list of B would fix a traced batch size)
        self.keys, self.counts = (None, []) if traced else (keys, [T] * B)
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
        if self.keys is not None:
            self.counts = lengths.tolist()
        if keep.device.type == "cpu" and not traced:
            self.lengths = self.counts if self.keys is not None else lengths.tolist()
        self.attn_mask = keep[:, None, None, :]  # (B, 1, 1, T)
        self.indices = keep.reshape(-1).nonzero().squeeze(1)  # (N,)
        if keep.device.type in VARLEN_DEVICES:
            shortest, longest = torch.stack(torch.aminmax(lengths)).tolist()
            if shortest > 0:
                self.offsets, self.max_len = F.pad(lengths.cumsum(0), (1, 0)), longest  # (B+1,)

    @classmethod
    def key_masked(cls, attention_mask: torch.Tensor | None, B: int, T: int) -> Layout:
        """The padded (B, T) layout with the key mask alone, padding left in: no data-dependent shapes and no
        host syncs, for code that ``torch.compile`` traces (outputs at pad positions are then computed)."""
        layout = cls(None, B, T)
        if attention_mask is not None:
            layout.attn_mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
            if in_export():  # ONNX's Attention operator takes a mask per query, not broadcast over the queries
                layout.attn_mask = layout.attn_mask.expand(B, 1, T, T)
        return layout

    @classmethod
    def one_row_each(cls, keys, B: int) -> Layout:
        """B rows, one of each sequence (the pooled [CLS] states), with the batch's dropout keys."""
        return cls(None, B, 1, keys)

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

    def flat(self) -> Layout:
        """The same batch with its rows always flat, (N, C) or (B*T, C) without padding, so that single rows
        can be selected (the rows-only last layer); its ``unpad``/``pad`` map (B, T, C) <-> flat rows."""
        return self if self.indices is not None else _FlatLayout(self)

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

    def select(self, rows: torch.Tensor) -> Layout:
        """The layout of ``rows`` (sorted indices among the flat rows): ``counts`` (with keys, for keyed
        dropout over them) of each sequence's rows among them."""
        selection = Layout(None, self.B, self.T, self.keys)
        selection.rows, selection.batch, selection.counts = rows, self, []
        if self.keys is not None:
            seq = torch.div(self.positions_of(rows), self.T, rounding_mode="floor")
            selection.counts = torch.bincount(seq, minlength=self.B).tolist()
        return selection


class _FlatLayout(Layout):
    """A batch without padding, carried as (B*T, C) rows so that rows can be selected in the last layer."""

    def __init__(self, base: Layout):
        super().__init__(None, base.B, base.T)
        self.attn_mask, self.keys, self.counts = base.attn_mask, base.keys, base.counts

    def unpad(self, x):  # (B, T, C) -> (B*T, C)
        return x.reshape(self.B * self.T, -1)

    def pad(self, x):  # (B*T, C) -> (B, T, C)
        return x.view(self.B, self.T, -1)
