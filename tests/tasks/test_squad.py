"""SQuAD: windows and answer positions, post-processing on hand-written logits, fine-tuning wiring, errors."""

import json

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.tasks.squad import Example, build_features, postprocess
from bertforge.tokenizer import from_vocab

from ..conftest import data_path
from ..helpers import tiny_model_dir

CONTEXT = "the quick brown fox jumps over the lazy dog . then the fox sleeps under a big old tree near the river ."


@pytest.fixture(scope="module")
def word_tok():
    words = sorted(set(CONTEXT.split() + ["where", "does", "what", "who", "is", "did"]))
    return from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words, kind="wordlevel")


def _ex(answer, qid="q1", question="where does the fox sleep"):
    return Example(qid, question, CONTEXT, [{"text": answer, "answer_start": CONTEXT.index(answer)}])


def test_windows_overlap_by_doc_stride_and_answers_map_back(word_tok):
    ex = _ex("big old tree")
    feats, skipped = build_features(word_tok, [ex], max_seq_length=16, doc_stride=4, max_query_length=5, training=True)
    assert skipped == 0 and len(feats) > 2
    room = 16 - 5 - 3
    ctx_tokens = CONTEXT.split()
    seen = []
    for f in feats:
        assert len(f["input_ids"]) <= 16
        ctx = [o for o in f["offsets"] if o is not None]
        seen.append(ctx)
        if f["start_positions"]:
            s, e = f["start_positions"], f["end_positions"]
            assert CONTEXT[f["offsets"][s][0] : f["offsets"][e][1]] == "big old tree"
        else:
            assert f["end_positions"] == 0  # window without the answer points at [CLS]
    for a, b in zip(seen, seen[1:]):
        assert a[-4:] == b[:4] and len(a) == room  # consecutive windows share doc_stride tokens
    assert sum(len(w) for w in seen) - 4 * (len(seen) - 1) == len(ctx_tokens)
    assert any(f["start_positions"] for f in feats)


def test_mismatched_answers_are_skipped_for_training(word_tok):
    bad = Example("q2", "what", CONTEXT, [{"text": "lazy cat", "answer_start": 10}])
    feats, skipped = build_features(word_tok, [_ex("lazy dog"), bad], 64, 8, 8, training=True)
    assert skipped == 1 and {f["example"] for f in feats} == {0}


def test_postprocess_picks_the_best_valid_span_across_windows(word_tok):
    ex = _ex("big old tree")
    feats, _ = build_features(word_tok, [ex], max_seq_length=16, doc_stride=4, max_query_length=5, training=False)
    starts = [np.zeros(len(f["input_ids"])) for f in feats]
    ends = [np.zeros(len(f["input_ids"])) for f in feats]
    target = max(range(len(feats)), key=lambda i: any(o and CONTEXT[o[0]:o[1]] == "big" for o in feats[i]["offsets"]))
    pos = {CONTEXT[o[0]:o[1]]: i for i, o in enumerate(feats[target]["offsets"]) if o}
    starts[target][pos["big"]] = 5.0
    ends[target][pos["tree"]] = 5.0
    starts[0][0] = ends[0][0] = 100.0  # [CLS]: not in the context, skipped
    # window 1: the best start lies after the best end (reversed, skipped); every other pair scores low
    other = 1 if target != 1 else 2
    first_ctx = next(i for i, o in enumerate(feats[other]["offsets"]) if o)
    starts[other][:] = ends[other][:] = -100.0
    starts[other][-2], ends[other][first_ctx] = 50.0, 50.0
    answers, scores = postprocess([ex], feats, starts, ends, n_best=20, max_answer_length=30)
    n_ctx = sum(o is not None for o in feats[target]["offsets"])
    p = np.exp(5.0) / (np.exp(5.0) + n_ctx - 1)  # a softmax over the window's context tokens, for start and end
    assert answers == {"q1": "big old tree"} and scores["q1"] == pytest.approx(p * p)
    answers, _ = postprocess([ex], feats, starts, ends, n_best=20, max_answer_length=2)  # too long now
    assert answers["q1"] != "big old tree"


