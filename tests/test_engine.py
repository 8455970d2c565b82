"""The engine's one training step, shared by pretraining and fine-tuning: accumulation, the non-finite
check before anything is applied, and the training state that checkpoints carry."""

import math

import pytest
import torch

from bertforge.config import ImplConfig, TrainConfig
from bertforge.engine import Engine, LinearSchedule, NonFiniteLoss, TrainState


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _loss_fn(scale: float = 1.0):
    def fn(m, b):
        loss = ((m(b["x"]).squeeze(-1) - b["y"]) ** 2).sum() * scale
        return loss, {"loss": loss.detach()}
    return fn


def test_accumulated_micro_batches_equal_one_batch():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, generator=g)
    results = []
    for parts in (1, 2, 4):
        m = _model()
        e = Engine(m, TrainConfig(lr=1e-2, weight_decay=0.0), ImplConfig(device="cpu"), torch.device("cpu"))
        batches = [{"x": a, "y": b} for a, b in zip(x.chunk(parts), y.chunk(parts))]
        out = e.step(batches, _loss_fn(1 / 8))  # normalised over the whole batch, as the loops do
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
    e = Engine(m, TrainConfig(lr=1e-2), ImplConfig(device="cpu"), torch.device("cpu"), schedule=sched)
    before = [p.detach().clone() for p in m.parameters()]
    b = {"x": torch.randn(3, 4), "y": torch.randn(3)}

    def nan_fn(m, batch):
        loss, parts = _loss_fn()(m, batch)
        if bad == "loss":
            return loss, {"loss": torch.tensor(math.nan)}
        return loss * torch.tensor(math.inf), parts  # infinite gradients, finite reported loss

    with pytest.raises(NonFiniteLoss, match="step 1"):
        e.step([b], nan_fn)
    assert e.state.step == 0
    assert all(torch.equal(a, p) for a, p in zip(before, m.parameters()))
    assert all(p.grad is None for p in m.parameters())
    assert e.step([b], _loss_fn())["lr"] == pytest.approx(1e-2 * 1.0)  # the next good step goes through
    assert e.state.step == 1


def test_train_state_round_trip_and_meters():
    s = TrainState(step=7, elapsed=3.5, tokens_seen=1000)
    s.add(loss=2.0, n=1)
    s.add(loss=1.0, n=1)
    t = TrainState()
    t.load_state_dict(s.state_dict())
    assert t == s
    assert t.take_meters() == {"loss": 3.0, "n": 2.0} and t.meters == {}
