"""The model: parity with transformers both ways, heads, sparse MLM, unpadding, learning."""

import pytest
import torch

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.ops.rows import hidden_at, pretraining_losses

from ..helpers import padded_batch as _batch

transformers = pytest.importorskip("transformers")


def test_parity_with_real_minilm_checkpoint(minilm_dir, sst2_sentences):
    ours = BertModel.from_pretrained(minilm_dir).eval()
    assert ours.loading_info == {"newly_initialized": [], "unused": []}
    theirs = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="sdpa").eval()
    tok = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    sentences = sst2_sentences[:32]
    enc = tok(sentences, padding=True, return_tensors="pt")
    assert len(set(enc["attention_mask"].sum(1).tolist())) > 10  # really different lengths
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = theirs(**enc)
    real = enc["attention_mask"].bool()
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() < 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max() < 1e-5


@pytest.mark.parametrize(
    "ours_cls,theirs_name,extra",
    [
        (BertForPreTraining, "BertForPreTraining", {}),
        (BertForMaskedLM, "BertForMaskedLM", {}),
        (BertForSequenceClassification, "BertForSequenceClassification", {"id2label": {0: "a", 1: "b", 2: "c"}}),
        (BertForQuestionAnswering, "BertForQuestionAnswering", {}),
    ],
)
def test_saved_models_load_in_transformers(tmp_path, ours_cls, theirs_name, extra):
    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=500, **extra)
    ours = ours_cls(cfg).eval()
    ours.save_pretrained(tmp_path / "m")
    theirs = getattr(transformers, theirs_name).from_pretrained(tmp_path / "m").eval()
    ids, am, tt = _batch(500)
    with torch.no_grad():
        a = ours(ids, am, tt)
        b = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt)
    real = am.bool()
    if theirs_name == "BertForPreTraining":
        assert (a.prediction_logits[real] - b.prediction_logits[real]).abs().max() < 1e-5
        assert (a.seq_relationship_logits - b.seq_relationship_logits).abs().max() < 1e-5
    elif theirs_name == "BertForMaskedLM":
        assert (a.logits[real] - b.logits[real]).abs().max() < 1e-5
    elif theirs_name == "BertForSequenceClassification":
        assert a.logits.shape == (4, 3)
        assert (a.logits - b.logits).abs().max() < 1e-5
    else:
        assert (a.start_logits[real] - b.start_logits[real]).abs().max() < 1e-5
        assert (a.end_logits[real] - b.end_logits[real]).abs().max() < 1e-5
    # transformers saves, we load: the same weights again
    theirs.save_pretrained(tmp_path / "t")
    again = ours_cls.from_pretrained(tmp_path / "t")
    assert again.loading_info["newly_initialized"] == []
    for k, v in ours.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k


def test_parameter_names_are_transformers_names():
    m = BertForPreTraining(BertConfig.preset("tiny", vocab_size=100))
    t = transformers.BertForPreTraining(transformers.BertConfig(**BertConfig.preset("tiny", vocab_size=100).to_dict()))
    ours = set(m.state_dict()) - {"cls.predictions.decoder.weight"}
    theirs = set(t.state_dict()) - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert ours == theirs
    assert m.cls.predictions.decoder.weight is m.bert.embeddings.word_embeddings.weight  # tied


def test_head_shapes_and_losses():
    cfg = BertConfig.preset("tiny", vocab_size=300, id2label={0: "x", 1: "y"})
    ids, am, tt = _batch(300)
    B, T = ids.shape
    out = BertModel(cfg)(ids, am, tt)
    assert out.last_hidden_state.shape == (B, T, 128) and out.pooler_output.shape == (B, 128)
    pt = BertForPreTraining(cfg)(ids, am, tt)
    assert pt.prediction_logits.shape == (B, T, 300) and pt.seq_relationship_logits.shape == (B, 2) and pt.loss is None
    labels = torch.full((B, T), -100)
    labels[:, 3] = ids[:, 3]
    pt = BertForPreTraining(cfg)(ids, am, tt, labels=labels, next_sentence_label=torch.tensor([0, 1, 0, 1]))
    assert pt.prediction_logits.shape == (B, 300)  # sparse: labelled rows only
    assert torch.isclose(pt.loss, pt.mlm_loss + pt.nsp_loss)
    cls = BertForSequenceClassification(cfg)(ids, am, tt, labels=torch.tensor([0, 1, 1, 0]))
    assert cls.logits.shape == (B, 2) and cls.loss.ndim == 0
    qa = BertForQuestionAnswering(cfg)(ids, am, tt, start_positions=torch.tensor([1, 2, 3, 99]), end_positions=torch.tensor([2, 2, 5, 99]))
    assert qa.start_logits.shape == (B, T) and torch.isfinite(qa.loss)  # out-of-range positions are ignored


