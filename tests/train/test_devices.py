import pytest
"""Device set-up: the CPU's threads."""

import os

import torch

from bertforge.config import ImplConfig
from bertforge.devices import available_cores, setup_backend


@pytest.mark.slow
def test_cpu_threads_are_the_flag_else_the_available_cores_shared_among_local_ranks(monkeypatch):
    cpu, cores = torch.device("cpu"), available_cores()
    if hasattr(os, "sched_getaffinity"):
        assert cores == len(os.sched_getaffinity(0))  # taskset / cpusets, not the machine's count
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        monkeypatch.delenv("BERTFORGE_THREADS", raising=False)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what torchrun sets for every rank: not read
        setup_backend(cpu, ImplConfig())
        assert torch.get_num_threads() == cores
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's local ranks share the cores
        setup_backend(cpu, ImplConfig())
        assert torch.get_num_threads() == max(1, cores // 2)
        monkeypatch.setenv("BERTFORGE_THREADS", "6")  # the machine's budget (tests under xdist), shared too
        setup_backend(cpu, ImplConfig())
        assert torch.get_num_threads() == 3
        setup_backend(cpu, ImplConfig(threads=2))  # --threads wins
        assert torch.get_num_threads() == 2
        monkeypatch.delenv("LOCAL_WORLD_SIZE")
        for unreadable in ("", "0", "two"):
            monkeypatch.setenv("BERTFORGE_THREADS", unreadable)
            setup_backend(cpu, ImplConfig())
            assert torch.get_num_threads() == cores, unreadable
    finally:
        torch.set_num_threads(before)
