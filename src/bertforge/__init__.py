"""bertforge: pretrain BERT from scratch and fine-tune it, in PyTorch.

The Python API mirrors the commands (:mod:`bertforge.api`): :func:`train_tokenizer`, :func:`prepare`,
:func:`run_pretraining`, :func:`run_finetuning`, :func:`evaluate` (and, by their names of old,
:func:`evaluate_classifier`, :func:`evaluate_squad`, :func:`evaluate_retrieval`, :func:`evaluate_ner`), :func:`embed`
and :func:`pipeline`;
the model classes load and save Hugging Face BERT directories (``from_pretrained`` /
``save_pretrained``).
"""

import importlib

# The names below load on first use (PEP 562), so that `bertforge --version` answers without importing torch.
_WHERE = {
    **dict.fromkeys(("embed", "evaluate", "evaluate_classifier", "evaluate_mlm", "evaluate_ner", "evaluate_retrieval",
                     "evaluate_squad", "pipeline", "prepare", "run_finetuning", "run_pretraining", "train_tokenizer"),
                    "api"),
    "UserError": "errors",
    **dict.fromkeys(("BertConfig", "BertForMaskedLM", "BertForPreTraining", "BertForQuestionAnswering",
                     "BertForSequenceClassification", "BertModel"), "models"),
    "load_tokenizer": "tokenizer",
}


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    try:  # a submodule (`bertforge.tasks`), as an eager package would have imported it
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError:
        raise AttributeError(f"module 'bertforge' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__version__ = "0.2.0"


__all__ = [*_WHERE, "__version__"]
