"""The fine-tuning runner (finetune.py): steps, accumulation, evaluation every N steps, the few-updates warning."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig, BertForPreTraining
from bertforge.checkpoint import list_checkpoints
from bertforge.cli import main
from bertforge.tokenizer import train_tokenizer

ROWS = [("good fun day", "pos"), ("bad sad mess", "neg"), ("a fine good show", "pos"), ("a dull bad show", "neg"),
        ("fun and good", "pos"), ("sad and dull", "neg"), ("very good", "pos"), ("very bad mess", "neg")] * 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    (d / "t.jsonl").write_text("".join(json.dumps({"text": a, "label": b}) + "\n" for a, b in ROWS))
    tok = train_tokenizer([r[0] for r in ROWS], 40, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)  # no dropout: split and whole batches then make the same update
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    BertForPreTraining(cfg).save_pretrained(str(d / "model"), tokenizer=tok)
    torch.manual_seed(1)  # and one with dropout, whose masks a resumed run must draw as the uninterrupted one
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    BertForPreTraining(cfg).save_pretrained(str(d / "dropout-model"), tokenizer=tok)
    return d


def _args(d, out, *extra, model="model") -> list[str]:
    return ["--quiet", "finetune", "classify", "--model", str(d / model), "--train", str(d / "t.jsonl"), "--validation",
            str(d / "t.jsonl"), "--out", str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", *extra]


def _run(d, out, *extra) -> dict:
    args = ["--quiet", "finetune", "classify", "--model", str(d / "model"), "--train", str(d / "t.jsonl"), "--validation",
            str(d / "t.jsonl"), "--out", str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", *extra]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


def _weights(out) -> dict:
    return load_file(out / "model.safetensors")


def test_gradient_accumulation_makes_the_update_of_the_whole_batch(setup, tmp_path, capsys):
    # 16 examples in batches of 6: the last batch of each epoch holds 4, split in micro-batches too
    whole = _run(setup, tmp_path / "a1", "--batch-size", "6", "--epochs", "2")
    split = _run(setup, tmp_path / "a4", "--batch-size", "6", "--epochs", "2", "--grad-accum", "3")
    smaller = _run(setup, tmp_path / "b2", "--batch-size", "2", "--epochs", "2")  # what accumulation must not be
    a, b, c = _weights(tmp_path / "a1"), _weights(tmp_path / "a4"), _weights(tmp_path / "b2")
    assert all(torch.allclose(a[k], b[k], atol=2e-5, rtol=1e-4) for k in a)
    assert not all(torch.allclose(a[k], c[k], atol=2e-5, rtol=1e-4) for k in a)
    assert whole["epochs"][-1]["step"] == split["epochs"][-1]["step"] == 6 and smaller["epochs"][-1]["step"] == 16
    capsys.readouterr()


def test_max_steps_and_evaluation_every_n_steps(setup, tmp_path, capsys):
    m = _run(setup, tmp_path / "o", "--batch-size", "4", "--max-steps", "7", "--eval-every", "3")
    # 4 steps per epoch: evaluations at step 3, the end of epoch 1 (4), step 6 and the last step (7)
    assert [(e["epoch"], e["step"]) for e in m["epochs"]] == [(1, 3), (1, 4), (2, 6), (2, 7)]
    best = max(m["epochs"], key=lambda e: e["accuracy"])
    assert (m["best_step"], m["accuracy"]) == (best["step"], best["accuracy"])
    rows = [json.loads(x) for x in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if r["type"] == "train") == 7
    card = (tmp_path / "o" / "README.md").read_text()
    assert "7 steps" in card and f"step {m['best_step']}" in card
    # the kept weights are the best evaluation's: evaluating them again gives its accuracy
    assert main(["evaluate", "classify", "--model", str(tmp_path / "o"), "--data", str(setup / "t.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] == pytest.approx(best["accuracy"])


def test_few_updates_are_warned_and_a_batch_that_accumulation_cannot_split_refused(setup, tmp_path, capsys):
    _run(setup, tmp_path / "o", "--batch-size", "8", "--epochs", "1")
    assert "only 2 optimizer updates" in capsys.readouterr().err
    args = ["finetune", "classify", "--model", str(setup / "model"), "--train", str(setup / "t.jsonl"), "--validation",
            str(setup / "t.jsonl"), "--out", str(tmp_path / "p"), "--batch-size", "4", "--grad-accum", "8", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == "error: --batch-size 4 must be a positive multiple of --grad-accum 8"
    assert not (tmp_path / "p").exists()


RESUMABLE = ["--batch-size", "4", "--epochs", "3", "--save-every", "3", "--eval-every", "5", "--log-every", "1"]


def _rows(out) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed"} for r in rows]


def test_sigkill_and_resume_end_with_the_weights_of_the_uninterrupted_run(setup, tmp_path, capsys):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(_args(setup, straight, *RESUMABLE, model="dropout-model")) == 0
    assert not (straight / "checkpoints").exists()  # a finished run keeps no checkpoints
    # killed (SIGKILL, as a power loss) in the middle of its third checkpoint (step 9), the writes counted:
    # step 3 saves 4 files (no evaluation yet), step 6 five (the best evaluation's weights too)
    env = dict(os.environ, BERTFORGE_FAULT="write:12", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "bertforge", *_args(setup, killed, *RESUMABLE, model="dropout-model")],
                          env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [s for s, _ in list_checkpoints(str(killed))] == [3, 6]
    assert main(_args(setup, killed, *RESUMABLE, model="dropout-model")) == 2  # a new run there: refused
    assert "already exists" in capsys.readouterr().err
    assert main(_args(setup, killed, *RESUMABLE, "--lr", "2e-3", "--resume", model="dropout-model")) == 2
    assert "--resume continues the run" in capsys.readouterr().err  # other settings than the checkpoint's: refused
    for other in (["--freeze-embeddings"], []):  # ... before anything is loaded: the checkpoints stay as they are
        other_model = "model" if not other else "dropout-model"
        assert main(_args(setup, killed, *RESUMABLE, "--resume", *other, model=other_model)) == 2
        assert "--resume continues the run" in capsys.readouterr().err
        assert [s for s, _ in list_checkpoints(str(killed))] == [3, 6]
    assert main(_args(setup, killed, *RESUMABLE, "--resume", model="dropout-model")) == 0
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _rows(straight) == _rows(killed)
    m1, m2 = (json.loads((o / "metrics.json").read_text()) for o in (straight, killed))
    assert (m1["best_step"], m1["accuracy"]) == (m2["best_step"], m2["accuracy"])
    assert (straight / "predictions.jsonl").read_text() == (killed / "predictions.jsonl").read_text()
    assert not (killed / "checkpoints").exists()


def test_resume_needs_a_checkpoint(setup, tmp_path, capsys):
    assert main(_args(setup, tmp_path / "none", "--resume")) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_an_interrupted_checkpointed_run_can_be_overwritten(setup, tmp_path, capsys):
    out = tmp_path / "o"
    env = dict(os.environ, BERTFORGE_FAULT="write:6")
    proc = subprocess.run([sys.executable, "-m", "bertforge", *_args(setup, out, *RESUMABLE)], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL and list_checkpoints(str(out))
    (out / "checkpoints" / ".step-00000009.tmp-x").mkdir()  # what a killed save leaves
    assert main(_args(setup, out, *RESUMABLE, "--overwrite")) == 0
    assert (out / "model.safetensors").is_file() and not (out / "checkpoints").exists()
    capsys.readouterr()
