"""The fine-tuning loop shared by every task: AdamW with linear warmup and decay, gradient clipping,
evaluation after each epoch, the best epoch kept.

A task supplies its training features, a function that pads a list of them into a batch, and a function
that evaluates a model (returning metrics, and whatever the task writes beside the model, such as
predictions).  Outputs are written into a temporary folder renamed into place at the end, so a run that
fails never leaves a half-written output directory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from .config import FinetuneConfig, ImplConfig, TrainConfig
from .engine import (
    LinearSchedule,
    TrainingError,
    autocast_context,
    build_optimizer,
    resolve_device,
    set_lr,
    setup_backend,
)
from .evaluation import to_device
from .plots import plot_finetuning

log = logging.getLogger("bertforge")


def impl_of(cfg: FinetuneConfig) -> ImplConfig:
    return ImplConfig(device=cfg.device, precision=cfg.precision, progress=cfg.progress)


def device_of(cfg: FinetuneConfig) -> torch.device:
    impl = impl_of(cfg)
    device = resolve_device(impl)
    setup_backend(device, impl)
    return device


def pad_batch(features: list[dict], pad_id: int, keys_1d: tuple[str, ...] = ()) -> dict:
    """Pad ``input_ids``/``token_type_ids`` to the longest feature; ``keys_1d`` are per-example integers."""
    T = max(len(f["input_ids"]) for f in features)
    B = len(features)
    ids = np.full((B, T), pad_id, dtype=np.int64)
    tt = np.zeros((B, T), dtype=np.int64)
    am = np.zeros((B, T), dtype=np.int64)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        ids[i, :n] = f["input_ids"]
        tt[i, :n] = f["token_type_ids"]
        am[i, :n] = 1
    batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(tt), "attention_mask": torch.from_numpy(am)}
    for k in keys_1d:
        batch[k] = torch.tensor([f[k] for f in features], dtype=torch.long)
    return batch


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    """Index batches of similar lengths (for inference: little padding); callers restore the order."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


@dataclass
class EpochResult:
    epoch: int
    step: int
    metrics: dict[str, float]
    artifacts: Any = None


def train_task(
    model: torch.nn.Module,
    features: list[dict],
    collate: Callable[[list[dict]], dict],
    evaluate: Callable[[torch.nn.Module], tuple[dict, Any]],
    select: str,
    cfg: FinetuneConfig,
    out_dir: str,
    device: torch.device,
) -> tuple[EpochResult, list[EpochResult]]:
    """Fine-tune ``model`` for ``cfg.epochs`` epochs; return (best epoch, every epoch).

    The model's weights are those of the best epoch (by ``select``, higher is better) when this returns.
    Training lines (every ``log_every`` steps) and evaluation lines (every epoch) go to
    ``out_dir/metrics.jsonl``.
    """
    if not features:
        raise TrainingError("no training examples")
    if cfg.freeze_embeddings:
        model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
    steps_per_epoch = math.ceil(len(features) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    tcfg = TrainConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, seed=cfg.seed)
    optimizer = build_optimizer(model, tcfg, device)
    schedule = LinearSchedule(cfg.lr, total, None, None, cfg.warmup_ratio)
    autocast = autocast_context(device, impl_of(cfg))
    gen = torch.Generator().manual_seed(cfg.seed)
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    history: list[EpochResult] = []
    best: EpochResult | None = None
    best_state = None
    step = 0
    start = time.perf_counter()
    bar = tqdm(total=total, desc="fine-tuning", unit="step", disable=not cfg.progress, dynamic_ncols=True)
    model.train()
    with open(metrics_path, "a", encoding="utf-8") as mlog:
        for epoch in range(1, cfg.epochs + 1):
            order = torch.randperm(len(features), generator=gen).numpy()
            run_loss, run_n = 0.0, 0
            for i in range(0, len(order), cfg.batch_size):
                batch = to_device(collate([features[j] for j in order[i : i + cfg.batch_size]]), device)
                lr = schedule.lr(step)
                set_lr(optimizer, lr)
                with autocast:
                    loss = model(**batch).loss
                if not torch.isfinite(loss):
                    raise TrainingError(f"the loss is not finite at step {step + 1}; try a lower --lr")
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm, foreach=True)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                run_loss += float(loss.detach())
                run_n += 1
                bar.update(1)
                if step % cfg.log_every == 0 or step == total:
                    mlog.write(json.dumps({"type": "train", "step": step, "epoch": epoch, "loss": run_loss / run_n, "lr": lr,
                                           "elapsed": time.perf_counter() - start}) + "\n")
                    mlog.flush()
                    bar.set_postfix(loss=f"{run_loss / run_n:.4f}", lr=f"{lr:.2e}")
                    run_loss, run_n = 0.0, 0
            res, artifacts = evaluate(model)
            model.train()
            result = EpochResult(epoch, step, res, artifacts)
            history.append(result)
            mlog.write(json.dumps({"type": "eval", "step": step, "epoch": epoch, **res}) + "\n")
            mlog.flush()
            log.info("epoch %d: %s", epoch, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
            if best is None or res[select] > best.metrics[select]:
                best = result
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    bar.close()
    assert best is not None and best_state is not None
    model.load_state_dict(best_state)
    return best, history


def finish_outputs(out_dir: str, cfg: FinetuneConfig, task_cfg: Any, best: EpochResult, history: list[EpochResult],
                   train_seconds: float, extra: dict, metric_keys: list[tuple[str, str]]) -> dict:
    """metrics.json, the resolved configuration and the plots."""
    import dataclasses

    metrics = {
        **best.metrics,
        "best_epoch": best.epoch,
        "epochs": [{"epoch": h.epoch, **h.metrics} for h in history],
        "train_seconds": train_seconds,
        **extra,
    }
    with open(os.path.join(out_dir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    with open(os.path.join(out_dir, "finetune_config.json"), "w", encoding="utf-8") as f:
        json.dump({"finetune": dataclasses.asdict(cfg), "task": dataclasses.asdict(task_cfg)}, f, indent=2)
    try:
        plot_finetuning(os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "plots"), metric_keys)
    except Exception as e:  # plots never cost a finished run
        log.warning("could not draw plots: %s", e)
    return metrics
