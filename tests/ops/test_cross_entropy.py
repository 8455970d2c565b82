"""ops.cross_entropy: the fused vocabulary projection + cross-entropy equals torch's, and its reused
buffer is never shared."""

import torch

from bertforge.ops.cross_entropy import LogitBuffer, head_buffer, linear_cross_entropy_sum


def test_fused_linear_cross_entropy_equals_torch():
    torch.manual_seed(0)
    h = torch.randn(37, 16, requires_grad=True)
    W = torch.randn(300, 16, requires_grad=True)
    b = torch.randn(300, requires_grad=True)
    y = torch.randint(0, 300, (37,))
    fused = linear_cross_entropy_sum(h, W, b, y)
    (fused * 0.7).backward()
    grads = [t.grad.clone() for t in (h, W, b)]
    for t in (h, W, b):
        t.grad = None
    ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, W, b), y, reduction="sum")
    (ref * 0.7).backward()
    assert abs(float(fused.detach()) - float(ref.detach())) < 1e-4 * float(ref.detach())
    for g, t in zip(grads, (h, W, b)):
        assert (g - t.grad).abs().max() < 1e-5


def test_fused_linear_cross_entropy_reused_buffer_is_safe():
    """The logit buffer kept between steps is never shared by two forward passes awaiting backward
    (gradient accumulation written as one graph), and is reused once released, with correct gradients."""
    torch.manual_seed(1)
    W = torch.randn(300, 16, requires_grad=True)
    b = torch.randn(300, requires_grad=True)
    hs = [torch.randn(n, 16) for n in (37, 40, 29)]
    ys = [torch.randint(0, 300, (len(h),)) for h in hs]
    buf = LogitBuffer()

    def grads(fn, pairs):
        W.grad = b.grad = None
        sum(fn(h, W, b, y) for h, y in pairs).backward()
        return W.grad.clone(), b.grad.clone()

    fused = lambda h, W, b, y: linear_cross_entropy_sum(h, W, b, y, buf)
    ref = lambda h, W, b, y: torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, W, b), y, reduction="sum")
    for pairs in (list(zip(hs[:2], ys[:2])), list(zip(hs[2:], ys[2:])), list(zip(hs, ys))):
        for g, r in zip(grads(fused, pairs), grads(ref, pairs)):
            assert (g - r).abs().max() < 1e-4
    # the memory really is reused from one step to the next
    first = buf._buf.data_ptr()
    grads(fused, list(zip(hs[2:], ys[2:])))
    assert buf._buf.data_ptr() == first
    # a graph dropped without backward (an exception mid-step) frees the buffer for the next step
    dropped = linear_cross_entropy_sum(hs[0], W, b, ys[0], buf)
    assert buf._holder() is not None
    del dropped
    assert buf._holder() is None


def test_each_head_owns_its_buffer():
    """Two models never share logit memory: the buffer belongs to the masked-LM head, and a copied model
    gets its own."""
    import copy

    from bertforge import BertConfig, BertForMaskedLM

    a = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=100))
    b = copy.deepcopy(a)
    assert head_buffer(a.cls.predictions) is not head_buffer(b.cls.predictions)
    assert head_buffer(a.cls.predictions) is head_buffer(a.cls.predictions)


def test_a_model_with_a_held_buffer_still_pickles_without_it():
    import pickle

    buf = LogitBuffer()
    W, b = torch.randn(50, 8, requires_grad=True), torch.zeros(50, requires_grad=True)
    held = linear_cross_entropy_sum(torch.randn(6, 8), W, b, torch.randint(0, 50, (6,)), buf)  # awaiting backward
    copy = pickle.loads(pickle.dumps(buf))
    assert copy._buf is None and copy._holder is None and buf._holder() is not None
    del held


def test_no_buffer_while_compiling():
    """Under ``torch.compile`` a head has no buffer (the fused loss is not traced): a guard on the weak
    dictionary's entries broke a compiled step once the collector dropped an entry."""
    head = torch.nn.Linear(2, 2)
    assert head_buffer(head) is not None

    def has(x):
        return x + (0 if head_buffer(head) is None else 1)

    assert torch.equal(torch.compile(has, backend="eager")(torch.zeros(1)), torch.zeros(1))
