"""ops.layout: unpadding and re-padding are exact inverses on real tokens, and the row gather's cheap
backward equals index_select's."""

import torch

from bertforge.ops.layout import Layout, gather_rows


def test_unpad_pad_round_trip_and_flat_rows():
    am = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    x = torch.randn(3, 4, 5)
    p = Layout(am, 3, 4)
    rows = p.unpad(x)  # (8, 5): the real tokens
    assert rows.shape == (8, 5) and torch.equal(rows, x[am.bool()])
    back = p.pad(rows)
    assert torch.equal(back[am.bool()], x[am.bool()]) and back[~am.bool()].abs().sum() == 0
    positions = torch.tensor([4, 0, 8])  # flat positions of real tokens
    r = p.rows_of(positions)
    assert torch.equal(p.positions_of(r), positions) and torch.equal(rows[r], x.reshape(12, 5)[positions])
    full = Layout(torch.ones(3, 4, dtype=torch.long), 3, 4)
    assert full.indices is None and full.unpad(x) is x
    flat = full.flat()  # a batch without padding as flat rows, for row selection
    assert flat.unpad(x).shape == (12, 5) and torch.equal(flat.pad(flat.unpad(x)), x)
    assert torch.equal(flat.rows_of(positions), positions)


def test_gather_rows_gradient_equals_index_select():
    torch.manual_seed(0)
    x = torch.randn(10, 3, requires_grad=True)
    rows = torch.tensor([7, 2, 9, 0])
    g = torch.randn(4, 3)
    gather_rows(x, rows).backward(g)
    ours = x.grad.clone()
    x.grad = None
    x.index_select(0, rows).backward(g)
    assert torch.equal(ours, x.grad)
    with torch.no_grad():
        assert torch.equal(gather_rows(x, rows), x[rows])
