"""The training engine: optimizer, learning-rate schedule,
the one optimisation step that pretraining and fine-tuning share (:class:`Engine`), and the training state
that checkpoints save so that a resumed run reproduces an uninterrupted one (:class:`TrainState`).

Loops (pretraining, fine-tuning) stay short because the engine owns the step, as in cramming.

Departures from BERT's training: AdamW (decoupled weight decay, none on biases and LayerNorm weights)
instead of BERT's Adam with L2 folded in; linear warmup then linear decay to zero, by steps or by the time
budget; each loss is averaged over the whole global batch (the MLM loss over its masked tokens); a step
whose loss or gradient norm is not finite stops the run before the optimizer applies it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from ..config import ImplConfig, TrainConfig
from ..devices import Dist, autocast_context, resolve_precision
from ..errors import TrainingError

log = logging.getLogger("bertforge")


class NonFiniteLoss(TrainingError):
    """A step whose loss or gradient norm is not finite; the optimizer did not apply it."""

    def __init__(self, step: int, lr: float | None):
        at = f" (lr {lr:.3g})" if lr is not None else ""
        super().__init__(f"the loss is not finite at step {step}{at}")
        self.step, self.lr = step, lr


# ------------------------------------------------------------------------------------------------ optimizer
def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices and embeddings; none on biases and LayerNorm weights (as BERT)."""
    decay, no_decay, seen = [], [], set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters) where PyTorch has it for the device, else foreach."""
    groups = param_groups(model, cfg.weight_decay)
    kw = dict(lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps)
    try:
        return torch.optim.AdamW(groups, fused=True, **kw)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw)


class LinearSchedule:
    """Linear warmup, then linear decay to zero.

    With ``max_steps`` the progress is ``step / max_steps`` as in transformers' linear schedule, except that
    the first update uses lr * 1/warmup where transformers' uses 0 (a wasted step): one warmup step ahead.
    With ``max_time`` it is the share of the time budget used (``time_progress``, which the engine keeps:
    :meth:`Engine.advance`), so that a run ends on time with the learning rate at zero; with both, whichever
    is further.  Warmup is ``warmup_steps`` or a fraction
    ``warmup_ratio`` of the run.
    """

    def __init__(self, base_lr: float, max_steps: int | None, max_time: float | None,
                 warmup_steps: int | None, warmup_ratio: float):
        if not (max_steps or max_time):
            raise ValueError("a schedule needs max_steps or max_time (the configuration's validation asks for one)")
        self.base_lr, self.max_steps, self.max_time = base_lr, max_steps, max_time
        self.warmup_steps, self.warmup_ratio = warmup_steps, warmup_ratio

    def progress(self, step: int, time_progress: float) -> float:
        p = 0.0
        if self.max_steps:
            p = step / self.max_steps
        if self.max_time:
            p = max(p, time_progress)
        return min(1.0, p)

    def lr(self, step: int, time_progress: float = 0.0) -> float:
        """Learning rate of update number ``step`` (0-based), ``time_progress`` of the time budget used."""
        if self.max_steps and not self.max_time:
            warm = self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * self.max_steps)
            if step < warm:
                return self.base_lr * (step + 1) / warm
            return self.base_lr * max(0.0, (self.max_steps - step) / max(1, self.max_steps - warm))
        p = self.progress(step, time_progress)
        if self.warmup_steps is not None:
            w = min(1.0, (step + 1) / max(1, self.warmup_steps))
            return self.base_lr * w * (1 - p)
        wr = self.warmup_ratio
        if wr > 0 and p < wr:
            return self.base_lr * max(p, 1e-3 * wr) / wr
        return self.base_lr * max(0.0, (1 - p) / (1 - wr)) if wr < 1 else 0.0

    def done(self, step: int, time_progress: float) -> bool:
        if self.max_steps and step >= self.max_steps:
            return True
        return bool(self.max_time and time_progress >= 1.0)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


# ------------------------------------------------------------------------------------------------ rng state
def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _gather_rng_states(d: Dist) -> list[dict]:
    """Every process's random states, in rank order (a collective under torchrun)."""
    if not d.enabled:
        return [_rng_state()]
    states: list = [None] * d.world
    dist.all_gather_object(states, _rng_state())
    return states


