"""Turning examples into model batches: padding to the longest, length-sorted batches for inference, moving
to the device.  Shared by fine-tuning, evaluation and prediction (which imports nothing of training)."""

from __future__ import annotations

import numpy as np
import torch


def to_device(batch: dict, device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


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
