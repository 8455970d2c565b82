"""What a run records as it goes: ``metrics.jsonl`` (one JSON line per logging step and per evaluation,
and TensorBoard scalars when it is installed) and ``train.log`` (a copy of the log); how long work says how far
it is (:func:`progress`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator

from .atomic import atomic_write_text

log = logging.getLogger("bertforge")


@contextlib.contextmanager
def progress(total: int, desc: str, shown: bool, say: Callable[[int, float], None], every: float,
             **bar) -> Iterator[Callable[[int], None]]:
    """``advance(n)`` for long work of ``total`` units: a tqdm bar (``bar``: its options) when ``shown`` (a
    terminal), else ``say(done, seconds since the start)`` every ``every`` seconds, so that work written to a log
    file is not silent."""
    from tqdm import tqdm

    b = tqdm(total=total, desc=desc, disable=not shown, leave=False, **bar)
    start = said = time.monotonic()
    done = 0

    def advance(n: int) -> None:
        nonlocal done, said
        b.update(n)
        done += n
        now = time.monotonic()
        if not shown and now - said >= every:
            said = now
            say(done, now - start)

    try:
        yield advance
    finally:
        b.close()


class _TqdmHandler(logging.Handler):
    """Log lines that do not break a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)


def setup_logging(quiet: bool = False, replica: bool = False) -> None:
    """Log lines on stderr: from INFO, or WARNING when ``quiet``; a ``replica`` (a process of torchrun other than
    its machine's first, which says the same) shows errors only."""
    for h in list(log.handlers):
        if isinstance(h, _TqdmHandler):
            log.removeHandler(h)
    h = _TqdmHandler()
    h.addFilter(lambda r: not getattr(r, "bar_shown", False))  # what the progress bar already shows
    h.setFormatter(logging.Formatter("%(message)s"))
    h.setLevel(logging.ERROR if replica else logging.WARNING if quiet else logging.INFO)
    log.addHandler(h)
    log.setLevel(logging.INFO)  # a run's train.log gets everything, whatever stderr shows
    log.propagate = False


@contextlib.contextmanager
def shown_on_stderr(quiet: bool = False):
    """A run started from Python says on stderr what the command line says (its step lines, warnings and result),
    unless ``quiet`` (warnings only) or the program shows bertforge's lines itself: a handler of its own on the
    ``bertforge`` logger, or root handlers that take INFO."""
    root = logging.getLogger()
    if any(not isinstance(h, logging.FileHandler) for h in log.handlers) or (  # (the command line's own too)
            root.handlers and root.isEnabledFor(logging.INFO) and log.propagate):
        yield
        return
    level, propagate = log.level, log.propagate
    setup_logging(quiet)
    try:
        yield
    finally:
        for h in [h for h in log.handlers if isinstance(h, _TqdmHandler)]:
            log.removeHandler(h)
        log.setLevel(level)
        log.propagate = propagate
steps_log = logging.getLogger("bertforge.steps")  # the training lines: train.log always, the terminal without a bar


def log_step(line: str, bar_shown: bool) -> None:
    """A training line: always in train.log; on stderr only when no progress bar shows the same figures
    (under nohup, a job scheduler, or --no-progress)."""
    steps_log.info(line, extra={"bar_shown": bar_shown})


def duration(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def parse_lines(lines) -> list[dict]:
    """The JSON objects of ``metrics.jsonl`` lines; a line that does not parse (one torn by a kill in the
    middle of an append) is dropped."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class MetricsLog:
    """``metrics.jsonl`` in ``out`` (and TensorBoard, when asked and installed); silent when not ``enabled``
    (the processes other than rank 0)."""

    def __init__(self, out: str, enabled: bool = True, tensorboard: bool = False):
        self.path = os.path.join(out, "metrics.jsonl")
        self.enabled = enabled
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(out, "tensorboard"))
            except Exception as e:  # tensorboard not installed
                log.warning("--report-to tensorboard: TensorBoard cannot be used (%s; pip install tensorboard); "
                            "metrics go to metrics.jsonl only", e)

    def truncate_after(self, step: int, ended: bool = False) -> None:
        """Drop lines written after ``step`` (by a run that was interrupted before its next checkpoint), and a
        line torn by a kill in the middle of an append; ``ended``: also the evaluation of ``step`` (a run resumed
        at its end evaluates it again, for its final figures)."""
        if not self.enabled or not os.path.isfile(self.path):
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            keep = [json.dumps(row) + "\n" for row in parse_lines(f) if row.get("step", 0) < step
                    or (row.get("step", 0) == step and not (ended and row.get("type") == "eval"))]
        atomic_write_text(self.path, "".join(keep))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k not in ("step", "type"):
                    self.tb.add_scalar(f"{row.get('type', 'train')}/{k}", v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def rounded(d: dict, digits: int = 4) -> str:
    """A metrics dict as one JSON line, floats rounded, for the log."""
    return json.dumps({k: round(v, digits) if isinstance(v, float) else v for k, v in d.items()})


@contextlib.contextmanager
def file_log(out: str, enabled: bool = True):
    """Copy the log to ``out/train.log`` for the duration of the run."""
    if not enabled:
        yield
        return
    h = logging.FileHandler(os.path.join(out, "train.log"), encoding="utf-8")
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    h.setLevel(logging.INFO)
    old_level = log.level
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(h)
        h.close()
        log.setLevel(old_level)
