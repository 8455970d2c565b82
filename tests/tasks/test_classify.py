"""finetune classify / evaluate classify: formats, labels, wiring, transformers interchange, errors."""

import json
import os

import pytest
import torch

from bertforge.cli import main

from ..conftest import data_path
from ..helpers import tiny_model_dir

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def sst_slice(tmp_path_factory):
    lines = data_path("sst2", "train.tsv").read_text(encoding="utf-8").splitlines()
    d = tmp_path_factory.mktemp("sst")
    (d / "train.tsv").write_text("\n".join(lines[:97]) + "\n", encoding="utf-8")  # header + 96 rows
    model = tiny_model_dir(d / "model", [x.split("\t")[0] for x in lines[1:2000]])
    return d, model


def test_tiny_model_learns_its_training_slice_and_transformers_agrees(sst_slice, tmp_path, capsys, plots_on):
    d, model = sst_slice
    out = tmp_path / "cls"
    rc = main(["--quiet", "finetune", "classify", "--model", model, "--train", str(d / "train.tsv"),
               "--validation", str(d / "train.tsv"), "--out", str(out), "--epochs", "12", "--lr", "1e-3",
               "--batch-size", "16", "--no-progress"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    m = json.loads((out / "metrics.json").read_text())
    assert m["accuracy"] == last["accuracy"]
    assert m["accuracy"] > m["majority_baseline_accuracy"] + 0.2, m  # learned, not guessed
    assert len(m["epochs"]) == 12 and m["best_epoch"] == max(m["epochs"], key=lambda e: e["accuracy"])["epoch"]
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "predictions.jsonl", "metrics.jsonl",
                 "finetune_config.json"):
        assert (out / name).exists(), name
    assert {p.name for p in (out / "plots").iterdir()} >= {"loss.png", "metrics.png"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["id2label"] == {"0": "0", "1": "1"} and cfg["architectures"] == ["BertForSequenceClassification"]
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 96 and sum(p["prediction"] == p["label"] for p in preds) / 96 == pytest.approx(m["accuracy"])
    # transformers loads the directory and predicts the same
    from bertforge import BertForSequenceClassification

    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok([p["text"] for p in preds[:16]], padding=True, return_tensors="pt")
    theirs = transformers.BertForSequenceClassification.from_pretrained(out).eval()
    ours = BertForSequenceClassification.from_pretrained(out).eval()
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).logits
        b = theirs(**enc).logits
    assert (a - b).abs().max() < 1e-5
    # evaluate classify scores the saved model the same way
    assert main(["evaluate", "classify", "--model", str(out), "--data", str(d / "train.tsv")]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["accuracy"] == pytest.approx(m["accuracy"])


def test_string_labels_pairs_jsonl_and_csv(tmp_path, capsys):
    rows = [("the cat sat", "a cat sits", "same"), ("dogs run fast", "a cat sits", "different"),
            ("birds fly high", "birds fly", "same"), ("fish swim", "cows moo", "different")] * 6
    with open(tmp_path / "pairs.jsonl", "w") as f:
        for a, b, lab in rows:
            f.write(json.dumps({"premise": a, "hypothesis": b, "gold": lab}) + "\n")
    with open(tmp_path / "pairs.csv", "w") as f:
        f.write("premise,hypothesis,gold\n")
        for a, b, lab in rows:
            f.write(f'"{a}","{b}",{lab}\n')
    model = tiny_model_dir(tmp_path / "m", [r[0] for r in rows] + [r[1] for r in rows], vocab_size=100, kind="wordlevel")
    for name in ("pairs.jsonl", "pairs.csv"):
        out = tmp_path / ("out-" + name)
        assert main(["--quiet", "finetune", "classify", "--model", model, "--train", str(tmp_path / name),
                     "--validation", str(tmp_path / name), "--out", str(out), "--text-column", "premise",
                     "--text-pair-column", "hypothesis", "--label-column", "gold", "--epochs", "1", "--no-progress"]) == 0
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["label2id"] == {"different": 0, "same": 1}
        first = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])
        assert first["text_pair"] == "a cat sits" and set(first["probabilities"]) == {"different", "same"}
    capsys.readouterr()


