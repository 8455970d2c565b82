"""Hostile input, table-driven: every case ends with one ``error:`` line and exit status 2, and leaves the
file system as it was (every file there before is intact, nothing half-written appears)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from bertforge.cli import main

from ..helpers import SENTENCES, tiny_model_dir, tiny_pretrain


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> pathlib.Path:
    """Inputs every case may use, and outputs of earlier runs that must survive."""
    w = tmp_path_factory.mktemp("world")
    (w / "corpus.txt").write_text("\n\n".join(SENTENCES) + "\n")
    (w / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in SENTENCES))
    tiny_model_dir(w / "model", SENTENCES, vocab_size=40, kind="wordlevel")
    assert main(["--quiet", "tokenizer", "train", "--input", str(w / "corpus.txt"), "--vocab-size", "12",
                 "--model", "wordlevel", "--min-frequency", "1", "--out", str(w / "tok")]) == 0
    (w / "notes").mkdir()
    (w / "notes" / "mine.txt").write_text("a user's own file\n")
    (w / "file.txt").write_text("a user's own file\n")
    rows = [{"text": "good movie", "label": "pos"}, {"text": "bad film", "label": "neg"}]
    (w / "cls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (w / "nolabel.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps({"text": "bad film"}) + "\n")
    (w / "nulllabel.jsonl").write_text(json.dumps(rows[0]) + "\n" + json.dumps({"text": "bad film", "label": None}) + "\n")
    ctx = "The cat sat on the mat."
    qas = [{"id": "q1", "question": "Where did the cat sit?", "answers": [{"text": "the mat", "answer_start": 15}]}]
    squad = {"data": [{"title": "t", "paragraphs": [{"context": ctx, "qas": qas}]}]}
    (w / "squad.json").write_text(json.dumps(squad))
    bad = json.loads(json.dumps(squad))
    bad["data"][0]["paragraphs"][0]["context"] = None
    (w / "squad-null-context.json").write_text(json.dumps(bad))
    bad = json.loads(json.dumps(squad))
    bad["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = "fifteen"
    (w / "squad-bad-start.json").write_text(json.dumps(bad))
    bad = json.loads(json.dumps(squad))
    bad["data"][0]["paragraphs"][0]["qas"][0]["question"] = None
    (w / "squad-null-question.json").write_text(json.dumps(bad))
    (w / "preds.json").write_text(json.dumps({"q1": "the mat"}))
    (w / "run.yaml").write_text("lr: abc\n")
    (w / "broken.yaml").write_text("a: [\n")
    (w / "recipe.yaml").write_text("recipe: [budget]\n")
    assert main(["--quiet", *tiny_pretrain(w / "corpus.jsonl", w / "run", "--eval-every", "0", "--max-eval-instances", "4",
                                           tokenizer=w / "model", batch=4, steps=1)]) == 0  # an earlier pretraining output ...
    (w / "run" / "book.jsonl").write_text((w / "corpus.jsonl").read_text())  # ... where the user keeps a corpus
    (w / "corrupt").mkdir()
    for name in os.listdir(w / "model"):
        (w / "corrupt" / name).write_bytes((w / "model" / name).read_bytes())
    (w / "corrupt" / "model.safetensors").write_bytes((w / "model" / "model.safetensors").read_bytes()[:300])
    (w / "mismatch").mkdir()  # a model directory whose tokenizer is smaller than its vocabulary
    for name in os.listdir(w / "model"):
        src = w / ("tok" if name in os.listdir(w / "tok") and name != ".bertforge" else "model") / name
        (w / "mismatch" / name).write_bytes(src.read_bytes())
    _config_files(w)
    return w


def _config_files(w: pathlib.Path) -> None:
    """Model folders whose config.json or modules.json holds a value of the wrong kind, and retrieval files with
    nothing to score (found by hostile testing)."""
    config = json.loads((w / "model" / "config.json").read_text())
    for name, change in {"label2id-text": {"label2id": {"a": "x"}}, "id2label-gap": {"id2label": {"0": "a", "5": "b"}},
                         "arch-5": {"architectures": 5}}.items():
        (w / name).mkdir()
        for f in os.listdir(w / "model"):
            (w / name / f).write_bytes((w / "model" / f).read_bytes())
        (w / name / "config.json").write_text(json.dumps({**config, **change}))
    from tokenizers import Tokenizer

    from bertforge import BertConfig, BertForSequenceClassification

    one = BertConfig.preset("tiny", vocab_size=config["vocab_size"], id2label={0: "LABEL_0"})  # a reranker's one score
    BertForSequenceClassification(one).save_pretrained(str(w / "st-text"),
                                                       tokenizer=Tokenizer.from_file(str(w / "model" / "tokenizer.json")))
    reranker = json.loads((w / "st-text" / "config.json").read_text())
    (w / "st-text" / "config.json").write_text(json.dumps({**reranker, "sentence_transformers": "abc"}))
    modules = [{"type": "sentence_transformers.models.Transformer", "path": ""},
               {"type": "sentence_transformers.models.Pooling", "path": 5}]
    (w / "arch-5" / "modules.json").write_text(json.dumps(modules))
    (w / "pairs.jsonl").write_text(json.dumps({"query": "a cat", "positive": "the cat sat", "negative": "a dog"}) + "\n")
    (w / "blank.txt").write_text("   \n\n")
    (w / "labels-no-header.tsv").write_text("a cat\tthe cat sat\t1\na cat\ta dog\t0\n")
    (w / "beir" / "qrels").mkdir(parents=True)
    (w / "beir" / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "the cat sat"}) + "\n")
    (w / "beir" / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "   "}) + "\n")
    (w / "beir" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")


def snapshot(*roots: pathlib.Path) -> dict[str, tuple[int, int] | str]:
    """Every file (size, modification time) and folder under ``roots``, but the tokenized-corpus cache
    (``BERTFORGE_CACHE``, a cache by design, written before the data's size is known)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "folder"
        for root in roots for p in sorted(root.rglob("*")) if "cache" not in p.relative_to(root).parts[:1]
    }


