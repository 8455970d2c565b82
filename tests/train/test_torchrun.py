"""Every command under torchrun trains as one process: pretraining and each fine-tuning task that gathers or
groups across processes, two processes against one, in one launch of torchrun (tests/torchrun_runs.py) so that its
start-up is paid once.  What torchrun adds beyond this (a signal to one process, a kill in a save, the corpus
preparation outside any collective) is tested where that promise is kept: test_lifecycle.py, test_finetune.py,
tests/data/test_prepared.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from bertforge.cli import main

from ..helpers import torchrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _weights(out) -> dict:
    return load_file(os.path.join(out, "model.safetensors"))


def _rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def _losses(out) -> list[float]:
    return [x["loss"] for x in _rows(out) if x["type"] == "train"]


def _same(one, other, tol: float, steps: int | None) -> None:
    """``other`` trained as ``one``: weights and (but for ``steps=None``) each of ``steps`` losses within ``tol``."""
    a, b = _weights(one), _weights(other)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < tol, other
    if steps is None:
        return
    la, lb = _losses(one), _losses(other)
    assert len(la) == steps and len(lb) == steps and max(abs(x - y) for x, y in zip(la, lb)) < tol, (other, la, lb)


@pytest.mark.slow
def test_every_command_under_torchrun_trains_as_one_process(small_text_corpus, story_tok_dir, tmp_path, capsys):
    from ..tasks.test_embed import _args as embed_args
    from ..tasks.test_embed import write_setup
    from ..tasks.test_rerank import _base, _squad
    from .test_finetune import _args as classify_args
    from .test_finetune import write_setup as classify_setup
    from .test_pretrain import _args as pretrain_args

    runs: list[dict] = []  # what torchrun runs, each with the status it must end with

    def two(argv: list[str], status: int = 0) -> None:
        runs.append({"argv": argv, "status": status})

    # pretraining, BERT's recipe with dropout and NSP: each sequence's masks keyed by (seed, step, sequence), so
    # two processes, or one accumulating two micro-batches, compute the one-process run
    pt = ["--max-steps", "6", "--eval-every", "0", "--save-every", "0", "--log-every", "1"]
    pt_one, pt_accum, pt_two = tmp_path / "pt-one", tmp_path / "pt-accum", tmp_path / "pt-two"
    assert main(["--quiet", *pretrain_args(small_text_corpus, story_tok_dir, pt_one, *pt)]) == 0
    assert main(["--quiet", *pretrain_args(small_text_corpus, story_tok_dir, pt_accum, *pt, "--grad-accum", "2")]) == 0
    two(["--quiet", *pretrain_args(small_text_corpus, story_tok_dir, pt_two, *pt)])

    # each machine's first process speaks for the others (they meet the same inputs and errors), and a timed run's
    # clock is rank 0's: every process ends at the same step (the only runs here that are not --quiet)
    two(pretrain_args(tmp_path / "missing.txt", story_tok_dir, tmp_path / "no", "--max-steps", "2"), status=2)
    timed = tmp_path / "timed"
    two(pretrain_args(small_text_corpus, story_tok_dir, timed, "--max-time", "4s", "--eval-every", "2"))

    # classification with dropout: batches of 6 from 13 examples, so each epoch's last batch holds one example and
    # the second process has none there (it takes part with a batch that counts for nothing)
    ft = classify_setup(_mkdir(tmp_path / "ft"))
    cl = ["--batch-size", "6", "--max-train-examples", "13", "--epochs", "2", "--log-every", "1"]
    cl_one, cl_accum, cl_two = tmp_path / "cl-one", tmp_path / "cl-accum", tmp_path / "cl-two"
    assert main(classify_args(ft, cl_one, *cl, model="dropout-model")) == 0
    assert main(classify_args(ft, cl_accum, *cl, "--grad-accum", "2", model="dropout-model")) == 0
    two(classify_args(ft, cl_two, *cl, model="dropout-model"))

    # embeddings, in-batch negatives across processes: each gathers the others' vectors, so two processes
    # accumulating two micro-batches each train as one (the last batch of each epoch holds one pair)
    emb = write_setup(_mkdir(tmp_path / "emb"))
    em = ["--batch-size", "6", "--epochs", "2", "--log-every", "1", "--symmetric"]
    em_one, em_two = tmp_path / "em-one", tmp_path / "em-two"
    assert main(embed_args(emb, em_one, *em)) == 0
    two(embed_args(emb, em_two, *em, "--grad-accum", "2"))

    # reranking: an example is a query with its passages (dropout keyed by query and slot); 5 queries in batches of
    # 4, so the second process has none in each epoch's last batch; in fp32, and in bf16, where each process
    # multiplies other row counts than one process does, so bf16's rounding of a product differs where fp32's
    # agreed to 1e-6: within bf16's precision there
    squad, base = _squad(tmp_path / "s.json"), _base(tmp_path / "base")
    rr = ["--quiet", "finetune", "rerank", "--model", base, "--train", squad, "--batch-size", "4", "--epochs", "2",
          "--max-train-examples", "5", "--num-negatives", "2", "--max-seq-length", "32", "--lr", "1e-3",
          "--log-every", "1", "--no-progress", "--seed", "3"]
    for precision in ("fp32", "bf16"):
        one, other = tmp_path / f"rr-{precision}-one", tmp_path / f"rr-{precision}-two"
        assert main([*rr, "--precision", precision, "--out", str(one)]) == 0
        two([*rr, "--precision", precision, "--out", str(other), "--grad-accum", "2"])
    capsys.readouterr()

    (tmp_path / "runs.json").write_text(json.dumps(runs))
    r = subprocess.run([*torchrun(2), "-m", "tests.torchrun_runs", str(tmp_path / "runs.json")], capture_output=True,
                       text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-12000:]

    _same(pt_one, pt_accum, 1e-5, None)
    _same(pt_one, pt_two, 1e-5, 6)
    assert not (pt_two / "pt-two").exists() and len(list((pt_two / "checkpoints").iterdir())) == 1  # one writer

    assert r.stderr.count("error: data path not found") == 1, r.stderr[-4000:]
    assert r.stderr.count("pretraining BertForPreTraining") == 1 and r.stderr.count("done: ") == 1, r.stderr[-4000:]
    m = json.loads((timed / "metrics.json").read_text())
    # the end reached together (no process left waiting), past an evaluation: a slow host makes 10 steps in 4 s
    assert m["wall_seconds"] <= 4 + 1.5 and m["steps"] > 2
    assert any(x["type"] == "eval" and x["step"] == 2 for x in _rows(timed))

    for other in (cl_accum, cl_two):
        _same(cl_one, other, 1e-5, 6)
    assert json.loads((cl_two / "finetune_config.json").read_text())["processes"] == 2
    # and dropout is on: the same model without it ends elsewhere
    shutil.copytree(ft / "dropout-model", tmp_path / "m0")
    c = json.loads((tmp_path / "m0" / "config.json").read_text())
    (tmp_path / "m0" / "config.json").write_text(json.dumps({**c, "hidden_dropout_prob": 0.0,
                                                             "attention_probs_dropout_prob": 0.0}))
    assert main(classify_args(ft, tmp_path / "nodrop", *cl, model=str(tmp_path / "m0"))) == 0  # (an absolute path)
    assert not torch.allclose(_weights(tmp_path / "nodrop")["classifier.weight"], _weights(cl_one)["classifier.weight"],
                              atol=1e-4)

    _same(em_one, em_two, 1e-5, 6)
    _same(tmp_path / "rr-fp32-one", tmp_path / "rr-fp32-two", 1e-5, 4)
    a, b = _weights(tmp_path / "rr-bf16-one"), _weights(tmp_path / "rr-bf16-two")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 5e-3
    la, lb = _losses(tmp_path / "rr-bf16-one"), _losses(tmp_path / "rr-bf16-two")
    assert len(la) == 4 and max(abs(x - y) for x, y in zip(la, lb)) < 2e-3
    saved = json.loads((tmp_path / "rr-bf16-two" / "finetune_config.json").read_text())
    assert saved["finetune"]["impl"]["precision"] == "bf16"
    capsys.readouterr()


def _mkdir(path):
    path.mkdir()
    return path

