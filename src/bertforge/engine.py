"""The training engine: device and precision, distributed set-up, optimizer, learning-rate schedule,
one optimisation step, and the state that makes a resumed run reproduce an uninterrupted one.

Loops (pretraining, fine-tuning) stay short because the engine owns the step, as in cramming.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ImplConfig, TrainConfig
from .errors import UserError

log = logging.getLogger("bertforge")


class TrainingError(Exception):
    """A run that cannot go on (e.g. a non-finite loss): ``error: ...`` and exit status 1."""


# ------------------------------------------------------------------------------------------------ devices
@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_sum(self, values: list[float], device) -> list[float]:
        """Sum a few numbers over all ranks (identity in one process)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()


def init_distributed(device_kind: str) -> Dist:
    """Join the process group that ``torchrun`` describes in the environment (no-op without torchrun)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend=backend)
    return Dist(rank, world, local_rank)


def resolve_device(impl: ImplConfig, d: Dist | None = None) -> torch.device:
    name = impl.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError("--device cuda was asked for, but no CUDA GPU is available")
        if name == "cuda":
            name = f"cuda:{d.local_rank if d else 0}"
    elif name != "cpu":
        raise UserError(f"unknown device {impl.device!r}; expected auto, cpu, cuda or cuda:N")
    return torch.device(name)


def setup_backend(device: torch.device, impl: ImplConfig, d: Dist | None = None) -> None:
    """Threads on the CPU (all cores, shared among local ranks); TF32 matmuls on CUDA."""
    if device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", d.world if d else 1))
        threads = impl.threads or max(1, (os.cpu_count() or 1) // max(1, local_world))
        torch.set_num_threads(threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast_context(device: torch.device, impl: ImplConfig):
    """bf16 autocast on CUDA (default there); fp32 on the CPU, where bf16 matmuls are ~500x slower here."""
    precision = impl.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise UserError(f"unknown precision {impl.precision!r}; expected auto, fp32 or bf16")
    return contextlib.nullcontext()


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

    With ``max_steps`` the progress is ``step / max_steps`` (as transformers' linear schedule, the first
    update already uses lr * 1/warmup).  With only ``max_time`` it is the fraction of the time budget spent,
    so a run ends on time with the learning rate at zero.  Warmup is ``warmup_steps`` or a fraction
    ``warmup_ratio`` of the run.
    """

    def __init__(self, base_lr: float, max_steps: int | None, max_time: float | None,
                 warmup_steps: int | None, warmup_ratio: float):
        if max_steps is None and max_time is None:
            raise UserError("give --max-steps or --max-time")
        self.base_lr, self.max_steps, self.max_time = base_lr, max_steps, max_time
        self.warmup_steps, self.warmup_ratio = warmup_steps, warmup_ratio

    def progress(self, step: int, elapsed: float) -> float:
        p = 0.0
        if self.max_steps:
            p = step / self.max_steps
        if self.max_time:
            p = max(p, elapsed / self.max_time)
        return min(1.0, p)

    def lr(self, step: int, elapsed: float = 0.0) -> float:
        """Learning rate of update number ``step`` (0-based), ``elapsed`` seconds into the run."""
        if self.max_steps and not self.max_time:
            warm = self.warmup_steps if self.warmup_steps is not None else int(self.warmup_ratio * self.max_steps)
            if step < warm:
                return self.base_lr * (step + 1) / warm
            return self.base_lr * max(0.0, (self.max_steps - step) / max(1, self.max_steps - warm))
        p = self.progress(step, elapsed)
        if self.warmup_steps is not None:
            w = min(1.0, (step + 1) / max(1, self.warmup_steps))
            return self.base_lr * w * (1 - p)
        wr = self.warmup_ratio
        if wr > 0 and p < wr:
            return self.base_lr * max(p, 1e-3 * wr) / wr
        return self.base_lr * max(0.0, (1 - p) / (1 - wr)) if wr < 1 else 0.0

    def done(self, step: int, elapsed: float) -> bool:
        if self.max_steps and step >= self.max_steps:
            return True
        return bool(self.max_time and elapsed >= self.max_time)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for g in optimizer.param_groups:
        g["lr"] = lr


# ------------------------------------------------------------------------------------------------ rng state
def rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
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