@pytest.mark.slow
def test_tiny_model_learns_a_squad_slice_and_transformers_agrees(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    squad = json.loads(data_path("squad", "train-8k-v1.1.json").read_text(encoding="utf-8"))
    paras = squad["data"][0]["paragraphs"][:4]
    small = {"version": "1.1", "data": [{"title": "slice", "paragraphs": paras}]}
    path = tmp_path / "slice.json"
    path.write_text(json.dumps(small))
    n_q = sum(len(p["qas"]) for p in paras)
    texts = [p["context"] for p in paras] + [q["question"] for p in paras for q in p["qas"]]
    model = tiny_model_dir(tmp_path / "m", texts, vocab_size=1500)
    out = tmp_path / "qa"
    rc = main(["--quiet", "finetune", "squad", "--model", model, "--train", str(path), "--validation", str(path),
               "--out", str(out), "--epochs", "12", "--lr", "2e-3", "--batch-size", "8", "--max-seq-length", "192",
               "--doc-stride", "64", "--no-progress"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    preds = json.loads((out / "predictions.json").read_text())
    assert len(preds) == n_q
    # trivial baseline: the first five words of the context
    first = {q["id"]: " ".join(p["context"].split()[:5]) for p in paras for q in p["qas"]}
    from bertforge.evaluation import squad_evaluate

    base = squad_evaluate(small["data"], first)
    assert m["f1"] > base["f1"] + 20 and m["f1"] > 40, (m["f1"], base["f1"])
    for k in ("exact_match", "f1", "precision", "recall"):
        assert k in m
    # the saved directory loads in transformers and predicts the same logits
    from bertforge import BertForQuestionAnswering

    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok([q["question"] for q in paras[0]["qas"][:4]], [paras[0]["context"]] * 4, padding=True, truncation=True,
              max_length=192, return_tensors="pt")
    with torch.no_grad():
        a = BertForQuestionAnswering.from_pretrained(out).eval()(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = transformers.BertForQuestionAnswering.from_pretrained(out).eval()(**enc)
    real = enc["attention_mask"].bool()
    assert (a.start_logits[real] - b.start_logits[real]).abs().max() < 1e-4
    assert (a.end_logits[real] - b.end_logits[real]).abs().max() < 1e-4
    # evaluate squad --model reproduces the fine-tuning's own score
    assert main(["evaluate", "squad", "--model", str(out), "--data", str(path), "--max-seq-length", "192", "--doc-stride", "64"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["f1"] == pytest.approx(m["f1"]) and ev["exact_match"] == pytest.approx(m["exact_match"])


def test_squad_rows_from_parquet_are_the_questions_of_the_json(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from bertforge.tasks.squad import read_examples

    squad = json.loads(data_path("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
    small = {"data": [{"title": a["title"], "paragraphs": a["paragraphs"][:2]} for a in squad["data"][:2]]}
    (tmp_path / "s.json").write_text(json.dumps(small))
    rows = [{"id": q["id"], "title": a["title"], "context": p["context"], "question": q["question"],
             "answers": {"text": [x["text"] for x in q["answers"]], "answer_start": [x["answer_start"] for x in q["answers"]]}}
            for a in small["data"] for p in a["paragraphs"] for q in p["qas"]]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    from_json, data_json = read_examples(str(tmp_path / "s.json"))
    from_parquet, data_parquet = read_examples(str(tmp_path / "s.parquet"))
    assert from_json == from_parquet and len(from_json) == len(rows) > 10
    assert data_parquet == data_json  # the articles the official evaluation reads
    try:
        import datasets  # noqa: F401

        assert read_examples(f"hf:{tmp_path}@train")[0] == from_json  # the folder's one parquet file: split train
    except ImportError:
        pass


def test_bad_squad_files(tmp_path, capsys):
    model = tiny_model_dir(tmp_path / "m", [CONTEXT] * 3, vocab_size=60, kind="wordlevel")
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [ {"paragraphs": ')
    out = tmp_path / "out"
    assert main(["finetune", "squad", "--model", model, "--train", str(bad), "--validation", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed JSON" in err[0] and not out.exists()
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"data": [{"paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "x", "question": "what", "answers": [{"text": "nowhere", "answer_start": 3}]}]}]}]}))
    assert main(["finetune", "squad", "--model", model, "--train", str(wrong), "--validation", str(wrong), "--out", str(out)]) == 2
    assert "no training question has an answer that matches" in capsys.readouterr().err


def test_the_qa_loss_does_not_depend_on_padding():
    """A sequence's loss is the same batched with a longer one (padded) or alone; so is a classifier's."""
    import torch

    from bertforge import BertConfig, BertForQuestionAnswering, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=200, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    a, b = torch.randint(5, 200, (1, 20)), torch.randint(5, 200, (1, 60))
    padded = torch.cat([torch.cat([a, torch.zeros(1, 40, dtype=torch.long)], 1), b])  # (2, 60)
    am = torch.ones(2, 60, dtype=torch.long)
    am[0, 20:] = 0
    qa = BertForQuestionAnswering(cfg).eval()
    s, e = torch.tensor([[3], [10]]), torch.tensor([[7], [30]])
    with torch.no_grad():
        both = qa(padded, am, start_positions=s, end_positions=e).loss
        one = qa(a, torch.ones_like(a), start_positions=s[:1], end_positions=e[:1]).loss
        two = qa(b, torch.ones_like(b), start_positions=s[1:], end_positions=e[1:]).loss
        out = qa(padded, am)
    assert abs(float(both) - float(one + two) / 2) < 1e-5
    assert bool((out.start_logits[0, 20:] < -1e30).all()) and bool((out.start_logits.softmax(-1)[0, 20:] == 0).all())
    cls = BertForSequenceClassification(cfg).eval()
    y = torch.tensor([0, 1])
    with torch.no_grad():
        both = cls(padded, am, labels=y).loss
        alone = (cls(a, torch.ones_like(a), labels=y[:1]).loss + cls(b, torch.ones_like(b), labels=y[1:]).loss) / 2
    assert abs(float(both) - float(alone)) < 1e-5


def test_postprocess_finds_an_answer_however_the_question_tokens_score(word_tok):
    """The best starts and ends among the question's tokens, or ends all before starts, still leave an answer in
    the context (never "" with score -inf), scored as a probability."""
    ex = Example("q", "where does the fox sleep", "the lazy dog", [])
    feats, _ = build_features(word_tok, [ex], max_seq_length=32, doc_stride=2, max_query_length=8, training=False)
    (f,) = feats
    ctx = [i for i, o in enumerate(f["offsets"]) if o is not None]
    starts, ends = np.zeros(len(f["input_ids"])), np.zeros(len(f["input_ids"]))
    starts[: ctx[0]] = ends[: ctx[0]] = 50.0  # [CLS] and the question: far above any context token
    starts[ctx[-1]], ends[ctx[0]] = 9.0, 9.0  # within the context, the best start lies after the best end
    for n_best in (1, 2):  # 1: no pair of the best start and end makes a span, so every span is searched
        answers, scores = postprocess([ex], feats, [starts], [ends], n_best=n_best, max_answer_length=30)
        assert answers["q"] == "the" and 0 < scores["q"] <= 1


def test_duplicate_question_ids_and_rows_of_the_wrong_type_are_refused(tmp_path):
    from bertforge.errors import UserError
    from bertforge.tasks.squad import read_examples, squad_from_rows

    qas = [{"id": "q1", "question": "what?", "answers": []}, {"id": "q1", "question": "who?", "answers": []}]
    (tmp_path / "dup.json").write_text(json.dumps({"data": [{"paragraphs": [{"context": CONTEXT, "qas": qas}]}]}))
    with pytest.raises(UserError, match=r"qas\[1\]: question id 'q1' is also the id of data\[0\].paragraphs\[0\].qas\[0\]"):
        read_examples(str(tmp_path / "dup.json"))
    with pytest.raises(UserError, match="rows: row 0: 'context' must be text, not list"):
        squad_from_rows([{"id": "1", "context": ["a", "b"], "question": "q", "answers": []}], "rows")


def test_predictions_of_the_first_questions_are_scored_over_those(tmp_path, capsys):
    """Issue 67, item 6: a run's predictions after --max-eval-samples cover the data file's first N questions;
    `evaluate squad --predictions` scores those N (it scored all, unanswered as wrong) and says so."""
    paragraphs = [{"context": f"the fox number {i} sleeps in den {i}", "qas": [
        {"id": f"q{i}", "question": f"where does fox {i} sleep", "answers": [{"text": f"den {i}",
                                                                             "answer_start": 26 + len(str(i))}]}]}
                  for i in range(5)]
    data = tmp_path / "d.json"
    data.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    (tmp_path / "run").mkdir()  # a run's folder: its predictions beside the settings that cut them
    (tmp_path / "run" / "finetune_config.json").write_text(json.dumps({"finetune": {"data": {"max_eval_examples": 2}}}))
    first = tmp_path / "run" / "predictions.json"
    first.write_text(json.dumps({"q0": "den 0", "q1": "den 1"}))
    assert main(["--quiet", "evaluate", "squad", "--data", str(data), "--predictions", str(first)]) == 0
    said = capsys.readouterr()
    res = json.loads(said.out)
    assert res["exact_match"] == 100.0 and res["questions"] == 2 and res["questions_in_data"] == 5
    assert "cover the first 2 of the 5 questions" in said.err and "--max-eval-samples 2" in said.err
    (tmp_path / "loose.json").write_text(first.read_text())  # the same, outside the run: the official rule
    loose = str(tmp_path / "loose.json")
    assert main(["--quiet", "evaluate", "squad", "--data", str(data), "--predictions", loose]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 5
    other = tmp_path / "run" / "other.json"  # not the first questions: every question scored, as before
    other.write_text(json.dumps({"q0": "den 0", "q3": "den 3"}))
    assert main(["--quiet", "evaluate", "squad", "--data", str(data), "--predictions", str(other)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["exact_match"] == 40.0 and res["questions"] == 5 and "questions_in_data" not in res
