"""The Python API and the readers check what they get: a wrong type or an empty input is one UserError naming
it, never a TypeError from deep inside; the pipelines take and shape what transformers' pipelines do."""

from __future__ import annotations

import json
import re

import pytest
import torch

import bertforge
from bertforge.cli import main
from bertforge.errors import UserError


TEXTS = ["the cat sat on the mat.", "a dog ran in the park.", "good movie", "bad film"] * 4
CONTEXT = "the cat sat on the mat. a dog ran in the park."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny models built on the spot: a masked LM with NSP, a classifier, a question-answering model, and a
    labelled file."""
    from bertforge import BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification
    from bertforge.tokenizer import from_vocab

    d = tmp_path_factory.mktemp("api")
    words = sorted({w for t in TEXTS for w in t.replace(".", " .").split()} | {"who", "where", "did", "?"})
    tok = from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words], kind="wordlevel")
    torch.manual_seed(0)
    cfg = dict(vocab_size=tok.get_vocab_size(), max_position_embeddings=128)
    mlm = str(d / "mlm")
    BertForPreTraining(BertConfig.preset("tiny", **cfg)).save_pretrained(mlm, tokenizer=tok)
    BertForSequenceClassification(BertConfig.preset("tiny", id2label={0: "neg", 1: "pos"}, **cfg)) \
        .save_pretrained(str(d / "cls"), tokenizer=tok)
    BertForQuestionAnswering(BertConfig.preset("tiny", **cfg)).save_pretrained(str(d / "qa"), tokenizer=tok)
    (d / "cls.jsonl").write_text('{"text": "good movie", "label": "pos"}\n{"text": "bad film", "label": "neg"}\n')
    return {"mlm": mlm, "cls": str(d / "cls"), "qa": str(d / "qa"), "data": str(d / "cls.jsonl"), "dir": d}


WRONG_CALLS = [
    ("pipeline-task-list", lambda m: bertforge.pipeline(["fill-mask"], m["mlm"]), "task must be a string"),
    ("pipeline-model-none", lambda m: bertforge.pipeline("fill-mask", None), "model must be a string or a path, not None"),
    ("pipeline-batch-text", lambda m: bertforge.pipeline("fill-mask", m["mlm"], batch_size="8"),
     "batch_size must be an integer of at least 1, not str '8'"),
    ("pipeline-device-int", lambda m: bertforge.pipeline("fill-mask", m["mlm"], device=0), "device must be a string"),
    ("fill-mask-none", lambda m: bertforge.pipeline("fill-mask", m["mlm"])(None), "texts must be a string or a list"),
    ("fill-mask-numbers", lambda m: bertforge.pipeline("fill-mask", m["mlm"])([1, 2]), "texts must be .* not list"),
    ("fill-mask-top-k-0", lambda m: bertforge.pipeline("fill-mask", m["mlm"])("a [MASK]", top_k=0), "top_k must be"),
    ("next-sentence-none", lambda m: bertforge.pipeline("next-sentence", m["mlm"])(None, None), "first must be"),
    ("next-sentence-mixed", lambda m: bertforge.pipeline("next-sentence", m["mlm"])("a", ["b"]),
     "second must be a string"),
    ("classify-none", lambda m: bertforge.pipeline("classify", m["cls"])(None), "texts must be"),
    ("classify-pairs-short", lambda m: bertforge.pipeline("classify", m["cls"])(["a", "b"], ["c"]),
     "pairs must be a list of 2 strings"),
    ("qa-numbers", lambda m: bertforge.pipeline("qa", m["qa"])(5, 6), "question must be a string"),
    ("qa-dict-keys", lambda m: bertforge.pipeline("qa", m["qa"])({"q": "who?", "context": CONTEXT}),
     "must be a dict of 'question' and 'context'"),
    ("qa-empty-context", lambda m: bertforge.pipeline("qa", m["qa"])("who sat?", ""), "context is empty"),
    ("qa-blank-context", lambda m: bertforge.pipeline("qa", m["qa"])(question="who sat?", context="  \n"),
     "context is empty"),
    ("qa-empty-question", lambda m: bertforge.pipeline("qa", m["qa"])([{"question": " ", "context": CONTEXT}]),
     "question\\[0\\] is empty"),
    ("evaluate-classifier-model-none", lambda m: bertforge.evaluate_classifier(None, m["data"]), "model must be"),
    ("evaluate-classifier-data-none", lambda m: bertforge.evaluate_classifier(m["cls"], None), "data must be"),
    ("evaluate-classifier-length-text", lambda m: bertforge.evaluate_classifier(m["cls"], m["data"], max_seq_length="x"),
     "max_seq_length must be an integer"),
    ("evaluate-classifier-length-beyond", lambda m: bertforge.evaluate_classifier(m["cls"], m["data"], max_seq_length=129),
     "--max-seq-length 129 exceeds the 128 positions"),
    ("evaluate-classifier-unknown-column", lambda m: bertforge.evaluate_classifier(m["cls"], m["data"], txt="text"),
     "unknown key\\(s\\) in evaluate_classifier's columns: txt"),
    ("evaluate-squad-data-none", lambda m: bertforge.evaluate_squad(None, model=m["qa"]), "data must be a string"),
    ("evaluate-mlm-data-none", lambda m: bertforge.evaluate_mlm(m["mlm"], None), "data must be"),
    ("evaluate-mlm-batch-1", lambda m: bertforge.evaluate_mlm(m["mlm"], m["data"], batch_size=0), "batch_size must be"),
    # found by hostile testing (2): a TypeError from os.fspath
    ("load-tokenizer-none", lambda m: bertforge.load_tokenizer(None), "path must be a string or a path, not None"),
    ("from-pretrained-none", lambda m: bertforge.BertForMaskedLM.from_pretrained(None), "path must be a string or a path"),
    ("from-pretrained-int", lambda m: bertforge.BertModel.from_pretrained(3), "path must be a string or a path, not int 3"),
]


@pytest.mark.parametrize("name,call,message", WRONG_CALLS, ids=[c[0] for c in WRONG_CALLS])
def test_api_entry_points_refuse_wrong_input_with_a_message(name, call, message, models):
    with pytest.raises(UserError) as e:
        call(models)
    assert re.search(message, str(e.value)), str(e.value)


def test_evaluate_squad_takes_paths_as_the_other_entry_points_do(models, tmp_path):
    """Found by hostile testing (2): ``evaluate_squad(pathlib.Path(...))`` was refused ("data must be a string")."""
    import json
    import pathlib

    squad = {"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": "q1", "question": "who?", "answers": [{"text": CONTEXT.split()[0], "answer_start": 0}]}]}]}]}
    (tmp_path / "s.json").write_text(json.dumps(squad))
    (tmp_path / "p.json").write_text(json.dumps({"q1": CONTEXT.split()[0]}))
    got = bertforge.evaluate_squad(pathlib.Path(tmp_path / "s.json"), predictions=pathlib.Path(tmp_path / "p.json"))
    assert got["exact_match"] == 100.0


def test_fill_mask_is_shaped_as_transformers_shapes_it(models):
    transformers = pytest.importorskip("transformers")
    fill = bertforge.pipeline("fill-mask", model=models["mlm"])
    hf = transformers.pipeline("fill-mask", model=models["mlm"], tokenizer=models["mlm"], device="cpu", top_k=3)
    one, two = "the cat sat on the [MASK].", "the [MASK] sat on the [MASK]."
    ours, theirs = fill(one, top_k=3), hf(one)
    assert isinstance(ours, list) and len(ours) == 3 and isinstance(ours[0], dict)  # one [MASK]: a flat list
    assert [c["token"] for c in ours] == [c["token"] for c in theirs]
    assert max(abs(c["score"] - t["score"]) for c, t in zip(ours, theirs)) < 1e-5
    ours = fill(two, top_k=3)
    assert len(ours) == 2 and all(len(m) == 3 and isinstance(m[0], dict) for m in ours)  # several: one list each
    assert [[c["token"] for c in m] for m in ours] == [[c["token"] for c in m] for m in hf(two)]
    both = fill([one, two], top_k=3)  # a list of texts: a list of those (scores equal up to the batch's padding)
    tokens = json.dumps(both, default=str)
    assert len(both) == 2 and [c["token"] for c in both[0]] == [c["token"] for c in fill(one, top_k=3)]
    assert [[c["token"] for c in m] for m in both[1]] == [[c["token"] for c in m] for m in ours], tokens


def test_qa_takes_transformers_inputs_and_scores_a_probability(models):
    qa = bertforge.pipeline("question-answering", model=models["qa"])
    a = qa(question="who sat on the mat?", context=CONTEXT)
    assert set(a) == {"answer", "score", "start", "end"} and 0 < a["score"] <= 1
    assert a["answer"] and CONTEXT[a["start"] : a["end"]] == a["answer"]
    assert qa({"question": "who sat on the mat?", "context": CONTEXT}) == a == qa("who sat on the mat?", CONTEXT)
    b = qa(question="where did the dog run?", context=CONTEXT)
    assert qa([{"question": "who sat on the mat?", "context": CONTEXT},
               {"question": "where did the dog run?", "context": CONTEXT}]) == [a, b]
    assert qa(question=["who sat on the mat?", "where did the dog run?"], context=CONTEXT) == [a, b]
    # a long question beside a short context: still a span of the context, never score -inf and offsets -1
    long = qa(question="the cat sat on the mat " * 9 + "?", context="the dog")
    assert long["answer"] and long["start"] >= 0 and 0 < long["score"] <= 1


def snapshot(*roots) -> dict:
    """Every file (size, modification time) and folder under ``roots``, but the tokenized-corpus cache (as
    test_hostile's)."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "folder"
            for root in roots for p in sorted(root.rglob("*")) if "cache" not in p.relative_to(root).parts[:1]}