PRETRAIN = ["pretrain", "--data", "{w}/corpus.jsonl", "--tokenizer", "{w}/tok", "--preset", "tiny", "--max-seq-length", "32",
            "--batch-size", "4", "--no-progress"]
CLASSIFY = ["finetune", "classify", "--model", "{w}/model", "--train", "{w}/cls.jsonl", "--validation", "{w}/cls.jsonl",
            "--no-progress"]
TOKENIZER = ["tokenizer", "train", "--input", "{w}/corpus.txt", "--vocab-size", "30", "--model", "wordlevel"]

CASES = [
    # outputs that must never be replaced or removed
    ("tokenizer-out-cwd", [*TOKENIZER, "--out", "."], "already exists and holds files"),
    ("tokenizer-out-empty", [*TOKENIZER, "--out", ""], "must name a folder"),
    ("tokenizer-out-model", [*TOKENIZER, "--out", "{w}/model"], "already exists"),
    ("tokenizer-out-file", [*TOKENIZER, "--out", "{w}/file.txt"], "exists and is not a folder"),
    ("tokenizer-out-own-no-flag", [*TOKENIZER, "--out", "{w}/tok"], "pass --overwrite to replace it"),
    ("tokenizer-overwrite-foreign", [*TOKENIZER, "--out", "{w}/notes", "--overwrite"], "replaces only a tokenizer output"),
    ("tokenizer-overwrite-model", [*TOKENIZER, "--out", "{w}/tok", "--overwrite", "--input", "{w}/missing.txt"], "data path not found"),
    ("pretrain-out-foreign", [*PRETRAIN, "--max-steps", "2", "--out", "{w}/notes"], "already exists and holds files"),
    ("pretrain-out-file", [*PRETRAIN, "--max-steps", "2", "--out", "{w}/file.txt"], "exists and is not a folder"),
    ("pretrain-out-empty", [*PRETRAIN, "--max-steps", "2", "--out", ""], "--out is required"),
    ("pretrain-overwrite-foreign", [*PRETRAIN, "--max-steps", "2", "--out", "{w}/model", "--overwrite"], "replaces only a pretrain output"),
    ("pretrain-resume-and-overwrite", ["pretrain", "--out", "{w}/model", "--resume", "--overwrite"], "give one of them"),
    ("finetune-out-existing", [*CLASSIFY, "--out", "{w}/notes"], "already exists"),
    ("finetune-overwrite-foreign", [*CLASSIFY, "--out", "{w}/model", "--overwrite"], "replaces only a finetune output"),
    ("write-predictions-existing", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model",
                                    "--write-predictions", "{w}/file.txt"], "already exists; pass --overwrite"),
    # values
    ("max-steps-0", [*PRETRAIN, "--max-steps", "0", "--out", "{t}/o"], "--max-steps must be positive"),
    ("max-steps-negative", [*PRETRAIN, "--max-steps", "-5", "--out", "{t}/o"], "--max-steps must be positive"),
    ("max-time-0", [*PRETRAIN, "--max-time", "0", "--out", "{t}/o"], "--max-time must be positive"),
    ("max-grad-norm-negative", [*PRETRAIN, "--max-steps", "2", "--max-grad-norm", "-1", "--out", "{t}/o"], "--max-grad-norm must be positive"),
    ("lr-nan", [*PRETRAIN, "--max-steps", "2", "--lr", "nan", "--out", "{t}/o"], "--lr must be a finite number"),
    ("lr-inf", [*PRETRAIN, "--max-steps", "2", "--lr", "inf", "--out", "{t}/o"], "--lr must be a finite number"),
    ("dropout-2", [*PRETRAIN, "--max-steps", "2", "--dropout", "2", "--out", "{t}/o"], "--dropout must be in \\[0, 1\\)"),
    ("batch-size-0", [*PRETRAIN, "--max-steps", "2", "--batch-size", "0", "--out", "{t}/o"], "--batch-size must be positive"),
    ("warmup-ratio-1.5", [*PRETRAIN, "--max-steps", "2", "--warmup-ratio", "1.5", "--out", "{t}/o"], "--warmup-ratio must be in"),
    ("mask-prob-0", [*PRETRAIN, "--max-steps", "2", "--mask-prob", "0", "--out", "{t}/o"], "--mask-prob must be in \\(0, 1\\)"),
    ("seed-negative", [*PRETRAIN, "--max-steps", "2", "--seed", "-1", "--out", "{t}/o"], "--seed must be zero or more"),
    ("grad-accum-not-dividing", [*PRETRAIN, "--max-steps", "2", "--grad-accum", "3", "--out", "{t}/o"], "multiple of --grad-accum"),
    ("config-lr-string", [*PRETRAIN, "--max-steps", "2", "--config", "{w}/run.yaml", "--out", "{t}/o"], "--lr must be a number"),
    ("epochs-0", [*CLASSIFY, "--epochs", "0", "--out", "{t}/o"], "--epochs must be positive"),
    ("finetune-lr-negative", [*CLASSIFY, "--lr", "-1", "--out", "{t}/o"], "--lr must be positive"),
    ("finetune-batch-0", [*CLASSIFY, "--batch-size", "0", "--out", "{t}/o"], "--batch-size must be positive"),
    ("top-k-negative", ["predict", "fill-mask", "--model", "{w}/model", "--top-k", "-1", "a [MASK]"], "--top-k: must be positive"),
    ("predict-batch-0", ["predict", "classify", "--model", "{w}/model", "--batch-size", "0", "x"], "--batch-size: must be positive"),
    ("tokenizer-vocab-0", [*TOKENIZER[:-4], "--vocab-size", "0", "--out", "{t}/o"], "--vocab-size: must be positive"),
    ("doc-stride-negative", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model", "--doc-stride", "-3"], "--doc-stride must be zero or more"),
    # a model and a tokenizer that do not belong together
    ("init-other-tokenizer", ["pretrain", "--data", "{w}/corpus.txt", "--init", "{w}/model", "--tokenizer", "{w}/tok",
                              "--max-steps", "2", "--out", "{t}/o", "--no-progress"], "do not belong together"),
    ("predict-smaller-tokenizer", ["predict", "fill-mask", "--model", "{w}/mismatch", "a [MASK]"], "do not belong together"),
    ("finetune-smaller-tokenizer", [*CLASSIFY[:3], "{w}/mismatch", *CLASSIFY[4:], "--out", "{t}/o"], "do not belong together"),
    # malformed records name the file, the record and the field
    ("squad-null-context", ["evaluate", "squad", "--data", "{w}/squad-null-context.json", "--predictions", "{w}/preds.json"],
     "paragraphs\\[0\\]: 'context' must be a string, not null"),
    ("squad-null-question", ["evaluate", "squad", "--data", "{w}/squad-null-question.json", "--predictions", "{w}/preds.json"],
     "qas\\[0\\] \\(id q1\\): 'question' must be a string"),
    ("squad-answer-start-text", ["evaluate", "squad", "--data", "{w}/squad-bad-start.json", "--predictions", "{w}/preds.json"],
     "answers\\[0\\]: 'answer_start' must be an integer, not str"),
    ("classify-record-without-label", [*CLASSIFY[:4], "--train", "{w}/nolabel.jsonl", "--validation", "{w}/cls.jsonl",
                                       "--out", "{t}/o"], "nolabel.jsonl: record 2 has no 'label' field"),
    ("predict-corrupt-weights", ["predict", "fill-mask", "--model", "{w}/corrupt", "a [MASK]"], "cannot read"),
    ("resume-nothing", ["pretrain", "--out", "{t}/o", "--resume"], "nothing to resume"),
    # found by hostile testing
    ("write-predictions-overwrite-foreign", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model",
                                            "--write-predictions", "{w}/file.txt", "--overwrite"], "replaces only a predictions file"),
    ("write-predictions-over-the-data", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model",
                                         "--write-predictions", "{w}/squad.json", "--overwrite"], "is one of the inputs"),
    ("pretrain-overwrite-own-output-holding-data", [*PRETRAIN[:2], "{w}/run/book.jsonl", *PRETRAIN[3:], "--max-steps", "2",
                                                    "--out", "{w}/run", "--overwrite"], "also holds files bertforge did not write \\(book.jsonl\\)"),
    ("pretrain-batch-larger-than-the-data", [*PRETRAIN, "--max-steps", "2", "--batch-size", "100000", "--out", "{t}/o"],
     "fewer than one batch of 100000"),
    ("config-recipe-list", [*PRETRAIN, "--max-steps", "2", "--config", "{w}/recipe.yaml", "--out", "{t}/o"], "--recipe must be one of"),
    ("recipe-unknown", [*PRETRAIN, "--max-steps", "2", "--recipe", "roberta", "--out", "{t}/o"], "invalid choice"),
    ("electra-with-nsp", [*PRETRAIN, "--max-steps", "2", "--objective", "electra", "--nsp", "--out", "{t}/o"], "without next sentence"),
    ("generator-size-1", [*PRETRAIN, "--max-steps", "2", "--objective", "electra", "--generator-size", "1", "--out", "{t}/o"],
     "--generator-size must be in \\(0, 1\\)"),
    ("config-yaml-syntax", [*PRETRAIN, "--max-steps", "2", "--config", "{w}/broken.yaml", "--out", "{t}/o"], "cannot parse config file"),
    ("evaluate-model-without-qa-head", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model"],
     "has no trained question-answering head"),
    ("evaluate-mlm-corrupt-weights", ["evaluate", "mlm", "--model", "{w}/corrupt", "--data", "{w}/corpus.txt"], "cannot read"),
    ("evaluate-mlm-text-too-short", ["evaluate", "mlm", "--model", "{w}/model", "--data", "{w}/corpus.txt", "--max-seq-length",
                                     "512"], "fewer than one block of 510"),
    ("weight-decay-huge", [*CLASSIFY, "--weight-decay", "1e23", "--out", "{t}/o"], "--weight-decay must be in \\[0, 1\\]"),
    # places that cannot be written (a full disk: tests/train/test_write_failures.py)
    ("pretrain-out-parent-file", [*PRETRAIN, "--max-steps", "2", "--out", "{w}/file.txt/o"], "cannot be created: .* is not a folder"),
    ("pretrain-out-grandparent-file", [*PRETRAIN, "--max-steps", "2", "--out", "{w}/file.txt/a/o"], "cannot be created"),
    ("tokenizer-out-parent-file", [*TOKENIZER, "--out", "{w}/file.txt/o"], "cannot be created: .* is not a folder"),
    ("finetune-out-parent-file", [*CLASSIFY, "--out", "{w}/file.txt/o"], "cannot be created: .* is not a folder"),
    ("pretrain-cache-dir-file", [*PRETRAIN, "--max-steps", "2", "--cache-dir", "{w}/file.txt", "--out", "{t}/o"],
     "tokenized-corpus cache .*file.txt is not a folder; choose another with --cache-dir"),
    # a resumed run keeps what it trains (by the corpus's content: tests/train/test_resume.py)
    ("resume-other-preset", ["pretrain", "--out", "{w}/run", "--resume", "--preset", "mini"], "--preset tiny -> mini"),
    ("resume-other-seq-length", ["pretrain", "--out", "{w}/run", "--resume", "--max-seq-length", "64"],
     "--max-seq-length 32 -> 64"),
    ("resume-other-objective", ["pretrain", "--out", "{w}/run", "--resume", "--objective", "electra"],
     "--objective mlm -> electra"),
    # (--data by content: test_resume.py; this run has ended, which is said first)
    ("resume-other-data", ["pretrain", "--out", "{w}/run", "--resume", "--data", "{w}/corpus.txt"],
     "is at step 1 already"),
    ("resume-a-finished-run", ["pretrain", "--out", "{w}/run", "--resume", "--max-steps", "1", "--lr", "0.5"],
     "is at step 1 already; --resume trains on to a larger --max-steps"),
    ("resume-other-tokenizer", ["pretrain", "--out", "{w}/run", "--resume", "--tokenizer", "{w}/tok"],
     "with its own tokenizer, and --tokenizer .*tok' is another; leave --tokenizer out"),
    # readers check what they get (more in test_api.py, whose inputs this world lacks)
    ("pretrain-hf-without-a-name", [*PRETRAIN[:2], "hf:", *PRETRAIN[3:], "--max-steps", "1", "--out", "{t}/o"],
     "data 'hf:': expected hf:NAME\\[:CONFIG\\]\\[@SPLIT\\]"),
    ("tokenizer-hf-empty-config", [*TOKENIZER[:3], "hf:corpus:", *TOKENIZER[4:], "--out", "{t}/o"],
     "data 'hf:corpus:': expected hf:NAME"),
    ("finetune-hf-empty-name", [*CLASSIFY[:4], "--train", "hf:@train", "--validation", "{w}/cls.jsonl", "--out", "{t}/o"],
     "data 'hf:@train': expected hf:NAME"),
    ("evaluate-squad-beyond-positions", ["evaluate", "squad", "--data", "{w}/squad.json", "--model", "{w}/model",
                                         "--max-seq-length", "1024"], "--max-seq-length 1024 exceeds the 512 positions"),
    # run lengths and validation data as a transformers user gives them
    ("pretrain-epochs-0", [*PRETRAIN, "--epochs", "0", "--out", "{t}/o"], "--epochs must be positive"),
    ("pretrain-no-length", [*PRETRAIN, "--out", "{t}/o"], "give --max-steps, --max-time or --epochs"),
    ("finetune-validation-and-split", [*CLASSIFY, "--validation-split", "0.2", "--out", "{t}/o"], "not both"),
    ("finetune-validation-split-1", [*CLASSIFY[:6], "--validation-split", "1", "--out", "{t}/o"],
     "--validation-split must be in \\(0, 1\\)"),
    ("finetune-max-eval-samples-0", [*CLASSIFY, "--max_eval_samples", "0", "--out", "{t}/o"], "must be positive"),
    # found by hostile testing (2)
    ("classify-null-label", [*CLASSIFY[:4], "--train", "{w}/nulllabel.jsonl", "--validation", "{w}/cls.jsonl",
                             "--out", "{t}/o"], "nulllabel.jsonl: record 2: the 'label' field is empty"),
    # the continued-pretraining recipe (issue 38): of a trained model only, and part of what a resumed run keeps
    ("recipe-continue-without-init", [*PRETRAIN, "--max-steps", "2", "--recipe", "continue", "--out", "{t}/o"],
     "--recipe continue continues pretraining a trained model: give --init MODEL"),
    ("resume-other-recipe", ["pretrain", "--out", "{w}/run", "--resume", "--recipe", "continue"],
     "--recipe budget -> continue"),
    # vocabulary extension (issue 38): of --init's WordPiece vocabulary, by a positive number, kept on resume
    ("add-vocab-without-init", [*PRETRAIN, "--max-steps", "1", "--add-vocab", "5", "--out", "{t}/o"],
     "--add-vocab extends the vocabulary of the model that --init names; pass --init MODEL"),
    ("add-vocab-0", ["pretrain", "--data", "{w}/corpus.jsonl", "--init", "{w}/model", "--add-vocab", "0",
                     "--max-steps", "1", "--out", "{t}/o"], "--add-vocab must be positive, not 0"),
    ("add-vocab-word-level", ["pretrain", "--data", "{w}/corpus.jsonl", "--init", "{w}/model", "--add-vocab", "5",
                              "--max-steps", "1", "--no-progress", "--out", "{t}/o"],
     "--add-vocab extends a WordPiece vocabulary; the tokenizer of .*model' is word-level"),
    ("resume-add-vocab", ["pretrain", "--out", "{w}/run", "--resume", "--add-vocab", "5"], "--add-vocab None -> 5"),
    # continued pretraining and --add-vocab: found by hostile testing
    ("init-and-model-config", ["pretrain", "--data", "{w}/corpus.jsonl", "--init", "{w}/model", "--model-config",
                               "{w}/run/config.json", "--max-steps", "1", "--out", "{t}/o"],
     "--model-config '.*run/config.json' describes a new model, and --init '.*model' has its own; give one of them"),
    ("init-whose-tokenizer-is-smaller", ["pretrain", "--data", "{w}/corpus.jsonl", "--init", "{w}/mismatch", "--max-steps", "1",
                                         "--no-progress", "--out", "{t}/o"],
     "--init '.*mismatch': its tokenizer and its model: the tokenizer has 12 tokens .* do not belong together"),
    # values of the wrong kind in a model folder's JSON, and nothing to score (found by hostile testing, 3)
    ("label2id-values-text", ["predict", "embed", "--model", "{w}/label2id-text", "hello"],
     "label2id's values must be label ids \\(integers\\)"),
    ("id2label-ids-with-a-gap", ["predict", "classify", "--model", "{w}/id2label-gap", "good"],
     "id2label's keys must be the ids 0 to 1, not \\[0, 5\\]"),
    ("rerank-activation-not-an-object", ["predict", "rerank", "--model", "{w}/st-text", "--query", "q", "a cat"],
     "config.json's sentence_transformers is 'abc', not an object"),
    ("first-stage-architectures-not-a-list", ["finetune", "rerank", "--model", "{w}/model", "--train",
                                              "{w}/pairs.jsonl", "--negatives", "{w}/arch-5", "--out", "{t}/o"],
     "--negatives .*arch-5: its config.json's architectures is 5, not a list"),
    ("pooling-path-not-text", ["predict", "embed", "--model", "{w}/arch-5", "hello"],
     "modules.json: the Pooling module's path is 5, not a folder's name"),
    ("rerank-blank-passages-only", ["predict", "rerank", "--model", "{w}/model", "--query", "q", "--input",
                                    "{w}/blank.txt"], "blank.txt holds no passage"),
    ("rerank-labels-without-a-header", ["finetune", "rerank", "--model", "{w}/model", "--train",
                                        "{w}/labels-no-header.tsv", "--negatives", "none", "--out", "{t}/o"],
     "every row's third field is a number, .* a labelled file starts with query<TAB>passage<TAB>label"),
    ("export-task-without-check-data", ["export", "onnx", "--model", "{w}/model", "--out", "{t}/o", "--task", "bogus"],
     "--task bogus names the evaluation that --check-data runs: give --check-data FILE too"),
    ("beir-blank-query", ["evaluate", "retrieval", "--model", "bm25", "--data", "{w}/beir"],
     "queries.jsonl: query 'q1' is empty"),
    ("init-without-weights", ["pretrain", "--data", "{w}/corpus.jsonl", "--init", "{w}/tok", "--max-steps", "1",
                              "--no-progress", "--out", "{t}/o"], "no model.safetensors in .*tok$"),
]


