"""A toy :class:`~bertforge.train.lifecycle.TrainingRun` (a linear regression on a fixed random table: no data files, no
BERT) on which the tests check once, at the seam, what every command's run inherits: signals, saves and their
fault points, exact resumption, timed ends and torchrun.

    python -m tests.toy_run OUT [--resume] [--signal-at STEP]     # one process, or under torchrun

writes ``OUT/weights.json`` (the final weight and bias) when the run ends; a run stopped by a signal or a
:class:`~bertforge.errors.TrainingError` exits with 1 after its ``error:`` line."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch

from bertforge.config import ImplConfig, TrainConfig
from bertforge.devices import Dist, init_distributed
from bertforge.train.engine import Engine, LinearSchedule
from bertforge.errors import TrainingError
from bertforge.train.lifecycle import TrainingRun


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
                 eval_pace: float = 0.0, d: Dist | None = None):
        torch.manual_seed(0)
        d = d or Dist()
        engine = Engine(Regression(), t, ImplConfig(), torch.device("cpu"), d,
                        LinearSchedule(lr, t.max_steps, t.max_time, 0, 0.0))
        super().__init__(str(out), d, engine, t, progress=False, tensorboard=False)
        self.table = torch.randn(64, 5, generator=torch.Generator().manual_seed(1))
        self.position, self.signal_at, self.evaluations = 0, signal_at, []
        self.pace, self.eval_pace = pace, eval_pace  # seconds a step and an evaluation take (a timed run)

    def next_batches(self) -> list[dict]:
        time.sleep(self.pace)
        if self.signal_at == self.engine.state.step + 1 and self.d.is_main:  # arrives during this step: it ends,
            os.kill(os.getpid(), signal.SIGINT)  # then the run stops (every process, under torchrun)
        per = 8 // self.d.world  # this process's rows of the global batch
        rows = self.table[(8 * self.position) % 64:][:8][self.d.rank * per:(self.d.rank + 1) * per]
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
        self.log_eval({"weight": float(self.engine.objective.model.weight.detach().sum())}, "eval")

    def run_state(self) -> tuple[dict, dict | None]:
        return {"position": self.position}, None

    def load_run_state(self, state: dict, path: str) -> None:
        self.position = state["position"]

    def eval_size(self) -> int:
        return 64

    def finish(self) -> None:
        if self.t.max_time:
            self.save()  # (as pretraining's: a final checkpoint, which a timed run keeps time for)


def toy_train(**kw) -> TrainConfig:
    """12 steps, a checkpoint every 4, an evaluation every 5 and at the end, every checkpoint kept."""
    return TrainConfig(**{"max_steps": 12, "save_every": 4, "eval_every": 5, "log_every": 1, "keep_checkpoints": 0,
                          **kw})


def weights(run: ToyRun) -> list[float]:
    m = run.engine.objective.model
    return [*m.weight.flatten().tolist(), *m.bias.tolist()]


def main(argv: list[str]) -> int:
    out, flags = argv[0], argv[1:]
    d = init_distributed(ImplConfig())
    signal_at = int(flags[flags.index("--signal-at") + 1]) if "--signal-at" in flags else None
    os.makedirs(out, exist_ok=True)
    run = ToyRun(out, toy_train(), signal_at=signal_at, d=d)
    try:
        if "--resume" in flags:
            run.restore()
        run.fit()
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        d.close()
    if d.is_main:
        with open(os.path.join(out, "weights.json"), "w", encoding="utf-8") as f:
            json.dump(weights(run), f)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main(sys.argv[1:]))
