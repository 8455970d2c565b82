"""The life of a training run, the same for pretraining and fine-tuning: the output rules and the lock,
the run's folder and its log, the progress bar and the log line, periodic evaluation and checkpoints, exact
resume, interruption, and the final metrics, model card and plots.

A command subclasses :class:`TrainingRun` with what is its own (its data, its objective, its evaluation and
what its checkpoints add to the engine's state) and calls :meth:`TrainingRun.fit`.  The engine
(:mod:`bertforge.train.engine`) owns the step and its state; :mod:`bertforge.checkpoint` writes and reads it.

A checkpoint holds everything that decides the rest of the run (weights, optimizer moments, every process's
random state, the data position, the step, the logging meters), so that a run killed at any point and
resumed from its newest checkpoint ends, on the CPU, with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from .. import checkpoint as ckpt
from .. import modelcard
from ..atomic import (atomic_write_json, creating, missing_folders, remove_folders,
                     remove_stale_temporaries, writing)
from ..config import ImplConfig, TrainConfig, progress_shown
from ..devices import Dist, init_distributed, resolve_device, resolve_precision, setup_backend
from ..errors import TrainingError, UserError
from ..logs import MetricsLog, duration, file_log, log_step, rounded
from ..outputs import Output, marker_kind, write_marker
from .engine import Engine, NonFiniteLoss
from .runfolder import RunFolder

log = logging.getLogger("bertforge")


# ------------------------------------------------------------------------------------------------ the output
def recover(out: str) -> None:
    """Put right, under the output's lock, what an interrupted run left beside ``out`` (an earlier output it was to
    replace comes back): called before a command reads anything of ``out``.  Under torchrun, where every process
    checks at once, it is left to :func:`start_run`, behind a barrier."""
    if out and int(os.environ.get("WORLD_SIZE", "1")) <= 1 and os.path.isdir(os.path.dirname(os.path.abspath(out))):
        Output(out, None).recover()


def preflight(folder: RunFolder, inputs: list, overwrite: bool, resume: bool, restarts: bool = False) -> Output:
    """The run's output, its rules checked before anything is read or written: ``--resume`` needs a checkpoint
    (or, when the command ``restarts``, a run started there and killed before its first, which starts again from
    step 0) and excludes ``--overwrite``; an existing output is refused unless ``overwrite`` replaces one of the
    same kind (never one that holds the run's ``inputs``)."""
    recover(folder.out)
    if resume and overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if resume and not (restarts and folder.started) and not folder.checkpoints():
        raise UserError(f"nothing to resume: no complete checkpoint in {os.path.join(folder.out, ckpt.CHECKPOINTS)}")
    output = Output(folder.out, folder.kind, overwrite, resume, inputs)
    output.check()
    return output


ONE_RUN = threading.Lock()  # held by the training run of this process
_started: float | None = None  # when it started (time.perf_counter): its clock counts the set-up


@contextlib.contextmanager
def start_run(output: Output, impl: ImplConfig) -> Iterator[tuple[Dist, torch.device]]:
    """A run's set-up, the same for every command: (the processes, the device).  The process group that torchrun
    describes is joined; rank 0 holds the output's lock for the whole run, and under it what an interrupted
    earlier run left beside the output is recovered and the output rule applied again (``output.replace``); the
    device and its backend (threads, TF32) are set up.  The process group ends with the run."""
    global _started
    if not ONE_RUN.acquire(blocking=False):
        raise UserError("another training run is going on in this process (the Python API from another thread): "
                        "runs in one process share torch's random state, threads and the log; run them one after "
                        "the other, or in separate processes")
    _started = time.perf_counter()
    try:
        d = init_distributed(impl)
    except BaseException:
        ONE_RUN.release()
        raise
    try:
        d.barrier()  # every process has checked the output before rank 0 writes there
        output.lock = d.is_main
        with output:
            d.barrier()
            device = resolve_device(impl, d)
            setup_backend(device, impl, d)
            impl.precision = resolve_precision(device, impl)  # what the run saves, and its --resume keeps
            yield d, device
    finally:
        _started = None
        ONE_RUN.release()
        d.close()


@contextlib.contextmanager
def run_folder(output: Output, d: Dist, resume: bool, in_place: bool) -> Iterator[str]:
    """The folder the run writes into, with its ``train.log``; only rank 0 writes.

    ``in_place`` (a run that checkpoints): the output itself, an earlier output moved aside when it is replaced;
    a new run that fails before its first checkpoint is removed (nothing there to resume) and the earlier
    output put back (:func:`_in_place`).  Otherwise a temporary folder renamed into place at the end (an earlier
    output replaced only then), so a run that fails never leaves a half-written output.  A failed write (a full
    disk, a file-size limit) is one error naming the output, raised after that clean-up."""
    out = output.path
    if not d.is_main:
        yield out
        return
    if not in_place:
        with output.atomic() as tmp, file_log(tmp):
            yield tmp
        return
    with writing(out), _in_place(output, resume):
        for p in remove_stale_temporaries(out) + remove_stale_temporaries(os.path.join(out, ckpt.CHECKPOINTS)):
            log.warning("removed %s, left by an interrupted save", p)
        with file_log(out):
            yield out


@contextlib.contextmanager
def _in_place(output: Output, resume: bool) -> Iterator[None]:
    """The output written in place.  A new run that fails before its first checkpoint (a full disk at its first
    save, an error, Ctrl-C) leaves the file system as it was: nothing there to resume, no half-written output,
    and an earlier output it was to replace (kept aside until then) back under its name."""
    out, kind = output.path, output.kind
    made, aside = missing_folders(out), None
    existed = os.path.isdir(out)  # empty (the output rule), or the run to resume
    if output.replace:
        if marker_kind(out) != kind:  # checked again: never anything else
            raise UserError(f"refusing to replace {out}: it is not a {kind} output that bertforge wrote")
        aside = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.replaced-",
                                 dir=os.path.dirname(os.path.abspath(out)))
        os.rmdir(aside)
        os.rename(out, aside)
        existed = False
    try:
        with creating(out):
            os.makedirs(out, exist_ok=True)
        write_marker(out, kind)
        yield
    except BaseException:
        if not resume and not ckpt.list_checkpoints(out):
            shutil.rmtree(out, ignore_errors=True)  # all of it this run's: it was new, empty or moved aside
            if aside:
                with contextlib.suppress(OSError):  # else left beside, for recover_beside to put back
                    os.rename(aside, out)
                aside = None
            elif existed:
                with contextlib.suppress(OSError):
                    os.mkdir(out)
            remove_folders(made)
        raise
    finally:
        if aside:  # the new run has a checkpoint, or has finished
            shutil.rmtree(aside, ignore_errors=True)


