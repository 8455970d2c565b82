"""Child processes that end with their parent: every process a pool forked since a point, killed and reaped,
by the pool's lists and by pid (a worker forked as an interrupt came may be in no list yet).  ``prepare``'s
workers use it (:mod:`bertforge.prepared`)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os


def child_pids() -> set[int]:
    """The processes whose parent is this one, as the operating system knows them (Linux's /proc; else none)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                            found.add(int(name))
    return found


def stop_children(others: set, before: set[int]) -> None:
    """Kill and reap every child process born since ``before`` (pids) that is not one of ``others`` (processes).

    By pid as well as by the lists: a worker forked as the interrupt came can be in no list of the pool's or of
    multiprocessing's yet. A second Ctrl-C while they stop does not leave one running."""
    while True:
        try:
            for _ in range(3):  # (one forked as the interrupt came may be listed only after the first round)
                _kill_born_since(others, before)
            return
        except KeyboardInterrupt:
            continue


def _kill_born_since(others: set, before: set[int]) -> None:
    import signal

    listed = {p for p in multiprocessing.active_children() if p not in others}
    for p in listed:
        p.kill()
    for pid in child_pids() - before:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for p in listed:  # reaped by multiprocessing, so that it knows them gone
        p.join()
    owned = {p.pid for p in multiprocessing.active_children()}  # (listed since: theirs to reap, not ours)
    for pid in child_pids() - before - owned:
        with contextlib.suppress(OSError):
            os.waitpid(pid, 0)