# CLI cases whose inputs the shared hostile table's world lacks: one line `error: ...`, exit 2, nothing written
def _bad_inputs(d, models) -> None:
    import shutil

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [1, 2, 3], "label": ["a", "b", "a"]}), d / "numbers.parquet")
    shutil.copytree(models["mlm"], d / "hidden0")
    config = json.loads((d / "hidden0" / "config.json").read_text())
    (d / "hidden0" / "config.json").write_text(json.dumps({**config, "hidden_size": 0}))
    qas = [{"id": "q1", "question": "Who sat?", "answers": [{"text": "the cat", "answer_start": 0}]},
           {"id": "q1", "question": "Who ran?", "answers": [{"text": "a dog", "answer_start": 24}]}]
    (d / "dup.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}))


CLI_CASES = [
    ("pretrain-parquet-numbers", ["pretrain", "--data", "{d}/numbers.parquet", "--tokenizer", "{mlm}", "--preset", "tiny",
                                  "--max-steps", "1", "--out", "{t}/o", "--no-progress"], "row 0: 'text' must be text, not int 1"),
    ("classify-parquet-numbers", ["evaluate", "classify", "--model", "{cls}", "--data", "{d}/numbers.parquet"],
     "record 1: 'text' must be text, not int 1"),
    ("config-hidden-size-0", ["predict", "fill-mask", "--model", "{d}/hidden0", "a [MASK]"],
     "hidden0/config.json: hidden_size must be an integer of at least 1, not int 0"),
    ("squad-duplicate-ids", ["evaluate", "squad", "--data", "{d}/dup.json", "--model", "{qa}", "--max-seq-length", "128"],
     "qas\\[1\\]: question id 'q1' is also the id of .*qas\\[0\\]"),
    ("qa-empty-context", ["predict", "qa", "--model", "{qa}", "--question", "Who sat?", "--context", ""], "context is empty"),
    ("evaluate-classify-beyond-positions", ["evaluate", "classify", "--model", "{cls}", "--data", "{data}", "--max-seq-length",
                                            "200"], "--max-seq-length 200 exceeds the 128 positions"),
]


@pytest.mark.parametrize("name,argv,message", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_readers_refuse_what_they_cannot_read(name, argv, message, models, tmp_path, capsys):
    d = models["dir"]
    if not (d / "dup.json").exists():
        _bad_inputs(d, models)
    argv = [a.format(d=d, t=tmp_path, **{k: v for k, v in models.items() if k != "dir"}) for a in argv]
    before = snapshot(d, tmp_path)
    rc = main(["--quiet", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err)
    assert re.search(message, err[0]), err[0]
    assert snapshot(d, tmp_path) == before


def test_the_training_entry_points_take_paths(tmp_path):
    """``pathlib.Path`` (any ``os.PathLike``) wherever a path goes, as transformers users write them."""
    d = tmp_path
    (d / "c.txt").write_text("the cat sat on the mat. a dog ran in the park.\n\n" * 30)
    assert bertforge.train_tokenizer(d / "c.txt", d / "tok", vocab_size=40, model="wordlevel", min_frequency=1)
    m = bertforge.run_pretraining(d / "pt", data=d / "c.txt", tokenizer=d / "tok", preset="tiny", max_seq_length=32,
                                  batch_size=4, max_steps=1, eval_every=0, max_eval_instances=4)
    assert m["steps"] == 1
    rows = [{"text": "good movie", "label": "pos"}, {"text": "bad film", "label": "neg"}] * 4
    (d / "cls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = bertforge.run_finetuning("classify", d / "pt", d / "cls.jsonl", d / "cls.jsonl", d / "ft", epochs=1,
                                 max_seq_length=16)
    assert (d / "ft" / "model.safetensors").is_file() and "accuracy" in m


def test_api_inputs_of_other_types_are_taken_or_refused_in_one_line(tmp_path, monkeypatch):
    """What hostile testing found ending in a traceback: max_time as a timedelta, evaluate_mlm's data as a
    pathlib.Path, and a BERTFORGE_DIST_TIMEOUT that is no positive number under torchrun."""
    import datetime
    import pathlib

    from bertforge.config import parse_duration
    from bertforge.devices import dist_timeout

    assert parse_duration(datetime.timedelta(minutes=2)) == 120.0
    assert bertforge.api._paths(pathlib.Path("a.txt"), listed=True) == ["a.txt"]
    from ..helpers import SENTENCES, tiny_model_dir

    model = tiny_model_dir(tmp_path / "m", SENTENCES)
    (tmp_path / "t.txt").write_text(" ".join(SENTENCES))
    assert 0 <= bertforge.evaluate_mlm(model, pathlib.Path(tmp_path / "t.txt"), max_seq_length=16)["mlm_accuracy"] <= 1
    with pytest.raises(UserError, match="data path not found"):
        bertforge.evaluate_mlm(model, pathlib.Path(tmp_path / "missing.txt"))
    for bad in ("ten", "0", "-5", "inf"):
        monkeypatch.setenv("BERTFORGE_DIST_TIMEOUT", bad)
        with pytest.raises(UserError, match="BERTFORGE_DIST_TIMEOUT must be a positive number of seconds"):
            dist_timeout()
    monkeypatch.setenv("BERTFORGE_DIST_TIMEOUT", "30")
    assert dist_timeout() == 30.0


def test_the_apis_types_are_taken_or_refused_in_one_line(tmp_path, capsys):
    """Issue 66, class 10: max_time of another type was a traceback (a list, bytes) or a one-second budget
    (True); a settings path may be any os.PathLike, as run_finetuning's are; predict qa --input with --top-k
    said nothing of it."""
    import pathlib

    from bertforge.config import parse_duration
    from bertforge.tasks.base import given_settings
    from bertforge.tasks.ner import NerConfig

    for bad in ([90], b"90s", True):
        with pytest.raises(UserError, match="max_time must be a duration"):
            parse_duration(bad)
    with pytest.raises(UserError, match="max_time must be a duration"):
        bertforge.run_finetuning("classify", model="m", train="t", out=str(tmp_path / "o"), max_time=[90])
    assert given_settings(NerConfig(), {"labels_file": pathlib.Path("tags.txt")}, "where").labels_file == "tags.txt"
    (tmp_path / "squad.json").write_text('{"data": []}')
    assert main(["--quiet", "predict", "qa", "--model", str(tmp_path), "--input", str(tmp_path / "squad.json"),
                 "--top-k", "3"]) == 2
    assert "--top-k gives a question's k best answers" in capsys.readouterr().err


def test_a_run_started_from_python_says_its_steps_on_stderr(tmp_path, capsys):
    """Issue 67, item 4: `run_finetuning` and `run_pretraining` trained in silence (their lines went to train.log
    only); now stderr shows what the command line shows, `quiet=True` keeps the warnings only, and a program that
    handles bertforge's log lines itself keeps them."""
    import logging

    from bertforge.logs import log

    from ..helpers import tiny_model_dir

    for h in list(log.handlers):  # (what an earlier command of this process left: a fresh Python session)
        log.removeHandler(h)
    log.propagate = True
    rows = [{"text": f"the cat number {i} is {'happy' if i % 2 else 'sad'}", "label": i % 2} for i in range(8)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tiny_model_dir(tmp_path / "m", [r["text"] for r in rows], vocab_size=60)
    common = dict(model=model, train=str(tmp_path / "t.jsonl"), validation=str(tmp_path / "t.jsonl"), max_steps=2,
                  batch_size=4, log_every=1, max_seq_length=16, progress=False)
    bertforge.run_finetuning("classify", out=str(tmp_path / "a"), **common)
    err = capsys.readouterr().err
    assert "step 1/2" in err and "step 2/2" in err, err
    assert not log.handlers and log.propagate  # (as it was)
    bertforge.run_finetuning("classify", out=str(tmp_path / "b"), quiet=True, **common)
    err = capsys.readouterr().err
    assert "step 1/2" not in err and "only 2 optimizer updates" in err, err  # (a warning still shows)
    mine = logging.StreamHandler()
    log.addHandler(mine)  # the program's own handler: bertforge adds none
    try:
        bertforge.run_finetuning("classify", out=str(tmp_path / "c"), **common)
        assert log.handlers == [mine]
    finally:
        log.removeHandler(mine)
    capsys.readouterr()