def test_sparse_and_dense_mlm_agree():
    torch.manual_seed(1)
    cfg = BertConfig.preset("tiny", vocab_size=400)
    m = BertForPreTraining(cfg).eval()
    ids, am, tt = _batch(400, seed=3)
    g = torch.Generator().manual_seed(0)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.15) & am.bool(), ids, torch.full_like(ids, -100))
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        sparse = m(ids, am, tt, labels=labels, next_sentence_label=nsp)
        dense = m(ids, am, tt, labels=labels, next_sentence_label=nsp, dense_logits=True)
    assert abs(float(sparse.loss - dense.loss)) < 1e-5
    sel = labels != -100
    assert (sparse.prediction_logits - dense.prediction_logits[sel]).abs().max() < 1e-5


def test_unpadded_path_equals_padded_path():
    """Removing padding before the token-wise layers changes nothing at real positions."""
    torch.manual_seed(2)
    m = BertModel(BertConfig.preset("tiny", vocab_size=300)).eval()
    ids, am, tt = _batch(300)
    with torch.no_grad():
        fast = m(ids, am, tt).last_hidden_state
        # one sequence at a time, no padding at all: the plain path
        for i in range(ids.shape[0]):
            n = int(am[i].sum())
            plain = m(ids[i : i + 1, :n], None, tt[i : i + 1, :n]).last_hidden_state[0]
            assert (fast[i, :n] - plain).abs().max() < 1e-5
        assert torch.all(fast[~am.bool()] == 0)


def test_tiny_model_overfits_one_batch():
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=200, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertForPreTraining(cfg)
    ids, am, tt = _batch(200, B=4, T=16)
    g = torch.Generator().manual_seed(0)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & am.bool(), ids, torch.full_like(ids, -100))
    nsp = torch.tensor([0, 1, 1, 0])
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3)
    first = None
    for _ in range(300):
        loss = m(ids, am, tt, labels=labels, next_sentence_label=nsp).loss
        first = first or float(loss.detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < first / 10


def test_gelu_variants():
    x = torch.linspace(-4, 4, 101)
    from bertforge.models.bert import ACT2FN

    exact = 0.5 * x * (1 + torch.erf(x / 2**0.5))
    assert torch.allclose(ACT2FN["gelu"](x), exact, atol=1e-6)
    tanh = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    assert torch.allclose(ACT2FN["gelu_new"](x), tanh, atol=1e-6)
    assert not torch.allclose(ACT2FN["gelu"](x), tanh, atol=1e-6)


# ------------------------------------------------------------------------------------------------ fast paths
@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("large", [False, True])
def test_pretraining_loss_fast_path_equals_plain_forward(cls, padded, large):
    """The engine's objective (rows-only last layer, fused vocabulary loss) = forward() with labels; the
    large batch (1,200+ tokens) takes the CPU's oneDNN projections too."""
    torch.manual_seed(0)
    m = cls(BertConfig.preset("tiny", vocab_size=500)).eval()  # eval: no dropout, so both paths are deterministic
    ids, am, tt = _batch(500, seed=4)
    if large:
        ids, am, tt = (t.repeat(16, 3) for t in (ids, am, tt))  # (64, 72)
    if not padded:
        am = None
    g = torch.Generator().manual_seed(1)
    real = torch.ones_like(ids, dtype=torch.bool) if am is None else am.bool()
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & real, ids, torch.full_like(ids, -100))
    nsp = torch.tensor([0, 1, 1, 0]).repeat(len(ids) // 4) if cls is BertForPreTraining else None
    n = int((labels != -100).sum())
    kw = {"next_sentence_label": nsp} if nsp is not None else {}
    fast_mlm, fast_nsp = pretraining_losses(m, ids, am, tt, labels, nsp)
    (fast_mlm / n + (fast_nsp / len(nsp) if nsp is not None else 0)).backward()
    fast_grads = {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    plain = m(ids, am, tt, labels=labels, **kw)
    plain.loss.backward()
    plain_mlm = plain.mlm_loss if nsp is not None else plain.loss
    assert abs(float(fast_mlm.detach()) / n - float(plain_mlm.detach())) < 1e-5
    if nsp is not None:
        assert abs(float(fast_nsp.detach()) / len(nsp) - float(plain.nsp_loss.detach())) < 1e-5
    for k, p in m.named_parameters():
        if p.grad is not None:
            assert (fast_grads[k] - p.grad).abs().max() < 1e-5, k


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("padded", [True, False])
def test_hidden_at_equals_forward_rows(train, padded):
    """The rows-only last layer (queries, output projection and feed-forward only at the given rows) equals
    the full forward at those rows: in eval mode (SDPA) and on the CPU training path (our attention maths,
    with a drop probability that rounds to zero); rows in any order, several or none per sequence."""
    torch.manual_seed(3)
    cfg = BertConfig.preset("tiny", vocab_size=300, attention_probs_dropout_prob=1e-9, hidden_dropout_prob=0.0)
    m = BertModel(cfg)
    ids, am, tt = _batch(300)
    if not padded:
        am = None
    pos = torch.tensor([49, 0, 30, 24, 26, 25, 0])  # flat positions of real tokens, one repeated; sequence 3 has none
    with torch.no_grad():
        full = m.eval()(ids, am, tt).last_hidden_state.reshape(-1, 128)[pos]
        rows = hidden_at(m.train(train), pos, ids, am, tt)
    assert rows.shape == (7, 128)
    assert (full - rows).abs().max() < 1e-5


def test_gradients_equal_transformers(tmp_path):
    """Training follows transformers exactly: same loss and same gradients on the same weights and batch."""
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = BertForPreTraining(cfg)
    ours.save_pretrained(tmp_path / "m")
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path / "m")
    ids, am, tt = _batch(300, T=20)
    g = torch.Generator().manual_seed(2)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & am.bool(), ids, torch.full_like(ids, -100))
    nsp = torch.tensor([0, 1, 0, 1])
    a = ours(ids, am, tt, labels=labels, next_sentence_label=nsp).loss
    b = theirs(input_ids=ids, attention_mask=am, token_type_ids=tt, labels=labels, next_sentence_label=nsp).loss
    a.backward()
    b.backward()
    assert abs(float(a.detach()) - float(b.detach())) < 1e-5
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert (p.grad - theirs_grads[name].grad).abs().max() < 1e-6, name