def finish(folder: str, metrics: dict, card: str, plot: Callable[[], Any]) -> None:
    """The end of a run: ``metrics.json``, the model card, the plots (which never cost a finished run)."""
    atomic_write_json(os.path.join(folder, "metrics.json"), metrics)
    modelcard.write(folder, card)
    try:
        plot()
    except Exception as e:
        log.warning("could not draw plots: %s", e)


# ------------------------------------------------------------------------------------------------ progress
class Progress:
    """The progress bar (on a terminal) and the training log line (in train.log always; on stderr when no bar
    shows the same figures), with an estimate of the time left from the schedule's progress."""

    def __init__(self, engine: Engine, desc: str, total: int | None, enabled: bool):
        self.engine, self.total = engine, total
        st = engine.state
        self.bar = tqdm(total=total, initial=st.step, desc=desc, unit="step", disable=not enabled, dynamic_ncols=True)
        self.start_elapsed = st.elapsed
        self.start_progress = engine.schedule.progress(st.step, st.time_progress)

    def eta(self) -> float:
        """Seconds left: at the pace so far, and at most what a time budget leaves."""
        st, schedule = self.engine.state, self.engine.schedule
        done = schedule.progress(st.step, st.time_progress)
        run_time = st.elapsed - self.start_elapsed
        left = run_time * (1 - done) / max(done - self.start_progress, 1e-9) if done > self.start_progress else 0.0
        return min(left, max(0.0, schedule.max_time - st.elapsed)) if schedule.max_time else left

    def line(self, text: str, **postfix: str) -> None:
        st = self.engine.state
        self.bar.set_postfix(**postfix)
        of = f"/{self.total}" if self.total else ""
        log_step(f"step {st.step}{of}  {text}  elapsed {duration(st.elapsed)}  eta {duration(self.eta())}",
                 bar_shown=not self.bar.disable)


