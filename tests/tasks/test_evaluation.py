"""Metrics: SQuAD v1.1 exactly as the official script, classification accuracy and macro-F1."""

import json

import pytest

from bertforge.cli import main
from bertforge.evaluation import (
    classification_metrics,
    f1_score,
    normalize_answer,
    squad_evaluate,
)


def _dataset(qas):
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": qid, "question": "q", "answers": [{"text": a, "answer_start": 0} for a in answers]} for qid, answers in qas
    ]}]}]


# (id, reference answers, prediction or None, hand-computed exact match, hand-computed F1)
CASES = [
    ("punct", ["Eiffel Tower"], "the Eiffel Tower!", 1, 1.0),
    ("article", ["apple"], "an apple a day", 0, 2 * (1 / 2) * 1 / (1 / 2 + 1)),  # "apple day" vs "apple"
    ("several", ["Denver Broncos", "Broncos", "the Denver Broncos team"], "Broncos", 1, 1.0),
    ("partial", ["Santa Clara, California"], "Santa Clara", 0, 2 * 1 * (2 / 3) / (1 + 2 / 3)),
    ("unicode", ["Café Müller"], "café müller", 1, 1.0),
    ("accent", ["naïve"], "naive", 0, 0.0),  # no accent stripping in the official normalisation
    ("dots", ["U.S."], "US", 1, 1.0),
    ("inner", ["theater"], "the theater", 1, 1.0),  # 'the' removed as a word, kept inside 'theater'
    ("empty", ["something"], "", 0, 0.0),
    ("missing", ["never answered"], None, 0, 0.0),  # no prediction: scores 0, still counted
]


def test_squad_metric_matches_official_arithmetic():
    data = _dataset([(c[0], c[1]) for c in CASES])
    preds = {c[0]: c[2] for c in CASES if c[2] is not None}
    res = squad_evaluate(data, preds)
    em = f1 = 0.0
    for _, _, _, e, f in CASES:  # accumulated in the official order, then scaled as the official script
        em += e
        f1 += f
    assert res["exact_match"] == 100.0 * em / len(CASES)
    assert res["f1"] == 100.0 * f1 / len(CASES)
    assert res["questions"] == 10 and res["unanswered"] == 1


def test_normalisation_details():
    assert normalize_answer("  The  Quick, brown-fox!  ") == "quick brownfox"
    assert normalize_answer("A an THE") == ""
    assert f1_score("a", "the") == 0


def test_precision_and_recall_show_long_and_short_answers():
    data = _dataset([("long", ["Paris"]), ("short", ["the city of Paris"])])
    res = squad_evaluate(data, {"long": "in the beautiful city of Paris", "short": "Paris"})
    assert res["precision"] == pytest.approx(100 * (1 / 5 + 1) / 2)
    assert res["recall"] == pytest.approx(100 * (1 + 1 / 3) / 2)


def test_evaluate_squad_cli(tmp_path, capsys):
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"version": "1.1", "data": _dataset([(c[0], c[1]) for c in CASES])}))
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({c[0]: c[2] for c in CASES if c[2] is not None}))
    assert main(["evaluate", "squad", "--data", str(data), "--predictions", str(preds)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["exact_match"] == pytest.approx(50.0) and set(out) >= {"exact_match", "f1"}
    preds.write_text("{broken")
    assert main(["evaluate", "squad", "--data", str(data), "--predictions", str(preds)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "malformed JSON" in err[0]


def test_classification_metrics():
    r = classification_metrics([0, 0, 1, 1, 2], [0, 1, 1, 1, 0], 3)
    assert r["accuracy"] == pytest.approx(3 / 5)
    # per class F1: c0: tp1 fp1 fn1 -> 0.5; c1: tp2 fp1 fn0 -> 0.8; c2: tp0 fn1 -> 0
    assert r["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)


def test_evaluate_mlm_equals_transformers_on_the_same_masked_tokens(tmp_path, capsys):
    """``evaluate mlm`` on a transformers-saved BertForMaskedLM gives what transformers computes directly on
    the protocol's masked tokens; the protocol masks ~15% of the tokens, never [CLS]/[SEP], the same per seed."""
    import torch

    transformers = pytest.importorskip("transformers")
    from bertforge.corpus import iter_documents
    from bertforge.demo.corpus import write_story_corpus
    from bertforge.evaluation import mlm_blocks
    from bertforge.tokenizer import load_tokenizer, save_tokenizer, train_vocabulary

    data = write_story_corpus(tmp_path / "held-out.jsonl", n_docs=60, seed=5)
    tok = train_vocabulary([line for line in open(data)], 300, kind="wordlevel", min_frequency=1)
    d = tmp_path / "hf"
    save_tokenizer(tok, str(d))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=128, max_position_embeddings=64)
    hf = transformers.BertForMaskedLM(cfg).eval()
    hf.save_pretrained(str(d))
    assert main(["evaluate", "mlm", "--model", str(d), "--data", data, "--max-seq-length", "32", "--device", "cpu"]) == 0
    ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ids, labels = mlm_blocks(load_tokenizer(str(d)), iter_documents([data]), 32, seed=0)
    sel = labels != -100
    assert 0.12 < float(sel.float().mean()) < 0.16 and not sel[:, 0].any() and not sel[:, -1].any()
    again, _ = mlm_blocks(load_tokenizer(str(d)), iter_documents([data]), 32, seed=0)
    assert torch.equal(again, ids)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[sel]
    acc = float((logits.argmax(-1) == labels[sel]).float().mean())
    loss = float(torch.nn.functional.cross_entropy(logits, labels[sel]))
    assert ours["masked_tokens"] == int(sel.sum()) and ours["blocks"] == len(ids)
    assert abs(ours["mlm_accuracy"] - acc) < 1e-9 and abs(ours["mlm_loss"] - loss) < 1e-4


def test_evaluate_squad_warns_when_most_questions_have_no_prediction(tmp_path, capsys):
    """Found in a new user's trial: the predictions of another file scored 0 without a word."""
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"version": "1.1", "data": _dataset([(c[0], c[1]) for c in CASES])}))
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps({"another-file": "Paris"}))
    assert main(["evaluate", "squad", "--data", str(data), "--predictions", str(preds)]) == 0
    assert f"of the {len(CASES)} questions of {data} have no prediction in {preds}" in capsys.readouterr().err
    preds.write_text(json.dumps({c[0]: c[2] for c in CASES if c[2] is not None}))
    assert main(["evaluate", "squad", "--data", str(data), "--predictions", str(preds)]) == 0
    assert "have no prediction" not in capsys.readouterr().err