def test_keyed_dropout_of_the_task_heads_does_not_depend_on_the_batch():
    """Fine-tuning's dropout keyed by example: an example's outputs in training mode are the same batched with
    another (longer, padded) example or alone, for the classification and the question-answering head."""
    from bertforge.ops.dropout import DropoutKeys

    cfg = BertConfig.preset("tiny", vocab_size=50, max_position_embeddings=16, id2label={0: "a", 1: "b"})
    ids = torch.tensor([[2, 5, 6, 7, 3, 0, 0, 0], [2, 8, 9, 10, 11, 12, 13, 3]])
    mask = (ids != 0).long()
    for cls in (BertForSequenceClassification, BertForQuestionAnswering):
        torch.manual_seed(0)
        model = cls(cfg).train()
        both = model(ids, mask, dropout_keys=DropoutKeys(1, 7, [40, 41]))
        alone = model(ids[:1, :5], mask[:1, :5], dropout_keys=DropoutKeys(1, 7, [40]))
        other = model(ids[:1, :5], mask[:1, :5], dropout_keys=DropoutKeys(1, 8, [40]))  # another step: other masks
        def outputs(o, n):  # the first example's outputs at its n real positions
            if cls is BertForSequenceClassification:
                return [o.logits[0]]
            return [o.start_logits[0, :n], o.end_logits[0, :n]]

        first = outputs(both, 5)
        assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(first, outputs(alone, 5))), cls
        assert not all(torch.allclose(x, y, atol=1e-5) for x, y in zip(first, outputs(other, 5))), cls


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_local_attention_heads_start_on_the_neighbours_and_load_in_transformers(tmp_path, preset):
    from bertforge.models.initialization import local_attention_heads_, sinusoidal_positions_

    torch.manual_seed(0)
    ours = BertForMaskedLM(BertConfig.preset(preset, vocab_size=500)).eval()
    sinusoidal_positions_(ours)
    cols = local_attention_heads_(ours)
    assert len(cols) == 32 and (ours.bert.embeddings.word_embeddings.weight[:, cols] == 0).all()
    ours.save_pretrained(tmp_path / "m")
    theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path / "m", attn_implementation="eager").eval()
    ids = torch.randint(5, 500, (4, 64))
    with torch.no_grad():
        att = theirs(input_ids=ids, output_attentions=True).attentions[0]  # (B, nh, T, T), transformers' own
        assert (ours(ids).logits - theirs(input_ids=ids).logits).abs().max() < 1e-5
    prev, nxt = att[:, 0].diagonal(-1, -2, -1).mean(), att[:, 1].diagonal(1, -2, -1).mean()
    assert prev > 0.5 and nxt > 0.5  # query i on key i-1 (head 0), on key i+1 (head 1)
    assert att[:, 0].diagonal(1, -2, -1).mean() < 0.05 and att[:, 1].diagonal(-1, -2, -1).mean() < 0.05
    for h in range(2, att.shape[1]):  # the other heads keep BERT's random start: near uniform
        assert att[:, h].max() < 0.1
