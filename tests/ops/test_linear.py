"""ops.linear: the oneDNN projection equals F.linear, values and gradients."""

import pytest
import torch

from bertforge.ops.linear import DNN_MIN_ROWS, dnn_linear_op, linear


@pytest.mark.parametrize("shape", [(7, 19, 33), (1200, 64, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_torch(shape, bias):
    """``linear`` (oneDNN above 1024 rows on the CPU) gives F.linear's values and gradients."""
    N, Cin, Cout = shape
    if N >= DNN_MIN_ROWS and torch.backends.mkldnn.is_available():
        assert dnn_linear_op() is not None  # the fast path is really taken here
    torch.manual_seed(0)
    x = torch.randn(N // 3, 3, Cin, requires_grad=True)  # 3-D input, as the padded layers pass
    w = torch.randn(Cout, Cin, requires_grad=True)
    b = torch.randn(Cout, requires_grad=True) if bias else None
    ours = linear(x, w, b)
    g = torch.randn(Cout, N // 3 * 3).t().reshape(N // 3, 3, Cout)  # a non-contiguous incoming gradient
    ours.backward(g)
    got = [t.grad.clone() for t in (x, w, b) if t is not None]
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    ref = torch.nn.functional.linear(x, w, b)
    ref.backward(g)
    assert ours.shape == ref.shape and torch.allclose(ours, ref, rtol=1e-5, atol=1e-4)
    for a, t in zip(got, [t for t in (x, w, b) if t is not None]):
        assert torch.allclose(a, t.grad, rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(linear(x, w, b), ref, rtol=1e-5, atol=1e-4)


def test_bf16_products_take_mkl_where_onednn_has_no_bf16_kernel(monkeypatch):
    """On a CPU without AVX-512 oneDNN refuses bf16 inputs ("could not create a primitive descriptor"):
    ``dnn_matmul_t`` then multiplies through ``F.linear``, and gives its values wherever it runs."""
    from bertforge.ops import linear as lin

    x, w = torch.randn(40, 16, dtype=torch.bfloat16), torch.randn(24, 16, dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x, w)
    assert torch.allclose(lin.dnn_matmul_t(x, w).float(), ref.float(), rtol=1e-2, atol=1e-2)

    def refuses(*a):
        raise RuntimeError("could not create a primitive descriptor")

    monkeypatch.setattr(lin, "dnn_linear_op", lambda: refuses)
    monkeypatch.setattr(lin, "dnn_bf16", lambda: False)
    assert torch.equal(lin.dnn_matmul_t(x, w), ref)
    with pytest.raises(RuntimeError):  # fp32 still takes oneDNN
        lin.dnn_matmul_t(x.float(), w.float())
