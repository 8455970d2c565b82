"""Device set-up: the CPU's threads."""

import os

import torch

from bertforge.config import ImplConfig
from bertforge.devices import setup_backend


def test_cpu_threads_are_the_flag_else_omp_num_threads_else_the_cores(monkeypatch):
    cpu, cores = torch.device("cpu"), os.cpu_count() or 1
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        setup_backend(cpu, ImplConfig())
        assert torch.get_num_threads() == 1
        setup_backend(cpu, ImplConfig(threads=2))  # --threads wins
        assert torch.get_num_threads() == 2
        for unreadable in ("", "0", "two"):
            monkeypatch.setenv("OMP_NUM_THREADS", unreadable)
            setup_backend(cpu, ImplConfig())
            assert torch.get_num_threads() == cores, unreadable
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's local ranks share the cores
        setup_backend(cpu, ImplConfig())
        assert torch.get_num_threads() == max(1, cores // 2)
    finally:
        torch.set_num_threads(before)
