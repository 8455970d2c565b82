"""ops.attention: our CPU maths with dropout, the variable-length path and the row queries each equal
the plain SDPA computation."""

import pytest
import torch

from bertforge import BertConfig, BertModel
from bertforge.ops import layout as P
from bertforge.ops.attention import attention_with_dropout, query_slots
from bertforge.ops.layout import Layout

from ..helpers import padded_batch


def test_attention_math_equals_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 6:] = False
    ours = attention_with_dropout(q / 8**0.5, k, v, mask, 0.0)  # the caller folds the scale into q
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours - ref).abs().max() < 1e-5


def test_cpu_training_attention_path_equals_sdpa_path():
    """The CPU training path (scale folded into the query weights, our softmax and dropout maths) computes
    the same layer as SDPA: with a drop probability that rounds to zero, train mode equals eval mode."""
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, attention_probs_dropout_prob=1e-9, hidden_dropout_prob=0.0)
    m = BertModel(cfg)
    ids, am, tt = padded_batch(300)
    with torch.no_grad():
        train = m.train()(ids, am, tt).last_hidden_state
        ref = m.eval()(ids, am, tt).last_hidden_state
    real = am.bool()
    assert (train[real] - ref[real]).abs().max() < 1e-5


def test_query_slots_group_rows_by_sequence():
    am = torch.ones(3, 5, dtype=torch.long)
    am[1, 3:] = 0
    layout = Layout(am, 3, 5)  # real tokens: 5 + 3 + 5 = 13 rows
    rows = torch.tensor([9, 0, 4, 8, 1])  # flat positions 11, 0, 4, 10, 1: sequences 2, 0, 0, 2, 0
    slots, R = query_slots(rows, layout)
    assert R == 3 and slots.tolist() == [2 * 3 + 0, 0, 1, 2 * 3 + 1, 2]


@pytest.mark.parametrize("train", [False, True])
def test_varlen_attention_equals_padded_attention(monkeypatch, train):
    """CUDA's variable-length attention (nested jagged tensors over each sequence's real tokens, no padded
    (B, T) layout), run here on the CPU's nested math backend, gives the padded path's hidden states and
    gradients, padding at either end."""
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertModel(cfg).train(train)
    ids, am, tt = padded_batch(300)
    am[3] = am[3].flip(0)  # left padding too

    from bertforge.ops import attention as A

    monkeypatch.setattr(A, "SEQUENCE_ATTENTION_WASTE", 2.0)  # the padded layout, not the CPU's per-sequence loop

    def run(varlen: bool):
        monkeypatch.setattr(P, "VARLEN_DEVICES", {"cpu", "cuda"} if varlen else {"cuda"})
        assert A.pick_kernel(ids.device, 0.0, Layout(am, *am.shape)) == ("varlen" if varlen else "sdpa")
        m.zero_grad()
        out = m(ids, am, tt)
        h = out.last_hidden_state[am.bool()]  # (N, C) real tokens
        (h.square().sum() + out.pooler_output.sum()).backward()
        return h.detach(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}

    (h_var, g_var), (h_pad, g_pad) = run(True), run(False)
    assert (h_var - h_pad).abs().max() < 1e-5
    assert g_var.keys() == g_pad.keys()
    for k in g_pad:
        assert (g_var[k] - g_pad[k]).abs().max() < 1e-4, k


def test_sequence_attention_equals_padded_attention(monkeypatch):
    """In CPU training with dropout a padded batch's attention runs one sequence at a time over its real
    tokens: the same hidden states and gradients as the padded (B, T) layout, with the same keyed dropout
    masks.  Without dropout the batched SDPA kernel runs, whatever the padding."""
    from bertforge.ops import attention as A
    from bertforge.ops.dropout import DropoutKeys

    p = 0.1
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=p)
    m = BertModel(cfg).train()
    ids, am, tt = padded_batch(300)
    cpu = ids.device
    # the defaults: short sequences keep the padded layout, long padded ones run per sequence, full ones padded
    long_am = torch.ones(4, 128, dtype=torch.long)
    long_am[1:, 80:] = 0
    assert A.pick_kernel(cpu, p, Layout(am, *am.shape)) == "own"
    assert A.pick_kernel(cpu, p, Layout(long_am, 4, 128)) == "seq"
    assert A.pick_kernel(cpu, p, Layout(torch.ones(4, 128, dtype=torch.long), 4, 128)) == "own"
    monkeypatch.setattr(A, "SEQUENCE_ATTENTION_MIN_T", 0)
    monkeypatch.setattr(A, "SEQUENCE_ATTENTION_WASTE", 0.0)
    assert A.pick_kernel(cpu, 0.0, Layout(am, *am.shape)) == "sdpa"

    def run(waste: float, expect: str):
        monkeypatch.setattr(A, "SEQUENCE_ATTENTION_WASTE", waste)
        keys = DropoutKeys(3, 7, [10, 11, 12, 13])
        assert A.pick_kernel(ids.device, p, Layout(am, *am.shape, keys)) == expect
        m.zero_grad()
        out = m(ids, am, tt, dropout_keys=keys)
        h = out.last_hidden_state[am.bool()]  # (N, C) real tokens
        (h.square().sum() + out.pooler_output.sum()).backward()
        return h.detach(), {k: q.grad.clone() for k, q in m.named_parameters() if q.grad is not None}

    (h_seq, g_seq), (h_pad, g_pad) = run(0.0, "seq"), run(2.0, "own")
    assert (h_seq - h_pad).abs().max() < 1e-5
    assert g_seq.keys() == g_pad.keys()
    for k in g_pad:
        assert (g_seq[k] - g_pad[k]).abs().max() < 1e-4, k
    monkeypatch.setattr(A, "SEQUENCE_ATTENTION_WASTE", 0.0)  # the masks are the keyed ones: other keys, other states
    other = m(ids, am, tt, dropout_keys=DropoutKeys(4, 7, [10, 11, 12, 13])).last_hidden_state[am.bool()]
    assert (other - h_seq).abs().max() > 1e-3
