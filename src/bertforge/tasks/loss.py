"""Fine-tuning's objective: a task model's own loss, as the engine takes an objective (:class:`TaskLoss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.dropout import batch_keys


class TaskLoss(torch.nn.Module):
    """The task model's loss as the engine's objective: the model's mean loss of a micro-batch, weighted by its
    share of the global batch's examples.  A process without examples in a step (the last, small batch of an
    epoch) takes part with one example of ``weight`` 0."""

    def __init__(self, model: torch.nn.Module, seed: int | None):
        super().__init__()
        self.model, self.seed = model, seed

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        return {"examples": b["input_ids"].shape[0] * b.get("weight", 1.0)}

    def forward(self, b: dict, step: int) -> dict:
        inputs = {k: v for k, v in b.items() if k not in ("sequence_ids", "weight")}
        loss = self.model(**inputs, dropout_keys=batch_keys(b, self.seed, step)).loss
        return {"loss": loss, "n": b["input_ids"].shape[0] * b.get("weight", 1.0)}

    @staticmethod
    def loss(out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        loss, n = out["loss"], out["n"]
        return loss * (n / totals["examples"]), {"loss": loss.detach() * n}


class TokenLoss(TaskLoss):
    """Token classification's loss: the mean over every labelled token of the global batch (transformers' mean
    over one batch's tokens), not a mean of micro-batch means, so that processes and accumulation compute the
    one-process run; a micro-batch without a labelled token adds nothing."""

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        w = b.get("weight", 1.0)
        return {"examples": b["input_ids"].shape[0] * w, "tokens": float((b["labels"] != -100).sum()) * w}

    def forward(self, b: dict, step: int) -> dict:
        inputs = {k: v for k, v in b.items() if k not in ("sequence_ids", "weight", "labels")}
        logits = self.model(**inputs, dropout_keys=batch_keys(b, self.seed, step)).logits  # (B, T, labels)
        total = F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100, reduction="sum")
        return {"loss": total * b.get("weight", 1.0), "n": b["input_ids"].shape[0] * b.get("weight", 1.0)}

    @staticmethod
    def loss(out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        tokens = max(1.0, totals["tokens"])
        # reported per example by the runner: scaled so that the log shows the loss per labelled token
        return out["loss"] / tokens, {"loss": out["loss"].detach() * (totals["examples"] / tokens)}
