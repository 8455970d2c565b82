"""Where a run computes: the device, its precision (autocast), CPU threads, and the process group that
``torchrun`` describes.  Used by training and by inference alike."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .config import ImplConfig
from .errors import UserError


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    # what lets go of the process group before it ends (Engine.release_group)
    releases: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)

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

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (``obj`` itself in one process)."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """End the process group, after each engine has let go of its DDP wrapper (``releases``): a reducer that
        is the group's last holder frees it while holding the GIL, and a gloo group ended then can hang or abort
        on its worker threads as the process ends (docs/log/test-suite.md)."""
        if self.enabled and dist.is_initialized():
            for release in self.releases:
                release()
            self.releases.clear()  # (and the engines go with the run)
            gc.collect()  # (a wrapper in a reference cycle goes now, not after the group)
            dist.destroy_process_group()


def init_distributed(impl: ImplConfig) -> Dist:
    """Join the process group that ``torchrun`` describes in the environment (no-op without torchrun): NCCL
    when ``impl`` trains on CUDA, gloo on the CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        cuda = impl.device.startswith("cuda") or (impl.device == "auto" and torch.cuda.is_available())
        backend = "nccl" if cuda else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        # rank 0 alone evaluates a fine-tuning run while the others wait in the next all-reduce: a CPU evaluation
        # of a large validation set can outlast the default timeout (10 minutes on NCCL, 30 on gloo).  Preparing
        # the data waits on a lock file, never in a collective (bertforge.data.build_corpus).
        seconds = dist_timeout()
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=seconds))
    return Dist(rank, world, local_rank)


def dist_timeout() -> float:
    """``BERTFORGE_DIST_TIMEOUT``: the process group's timeout in seconds (2 hours when unset)."""
    text = os.environ.get("BERTFORGE_DIST_TIMEOUT") or "7200"
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise UserError(f"BERTFORGE_DIST_TIMEOUT must be a positive number of seconds, not {text!r}")
    return seconds


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
    """Threads on the CPU: ``--threads``, else the cores this process may run on (or ``BERTFORGE_THREADS``)
    shared among the local ranks; TF32 matmuls on CUDA.  (``OMP_NUM_THREADS`` is not read: torchrun sets it to
    1 for every rank.)"""
    if device.type == "cpu":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", d.world if d else 1))
        threads = impl.threads or max(1, (_env_threads() or available_cores()) // max(1, local_world))
        torch.set_num_threads(threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: ``taskset``, cgroup cpusets), else all of them."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def _env_threads() -> int | None:
    """``BERTFORGE_THREADS`` (the threads that the bertforge processes of one node share among their local
    ranks) as a positive number, else None (unset or unreadable)."""
    value = os.environ.get("BERTFORGE_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX tiles, as torch detects
    them); ``BERTFORGE_CPU_BF16=1`` or ``0`` overrides the detection.  Without them bf16 matmuls are emulated,
    slower than fp32."""
    forced = os.environ.get("BERTFORGE_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the checks
        return False


def resolve_precision(device: torch.device, impl: ImplConfig) -> str:
    """``auto``: bf16 autocast on CUDA GPUs that have it, fp16 (with loss scaling) on those that do not (T4,
    V100); on the CPU bf16 autocast where it has native bf16 matmuls (:func:`native_bf16`), else fp32."""
    precision = impl.precision
    if precision == "auto":
        if device.type != "cuda":
            return "bf16" if device.type == "cpu" and native_bf16() else "fp32"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if precision not in ("fp32", "bf16", "fp16"):
        raise UserError(f"unknown precision {impl.precision!r}; expected auto, fp32, bf16 or fp16")
    return precision


def autocast_context(device: torch.device, impl: ImplConfig):
    """The autocast of :func:`resolve_precision`'s choice (none for fp32)."""
    precision = resolve_precision(device, impl)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


