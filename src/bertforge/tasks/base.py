"""What a fine-tuning task supplies to the one runner (:func:`bertforge.finetune.finetune`).

Tasks import nothing of training, so that inference (:mod:`bertforge.predict`) can use their data
handling (SQuAD windows and post-processing) without the training engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from tokenizers import Tokenizer

from ..config import BertConfig, FinetuneConfig


class FinetuneTask:
    """What a task supplies to :func:`~bertforge.finetune.finetune`.  Called in this order: ``read`` (before
    any model is loaded), ``configure``, ``encode``, then ``evaluate`` after every epoch, ``write_outputs`` at
    the end."""

    name: ClassVar[str] = ""
    model_class: ClassVar[type] = type(None)
    settings_class: ClassVar[type] = type(None)  # the task's own settings dataclass
    select: ClassVar[str] = ""  # the metric that picks the best epoch (higher is better)
    plotted: ClassVar[list[tuple[str, str]]] = []  # (metric, label) drawn per epoch
    defaults: ClassVar[dict[str, Any]] = {}  # this task's defaults of FinetuneConfig fields (by flat name)

    def __init__(self, settings: Any):
        self.settings = settings  # the task's own dataclass (ClassifyConfig, SquadConfig)

    @classmethod
    def config(cls, **flat: Any) -> FinetuneConfig:
        """A FinetuneConfig with this task's defaults, then ``flat`` (fields by their flat names)."""
        cfg = FinetuneConfig()
        cfg.update_flat({**cls.defaults, **flat})
        return cfg

    def read(self, cfg: FinetuneConfig) -> None:
        """Read and check the training and validation files."""
        raise NotImplementedError

    def configure(self, config: BertConfig) -> bool:
        """Adapt the model's config to the task; True when the checkpoint's head must be re-initialised."""
        return False

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig) -> tuple[list[dict], Callable[[list[dict]], dict]]:
        """Training features and the function that makes a batch of them."""
        raise NotImplementedError

    def evaluate(self, model, device) -> tuple[dict, Any]:
        """Validation metrics, and what ``write_outputs`` writes of them (predictions)."""
        raise NotImplementedError

    def write_outputs(self, folder: str, artifacts: Any) -> dict:
        """Write predictions into the output folder; return figures for metrics.json."""
        return {}
