"""ops.dropout: 16-bit masks are inverted Bernoulli dropout with probability p."""

import torch

from bertforge.ops.dropout import dropout


def test_cpu_dropout_is_inverted_bernoulli_with_p():
    torch.manual_seed(0)
    x = torch.ones(1_000_000, requires_grad=True)
    y = dropout(x, 0.1, True)
    kept = y != 0
    assert abs(1 - float(kept.float().mean()) - 0.1) < 0.002
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept) and torch.allclose(x.grad[kept], torch.full_like(y[kept], 1 / 0.9))
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    torch.manual_seed(5)
    a = dropout(torch.ones(1000), 0.5, True)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(torch.ones(1000), 0.5, True))  # seeded by torch's generator
