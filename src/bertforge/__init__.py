"""bertforge: pretrain BERT from scratch and fine-tune it, in PyTorch."""

from .config import BertConfig
from .errors import UserError
from .model import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from .tokenizer import load_tokenizer

__version__ = "0.2.0"


def pipeline(task: str, model: str, **kw):
    """``bertforge.pipeline("fill-mask" | "next-sentence" | "classify" | "qa", model=DIR)``; see bertforge.predict."""
    from .predict import pipeline as _pipeline

    return _pipeline(task, model, **kw)


__all__ = [
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForQuestionAnswering",
    "UserError",
    "load_tokenizer",
    "pipeline",
    "__version__",
]
