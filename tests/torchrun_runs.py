"""Several bertforge runs one after the other in each process that torchrun starts, so that the tests which
compare a run under torchrun with one process (tests/train/test_lifecycle.py) pay torchrun's start-up (the launcher
and each process importing torch) once for all of them instead of once each.

    torchrun --nproc_per_node=2 -m tests.torchrun_runs RUNS.json

RUNS.json is a list of ``{"argv": [...], "status": N}``: each ``argv`` is what follows ``bertforge``, and each run
joins and leaves its own process group as a run of its own would.  Every process writes ``=== run K: status S``
to stderr after run K; the exit status is 0 when every run ended with the status it names, 1 otherwise.

A DDP wrapper still alive when its run ends the process group fails the run: freed later, its reducer could be
the group's last holder and end it holding the GIL, which hung runs (``Engine.release_group``,
docs/log/test-suite.md). A run that has not ended after ``HANG_SECONDS`` prints every thread's Python stack and
ends its process (the launch then fails at once, with the stacks in its stderr, instead of at the test's timeout).

Each run's process group meets in its own part of torchrun's store: after ``destroy_process_group`` torch counts
groups from 0 again, so a second group would read the first one's addresses where its peer has not yet written
its own (gloo then connects to a closed port).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import sys

import torch.distributed as dist

from bertforge.cli import main

_init = dist.init_process_group
_destroy = dist.destroy_process_group
HANG_SECONDS = 180  # (each run takes seconds)
wrappers_at_end: list[int] = []  # the DDP wrappers alive as each group of the run ended


def _destroy_counting(*args, **kwargs):
    from torch.nn.parallel import DistributedDataParallel

    wrappers_at_end.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
    return _destroy(*args, **kwargs)


def _init_in(prefix: str):
    def init(backend=None, timeout=None, **_):
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timeout)
        _init(backend=backend, timeout=timeout, store=dist.PrefixStore(prefix, store),
              rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    return init


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        runs = json.load(f)
    failed = 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    ranks = range(int(os.environ["WORLD_SIZE"]))
    dist.destroy_process_group = _destroy_counting
    for k, run in enumerate(runs):
        dist.init_process_group = _init_in(f"run-{k}/")
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
        wrappers_at_end.clear()
        status = main(run["argv"])
        print(f"=== run {k}: status {status}, DDP wrappers alive as its group ended: {sum(wrappers_at_end)} "
              f"(rank {os.environ.get('RANK')})", file=sys.stderr, flush=True)
        failed += status != run["status"] or sum(wrappers_at_end) > 0
        # every process has left run k (and its process group) before any starts run k + 1
        store.set(f"ended-{k}/{os.environ['RANK']}", "1")
        store.wait([f"ended-{k}/{r}" for r in ranks])
        faulthandler.cancel_dump_traceback_later()
    sys.exit(1 if failed else 0)
