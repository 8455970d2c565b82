"""Fine-tuning: one runner for every task, on the same engine as pretraining.

A task (:class:`~bertforge.tasks.base.FinetuneTask`; :mod:`bertforge.tasks`) reads and checks its files, adapts the model's
config (labels), encodes its examples, evaluates a model and writes its predictions.  The runner does the
rest, the same for every task: the model directory and its tokenizer, the device, the seed, training for a
number of epochs or steps with evaluation after each epoch and every ``--eval-every`` steps (the best
evaluation kept), and the outputs, written into a
temporary folder renamed into place at the end, so a run that fails never leaves a half-written output
directory.

Under ``torchrun`` every process trains on its share of each global batch (DistributedDataParallel); rank 0
alone evaluates, checkpoints and writes.  On the CPU each example's dropout masks are keyed by (seed, step,
its index in the training set), so one process, N processes and N accumulation steps compute the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from tqdm import tqdm

from . import checkpoint as ckpt
from . import modelcard
from .batching import to_device
from .checkpoint import save_pretrained
from .config import BertConfig, FinetuneConfig, validate_fields
from .devices import Dist, init_distributed, resolve_device, setup_backend
from .engine import Engine, LinearSchedule, NonFiniteLoss, gather_rng_states, restore_rng_state
from .errors import TrainingError, UserError
from .atomic import atomic_dir, remove_stale_temporaries
from .files import read_json_object
from .outputs import (MODEL_FILES, OutputLock, check_inputs_outside, check_output, recover_beside, register_output,
                      remove_output, write_marker)
from .logs import MetricsLog, duration, file_log, log_step, rounded
from .ops.dropout import batch_keys
from .plots import plot_finetuning
from .tasks import FinetuneTask
from .tokenizer import check_vocab_fits, load_tokenizer

log = logging.getLogger("bertforge")
register_output("finetune", MODEL_FILES | {"finetune_config.json", "metrics.jsonl", "metrics.json", "train.log",
                                           "plots", "tensorboard", "predictions.json", "predictions.jsonl",
                                           "README.md", "checkpoints"})


@dataclass
class EpochResult:
    epoch: int
    step: int
    metrics: dict[str, float]
    artifacts: Any = None


def finetune(task: FinetuneTask, cfg: FinetuneConfig, overwrite: bool = False, resume: bool = False) -> dict:
    """Fine-tune ``cfg.model`` on ``task``; return the best evaluation's metrics (also in OUT/metrics.json).

    An existing, non-empty ``cfg.out`` is refused, unless ``overwrite`` and it is an earlier fine-tuning
    output of bertforge's; or ``resume``, which continues the run that ``--save-every`` checkpointed there
    from its newest checkpoint that loads (with the same settings, checked first).  Without ``--save-every``
    the output is written into a temporary folder renamed into place at the end (an earlier output replaced
    only then); with it the run writes into ``cfg.out`` (its checkpoints in ``checkpoints/``, removed at the
    end), and ``overwrite`` removes the earlier output first, as pretraining's does.
    """
    if cfg.model and isinstance(cfg.model, str):  # (the rest of --model's checks: in validate)
        if not os.path.isdir(cfg.model):
            raise UserError(f"model directory not found: {cfg.model}")
    cfg.validate()
    validate_fields(task.settings)
    if resume and overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if resume and not ckpt.list_checkpoints(cfg.out):
        raise UserError(f"nothing to resume: no complete checkpoint in {os.path.join(cfg.out, ckpt.CHECKPOINTS)}")
    if check_output(cfg.out, "finetune", overwrite=overwrite, resume=resume):
        check_inputs_outside(cfg.out, [cfg.model, cfg.data.train_file, cfg.data.validation_file])
    d = init_distributed(cfg.impl)
    try:
        if cfg.train.batch_size < d.world * cfg.train.grad_accum:
            raise UserError(f"--batch-size {cfg.train.batch_size} is smaller than processes x --grad-accum")
        d.barrier()  # every process has checked the output before rank 0 writes there
        with OutputLock(cfg.out, enabled=d.is_main):  # rank 0 writes, so rank 0 locks
            replace = False
            if d.is_main:
                recover_beside(cfg.out)  # an interrupted earlier run's leftovers, then the rule again
                replace = check_output(cfg.out, "finetune", overwrite=overwrite, resume=resume)
            d.barrier()
            return _run(task, cfg, replace, resume, d)
    finally:
        if d.enabled and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _in_place(out: str, replace: bool, resume: bool) -> Iterator[str]:
    """The output folder of a checkpointed run, written in place; a new one that fails before its first
    checkpoint is removed (nothing there to resume)."""
    if replace:
        remove_output(out, "finetune")
    os.makedirs(out, exist_ok=True)
    write_marker(out, "finetune")
    with ckpt.removed_unless_checkpointed(out, "finetune", enabled=not resume):
        yield out


def _run(task: FinetuneTask, cfg: FinetuneConfig, replace: bool, resume: bool = False, d: Dist | None = None) -> dict:
    d = d or Dist()
    task.read(cfg)
    tok = load_tokenizer(cfg.model)
    config = BertConfig.load(cfg.model)
    check_vocab_fits(tok, config.vocab_size, cfg.model)
    if cfg.data.max_seq_length > config.max_position_embeddings:
        raise UserError(f"--max-seq-length {cfg.data.max_seq_length} exceeds the model's {config.max_position_embeddings} positions")
    reinit_head = task.configure(config)
    features, collate = task.encode(tok, cfg)
    warn_untrained_positions(cfg.model, max((len(f["input_ids"]) for f in features), default=0), d)
    device = resolve_device(cfg.impl, d)
    setup_backend(device, cfg.impl, d)
    torch.manual_seed(cfg.train.seed)
    model = task.model_class.from_pretrained(cfg.model, config=config, reinit_head=reinit_head).to(device)
    torch.manual_seed(cfg.train.seed + d.rank)  # the same new head everywhere; dropout streams differ by rank (CUDA)
    checkpointed = resume or bool(cfg.train.save_every)
    if not d.is_main:  # the other processes train, and write nothing
        train_epochs(model, features, collate, task, cfg, cfg.out, device, resume=resume, d=d)
        d.barrier()  # until rank 0 has written the outputs
        return {}
    folder = _in_place(cfg.out, replace, resume) if checkpointed else atomic_dir(cfg.out, replace=replace)
    with folder as tmp, file_log(tmp):
        if not checkpointed:
            write_marker(tmp, "finetune")
        best, history, train_seconds = train_epochs(model, features, collate, task, cfg, tmp, device, resume=resume, d=d)
        save_pretrained(model, tmp, tokenizer=tok)
        extra = task.write_outputs(tmp, best.artifacts)
        metrics = {**best.metrics, "best_epoch": best.epoch, "best_step": best.step,
                   "epochs": [{"epoch": h.epoch, "step": h.step, **h.metrics} for h in history],  # every evaluation
                   "train_seconds": train_seconds, **extra}
        with open(os.path.join(tmp, "metrics.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
        with open(os.path.join(tmp, "finetune_config.json"), "w", encoding="utf-8") as f:
            json.dump({"finetune": cfg.to_dict(), "task": dataclasses.asdict(task.settings), "processes": d.world}, f, indent=2)
        _write_card(tmp, task, cfg, metrics)
        try:
            plot_finetuning(os.path.join(tmp, "metrics.jsonl"), os.path.join(tmp, "plots"), task.plotted)
        except Exception as e:  # plots never cost a finished run
            log.warning("could not draw plots: %s", e)
        if checkpointed:  # the run is complete: its checkpoints have served (damaged ones stay, for inspection)
            for _, path in ckpt.list_checkpoints(tmp):
                shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(tmp, ckpt.CHECKPOINTS))
    d.barrier()
    return metrics


def _write_card(folder: str, task: FinetuneTask, cfg: FinetuneConfig, metrics: dict) -> None:
    t = cfg.train
    length = f"{t.max_steps} steps" if t.max_steps else f"{t.epochs} epoch(s)"
    summary = (f"`{cfg.model}` fine-tuned for {task.name} on `{cfg.data.train_file}` for {length}; the weights of epoch "
               f"{metrics['best_epoch']} (step {metrics['best_step']}) kept, the best by {task.select} on "
               f"`{cfg.data.validation_file}`.")
    settings = {"task": task.name, "epochs": t.epochs, "max_steps": t.max_steps, "grad_accum": t.grad_accum,
                "eval_every": t.eval_every, "batch_size": t.batch_size, "lr": t.lr, "warmup_ratio": t.warmup_ratio,
                "weight_decay": t.weight_decay, "max_seq_length": cfg.data.max_seq_length,
                "max_train_examples": cfg.data.max_train_examples, "group_by_length": cfg.data.group_by_length, "seed": t.seed, **dataclasses.asdict(task.settings)}
    shown = {k: v for k, v in metrics.items() if k != "epochs"}
    modelcard.write(folder, modelcard.render(
        f"{task.name} model fine-tuned by bertforge", summary,
        "question-answering" if task.name == "squad" else "text-classification", shown, settings,
        [cfg.data.train_file, cfg.data.validation_file], cfg.model, modelcard.base_license(cfg.model),
        load=task.model_class.__name__))


def pretrained_length(model_dir: str) -> int | None:
    """The longest sequence ``bertforge pretrain`` trained the model in ``model_dir`` on, when it trained it
    from its start (positions beyond it are still at their starting values); None when unknown (a model
    from elsewhere, or one pretrained on from another's weights with ``--init``)."""
    from .pretrain import CONFIG_FILE

    try:
        saved = read_json_object(os.path.join(model_dir, CONFIG_FILE), CONFIG_FILE)
        if saved["model"].get("init"):
            return None
        return int(saved["data"]["max_seq_length"])
    except (UserError, ValueError, KeyError, TypeError, AttributeError):
        return None


def warn_untrained_positions(model_dir: str, longest: int, d: Dist) -> None:
    """Warn when the fine-tuning sequences reach positions the model was never pretrained at."""
    trained = pretrained_length(model_dir)
    if trained and longest > trained and d.is_main:
        log.warning("%s was pretrained on sequences of at most %d tokens and these reach %d: positions %d-%d start "
                    "untrained (a shorter --max-seq-length keeps to what it learned)", model_dir, trained, longest,
                    trained, longest - 1)


MIN_UPDATES = 100  # fewer optimizer updates than this rarely fine-tune a BERT well: warned


def _loss_fn(global_batch: int, seed: int | None = None, step: int = 0, weight: float = 1.0):
    """The loss of one micro-batch, normalised over the global batch (the task losses are means).  On the CPU,
    with ``seed`` and the batch's ``sequence_ids`` (each example's index in the training set), dropout masks
    are keyed by (seed, ``step``, example).  ``weight`` 0: a process without examples in this step (the last,
    small batch of an epoch) takes part with a batch that counts for nothing."""

    def loss_fn(model, batch: dict):
        keys = batch_keys(batch, seed, step)
        loss = model(**{k: v for k, v in batch.items() if k != "sequence_ids"}, dropout_keys=keys).loss
        n = batch["input_ids"].shape[0] * weight
        return loss * (n / global_batch), {"loss": loss.detach() * n}

    return loss_fn


def plan_steps(n_examples: int, t) -> tuple[int, int]:
    """(epochs, total optimizer steps): ``--max-steps``, when given, sets the total (as the Trainer's
    ``max_steps``: the epochs are as many as it takes); otherwise ``--epochs`` passes."""
    per_epoch = math.ceil(n_examples / t.batch_size)
    if t.max_steps:
        return math.ceil(t.max_steps / per_epoch), t.max_steps
    return t.epochs, per_epoch * t.epochs


GROUP_BATCHES = 50  # --group-by-length sorts by length within each run of this many batches


def group_by_length(order, lengths: list[int], batch_size: int):
    """The epoch's random ``order`` cut into runs of :data:`GROUP_BATCHES` batches, each run sorted by length,
    longest first: batches of similar lengths, in an order that stays random from run to run (the idea of
    the Trainer's ``group_by_length``)."""
    size = GROUP_BATCHES * batch_size
    runs = [sorted(order[i : i + size], key=lambda j: -lengths[j]) for i in range(0, len(order), size)]
    return np.asarray([j for run in runs for j in run], dtype=np.int64)


def _fingerprint(cfg: FinetuneConfig, task: FinetuneTask) -> dict:
    """The settings a resumed run must share with the run it continues (not how often it saves or logs)."""
    train = {k: v for k, v in dataclasses.asdict(cfg.train).items() if k not in ("save_every", "keep_checkpoints", "log_every")}
    return {"model": cfg.model, "freeze_embeddings": cfg.freeze_embeddings, "train": train, "data": dataclasses.asdict(cfg.data),
            "task": dataclasses.asdict(task.settings), "precision": cfg.impl.precision}


def _differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k), now.get(k)
        if k not in saved and b in (None, False):  # a setting newer than the checkpoint, at its default
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k} {b!r} (the checkpoint's: {a!r})")
    return out


def train_epochs(model: torch.nn.Module, features: list[dict], collate: Callable[[list[dict]], dict], task: FinetuneTask,
                 cfg: FinetuneConfig, out_dir: str, device: torch.device, resume: bool = False,
                 d: Dist | None = None) -> tuple[EpochResult, list[EpochResult], float]:
    """Fine-tune ``model`` for ``cfg.train.epochs`` epochs (or ``max_steps`` steps); return (best evaluation,
    every evaluation, seconds of training across resumptions).

    Evaluation runs after every epoch and, with ``eval_every``, every that many steps; the model's weights are
    those of the best evaluation (by ``task.select``) when this returns.  Each optimizer step takes
    ``batch_size`` examples in ``grad_accum`` micro-batches (the same update as one batch, in less memory).
    Training lines (every ``log_every`` steps) and evaluation lines go to ``out_dir/metrics.jsonl``.  With
    ``save_every`` a checkpoint every that many steps holds everything the rest of the run depends on
    (weights, optimizer, the epoch's data order and position, the random states, the evaluations so far and
    the best one's weights), so that ``resume`` ends with the weights of the uninterrupted run, bit for bit.
    Under ``torchrun`` (``d``) each process takes its share of every batch; rank 0 evaluates and saves.
    """
    t, d = cfg.train, d or Dist()
    if not features:
        raise TrainingError("no training examples")
    if cfg.freeze_embeddings:
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    epochs, total = plan_steps(len(features), t)
    if total < MIN_UPDATES and not resume and d.is_main:
        log.warning("this run makes only %d optimizer updates (%d examples, batch %d, %s); fine-tuning usually "
                    "needs a few hundred: lower --batch-size or raise --epochs (or --max-steps)", total, len(features), t.batch_size,
                    f"--max-steps {t.max_steps}" if t.max_steps else f"{t.epochs} epoch(s)")
    engine = Engine(model, t, cfg.impl, device, d, schedule=LinearSchedule(t.lr, total, None, t.warmup_steps, t.warmup_ratio))
    metrics = MetricsLog(out_dir, d.is_main, tensorboard=cfg.impl.report_to == "tensorboard")
    gen = torch.Generator().manual_seed(t.seed)
    history: list[EpochResult] = []
    best: list = [None, None]  # (EpochResult, weights on the CPU)
    fingerprint = _fingerprint(cfg, task)
    start_epoch, start_i, order = 1, 0, None
    if resume:
        def same_settings(state: dict) -> None:
            changed = _differences(state["settings"], fingerprint)
            if changed:
                raise UserError(f"--resume continues the run in {out_dir} with its own settings; this command changes "
                                + "; ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))

        if d.is_main:  # rank 0 chooses the checkpoint (moving damaged ones aside); the others load the same
            for p in remove_stale_temporaries(os.path.join(out_dir, ckpt.CHECKPOINTS)):
                log.warning("removed %s, left by an interrupted save", p)
            step, path, state = ckpt.restore_newest(out_dir, model, engine.optimizer, check=same_settings,
                                                    required=("epoch", "next", "order", "gen", "rng", "history", "settings"))
        if d.enabled:
            chosen = [path if d.is_main else None]
            dist.broadcast_object_list(chosen, src=0)
            if not d.is_main:
                path = chosen[0]
                state = ckpt.load_checkpoint(path, model, engine.optimizer)
                step = int(state["step"])
        engine.state.load_state_dict(state)
        if "scaler" in state and engine.scaler.is_enabled():
            engine.scaler.load_state_dict(state["scaler"])
        gen.set_state(state["gen"])
        restore_rng_state(state["rng"], d.rank)
        history = [EpochResult(e, s, m) for e, s, m in state["history"]]
        if state.get("best") is not None:
            best[:] = EpochResult(*state["best"]), load_file(os.path.join(path, "best.safetensors"))
        start_epoch, start_i, order = int(state["epoch"]), int(state["next"]), state["order"].numpy()
        if start_i >= len(order):
            start_epoch, start_i, order = start_epoch + 1, 0, None
        metrics.truncate_after(step)
        engine.start_clock()
        log.info("resumed from %s (step %d of %d)", path, step, total)
    bar = tqdm(total=total, initial=engine.state.step, desc="fine-tuning", unit="step",
               disable=not (cfg.impl.progress and d.is_main), dynamic_ncols=True)

    def evaluate(epoch: int) -> None:
        if not d.is_main:  # rank 0 evaluates; the others wait for it at the next step's all-reduce
            return
        res, artifacts = task.evaluate(model, device)
        model.train()
        result = EpochResult(epoch, engine.state.step, res, artifacts)
        history.append(result)
        metrics.write({"type": "eval", "step": engine.state.step, "epoch": epoch, **res})
        log.info("epoch %d, step %d: %s", epoch, engine.state.step, rounded(res))
        if best[0] is None or res[task.select] > best[0].metrics[task.select]:
            best[:] = result, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def save(epoch: int, next_i: int, order) -> None:
        rngs = gather_rng_states(d)
        if not d.is_main:
            d.barrier()
            return
        b = best[0]
        state = {**engine.state.state_dict(), "epoch": epoch, "next": next_i, "order": torch.as_tensor(order),
                 "gen": gen.get_state(), "rng": rngs, "settings": fingerprint,
                 "history": [[h.epoch, h.step, h.metrics] for h in history],
                 "best": None if b is None else [b.epoch, b.step, b.metrics]}
        if engine.scaler.is_enabled():
            state["scaler"] = engine.scaler.state_dict()
        ckpt.save_checkpoint(out_dir, engine.state.step, model, engine.optimizer, state, t.keep_checkpoints,
                             extra_weights=None if b is None else {"best": best[1]})
        engine.tick()
        d.barrier()

    lengths = [len(f["input_ids"]) for f in features] if cfg.data.group_by_length else None
    model.train()
    for epoch in range(start_epoch, epochs + 1):
        if order is None:
            order = torch.randperm(len(features), generator=gen).numpy()
            if lengths is not None:
                order = group_by_length(order, lengths, t.batch_size)
        if start_i == 0:
            engine.state.take_meters()  # a logging line covers steps of its own epoch only
        for i in range(start_i, len(order), t.batch_size):
            idx = order[i : i + t.batch_size]
            mine, weight = idx[d.rank :: d.world], 1.0  # this process's share of the batch
            if len(mine) == 0:
                mine, weight = idx[:1], 0.0
            micro = math.ceil(len(mine) / t.grad_accum)
            batches = [to_device({**collate([features[j] for j in part]), "sequence_ids": torch.as_tensor(part)}, device)
                       for part in (mine[k : k + micro] for k in range(0, len(mine), micro))]
            try:
                out = engine.step(batches, _loss_fn(len(idx), t.seed, engine.state.step, weight))
            except NonFiniteLoss as err:
                raise TrainingError(f"{err}; try a lower --lr") from None
            engine.state.add(loss=out["loss"] / len(idx), grad_norm=out["grad_norm"], n=1)
            bar.update(1)
            step = engine.state.step
            if step % t.log_every == 0 or step == total:
                m = engine.state.take_meters()
                elapsed = engine.tick()
                metrics.write({"type": "train", "step": step, "epoch": epoch, "loss": m["loss"] / m["n"], "lr": out["lr"],
                               "elapsed": elapsed})
                bar.set_postfix(loss=f"{m['loss'] / m['n']:.4f}", lr=f"{out['lr']:.2e}")
                if d.is_main:  # one process reports
                    log_step(f"step {step}/{total}  epoch {epoch}  loss {m['loss'] / m['n']:.4f}  lr {out['lr']:.2e}  "
                             f"grad-norm {m['grad_norm'] / m['n']:.3f}  elapsed {duration(elapsed)}  "
                             f"eta {duration(elapsed * (total - step) / step)}", bar_shown=not bar.disable)
            if step == total or i + t.batch_size >= len(order):
                evaluate(epoch)  # the end of the epoch, or of the run
            elif t.eval_every and step % t.eval_every == 0:
                evaluate(epoch)
            if step == total:
                break
            if t.save_every and step % t.save_every == 0:
                save(epoch, i + t.batch_size, order)
        order, start_i = None, 0
        if engine.state.step >= total:
            break
    bar.close()
    if not d.is_main:
        return None, [], engine.tick()
    model.load_state_dict(best[1])
    if best[0].artifacts is None:  # the best evaluation came before a resumption: its predictions again
        best[0].artifacts = task.evaluate(model, device)[1]
    return best[0], history, engine.tick()
