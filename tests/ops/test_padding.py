"""No computation on padding: on a padded batch the attention and the feed-forward block of every encoder layer
see the real tokens only, counted where they compute (the attention kernels' entry points, the projections,
the feed-forward's first matmul).  The rows-only last layer of pretraining is the one exception: its few
queries sit in a (B, R) grid over the padded keys, and only [CLS] and the masked tokens reach its projections
and feed-forward block.  Unpadding is easy to lose without a test failing, since the padded path computes the
same values (a padded key mask reaching the kernel quietly turns the variable-length path off).

Here on the CPU: the variable-length path that CUDA takes (``VARLEN_DEVICES`` with "cpu"; nested SDPA) and the
CPU's per-sequence path (training with attention dropout); ``tests/train/test_cuda.py`` runs the same count on CUDA.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.bench import pretraining_batch
from bertforge.ops import attention as A
from bertforge.ops import layout as P
from bertforge.ops import rows as R


def ragged(batch: dict, lengths: list[int]) -> dict:
    """The batch right-padded after ``lengths`` real tokens (labels only at real tokens)."""
    T = batch["input_ids"].shape[1]
    keep = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return {**batch, "attention_mask": keep.long(), "input_ids": batch["input_ids"].masked_fill(~keep, 0),
            "token_type_ids": batch["token_type_ids"].masked_fill(~keep, 0),
            "labels": batch["labels"].masked_fill(~keep, -100)}


def _tokens(t: torch.Tensor) -> int:
    """Tokens in a (B, nh, T, hs) query or key tensor, nested (each sequence its own length) or padded."""
    if t.is_nested:
        return sum(x.shape[-2] for x in t.unbind())
    return t.shape[0] * t.shape[-2]


class TokenCounter:
    """What each encoder layer of ``model`` computes on, call by call: ``attention[i]`` the (kernel, queries, keys)
    of layer i's attention, ``projections[i]`` the rows of its Q/K/V projections, ``ffn[i]`` the rows of its
    feed-forward block.  The rows-only last layer's attention is recorded with the kernel "rows"."""

    def __init__(self, model, monkeypatch):
        layers = model.bert.encoder.layer
        self.attention = {i: [] for i in range(len(layers))}
        self.projections = {i: [] for i in range(len(layers))}
        self.ffn = {i: [] for i in range(len(layers))}
        self.layer = None  # the layer whose attention runs
        for i, layer in enumerate(layers):
            layer.intermediate.dense.register_forward_hook(
                lambda m, inp, out, i=i: self.ffn[i].append(inp[0].numel() // inp[0].shape[-1]))
            layer.attention.self.register_forward_pre_hook(lambda m, inp, i=i: setattr(self, "layer", i))
        last = len(layers) - 1
        attend, seq, linear, rows = A.attend, A.sequence_attention, A.linear, R.row_attention

        def counted_attend(kernel, q, k, v, *a, **kw):
            self.attention[self.layer].append((kernel, _tokens(q), _tokens(k)))
            return attend(kernel, q, k, v, *a, **kw)

        def counted_seq(qkv, lengths, *a, **kw):
            self.attention[self.layer].append(("seq", qkv.shape[0], qkv.shape[0]))
            return seq(qkv, lengths, *a, **kw)

        def counted_linear(x, w, b=None):
            self.projections[self.layer].append(x.numel() // x.shape[-1])
            return linear(x, w, b)

        def counted_rows(*a, **kw):
            self.layer = "rows"
            try:
                return rows(*a, **kw)
            finally:
                self.layer = last

        self.attention["rows"], self.projections["rows"] = [], []
        monkeypatch.setattr(A, "attend", counted_attend)
        monkeypatch.setattr(A, "sequence_attention", counted_seq)
        monkeypatch.setattr(A, "linear", counted_linear)
        monkeypatch.setattr(R, "row_attention", counted_rows)


def pretraining_step_counts(model, batch: dict, monkeypatch, autocast=None) -> tuple[TokenCounter, int, int]:
    """The training step's forward and backward on ``batch``, counted: (counter, real tokens, rows that reach the
    loss: the masked tokens)."""
    counter = TokenCounter(model, monkeypatch)
    b = {k: v.to(model.device) for k, v in batch.items()}
    with autocast or contextlib.nullcontext():
        mlm, nsp = R.pretraining_losses(model, b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"],
                                        b["next_sentence_label"])
    (mlm.float() + nsp.float()).backward()
    real = int(b["attention_mask"].sum())
    return counter, real, int((b["labels"] != -100).sum()) + len(b["labels"])  # masked tokens and [CLS]


def assert_real_tokens_only(counter: TokenCounter, real: int, selected: int, n_layers: int, kernel: str) -> None:
    """Every layer but the last: attention, projections and feed-forward over the ``real`` tokens alone; the
    rows-only last layer: projections over the real tokens (keys, values) and the ``selected`` rows (queries),
    the feed-forward over the selected rows; its query grid is not counted."""
    for i in range(n_layers - 1):
        assert counter.attention[i] == [(kernel, real, real)], i
        assert counter.projections[i] == [real] and counter.ffn[i] == [real], i
    assert len(counter.attention["rows"]) == 1  # its (B, R) query grid over the padded keys: not counted
    assert sorted(counter.projections["rows"]) == sorted([real, selected])
    assert counter.ffn[n_layers - 1] == [selected]


def _model(dropout: float = 0.0) -> BertForPreTraining:
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=dropout)
    return BertForPreTraining(cfg).train()


LENGTHS = [64, 40, 17, 50]  # B = 4, T = 64


@pytest.mark.parametrize("path", ["varlen", "seq"])
def test_pretraining_step_computes_on_real_tokens_only(monkeypatch, path):
    """The pretraining step on a padded batch: CUDA's variable-length attention (run on the CPU's nested
    kernels) and the CPU's per-sequence attention with dropout never compute on padding."""
    if path == "varlen":
        monkeypatch.setattr(P, "VARLEN_DEVICES", {"cpu", "cuda"})
    model = _model(dropout=0.1 if path == "seq" else 0.0)
    batch = ragged(pretraining_batch(4, 64, 300, mask_prob=0.3), LENGTHS)
    counter, real, selected = pretraining_step_counts(model, batch, monkeypatch)
    assert real == sum(LENGTHS) < 4 * 64
    assert_real_tokens_only(counter, real, selected, model.config.num_hidden_layers, path)


def test_forward_of_a_padded_batch_computes_on_real_tokens_only(monkeypatch):
    """The whole model's forward (fine-tuning, inference) on the variable-length path: every layer, the last
    included, on the real tokens alone."""
    monkeypatch.setattr(P, "VARLEN_DEVICES", {"cpu", "cuda"})
    model = _model().eval()
    b = ragged(pretraining_batch(4, 64, 300), LENGTHS)
    counter = TokenCounter(model, monkeypatch)
    with torch.no_grad():
        model.bert(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    for i in range(model.config.num_hidden_layers):
        assert counter.attention[i] == [("varlen", sum(LENGTHS), sum(LENGTHS))], i
        assert counter.projections[i] == [sum(LENGTHS)] and counter.ffn[i] == [sum(LENGTHS)], i


def test_the_count_sees_padding_where_attention_keeps_it(monkeypatch):
    """The counter is no tautology: the padded (B, T) attention layout (the CPU's without dropout) shows up as
    B x T queries and keys, while the token-wise layers still run on the real tokens."""
    model = _model()
    batch = ragged(pretraining_batch(4, 64, 300, mask_prob=0.3), LENGTHS)
    counter, real, _ = pretraining_step_counts(model, batch, monkeypatch)
    assert counter.attention[0] == [("sdpa", 4 * 64, 4 * 64)] and counter.ffn[0] == [real]
