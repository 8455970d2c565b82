"""bertforge: pretrain BERT from scratch and fine-tune it, in PyTorch.

The Python API mirrors the commands (:mod:`bertforge.api`): :func:`train_tokenizer`, :func:`prepare`,
:func:`run_pretraining`, :func:`run_finetuning`, :func:`evaluate` (and, by their names of old,
:func:`evaluate_classifier`, :func:`evaluate_squad`, :func:`evaluate_retrieval`, :func:`evaluate_ner`), :func:`embed`
and :func:`pipeline`;
the model classes load and save Hugging Face BERT directories (``from_pretrained`` /
``save_pretrained``).
"""

from .api import (
    embed,
    evaluate,
    evaluate_classifier,
    evaluate_mlm,
    evaluate_ner,
    evaluate_retrieval,
    evaluate_squad,
    pipeline,
    prepare,
    run_finetuning,
    run_pretraining,
    train_tokenizer,
)
from .errors import UserError
from .models import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
)
from .tokenizer import load_tokenizer

__version__ = "0.2.0"


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
    "embed",
    "evaluate",
    "evaluate_retrieval",
    "evaluate_ner",
    "train_tokenizer",
    "prepare",
    "run_pretraining",
    "run_finetuning",
    "evaluate_classifier",
    "evaluate_squad",
    "evaluate_mlm",
    "__version__",
]