def test_parquet_and_hf_datasets_train_as_the_same_rows_in_jsonl(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [("good fun", "pos"), ("bad mess", "neg"), ("fine show", "pos"), ("dull show", "neg")] * 4
    with open(tmp_path / "t.jsonl", "w") as f:
        f.writelines(json.dumps({"text": a, "label": b}) + "\n" for a, b in rows)
    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"text": [a for a, _ in rows], "label": [b for _, b in rows]}), tmp_path / "ds" / "train.parquet")
    model = tiny_model_dir(tmp_path / "m", [a for a, _ in rows], vocab_size=30, kind="wordlevel")
    sources = {"jsonl": str(tmp_path / "t.jsonl"), "parquet": str(tmp_path / "ds" / "train.parquet")}
    try:
        import datasets  # noqa: F401 - the datasets extra, for hf:

        sources["hf"] = f"hf:{tmp_path / 'ds'}@train"
    except ImportError:
        pass
    preds = {}
    for name, path in sources.items():
        out = tmp_path / f"out-{name}"
        assert main(["--quiet", "finetune", "classify", "--model", model, "--train", path, "--validation", path,
                     "--out", str(out), "--epochs", "2", "--no-progress"]) == 0
        preds[name] = (out / "predictions.jsonl").read_text()
    assert len(set(preds.values())) == 1 and preds["jsonl"]
    capsys.readouterr()
    assert main(["finetune", "classify", "--model", model, "--train", str(tmp_path / "none.parquet"), "--validation",
                 sources["parquet"], "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: data file not found")


@pytest.mark.parametrize("case,message", [
    ("no_label_column", "no label column 'label'"),
    ("unseen_label", "label 'maybe' \\(row 2\\) was never seen in training"),
    ("bad_json", "bad.jsonl:2: not valid JSON"),
    ("missing_model", "model directory not found"),
    ("empty", "is empty|has no rows"),
    ("real_labels", "the labels are real numbers \\(0.5, 1.7\\.\\.\\.\\), not classes"),  # (no regression)
    ("carriage_return", "cr.tsv:2: new-line character seen in unquoted field"),
])
def test_bad_input(case, message, tmp_path, capsys):
    import re

    model = tiny_model_dir(tmp_path / "m", ["good movie", "bad film"] * 5, vocab_size=50, kind="wordlevel")
    good = tmp_path / "good.jsonl"
    good.write_text('{"text": "good movie", "label": "pos"}\n{"text": "bad film", "label": "neg"}\n')
    train, val = good, good
    if case == "no_label_column":
        train = tmp_path / "nolabel.jsonl"
        train.write_text('{"text": "good movie", "stars": 5}\n')
    elif case == "unseen_label":
        val = tmp_path / "val.jsonl"
        val.write_text('{"text": "good movie", "label": "pos"}\n{"text": "meh", "label": "maybe"}\n')
    elif case == "bad_json":
        train = tmp_path / "bad.jsonl"
        train.write_text('{"text": "good movie", "label": "pos"}\n{"text": "oops"\n')
    elif case == "missing_model":
        model = str(tmp_path / "nomodel")
    elif case == "empty":
        train = tmp_path / "empty.tsv"
        train.write_text("")
    elif case == "carriage_return":  # (a lone \r inside a field: csv's own error)
        train = tmp_path / "cr.tsv"
        train.write_text("sentence\tlabel\nold mac\rline\tpos\n", newline="")
    elif case == "real_labels":
        train = val = tmp_path / "scores.jsonl"
        train.write_text('{"text": "good movie", "label": 1.7}\n{"text": "bad film", "label": 0.5}\n')
    out = tmp_path / "out"
    rc = main(["finetune", "classify", "--model", model, "--train", str(train), "--validation", str(val), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and re.search(message, err[0]), err
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".out")]


def test_freeze_embeddings_keeps_the_word_embeddings(tmp_path, capsys):
    from safetensors.torch import load_file

    rows = [("good fun", "pos"), ("bad mess", "neg")] * 8
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": a, "label": b}) + "\n" for a, b in rows))
    model = tiny_model_dir(tmp_path / "m", [r[0] for r in rows], vocab_size=30, kind="wordlevel")
    key = "bert.embeddings.word_embeddings.weight"
    for frozen in (True, False):
        out = tmp_path / f"out-{frozen}"
        args = ["--quiet", "finetune", "classify", "--model", model, "--train", str(tmp_path / "t.jsonl"),
                "--validation", str(tmp_path / "t.jsonl"), "--out", str(out), "--epochs", "2", "--lr", "1e-3", "--no-progress"]
        assert main(args + (["--freeze-embeddings"] if frozen else [])) == 0
        same = torch.equal(load_file(out / "model.safetensors")[key], load_file(f"{model}/model.safetensors")[key])
        assert same == frozen
    capsys.readouterr()


def test_text_columns_must_hold_text_and_labels_may_be_numbers(tmp_path):
    from bertforge.tasks.classify import ClassifyConfig
    from bertforge.errors import UserError
    from bertforge.tasks.classify import read_table, resolve_columns

    (tmp_path / "ok.jsonl").write_text('{"text": "good movie", "label": 1}\n{"text": "bad film", "label": 0}\n')
    rows = read_table(str(tmp_path / "ok.jsonl"))
    assert resolve_columns(rows, ClassifyConfig(), "ok.jsonl") == ("text", None, "label")
    assert [r["label"] for r in rows] == ["1", "0"]  # label names, as a TSV gives them
    (tmp_path / "numbers.jsonl").write_text('{"text": "good movie", "label": 1}\n{"text": 5, "label": 0}\n')
    with pytest.raises(UserError, match="numbers.jsonl: record 2: 'text' must be text, not int 5"):
        resolve_columns(read_table(str(tmp_path / "numbers.jsonl")), ClassifyConfig(), "numbers.jsonl")
    with pytest.raises(UserError, match="record 1: 'text' must be text, not list"):
        resolve_columns([{"text": ["a"], "label": "x"}], ClassifyConfig(), "rows")


def test_evaluate_and_predict_read_the_columns_the_model_was_trained_on(tmp_path, capsys):
    """After `finetune classify --text-column review --label-column sentiment`, `evaluate classify` and `predict
    classify --input` read those columns without being told (issue 67, item 5); a flag still wins."""
    rows = [("a fine film", "pos"), ("a dull film", "neg"), ("great fun", "pos"), ("awful mess", "neg")] * 5
    (tmp_path / "reviews.csv").write_text("id,review,sentiment\n" + "".join(f"{i},{t},{y}\n"
                                                                          for i, (t, y) in enumerate(rows)))
    model = tiny_model_dir(tmp_path / "m", [t for t, _ in rows], vocab_size=60, kind="wordlevel")
    out, data = tmp_path / "out", str(tmp_path / "reviews.csv")
    assert main(["--quiet", "finetune", "classify", "--model", model, "--train", data, "--validation", data, "--out",
                 str(out), "--text-column", "review", "--label-column", "sentiment", "--epochs", "1",
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["--quiet", "evaluate", "classify", "--model", str(out), "--data", data]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(
        json.loads((out / "metrics.json").read_text())["accuracy"])
    assert main(["--quiet", "predict", "classify", "--model", str(out), "--input", data, "--json"]) == 0
    assert [r["text"] for r in json.loads(capsys.readouterr().out)] == [t for t, _ in rows]
    assert main(["--quiet", "predict", "classify", "--model", str(out), "--input", data, "--json",
                 "--text-column", "sentiment"]) == 0  # a flag wins
    assert [r["text"] for r in json.loads(capsys.readouterr().out)] == [y for _, y in rows]


def test_glue_pairs_are_read_predicted_and_evaluated_as_pairs(tmp_path, capsys):
    """A table with sentence1 and sentence2 (MRPC, RTE; QNLI's question and sentence, ...) is a pair task without
    being told, as run_glue reads it; predict --input gives each pair to the model, as evaluate does."""
    from bertforge import pipeline

    rows = [("the cat sat", "a cat sits", "1"), ("dogs run fast", "a cat sits", "0"),
            ("birds fly high", "birds fly", "1"), ("fish swim", "cows moo", "0")] * 5
    (tmp_path / "mrpc.tsv").write_text("label\tsentence1\tsentence2\n" + "".join(f"{y}\t{a}\t{b}\n" for a, b, y in rows))
    model = tiny_model_dir(tmp_path / "m", [r[0] for r in rows] + [r[1] for r in rows], vocab_size=100,
                           kind="wordlevel")
    out, data = tmp_path / "out", str(tmp_path / "mrpc.tsv")
    assert main(["--quiet", "finetune", "classify", "--model", model, "--train", data, "--validation", data, "--out",
                 str(out), "--epochs", "1", "--no-progress"]) == 0
    assert json.loads((out / "predictions.jsonl").read_text().splitlines()[0])["text_pair"] == "a cat sits"
    capsys.readouterr()
    (tmp_path / "DEV.TSV").write_text((tmp_path / "mrpc.tsv").read_text())  # (the suffix in capitals)
    ours = pipeline("classify", model=str(out))([a for a, _, _ in rows], [b for _, b, _ in rows])
    for name in (data, str(tmp_path / "DEV.TSV")):
        assert main(["--quiet", "predict", "classify", "--model", str(out), "--input", name, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert [(r["text"], r["text_pair"]) for r in got] == [(a, b) for a, b, _ in rows]
        assert [r["score"] for r in got] == pytest.approx([r["score"] for r in ours], abs=1e-6)
    from bertforge.tasks.classify import ClassifyConfig, read_table, resolve_columns

    (tmp_path / "qnli.tsv").write_text("question\tsentence\tlabel\nwho sat\tthe cat sat\t1\n")
    assert resolve_columns(read_table(str(tmp_path / "qnli.tsv")), ClassifyConfig(), "q")[:2] == ("question",
                                                                                                  "sentence")
    assert resolve_columns(read_table(data), ClassifyConfig(text_column="sentence1"), "m")[:2] == ("sentence1", None)
