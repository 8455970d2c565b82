"""The run's lifecycle on a toy :class:`~bertforge.train.lifecycle.TrainingRun` (a linear regression, no data files, no
BERT): what every command's run inherits, tested once at the seam, in-process and in milliseconds: a signal
stops the run after a whole step with a checkpoint of it, and the run resumed from it ends exactly as the
uninterrupted one; ``save_every`` means the same for every command; a non-finite loss names the last good
checkpoint.  Then the one end-to-end torchrun test of the commands: pretraining and each fine-tuning task that
gathers or groups across processes, two processes against one, in one launch of torchrun
(tests/torchrun_runs.py) so that its start-up is paid once, and in it a fine-tuning run killed under torchrun in a
save (rank 0, the writer), resumed.  The corpus preparation outside any collective is tested with the command
(tests/data/test_prepared.py)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import bertforge.train.lifecycle as lifecycle
from bertforge import checkpoint as ckpt
from bertforge.cli import main
from bertforge.devices import Dist
from bertforge.errors import TrainingError

from ..helpers import torchrun
from ..toy_run import ToyRun, toy_train, weights

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _rows(out) -> list[str]:
    return [line for line in (out / "metrics.jsonl").read_text().splitlines() if '"elapsed"' not in line]


@pytest.fixture(autouse=True)
def _python_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_signal_saves_the_step_and_the_resumed_run_ends_as_the_uninterrupted_one(tmp_path):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for out in (straight, stopped):
        out.mkdir()
    run = ToyRun(straight, toy_train())
    run.fit()
    assert [s for s, _ in ckpt.list_checkpoints(str(straight))] == [4, 8]  # (the last: the command's own)
    assert run.evaluations == [5, 10, 12]

    with pytest.raises(TrainingError, match="interrupted at step 6 by SIGINT; saved a checkpoint of it"):
        ToyRun(stopped, toy_train(), signal_at=6).fit()
    assert [s for s, _ in ckpt.list_checkpoints(str(stopped))] == [4, 6]
    resumed = ToyRun(stopped, toy_train())
    resumed.restore()
    assert resumed.engine.state.step == 6 and resumed.position == 6
    resumed.fit()
    assert resumed.engine.state.step == 12
    assert torch.equal(resumed.engine.objective.model.weight, run.engine.objective.model.weight)
    assert _rows(stopped) == _rows(straight)  # every logged row and evaluation, as if never stopped


def test_save_every_is_steps_or_the_clock_and_zero_saves_nothing_before_the_end(tmp_path, monkeypatch):
    saved: list[int] = []
    save = ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint", lambda out, step, *a, **k: saved.append(step) or save(out, step, *a,
                                                                                                        **k))
    for every, expected in ((4, [4, 8]), (0, []), (None, list(range(1, 12)))):
        out = tmp_path / str(every)
        out.mkdir()
        monkeypatch.setattr(lifecycle, "SAVE_INTERVAL", 0)  # None: by the clock, due after every step
        saved.clear()
        ToyRun(out, toy_train(save_every=every)).fit()
        assert saved == expected, every


def test_a_non_finite_loss_names_the_last_good_checkpoint(tmp_path):
    (tmp_path / "o").mkdir()
    run = ToyRun(tmp_path / "o", toy_train(max_grad_norm=1e30), lr=1e30)  # diverges within a few steps
    with pytest.raises(TrainingError, match="the loss is not finite at step"):
        run.fit()


def test_a_second_training_run_in_the_same_process_is_refused(tmp_path):
    """Found by hostile testing: two runs from two threads of the API changed each other's weights (one global
    random state) and shared one log. While one runs, another is refused before it writes anything."""
    from bertforge.api import run_pretraining
    from bertforge.errors import UserError

    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat. It was warm. A dog ran in the park. The sun was up.\n" * 20)
    with lifecycle.ONE_RUN:  # as while another thread's run goes on
        with pytest.raises(UserError, match="another training run is going on in this process"):
            run_pretraining(str(tmp_path / "o"), data=[str(corpus)], preset="tiny", max_steps=1, vocab_size=100)
    assert not (tmp_path / "o").exists()


class VirtualClock:
    """The run's clock without the host's speed: time passes only while the toy sleeps (its steps, evaluations)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_timed_run_ends_on_time_with_its_final_evaluation_and_no_steps_in_the_learning_rate(tmp_path,
                                                                                              monkeypatch):
    """--max-time bounds the whole run, and the time its evaluations take shortens what is left of the
    learning rate's decay instead of cutting it in steps (an evaluation here costs as much as 30 steps)."""
    import bertforge.train.engine

    from .. import toy_run

    clock = VirtualClock()
    for module in (lifecycle, bertforge.train.engine, toy_run):
        monkeypatch.setattr(module, "time", clock)
    (tmp_path / "o").mkdir()
    run = ToyRun(tmp_path / "o", toy_train(max_steps=None, max_time=2.0, eval_every=50, save_every=0),
                 pace=0.01, eval_pace=0.3)
    t0 = clock.now
    run.fit()
    took = clock.now - t0
    assert 2.0 - 1e-6 <= took <= 2.0 + 0.01 + 1e-6, took  # to a step; the final evaluation alone would add 15%
    assert len(run.evaluations) >= 2 and run.evaluations[-1] == run.engine.state.step
    rows = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    lr = [r["lr"] for r in rows if r["type"] == "train"]
    falls = [a - b for a, b in zip(lr, lr[1:])]
    assert min(falls) >= 0 and lr[-1] < 0.05 * lr[0]
    assert max(falls) <= 4 * sorted(falls)[len(falls) // 2], falls  # an evaluation's 0.3 s would be a 30x fall


def test_a_timed_run_resumed_goes_on_with_the_share_of_its_budget_used(tmp_path):
    """Found in review: a checkpoint kept a timed run's progress but resuming read it back as 0, so the learning
    rate started its decay (and warm-up) over again."""
    (tmp_path / "o").mkdir()
    timed = toy_train(max_steps=None, max_time=60.0, save_every=0, eval_every=0)
    stopped = ToyRun(tmp_path / "o", timed, signal_at=6, pace=0.05)
    with pytest.raises(TrainingError, match="interrupted at step 6"):
        stopped.fit()
    used = stopped.engine.state.time_progress
    assert used > 0
    resumed = ToyRun(tmp_path / "o", timed)
    resumed.restore()
    assert resumed.engine.state.time_progress == used and resumed.engine.lr() == stopped.engine.lr()


class _SecondProcess(Dist):
    """Rank 1 of two, whose all-reduce adds rank 0's figures (``theirs``) to its own."""

    def __init__(self, theirs: list[float]):
        super().__init__(rank=1, world=2)
        self.theirs = theirs

    def all_sum(self, values: list[float], device) -> list[float]:
        return [a + b for a, b in zip(values, self.theirs)]


def test_a_timed_runs_progress_and_its_skipped_evaluation_are_rank_0s_on_every_process(tmp_path):
    """Every decision of a timed run that a clock makes travels in the step's one all-reduce: another process
    takes rank 0's share of the budget used, and skips an evaluation when rank 0 does (each by its own clock,
    one process would wait in an evaluation's barrier that the other skipped)."""
    (tmp_path / "o").mkdir()
    run = ToyRun(tmp_path / "o", toy_train(max_steps=None, max_time=60.0, save_every=0))
    run.d = _SecondProcess([0.0, 0.0, 0.25, 1.0])  # rank 0: a quarter of the budget used, too near the end
    assert run._agree(lifecycle.StopSignals(), 0.01) == (False, False, True)
    assert run.engine.state.time_progress == 0.25
    run.d = _SecondProcess([0.0, 0.0, 0.5, 0.0])
    assert run._agree(lifecycle.StopSignals(), 0.01) == (False, False, False)
    assert run.engine.state.time_progress == 0.5


def _toy(out, *flags: str, env: dict | None = None, under: list[str] | None = None) -> subprocess.CompletedProcess:
    """The toy run as a command of its own: in one process, or ``under`` torchrun."""
    start = under or [sys.executable]
    return subprocess.run([*start, "-m", "tests.toy_run", str(out), *flags], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.slow
def test_a_kill_at_any_instant_of_a_save_resumes_to_the_uninterrupted_run(tmp_path):
    """SIGKILL (a power cut) at each write and rename of the second checkpoint: the run resumed from what is left
    (the first checkpoint, or the second whole) ends exactly as the run never killed."""
    (tmp_path / "straight").mkdir()
    straight = ToyRun(tmp_path / "straight", toy_train())
    straight.fit()
    # a checkpoint is four files written in a folder of its own, then the folder renamed into place
    second = "checkpoints/step-00000008"
    files = ("model.safetensors", "optimizer.pt", "trainer_state.pt", "trainer_state.json")
    for fault in (*(f"write:{second}/{name}" for name in files), f"rename:{second}"):
        out = tmp_path / fault.replace(":", "-").replace("/", "-")
        r = _toy(out, env={"BERTFORGE_FAULT": fault})
        assert r.returncode == -signal.SIGKILL, (fault, r.stderr[-2000:])
        assert [s for s, _ in ckpt.list_checkpoints(str(out))] == ([4, 8] if fault.startswith("rename") else [4]), fault
        resumed = ToyRun(out, toy_train())
        resumed.restore()
        resumed.fit()
        assert weights(resumed) == weights(straight), fault
        assert _rows(out) == _rows(tmp_path / "straight"), fault


@pytest.mark.slow
def test_under_torchrun_a_signal_to_one_process_stops_both_and_the_resumed_run_ends_as_one_process(tmp_path):
    """Two processes, each with half of every batch: SIGINT to rank 0 stops both after the same step with one
    checkpoint of it; resumed under torchrun, the run ends as one process with the whole batches does."""
    (tmp_path / "one").mkdir()
    one = ToyRun(tmp_path / "one", toy_train())
    one.fit()
    out = tmp_path / "two"
    r = _toy(out, "--signal-at", "6", under=torchrun(2))
    assert r.returncode != 0 and [s for s, _ in ckpt.list_checkpoints(str(out))] == [4, 6], r.stderr[-3000:]
    assert r.stderr.count("error: interrupted at step 6") == 2, r.stderr[-3000:]
    r = _toy(out, "--resume", under=torchrun(2))
    assert r.returncode == 0, r.stderr[-3000:]
    two = json.loads((out / "weights.json").read_text())
    assert max(abs(a - b) for a, b in zip(two, weights(one))) < 1e-6
    ra, rb = (_rows(tmp_path / "one"), _rows(out))
    assert [json.loads(x)["step"] for x in ra] == [json.loads(x)["step"] for x in rb]


def test_a_fault_point_is_named_by_what_is_written(monkeypatch):
    """``BERTFORGE_FAULT=EVENT:NAME[:N]`` kills at the N-th point EVENT whose name ends with NAME (a glob per
    component), and at no other."""
    import bertforge.atomic as atomic

    killed = []
    monkeypatch.setattr(atomic.os, "kill", lambda pid, sig: killed.append(sig))
    points = [("write", "/o/checkpoints/step-00000004/optimizer.pt"), ("rename", "/o/checkpoints/step-00000004"),
              ("write", "/o/checkpoints/step-00000008/optimizer.pt"), ("rename", "/o/config.json"),
              ("rename", "/o/checkpoints/step-00000008")]
    for spec, at in [("write:step-00000008/optimizer.pt", 2), ("rename:checkpoints/step-*:2", 4),
                     ("write:optimizer.pt", 0), ("rename:config.json", 3), ("rename:step-00000004/x", None),
                     ("write:s/optimizer.pt", None), ("aside:step-00000008", None)]:
        monkeypatch.setenv("BERTFORGE_FAULT", spec)
        atomic._FAULT_COUNTS.clear()
        hits = []
        for i, (event, name) in enumerate(points):
            atomic.fault_point(event, name)
            if killed:
                hits.append(i)
                killed.clear()
        assert hits == ([] if at is None else [at]), spec


# ------------------------------------------------------------------ every command under torchrun, one launch
def _weights(out) -> dict:
    return load_file(os.path.join(out, "model.safetensors"))


def _run_rows(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def _losses(out) -> list[float]:
    return [x["loss"] for x in _run_rows(out) if x["type"] == "train"]


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
    from .test_finetune import RESUMABLE
    from .test_finetune import _args as classify_args
    from .test_finetune import _rows as classify_rows
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

    # the same task killed under torchrun in the middle of its third checkpoint (rank 0, the writer, at step 9),
    # then resumed in the launch: both processes stopped, the half-written checkpoint never published, and the
    # resumed run ends as one process does
    kl_one, kl_two = tmp_path / "kl-one", tmp_path / "kl-two"
    assert main(classify_args(ft, kl_one, *RESUMABLE, model="dropout-model")) == 0
    r = subprocess.run([*torchrun(2), "-m", "bertforge", *classify_args(ft, kl_two, *RESUMABLE, model="dropout-model")],
                       env={**os.environ, "BERTFORGE_FAULT": "write:step-00000009/optimizer.pt"}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and [s for s, _ in ckpt.list_checkpoints(str(kl_two))] == [6], r.stderr[-3000:]
    two(classify_args(ft, kl_two, *RESUMABLE, "--resume", model="dropout-model"))

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
                       text=True, timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-12000:]

    _same(pt_one, pt_accum, 1e-5, None)
    _same(pt_one, pt_two, 1e-5, 6)
    assert not (pt_two / "pt-two").exists() and len(list((pt_two / "checkpoints").iterdir())) == 1  # one writer

    assert r.stderr.count("error: data path not found") == 1, r.stderr[-4000:]
    assert r.stderr.count("pretraining BertForPreTraining") == 1 and r.stderr.count("done: ") == 1, r.stderr[-4000:]
    m = json.loads((timed / "metrics.json").read_text())
    # the end reached together (no process left waiting), past an evaluation: a slow host makes 10 steps in 4 s
    assert m["wall_seconds"] <= 4 + 1.5 and m["steps"] > 2
    assert any(x["type"] == "eval" and x["step"] == 2 for x in _run_rows(timed))

    for other in (cl_accum, cl_two):
        _same(cl_one, other, 1e-5, 6)
    assert json.loads((cl_two / "finetune_config.json").read_text())["processes"] == 2
    a, b = _weights(kl_one), _weights(kl_two)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    ra, rb = classify_rows(kl_one), classify_rows(kl_two)
    assert [(x["type"], x["step"]) for x in ra] == [(x["type"], x["step"]) for x in rb]
    assert all(abs(x.get("loss", 0) - y.get("loss", 0)) < 1e-5 for x, y in zip(ra, rb))
    assert not (kl_two / "checkpoints").exists()
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

