"""The run's lifecycle on a toy :class:`~bertforge.lifecycle.TrainingRun` (a linear regression, no data files, no
BERT): what every command's run inherits, tested once at the seam, in-process and in milliseconds: a signal
stops the run after a whole step with a checkpoint of it, and the run resumed from it ends exactly as the
uninterrupted one; ``save_every`` means the same for every command; a non-finite loss names the last good
checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

import bertforge.lifecycle as lifecycle
from bertforge import checkpoint as ckpt
from bertforge.config import ImplConfig, TrainConfig
from bertforge.devices import Dist
from bertforge.engine import Engine, LinearSchedule
from bertforge.errors import TrainingError
from bertforge.lifecycle import TrainingRun


class Linear(torch.nn.Linear):
    def tie_weights(self) -> None:  # (what the checkpoint asks of a model: nothing to tie here)
        pass


class Regression(torch.nn.Module):
    """The engine's objective protocol around a linear model: a sum of squared errors, averaged over the batch."""

    def __init__(self):
        super().__init__()
        self.model = Linear(4, 1)

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        return {"n": float(b["x"].shape[0])}

    def forward(self, b: dict, step: int) -> dict:
        return {"sse": ((self.model(b["x"]) - b["y"]) ** 2).sum()}

    @staticmethod
    def loss(out: dict, totals: dict) -> tuple[torch.Tensor, dict]:
        return out["sse"] / totals["n"], {"sse": out["sse"].detach()}


class ToyRun(TrainingRun):
    """Batches of 8 rows of a fixed random table, in order; the position in it is the run's own state."""

    required = ("position",)

    def __init__(self, out, t: TrainConfig, signal_at: int | None = None, lr: float = 0.05, pace: float = 0.0,
                 eval_pace: float = 0.0):
        torch.manual_seed(0)
        engine = Engine(Regression(), t, ImplConfig(), torch.device("cpu"), Dist(),
                        LinearSchedule(lr, t.max_steps, t.max_time, 0, 0.0))
        super().__init__(str(out), Dist(), engine, t, progress=False, tensorboard=False)
        self.table = torch.randn(64, 5, generator=torch.Generator().manual_seed(1))
        self.position, self.signal_at, self.evaluations = 0, signal_at, []
        self.pace, self.eval_pace = pace, eval_pace  # seconds a step and an evaluation take (a timed run)

    def next_batches(self) -> list[dict]:
        time.sleep(self.pace)
        if self.signal_at == self.engine.state.step + 1:  # arrives during this step: it ends, then the run stops
            os.kill(os.getpid(), signal.SIGINT)
        rows = self.table[(8 * self.position) % 64:][:8]
        self.position += 1
        return [{"x": rows[:, :4], "y": rows[:, 4:]}]

    def record(self, out: dict, seconds: float) -> None:
        self.engine.state.add(sse=float(out["sse"]), steps=1)

    def log_line(self, out: dict) -> tuple[dict, str, dict]:
        st, m = self.engine.state, self.engine.state.take_meters()
        return {"type": "train", "step": st.step, "sse": m["sse"] / m["steps"], "lr": out["lr"]}, "", {}

    def evaluate(self) -> None:
        time.sleep(self.eval_pace)
        self.evaluations.append(self.engine.state.step)
        self.log_eval({"weight": float(self.engine.objective.model.weight.sum())}, "eval")

    def run_state(self) -> tuple[dict, dict | None]:
        return {"position": self.position}, None

    def load_run_state(self, state: dict, path: str) -> None:
        self.position = state["position"]

    def eval_size(self) -> int:
        return 64

    def finish(self) -> None:
        if self.t.max_time:
            self.save()  # (as pretraining's: a final checkpoint, which a timed run keeps time for)


def _train(**kw) -> TrainConfig:
    return TrainConfig(**{"max_steps": 12, "save_every": 4, "eval_every": 5, "log_every": 1, "keep_checkpoints": 0,
                          **kw})


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
    run = ToyRun(straight, _train())
    run.fit()
    assert [s for s, _ in ckpt.list_checkpoints(str(straight))] == [4, 8]  # (the last: the command's own)
    assert run.evaluations == [5, 10, 12]

    with pytest.raises(TrainingError, match="interrupted at step 6 by SIGINT; saved a checkpoint of it"):
        ToyRun(stopped, _train(), signal_at=6).fit()
    assert [s for s, _ in ckpt.list_checkpoints(str(stopped))] == [4, 6]
    resumed = ToyRun(stopped, _train())
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
        ToyRun(out, _train(save_every=every)).fit()
        assert saved == expected, every


def test_a_non_finite_loss_names_the_last_good_checkpoint(tmp_path):
    (tmp_path / "o").mkdir()
    run = ToyRun(tmp_path / "o", _train(max_grad_norm=1e30), lr=1e30)  # diverges within a few steps
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


def test_a_timed_run_ends_on_time_with_its_final_evaluation_and_no_steps_in_the_learning_rate(tmp_path):
    """--max-time bounds the whole run, and the time its evaluations take shortens what is left of the
    learning rate's decay instead of cutting it in steps (an evaluation here costs as much as 30 steps)."""
    (tmp_path / "o").mkdir()
    run = ToyRun(tmp_path / "o", _train(max_steps=None, max_time=2.0, eval_every=50, save_every=0),
                 pace=0.01, eval_pace=0.3)
    t0 = time.perf_counter()
    run.fit()
    took = time.perf_counter() - t0
    assert 0.9 * 2.0 <= took <= 1.08 * 2.0, took  # (the final evaluation alone would add 15%)
    assert len(run.evaluations) >= 2 and run.evaluations[-1] == run.engine.state.step
    rows = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    lr = [r["lr"] for r in rows if r["type"] == "train"]
    falls = [a - b for a, b in zip(lr, lr[1:])]
    assert min(falls) >= 0 and lr[-1] < 0.05 * lr[0]
    assert max(falls) <= 4 * sorted(falls)[len(falls) // 2], falls  # an evaluation's 0.3 s would be a 30x fall


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
    run = ToyRun(tmp_path / "o", _train(max_steps=None, max_time=60.0, save_every=0))
    run.d = _SecondProcess([0.0, 0.0, 0.25, 1.0])  # rank 0: a quarter of the budget used, too near the end
    assert run._agree(lifecycle.StopSignals(), 0.01) == (False, False, True)
    assert run.engine.state.time_progress == 0.25
    run.d = _SecondProcess([0.0, 0.0, 0.5, 0.0])
    assert run._agree(lifecycle.StopSignals(), 0.01) == (False, False, False)
    assert run.engine.state.time_progress == 0.5