# ------------------------------------------------------------------------------------------------ interruption
STOP_SIGNALS = ("SIGINT", "SIGTERM")  # Ctrl-C; and what torchrun, a job scheduler or `kill` send to stop a run


class StopSignals:
    """While the training loop runs: the first SIGINT or SIGTERM asks the run to stop after its current step
    (:attr:`received` names it), so that it can save a checkpoint of a whole step; a second one stops it at
    once (KeyboardInterrupt), unless ``relayed``: under torchrun the agent passes each signal on to its workers
    and kills them itself if they take too long.  Signals are left alone outside the main thread."""

    def __init__(self, relayed: bool = False):
        self.received: str | None = None
        self.relayed = relayed
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for name in STOP_SIGNALS:
                sig = getattr(signal, name)
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:  # (nothing logged here: the signal may have come in the middle of a log write)
            self.received = signal.Signals(signum).name
        elif not self.relayed:
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM treated as Ctrl-C (a KeyboardInterrupt) while a command sets up its run, so that what it has
    begun to write is cleaned up as after Ctrl-C, not left behind by a process killed outright."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


# ------------------------------------------------------------------------------------------------ the run
# A checkpoint by the clock when no --save-every is given: by time, since a step lasts from milliseconds to seconds by
# model and device.  A kill that leaves no time to save (kill -9, a power cut) then costs at most this much work, while
# writing a checkpoint (the weights, Adam's two moments, fine-tuning's best weights) stays a small share of it even
# for a large model on a slow disk.
SAVE_INTERVAL = 15 * 60


