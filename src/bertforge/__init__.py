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

__version__ = "0.1.0"

__all__ = [
    "BertConfig",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForQuestionAnswering",
    "UserError",
    "__version__",
]