def _restore_rng_state(states: list[dict], rank: int) -> None:
    """This process's states (rank 0's when the run had fewer processes)."""
    state = states[rank] if rank < len(states) else states[0]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def maybe_compile(model: torch.nn.Module, impl: ImplConfig) -> torch.nn.Module:
    if not impl.compile:
        return model
    try:
        return torch.compile(model, dynamic=True)
    except Exception as e:  # compile is an optimisation; never a reason to fail a run
        log.warning("torch.compile unavailable (%s); running eagerly", e)
        return model


# ------------------------------------------------------------------------------------------------ state
@dataclass
class TrainState:
    """What a run knows besides weights, optimizer and data position: saved in every checkpoint."""

    step: int = 0  # optimizer steps taken
    elapsed: float = 0.0  # wall-clock seconds of the run, across resumptions
    time_progress: float = 0.0  # the share of a time budget used (Engine.advance)
    tokens_seen: int = 0
    meters: dict[str, float] = field(default_factory=dict)  # sums since the last log line

    def add(self, **values: float) -> None:
        for k, v in values.items():
            self.meters[k] = self.meters.get(k, 0.0) + v

    def take_meters(self) -> dict[str, float]:
        """The sums since the last call; the meters start again from zero."""
        m, self.meters = self.meters, {}
        return m

    def state_dict(self) -> dict:
        return {"step": self.step, "elapsed": self.elapsed, "time_progress": self.time_progress,
                "tokens_seen": self.tokens_seen, "meters": dict(self.meters)}

    def load_state_dict(self, d: dict) -> None:
        self.step, self.elapsed, self.tokens_seen = int(d["step"]), float(d["elapsed"]), int(d["tokens_seen"])
        self.time_progress = float(d.get("time_progress", 0.0))  # (none in a checkpoint of an untimed run)
        self.meters = {k: float(v) for k, v in d["meters"].items()}


# ------------------------------------------------------------------------------------------------ the step
class Objective(Protocol):
    """What the engine trains: a module whose ``forward(batch, step)`` returns a micro-batch's summed losses
    (what DDP and ``torch.compile`` wrap); ``counts(batch)`` gives the micro-batch's share of the normalisers,
    and ``loss(out, totals)`` the loss to differentiate, normalised by ``totals`` (the counts summed over the
    micro-batches of every process), with the named parts to report."""

    def counts(self, batch: dict) -> dict[str, float]: ...

    def __call__(self, batch: dict, step: int) -> dict: ...

    def loss(self, out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]: ...


