"""Fine-tuning tasks: sentence (pair) classification, SQuAD v1.1 extractive question answering, sentence
embeddings, and token classification (named entities).

Each is a :class:`~bertforge.tasks.base.FinetuneTask` that the one runner (:mod:`bertforge.finetune`)
trains; their data handling is also what evaluation and prediction use.
"""

from .base import FinetuneTask
from .classify import ClassificationTask
from .embed import EmbedTask
from .ner import NerTask
from .squad import SquadTask

TASKS: dict[str, type[FinetuneTask]] = {t.name: t for t in (ClassificationTask, SquadTask, EmbedTask, NerTask)}

__all__ = ["TASKS", "ClassificationTask", "EmbedTask", "FinetuneTask", "NerTask", "SquadTask"]
