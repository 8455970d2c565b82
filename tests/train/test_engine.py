"""The engine's one training step, shared by pretraining and fine-tuning: accumulation, the non-finite
check before anything is applied, and the training state that checkpoints carry."""

import math

import pytest
import torch

from bertforge.config import ImplConfig, TrainConfig
from bertforge.train.engine import Engine, LinearSchedule, NonFiniteLoss, TrainState


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


class Squares(torch.nn.Module):
    """An objective: the summed squared error, normalised over the global batch's examples (or scaled)."""

    def __init__(self, model, scale: float | None = None, poison: str | None = None):
        super().__init__()
        self.model, self.scale, self.poison = model, scale, poison

    @staticmethod
    def counts(b):
        return {"examples": float(len(b["y"]))}

    def forward(self, b, step):
        return {"sum": ((self.model(b["x"]).squeeze(-1) - b["y"]) ** 2).sum()}

    def loss(self, out, totals):
        loss = out["sum"] * (self.scale if self.scale is not None else 1 / totals["examples"])
        if self.poison == "loss":
            return loss, {"loss": torch.tensor(math.nan)}
        if self.poison == "gradient":
            return loss * torch.tensor(math.inf), {"loss": loss.detach()}  # infinite gradients, finite reported loss
        return loss, {"loss": loss.detach()}


def test_accumulated_micro_batches_equal_one_batch():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, generator=g)
    results = []
    for parts in (1, 2, 4):
        m = _model()
        e = Engine(Squares(m), TrainConfig(lr=1e-2, weight_decay=0.0), ImplConfig(device="cpu"), torch.device("cpu"))
        batches = [{"x": a, "y": b} for a, b in zip(x.chunk(parts), y.chunk(parts))]
        out = e.step(batches)  # normalised over the whole batch, as the loops do
        assert out["examples"] == 8
        results.append((out["loss"], [p.detach().clone() for p in m.parameters()]))
        assert e.state.step == 1
    for loss, params in results[1:]:
        assert abs(loss - results[0][0]) < 1e-5
        for a, b in zip(params, results[0][1]):
            assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("bad", ["loss", "gradient"])
def test_non_finite_step_is_refused_before_the_optimizer(bad):
    m = _model()
    sched = LinearSchedule(1e-2, 10, None, None, 0.0)
    objective = Squares(m, scale=1.0, poison=bad)
    e = Engine(objective, TrainConfig(lr=1e-2), ImplConfig(device="cpu"), torch.device("cpu"), schedule=sched)
    before = [p.detach().clone() for p in m.parameters()]
    b = {"x": torch.randn(3, 4), "y": torch.randn(3)}

    with pytest.raises(NonFiniteLoss, match="step 1"):
        e.step([b])
    assert e.state.step == 0
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert all(p.grad is None for p in m.parameters())
    objective.poison = None
    assert e.step([b])["lr"] == pytest.approx(1e-2 * 1.0)  # the next good step goes through
    assert e.state.step == 1


def test_train_state_round_trip_and_meters():
    s = TrainState(step=7, elapsed=3.5, tokens_seen=1000)
    s.add(loss=2.0, n=1)
    s.add(loss=1.0, n=1)
    t = TrainState()
    t.load_state_dict(s.state_dict())
    assert t == s
    assert t.take_meters() == {"loss": 3.0, "n": 2.0} and t.meters == {}


def test_state_dict_carries_the_run_on():
    """A second engine loaded from the first's state_dict takes the same next steps (optimizer moments, step,
    clock and the random state all carried)."""
    g = torch.Generator().manual_seed(2)
    batches = [{"x": torch.randn(4, 4, generator=g), "y": torch.randn(4, generator=g)} for _ in range(4)]

    def engine(m):
        sched = LinearSchedule(1e-2, 4, None, 1, 0.0)
        return Engine(Squares(m), TrainConfig(lr=1e-2), ImplConfig(device="cpu"), torch.device("cpu"), schedule=sched)

    straight = engine(_model())
    for b in batches:
        straight.step([b])
    first = engine(m1 := _model())
    for b in batches[:2]:
        first.step([b])
    state = first.state_dict()
    torch.manual_seed(123)  # the random state is the checkpoint's business: it comes back
    second = engine(m2 := _model())
    m2.load_state_dict(m1.state_dict())
    second.load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), state["rng"][0]["torch"])
    assert second.state.step == 2 and second.optimizer.state_dict()["state"].keys() == state["optimizer"]["state"].keys()
    for b in batches[2:]:
        second.step([b])
    for a, b in zip(straight.objective.parameters(), second.objective.parameters()):
        assert torch.equal(a, b)