class Engine:
    """Owns the optimisation step of every run and the state it needs: the optimizer, the learning-rate
    schedule, autocast and the fp16 loss scaler, DDP and ``torch.compile`` wrapping, gradient accumulation,
    clipping, the non-finite check, the clock, and every process's random state.  :meth:`state_dict` and
    :meth:`load_state_dict` carry all of it across a checkpoint.
    """

    def __init__(self, objective: torch.nn.Module, cfg: TrainConfig, impl: ImplConfig, device: torch.device,
                 d: Dist | None = None, schedule: LinearSchedule | None = None):
        self.objective, self.device, self.dist, self.impl = objective, device, d or Dist(), impl
        self.optimizer = build_optimizer(objective, cfg, device)
        self.schedule = schedule
        self.max_grad_norm = cfg.max_grad_norm
        self.autocast = autocast_context(device, impl)
        # fp16 needs its loss scaled (bf16 and fp32 do not): a scaler that skips steps whose gradients overflow
        self.scaler = torch.amp.GradScaler(device.type, enabled=resolve_precision(device, impl) == "fp16")
        module = objective
        self.ddp = None
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            module = self.ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
            self.dist.releases.append(self.release_group)
        self.module = maybe_compile(module, impl)
        self.state = TrainState()
        self.generators: dict[str, torch.Generator] = {}  # the run's own random streams (data order, ...)
        self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.start_clock()

    def release_group(self) -> None:
        """Drop the DDP wrapper while the process group it holds is still registered, so that its reducer is not
        the group's last holder. torch frees a reducer holding the GIL; a gloo group it ended then would wait for
        its worker threads, one of which may be waiting for the GIL to free the tensors of the run's last
        collective: a run under torchrun that hangs as it ends, on a loaded host (docs/log/test-suite.md). The
        group's own binding frees it without the GIL (``dist.destroy_process_group``)."""
        self.module, self.ddp = self.objective, None

    # the clock: elapsed wall-clock time of the run, carried across resumptions
    def start_clock(self, since: float | None = None) -> None:
        """The clock goes on from the state's ``elapsed``, counted from ``since`` (a ``perf_counter`` time before
        now: the run's set-up) or from now."""
        self._t0 = (time.perf_counter() if since is None else since) - self.state.elapsed

    def tick(self) -> float:
        self.state.elapsed = time.perf_counter() - self._t0
        return self.state.elapsed

    def advance(self, seconds: float, reserve: float) -> float:
        """A timed schedule's progress after a step of ``seconds``: the share of the training time left that the
        step used, the run keeping ``reserve`` seconds for its end (final evaluation and saves).  Time spent
        outside the steps (evaluations, checkpoints) shortens what is left, so the learning rate decays faster
        from there on, without a jump."""
        s, st = self.schedule, self.state
        if s is None or not s.max_time:
            return st.time_progress
        left = s.max_time - self.tick() - reserve  # training time left after this step
        st.time_progress = 1.0 if left <= 0 else 1 - (1 - st.time_progress) * left / (left + seconds)
        return st.time_progress

    def done(self) -> bool:
        return self.schedule is not None and self.schedule.done(self.state.step, self.state.time_progress)

    def lr(self) -> float | None:
        """The learning rate of the next step (None without a schedule: the optimizer's own)."""
        return self.schedule.lr(self.state.step, self.state.time_progress) if self.schedule is not None else None

    def generator(self, name: str, seed: int) -> torch.Generator:
        """A random stream of the run's own (the data order of fine-tuning), seeded, saved in checkpoints."""
        self.generators[name] = torch.Generator().manual_seed(seed)
        return self.generators[name]

    # ---- checkpoints
    def state_dict(self) -> dict:
        """The optimizer, the loss scaler, the training state and every random state (the processes' and the
        run's own streams): a collective under torchrun, to be called by every process."""
        state = {"optimizer": self.optimizer.state_dict(), "train": self.state.state_dict(),
                 "rng": _gather_rng_states(self.dist),
                 "generators": {k: g.get_state() for k, g in self.generators.items()}}
        if self.scaler.is_enabled():
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s ``state`` (the weights are the checkpoint's business)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.state.load_state_dict(state["train"])
        if state.get("scaler") is not None and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        _restore_rng_state(state["rng"], self.dist.rank)
        for k, g in state["generators"].items():
            self.generators[k].set_state(g)
        self.start_clock()

    # ---- the step
    def step(self, batches: list[dict]) -> dict[str, float]:
        """One optimizer step over the micro-batches of this process.

        The objective's loss of each micro-batch is normalised over the global batch (its ``totals``), so
        that N processes with accumulation compute exactly the gradient of one process with the whole batch.
        Returns the parts summed over micro-batches and processes, the ``totals``, ``grad_norm`` and ``lr``.
        A non-finite part or gradient norm raises :class:`NonFiniteLoss` before the optimizer applies anything.
        """
        lr = self.lr()
        if lr is not None:
            set_lr(self.optimizer, lr)
        local: dict[str, float] = {}
        for b in batches:
            for k, v in self.objective.counts(b).items():
                local[k] = local.get(k, 0.0) + v
        totals = dict(zip(local, self.dist.all_sum(list(local.values()), self.device)))
        prepare = getattr(self.objective, "prepare", None)  # an objective whose loss spans the micro-batches
        if prepare is not None:
            with self.autocast:
                prepare(batches, self.state.step)
        sums: dict[str, float] = {}
        for i, b in enumerate(batches):
            # gradients are all-reduced once per step, after the last micro-batch
            last = self.ddp is None or i == len(batches) - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync():
                with self.autocast:
                    loss, parts = self.objective.loss(self.module(b, self.state.step), totals)
                # DDP averages over processes; the loss is a global mean
                self.scaler.scale(loss * self.dist.world).backward()
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        parts = dict(zip(sums, self.dist.all_sum(list(sums.values()), self.device)))
        scaled = self.scaler.is_enabled()
        if scaled:
            self.scaler.unscale_(self.optimizer)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm, foreach=True))
        # with fp16 loss scaling an overflowing gradient is expected now and then: the scaler skips that step
        if not all(math.isfinite(v) for v in (*parts.values(), *(() if scaled else (grad_norm,)))):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLoss(self.state.step + 1, lr)
        if scaled:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        lr = lr if lr is not None else self.optimizer.param_groups[0]["lr"]
        return {**parts, **totals, "grad_norm": grad_norm, "lr": lr}
