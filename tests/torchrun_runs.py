"""Several bertforge runs one after the other in each process that torchrun starts, so that the tests which
compare a run under torchrun with one process (tests/train/test_torchrun.py) pay torchrun's start-up (the launcher
and each process importing torch) once for all of them instead of once each.

    torchrun --nproc_per_node=2 -m tests.torchrun_runs RUNS.json

RUNS.json is a list of ``{"argv": [...], "status": N}``: each ``argv`` is what follows ``bertforge``, and each run
joins and leaves its own process group as a run of its own would.  Every process writes ``=== run K: status S``
to stderr after run K; the exit status is 0 when every run ended with the status it names, 1 otherwise.

Each run's process group meets in its own part of torchrun's store: after ``destroy_process_group`` torch counts
groups from 0 again, so a second group would read the first one's addresses where its peer has not yet written
its own (gloo then connects to a closed port).
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

from bertforge.cli import main

_init = dist.init_process_group


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
    for k, run in enumerate(runs):
        dist.init_process_group = _init_in(f"run-{k}/")
        status = main(run["argv"])
        print(f"=== run {k}: status {status} (rank {os.environ.get('RANK')})", file=sys.stderr, flush=True)
        failed += status != run["status"]
        # every process has left run k (and its process group) before any starts run k + 1
        store.set(f"ended-{k}/{os.environ['RANK']}", "1")
        store.wait([f"ended-{k}/{r}" for r in ranks])
    sys.exit(1 if failed else 0)
