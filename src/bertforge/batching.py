"""Turning examples into model batches: padding to the longest, length-sorted batches for inference, moving
to the device.  Shared by fine-tuning, evaluation and prediction (which imports nothing of training)."""

from __future__ import annotations

import math

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
    batch = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(tt),
             "attention_mask": torch.from_numpy(am)}
    for k in keys_1d:
        batch[k] = torch.tensor([f[k] for f in features], dtype=torch.long)
    return batch


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[np.ndarray]:
    """Index batches of similar lengths (for inference: little padding), longest first; callers restore the order.

    Longest first, because each batch's tensors then fit in the memory the batch before freed: in ascending
    order every batch asks for a little more than any freed block, and glibc's heap grew with every batch of a
    long evaluation (docs/log/edges.md, "An evaluation's memory")."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# ------------------------------------------------------------------------------------------------ training
GROUP_BATCHES = 50  # --group-by-length sorts by length within each run of this many batches


def plan_steps(n_examples: int, t) -> tuple[int, int]:
    """(epochs, total optimizer steps): ``--max-steps``, when given, sets the total (as the Trainer's
    ``max_steps``: the epochs are as many as it takes); otherwise ``--epochs`` passes."""
    per_epoch = math.ceil(n_examples / t.batch_size)
    if t.max_steps:
        return math.ceil(t.max_steps / per_epoch), t.max_steps
    return t.epochs, per_epoch * t.epochs


def group_by_length(order, lengths: list[int], batch_size: int):
    """The epoch's random ``order`` cut into runs of :data:`GROUP_BATCHES` batches, each run sorted by length,
    longest first: batches of similar lengths, in an order that stays random from run to run (the idea of
    the Trainer's ``group_by_length``)."""
    size = GROUP_BATCHES * batch_size
    runs = [sorted(order[i : i + size], key=lambda j: -lengths[j]) for i in range(0, len(order), size)]
    return np.asarray([j for run in runs for j in run], dtype=np.int64)


class EpochBatches:
    """Fine-tuning's batches: each epoch a random order of the examples (from ``generator``, optionally
    grouped by length), cut into global batches of ``batch_size``; this process takes every ``world``-th
    example of each, in ``grad_accum`` micro-batches.  The position (epoch, next example, the epoch's order)
    is the state saved in checkpoints (the generator's, by the engine that owns it)."""

    def __init__(self, features: list[dict], collate, batch_size: int, grad_accum: int, generator: torch.Generator,
                 rank: int = 0, world: int = 1, group: bool = False):
        self.features, self.collate, self.batch_size, self.grad_accum = features, collate, batch_size, grad_accum
        self.rank, self.world = rank, world
        self.generator = generator
        self.lengths = [len(f["input_ids"]) for f in features] if group else None
        self.epoch, self.next, self.order = 1, 0, None

    def epoch_ended(self) -> bool:
        return self.order is not None and self.next >= len(self.order)

    def at_epoch_start(self) -> bool:
        """Whether the next batch is an epoch's first."""
        return self.order is None or self.epoch_ended()

    def take(self) -> list[dict]:
        """This process's micro-batches of the next global batch."""
        if self.epoch_ended():
            self.epoch, self.next, self.order = self.epoch + 1, 0, None
        if self.order is None:
            self.order = torch.randperm(len(self.features), generator=self.generator).numpy()
            if self.lengths is not None:
                self.order = group_by_length(self.order, self.lengths, self.batch_size)
        idx = self.order[self.next : self.next + self.batch_size]
        self.next += self.batch_size
        mine, weight = idx[self.rank :: self.world], 1.0  # this process's share of the batch
        if len(mine) == 0:
            mine, weight = idx[:1], 0.0
        micro = math.ceil(len(mine) / self.grad_accum)
        parts = (mine[k : k + micro] for k in range(0, len(mine), micro))
        batches = [{**self.collate([self.features[j] for j in part]), "sequence_ids": torch.as_tensor(part)}
                   for part in parts]
        if weight == 0.0:
            batches = [{**b, "weight": weight} for b in batches]
        return batches

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next": self.next, "order": torch.as_tensor(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.next, self.order = int(state["epoch"]), int(state["next"]), state["order"].numpy()
