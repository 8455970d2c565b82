"""Fine-tuning tasks: sentence (pair) classification, SQuAD v1.1 extractive question answering, sentence
embeddings, token classification (named entities), and reranking (a cross-encoder).

Each is a :class:`~bertforge.tasks.base.FinetuneTask` that the one runner (:mod:`bertforge.train.finetune`)
trains; their data handling is also what evaluation and prediction use.
"""

from ..errors import UserError
from .base import FinetuneTask
from .classify import ClassificationTask
from .embed import EmbedTask
from .ner import NerTask
from .rerank import RerankTask
from .squad import SquadTask

TASKS: dict[str, type[FinetuneTask]] = {t.name: t for t in (ClassificationTask, SquadTask, EmbedTask, NerTask,
                                                                  RerankTask)}


def register(task: type[FinetuneTask]) -> type[FinetuneTask]:
    """Add a fine-tuning task: the command line (``finetune``, ``evaluate``), the API and ``bench`` take it from
    here (a class decorator, or a call)."""
    TASKS[task.name] = task
    return task


def evaluation(name: str):
    """The API function of ``evaluate NAME``."""
    found = {t.evaluate_name: t for t in TASKS.values() if t.evaluate_name}
    if name not in found:
        raise UserError(f"unknown evaluation {name!r}; expected one of {', '.join([*found, 'mlm'])}")
    return found[name].evaluation()


__all__ = ["TASKS", "evaluation", "register", "ClassificationTask", "EmbedTask", "FinetuneTask", "NerTask",
           "RerankTask", "SquadTask"]
