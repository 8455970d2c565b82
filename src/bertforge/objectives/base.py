"""The protocol every pretraining objective follows (see :mod:`bertforge.objectives`)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..config import PretrainConfig
from ..evaluation import evaluate_pretraining
from ..models import BertConfig


class PretrainingObjective(nn.Module):
    """The module the engine trains around ``model`` (what checkpoints hold): an
    :class:`~bertforge.train.engine.Objective` (``forward``, :meth:`counts`, :meth:`loss`).  On the CPU, with ``seed``,
    dropout masks are keyed by (seed, ``step``, each sequence's index in the epoch: the batch's
    ``sequence_ids``), so that they do not depend on how sequences are split among processes and micro-batches
    (on CUDA the fused attention kernels draw their own).
    """

    name = ""
    meter_keys: tuple[str, ...] = ()  # the step's outputs summed into the log's meters
    pipeline_tag = "fill-mask"
    outputs: frozenset[str] = frozenset()  # what it saves in the run's folder besides the model directory

    def __init__(self, model: nn.Module, cfg: PretrainConfig):
        super().__init__()
        self.model, self.cfg, self.seed = model, cfg, cfg.train.seed

    # ---- the model
    @classmethod
    def build(cls, cfg: PretrainConfig, config: BertConfig, from_init: bool) -> PretrainingObjective:
        """The objective around a new model (``from_init``: --init's weights), built from the current random
        state (:func:`bertforge.train.plan.pretraining_objective`)."""
        raise NotImplementedError

    @classmethod
    def check(cls, cfg: PretrainConfig, from_init: bool) -> None:
        """Settings this objective cannot train with (a UserError), before anything is read."""

    @classmethod
    def masked_lm_of(cls, path: str) -> tuple[type, BertConfig, str] | None:
        """When directory ``path`` is a masked LM this objective saves as its own: (the class that loads it,
        its architecture, a weight its head stores); else None."""
        return None

    @property
    def masked_lm(self) -> nn.Module:
        """The masked LM that evaluation and the sample predictions read."""
        return self.model

    # ---- the step
    @staticmethod
    def counts(batch: dict) -> dict[str, float]:
        return {"masked": float((batch["labels"] != -100).sum()), "tokens": float(batch["attention_mask"].sum()),
                "sequences": float(batch["input_ids"].shape[0])}

    def forward(self, batch: dict, step: int) -> dict:
        raise NotImplementedError

    def loss(self, out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    # ---- the log
    def log_row(self, m: dict[str, float]) -> dict[str, float]:
        """The losses of a log line from the meters ``m`` (sums since the last line)."""
        return {"mlm_loss": m["mlm"] / max(1, m["masked"])}

    def log_text(self, row: dict) -> str:
        return ""

    # ---- evaluation and outputs
    def evaluate(self, eval_set: list[dict], device, autocast, baseline_token: int | None, mask_id: int) -> dict:
        return evaluate_pretraining(self.masked_lm, eval_set, device, autocast, baseline_token, mask_id=mask_id)

    def save_pretrained(self, out: str, tokenizer) -> None:
        """The run's model directory (refreshed at each checkpoint)."""
        raise NotImplementedError

    def flops_per_token(self) -> float:
        raise NotImplementedError

    def start_said(self, init: str | None) -> str | None:
        """What the log says of the model this objective starts from (``init``: --init's folder), or None."""
        return None

    def describe(self) -> tuple[str, str]:
        """(what the model was pretrained by, the transformers class that loads the saved model)."""
        raise NotImplementedError