@pytest.mark.parametrize("name,argv,message", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(name, argv, message, world, tmp_path, capsys, monkeypatch):
    import re

    monkeypatch.chdir(world)  # "--out ." names the folder holding the user's corpus
    argv = [a.format(w=world, t=tmp_path) for a in argv]
    before = snapshot(world, tmp_path)
    rc = main(["--quiet", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err)
    assert re.search(message, err[0]), err[0]
    after = snapshot(world, tmp_path)
    assert after == before, sorted(set(after.items()) ^ set(before.items()))


def test_overwrite_replaces_only_our_own_output(world, tmp_path, capsys):
    out = tmp_path / "tok"
    base = [*[a.format(w=world) for a in TOKENIZER], "--out", str(out)]
    assert main(["--quiet", *base]) == 0
    first = (out / "vocab.txt").read_text()
    assert main(["--quiet", *base, "--vocab-size", "10"]) == 2  # not without --overwrite
    assert "pass --overwrite" in capsys.readouterr().err
    assert (out / "vocab.txt").read_text() == first
    assert main(["--quiet", *base, "--vocab-size", "10", "--overwrite"]) == 0
    assert (out / "vocab.txt").read_text() != first and len((out / "vocab.txt").read_text().split()) == 10
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no lock or temporary file left
    capsys.readouterr()


def test_a_second_run_on_the_same_output_is_refused(world, tmp_path, capsys):
    from bertforge.outputs import Output

    out = tmp_path / "run"
    with Output(str(out), "pretrain"):  # a first run holds the output
        rc = main(["--quiet", *[a.format(w=world) for a in PRETRAIN], "--max-steps", "2", "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "another bertforge run is writing" in err[0]
        assert not out.exists()
    assert main(["--quiet", *[a.format(w=world) for a in PRETRAIN], "--max-steps", "2", "--out", str(out)]) == 0


def test_squad_questions_without_answers_are_counted_not_fatal(world, tmp_path, capsys):
    data = json.loads((world / "squad.json").read_text())
    data["data"][0]["paragraphs"][0]["qas"].append({"id": "q2", "question": "Who?", "answers": []})
    data["data"][0]["paragraphs"][0]["qas"].append({"id": "q3", "question": "What?"})
    (tmp_path / "s.json").write_text(json.dumps(data))
    assert main(["evaluate", "squad", "--data", str(tmp_path / "s.json"), "--predictions", str(world / "preds.json")]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["questions"] == 1 and res["questions_without_answers"] == 2 and res["exact_match"] == 100.0


def test_a_new_run_that_fails_before_its_first_checkpoint_leaves_nothing(world, tmp_path, capsys, monkeypatch):
    import bertforge.models.bert as model_mod

    real = model_mod.BertEmbeddings.forward

    def poisoned(self, *a, **k):
        x = real(self, *a, **k)
        return x * float("nan") if self.training else x

    monkeypatch.setattr(model_mod.BertEmbeddings, "forward", poisoned)
    out = tmp_path / "run"
    rc = main(["--quiet", *[a.format(w=world) for a in PRETRAIN], "--max-steps", "4", "--save-every", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "not finite at step 1" in err[0]
    assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
