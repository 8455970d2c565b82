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


def test_keyed_masks_depend_on_the_sequence_not_on_its_batch():
    """A sequence's masks are the same whether it shares its micro-batch with others or not, differ between
    sequences, steps and sites, and keep the inverted-dropout statistics."""
    from bertforge.ops.dropout import DropoutKeys, keyed_attention_dropout, keyed_dropout

    x = torch.ones(5 + 3 + 4, 64)
    both = keyed_dropout(x, 0.25, DropoutKeys(0, 7, [10, 11, 12]), [5, 3, 4])
    alone = keyed_dropout(torch.ones(3, 64), 0.25, DropoutKeys(0, 7, [11]), [3])
    assert torch.equal(both[5:8], alone)
    assert not torch.equal(both[:3], both[5:8]) and not torch.equal(
        keyed_dropout(torch.ones(3, 64), 0.25, DropoutKeys(0, 8, [11]), [3]), alone)
    k = DropoutKeys(0, 7, [11])
    first, second = keyed_dropout(torch.ones(3, 64), 0.25, k, [3]), keyed_dropout(torch.ones(3, 64), 0.25, k, [3])
    assert not torch.equal(first, second)  # the next site draws anew
    big = keyed_dropout(torch.ones(2000, 500), 0.25, DropoutKeys(1, 1, [0]), [2000])
    assert abs(float((big == 0).float().mean()) - 0.25) < 0.01 and torch.allclose(big[big != 0], torch.tensor(1 / 0.75))
    att = torch.full((2, 4, 6, 6), 0.5)  # sequence 0: 6 real tokens, sequence 1: 4
    m2 = keyed_attention_dropout(att, 0.5, DropoutKeys(0, 3, [4, 9]), [6, 4], [6, 4])
    m1 = keyed_attention_dropout(att[1:, :, :4, :4], 0.5, DropoutKeys(0, 3, [9]), [4], [4])
    assert torch.equal(m2[1, :, :4, :4], m1[0]) and float(m2[1, :, 4:].abs().sum()) == 0
    assert float(m2[1, :, :4, 4:].abs().sum()) == 0  # padded keys: zero, whatever the probabilities hold there


def test_keyed_masks_are_dropout_masks_from_each_sequences_generator():
    """The keyed masks, written in place into one tensor, hold exactly the numbers :func:`dropout_mask` draws
    from each sequence's generator (the definition the batch-independence rests on)."""
    from bertforge.ops.dropout import DropoutKeys, dropout_mask, keyed_attention_dropout, keyed_dropout

    keys = DropoutKeys(3, 5, [7, 8])
    gens = DropoutKeys(3, 5, [7, 8]).generators()
    rows = keyed_dropout(torch.ones(4 + 6, 10), 0.1, keys, [4, 6])
    assert torch.equal(rows[:4], dropout_mask((4, 10), 0.1, "cpu", generator=gens[0]))
    assert torch.equal(rows[4:], dropout_mask((6, 10), 0.1, "cpu", generator=gens[1]))
    gens = DropoutKeys(3, 5, [7, 8]).generators()
    att = keyed_attention_dropout(torch.ones(2, 3, 5, 5), 0.1, DropoutKeys(3, 5, [7, 8]), [5, 2], [5, 3])
    assert torch.equal(att[0], dropout_mask((3, 5, 5), 0.1, "cpu", generator=gens[0]))
    assert torch.equal(att[1, :, :2, :3], dropout_mask((3, 2, 3), 0.1, "cpu", generator=gens[1]))