class TrainingRun:
    """One training run on one :class:`~bertforge.train.engine.Engine`.  Subclasses give:

    * :meth:`next_batches`: this process's micro-batches of the next step;
    * :meth:`record`: what a step adds to the meters; :meth:`log_line`: the logged row and its text;
    * :meth:`evaluate`: an evaluation (rank 0), written to ``metrics.jsonl`` by them;
    * :meth:`run_state` / :meth:`load_run_state`: what a checkpoint adds to the engine's state (the data
      position, ...), and :attr:`required` its keys;
    * :meth:`epoch_ended`: whether the step just taken ended an epoch (an evaluation then).
    """

    desc = "training"
    required: tuple[str, ...] = ()
    checkpoints = True  # whether the run writes checkpoints (where an interrupted run saves one)
    restarts = False  # whether --resume without a checkpoint starts again from step 0 (the model is built
    # afresh from the run's settings), rather than being refused

    def __init__(self, out: str, d: Dist, engine: Engine, t: TrainConfig, progress: bool | None, tensorboard: bool,
                 total: int | None = None):
        if total is None and engine.schedule is not None:
            total = engine.schedule.max_steps  # steps that the run's length came to (pretraining's --epochs)
        self.out, self.d, self.engine, self.t, self.total = out, d, engine, t, total
        self.show_progress = progress_shown(progress) and d.is_main
        self.metrics = MetricsLog(out, d.is_main, tensorboard=tensorboard)
        self.evaluated_at = None  # the step of the last evaluation
        self.saved_step, self.saved_clock = None, time.monotonic()  # the last checkpoint's step, and when
        # save_every, the same in every command: N steps; 0 none between the start and the end; None (fine-tuning's
        # default) by the clock, every SAVE_INTERVAL seconds of the run
        self.save_interval = SAVE_INTERVAL if t.save_every is None else None
        # what a timed run's end costs (end_reserve): seconds of the steps since first_step, the last
        # evaluation's and the last save's
        self.step_seconds, self.first_step, self.eval_seconds, self.save_seconds = 0.0, 0, None, None
        self.warnings: list[str] = []  # what the run's end says it should have done otherwise (metrics, card)
        self.estimated = None  # eval_estimate's answer

    # ---- hooks
    def next_batches(self) -> list[dict]:
        raise NotImplementedError

    def record(self, out: dict, seconds: float) -> None:
        raise NotImplementedError

    def log_line(self, out: dict) -> tuple[dict, str, dict]:
        """(the metrics row, the log line's text, the progress bar's figures)."""
        raise NotImplementedError

    def evaluate(self) -> None:
        raise NotImplementedError

    def run_state(self) -> tuple[dict, dict | None]:
        """(what a checkpoint saves besides the engine's state, extra weights to save with it or None)."""
        return {}, None

    def load_run_state(self, state: dict, path: str) -> None:
        pass

    def epoch_ended(self) -> bool:
        return False

    def epoch_steps(self) -> int | None:
        """Optimizer steps in an epoch (None: not known)."""
        return None

    def short_budget_said(self) -> str | None:
        """A timed run that trained less than a tenth of an epoch, or fewer steps than its ``--warmup-steps``:
        what it did and what to do, else None.  (A ``--warmup-ratio`` is a share of the time under ``--max-time``,
        which a run that ends on time has had.)"""
        s, st, t = self.engine.schedule, self.engine.state, self.t
        epoch = self.epoch_steps()
        if s is None or not s.max_time or not epoch:
            return None
        warmup = t.warmup_steps or 0
        if st.step >= 0.1 * epoch and st.step >= warmup:
            return None
        spent = max(0.0, st.elapsed - self.progress.start_elapsed - self.step_seconds)  # (this session's)
        return (f"--max-time {duration(s.max_time)} trained {st.step} step(s), {100 * st.step / epoch:.2g}% of an "
                f"epoch of {epoch}: set-up, evaluations and saves took {duration(spent)} of it; the model has barely "
                "trained. Give a longer --max-time, a smaller --max-eval-samples or fewer evaluations (--eval-every)")

    def save_model(self) -> None:
        """Rank 0, after each checkpoint: refresh the model directory (pretraining's output is one)."""

    def nonfinite_hint(self) -> str:
        return "; try a lower --lr"

    def eval_size(self) -> int:
        """Sequences in an evaluation."""
        return 0

    def eval_estimate(self) -> float:
        """Seconds an evaluation will take, before one is measured (after the first step): a third of the
        training steps over as many sequences (the forward pass of each)."""
        per_sequence = self.step_seconds / max(1, self.engine.state.step - self.first_step) / self.t.batch_size
        return per_sequence * self.d.world * self.eval_size() / 3

    # ---- the loop
    def fit(self) -> Any:
        """Train until the schedule ends: a log line every ``log_every`` steps, an evaluation every
        ``eval_every`` steps, at each epoch's end and at the end, a checkpoint every ``save_every`` steps (or
        every ``save_interval`` seconds); then :meth:`finish`, whose result it returns.  SIGINT or SIGTERM stops
        the run after its current step with a checkpoint of it (:class:`StopSignals`): a TrainingError that says
        how to continue; once the last step is taken, the run finishes instead (the final evaluation and what
        :meth:`finish` saves are not cut short; a second Ctrl-C still stops it at once)."""
        e, st = self.engine, self.engine.state
        e.start_clock(since=_started)  # the run's clock counts its set-up, training, evaluation and saves
        self.first_step = st.step
        self.progress = Progress(e, self.desc, self.total, self.show_progress)
        with StopSignals(relayed=self.d.enabled) as signals:
            try:
                while not e.done():
                    stop, save = self._step(signals)
                    if stop:
                        raise self._interrupted(signals.received)
                    if save:
                        self.save()
            except KeyboardInterrupt:
                where = (self.last_checkpoint("; continue with --resume (from step {step})")
                         or " before the first checkpoint")
                raise TrainingError(f"interrupted at step {st.step}{where}") from None
            finally:
                self.progress.bar.close()
            said = self.short_budget_said()
            if said:
                self.warnings.append(said)
                if self.d.is_main:
                    log.warning("%s", said)
            if self.evaluated_at != st.step:
                self._evaluate()
            return self.finish()

    def finish(self) -> Any:
        """What the run saves once trained, under the stop handler (pretraining: its final checkpoint and files)."""

    def _step(self, signals: StopSignals) -> tuple[bool, bool]:
        """One optimizer step, and the log line and evaluation that fall after it: (stop now, checkpoint now)."""
        e, st, t = self.engine, self.engine.state, self.t
        t0 = time.perf_counter()
        batches = self.next_batches()
        try:
            out = e.step(batches)
        except NonFiniteLoss as err:
            raise TrainingError(f"{err}{self.nonfinite_hint()}") from None
        seconds = time.perf_counter() - t0
        self.record(out, seconds)
        self.step_seconds += seconds
        stop, save, ending = self._agree(signals, seconds)
        self.progress.bar.update(1)
        if st.step % t.log_every == 0 or e.done():
            self._log(out)
        if ((t.eval_every and st.step % t.eval_every == 0) or self.epoch_ended()) and not ending:
            self._evaluate()
        return stop, save

    def _ending(self) -> bool:
        """Whether a timed run's training time left is less than two evaluations take: one now would leave the
        final evaluation right after it (or less training than it took), the learning rate's decay cut short."""
        s, st = self.engine.schedule, self.engine.state
        if s is None or not s.max_time or self.eval_seconds is None or self.engine.done():
            return False
        return s.max_time - st.elapsed - self.end_reserve() < 2 * self.eval_seconds

    def _agree(self, signals: StopSignals, seconds: float) -> tuple[bool, bool, bool]:
        """(stop now, checkpoint now, too near a timed end to evaluate), and a timed run's progress
        (:meth:`Engine.advance`), the same on every process: a signal that any process received (a run at its
        last step finishes instead); a checkpoint every ``save_every`` steps, or once ``save_interval`` seconds
        have passed on rank 0's clock since the last one; the time budget's share used, and :meth:`_ending`, by
        rank 0's clock."""
        e, st, t = self.engine, self.engine.state, self.t
        by_steps = bool(t.save_every) and st.step % t.save_every == 0
        by_time = (self.save_interval is not None and self.d.is_main
                   and time.monotonic() - self.saved_clock >= self.save_interval)
        used = e.advance(seconds, self.end_reserve()) if self.d.is_main else 0.0
        flags = [float(signals.received is not None), float(by_time), used, float(self.d.is_main and self._ending())]
        if self.d.enabled:  # one all-reduce of four numbers a step
            flags = self.d.all_sum(flags, e.device)
            st.time_progress = flags[2]
        going = not e.done()
        return flags[0] > 0 and going, (by_steps or flags[1] > 0) and going, flags[3] > 0

    def end_reserve(self) -> float:
        """Seconds a timed run keeps for its end: a final evaluation and a save, as long as the last ones took
        (before the first evaluation, :meth:`eval_estimate`)."""
        if self.engine.schedule is None or not self.engine.schedule.max_time:
            return 0.0
        if self.eval_seconds is None and self.estimated is None:
            self.estimated = self.eval_estimate()
        evaluation = self.eval_seconds if self.eval_seconds is not None else self.estimated
        return evaluation + (self.save_seconds or 0.0)

    def _interrupted(self, received: str | None) -> TrainingError:
        """A run stopped by a signal after its current step: a checkpoint of that step, and how to continue."""
        st = self.engine.state
        by = f" by {received}" if received else " (another process was signalled)"
        if not self.checkpoints:
            return TrainingError(f"interrupted at step {st.step}{by}; this run writes no checkpoints (--save-every 0): "
                                 "nothing to resume")
        if self.saved_step != st.step:
            if self.d.is_main:
                log.warning("interrupted%s: saving a checkpoint of step %d%s", by, st.step,
                            "" if self.d.enabled else " (a second Ctrl-C stops at once)")
            self.save()
        return TrainingError(f"interrupted at step {st.step}{by}; saved a checkpoint of it: resume with the same "
                             "command and --resume")

    def _log(self, out: dict) -> None:
        self.engine.tick()  # the clock moves at every line, not only where a timed schedule or an evaluation reads it
        row, text, postfix = self.log_line(out)
        self.metrics.write(row)
        if self.d.is_main:
            self.progress.line(text, **postfix)

    def _evaluate(self) -> None:
        t0 = time.perf_counter()
        self.evaluate()
        self.evaluated_at = self.engine.state.step
        self.engine.tick()
        self.eval_seconds = time.perf_counter() - t0

    # ---- checkpoints
    def save(self) -> None:
        """A checkpoint of everything that decides the rest of the run (a collective: every process calls it); none
        when the newest is of this step already (a run resumed at its end)."""
        if self.saved_step == self.engine.state.step:  # (the model directory refreshed all the same: a run killed
            if self.d.is_main:  # between its checkpoint and that refresh holds an older step's there)
                self.save_model()
            return
        t0 = time.perf_counter()
        engine_state = self.engine.state_dict()
        if self.d.is_main:
            state, extra = self.run_state()
            ckpt.save_checkpoint(self.out, self.engine.state.step, self.engine.objective.model, engine_state, state,
                                 self.t.keep_checkpoints, extra_weights=extra)
            self.save_model()
        self.engine.tick()
        self.d.barrier()
        self.saved_step, self.saved_clock = self.engine.state.step, time.monotonic()
        self.save_seconds = time.perf_counter() - t0

    def restore(self) -> None:
        """Continue from the newest checkpoint that loads whole; rank 0 chooses it (damaged newer ones are moved
        aside, with a warning) and the other processes load the same.  A run killed before its first checkpoint
        starts again from step 0 (when it :attr:`restarts`), and says so."""
        model, path, refused = self.engine.objective.model, None, None
        if self.d.is_main:
            ckpt.set_aside_incomplete(self.out)
        self.d.barrier()
        if not ckpt.list_checkpoints(self.out):
            if not self.restarts:
                raise UserError(f"nothing to resume in {self.out}: no checkpoint there loads whole")
            self.metrics.truncate_after(0)  # what it logged before it was killed
            log.warning("no checkpoint in %s: the run was stopped before its first one, so it starts again "
                        "from step 0", os.path.join(self.out, ckpt.CHECKPOINTS))
            return
        if self.d.is_main:
            try:
                step, path, engine_state, state = ckpt.restore_newest(self.out, model, self.required)
            except UserError as e:  # said by every process, none left waiting for rank 0's choice
                refused = str(e)
        if self.d.enabled:
            chosen = [path, refused]
            dist.broadcast_object_list(chosen, src=0)
            path, refused = chosen
        if refused is not None:
            raise UserError(refused)
        if not self.d.is_main:
            engine_state, state = ckpt.load_checkpoint(path, model)
            step = int(state["step"])
        try:
            self.engine.load_state_dict(engine_state)
        except (ValueError, KeyError, RuntimeError) as e:  # the optimizer's groups of another model
            detail = " ".join(str(e).split())[:200]
            raise UserError(f"checkpoint {path} does not fit this run's model ({detail})") from None
        self.load_run_state(state, path)
        self.saved_step = step
        self.metrics.truncate_after(step, ended=self.engine.done())
        log.info("resumed from %s (step %d%s)", path, step, f" of {self.total}" if self.total else "")

    def last_checkpoint(self, fmt: str = "; the last good checkpoint is {path}") -> str:
        found = ckpt.list_checkpoints(self.out)
        return fmt.format(step=found[-1][0], path=found[-1][1]) if found else ""

    def log_eval(self, res: dict, what: str, **extra: Any) -> None:
        """An evaluation's line in metrics.jsonl (with ``extra`` fields) and in the log."""
        self.metrics.write({"type": "eval", "step": self.engine.state.step, **extra, **res})
        log.info("%s: %s", what, rounded(res))
