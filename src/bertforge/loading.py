"""Model directories loaded for inference: the one way that evaluation, prediction and the API open a
directory (ours or a transformers checkpoint): its config, a tokenizer that fits it, the model on its
device in eval mode; and the one place where a pretraining objective's own directories (an ELECTRA run's
generator) are recognised."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from tokenizers import Tokenizer

from .checkpoint import has_weight
from .config import ImplConfig
from .devices import resolve_device
from .errors import UserError, require_type
from .models import OUTPUTS, BertConfig, family, for_folder, load_config
from .runtime import BACKENDS, Bf16Model, current_backend, load_graph
from .tokenizer import check_vocab_fits, load_tokenizer

log = logging.getLogger("bertforge")


def model_dir(path: str | os.PathLike) -> str:
    """``path`` as a string, refused unless it is a folder."""
    path = os.fspath(require_type(path, (str, os.PathLike), "model"))
    if not os.path.isdir(path):
        raise UserError(f"model directory not found: {path}")
    return path


class StoredMaskedLM(NamedTuple):
    """How a directory reads as a masked LM: the class, its architecture and the weight its head stores."""

    model_class: type
    config: BertConfig
    head: str


def masked_lm(path: str) -> StoredMaskedLM:
    """The masked LM stored in directory ``path``: one a pretraining objective saves as its own (an ELECTRA
    run's ``generator/``, through :meth:`~bertforge.objectives.base.PretrainingObjective.masked_lm_of`), else
    BERT's."""
    from .objectives import OBJECTIVES

    for objective in OBJECTIVES.values():
        found = objective.masked_lm_of(path)
        if found is not None:
            return StoredMaskedLM(*found)
    cls, config = for_folder(path, "masked_lm")
    return StoredMaskedLM(cls, config, cls.head_weight)


def refuse_other_head(path: str, model_class: type, config) -> None:
    """A folder read as a question-answering model whose span head's weights are another task's head (a family
    whose heads share one name, ``classifier``): one error naming what its config.json says it holds."""
    other = model_class.other_head(config)
    if other is not None:
        raise UserError(f"{path} holds a {other} (its config.json says), not a question-answering model")


def check_max_seq_length(config: BertConfig, max_seq_length: int | None, path: str | None,
                         default: int = 512) -> int:
    """``max_seq_length`` when the model in ``path`` (of ``config``; None: a new model) has positions for it; a
    UserError when it does not (or is no integer of at least 3: [CLS], a token, [SEP]): the one rule of every
    command.  None: ``default``, or the model's positions when it has fewer."""
    if max_seq_length is None:
        return min(default, config.max_position_embeddings)
    require_type(max_seq_length, int, "--max-seq-length", at_least=3)
    if max_seq_length > config.max_position_embeddings:
        where = f"the model in {path}" if path else "the model"
        raise UserError(f"--max-seq-length {max_seq_length} exceeds the {config.max_position_embeddings} positions of "
                        f"{where}; give --max-seq-length {config.max_position_embeddings} or less")
    return max_seq_length


@dataclass
class Loaded:
    """A model directory ready for inference."""

    path: str
    config: BertConfig
    tokenizer: Tokenizer
    model: Any
    device: torch.device


def load_for_inference(path: str | os.PathLike, model_class: type, device: str = "auto",
                       config: BertConfig | None = None, head: tuple[str, str] | None = None,
                       backend: str | None = None) -> Loaded:
    """Directory ``path`` as ``model_class`` (its ``config`` when given, else its config.json), with its
    tokenizer (checked to fit the model's vocabulary), on ``device`` in eval mode.  ``head``: (a weight the
    directory must store, the error when it does not).  ``backend``: ``torch``, or a graph of the folder's
    ``onnx/`` run by onnxruntime on the CPU (:mod:`bertforge.runtime`; None: the command's backend)."""
    path = model_dir(path)
    config = config if config is not None else load_config(path)
    tok = load_tokenizer(path)
    check_vocab_fits(tok, config.vocab_size, path)
    if head is not None and not has_weight(path, head[0]):
        raise UserError(head[1])
    backend = current_backend(backend)
    if BACKENDS[backend] is not None:
        if device not in ("auto", "cpu"):
            raise UserError(f"--backend {backend} runs on the CPU (onnxruntime), not --device {device}")
        return Loaded(path, config, tok, load_graph(path, backend, config, OUTPUTS[model_class.role]),
                      torch.device("cpu"))
    dev = resolve_device(ImplConfig(device=device))
    model = model_class.from_pretrained(path, config=config).to(dev).eval()
    return Loaded(path, config, tok, Bf16Model(model, dev) if backend == "torch-bf16" else model, dev)


def pretrained_length(model_dir: str) -> int | None:
    """The longest sequence ``bertforge pretrain`` trained the model in ``model_dir`` on, when it trained it
    from its start (positions beyond it are still at their starting values); None when unknown."""
    from .train.runfolder import RunFolder

    try:
        saved = RunFolder(model_dir, "pretrain").saved()
        if saved["model"].get("init") or not family(saved["model"].get("arch")).position_table:
            return None
        return int(saved["data"]["max_seq_length"])
    except (UserError, ValueError, KeyError, TypeError, AttributeError):
        return None


def warn_untrained_positions(model_dir: str, longest: int, d) -> None:
    """Warn when the fine-tuning sequences reach positions the model was never pretrained at."""
    trained = pretrained_length(model_dir)
    if trained and longest > trained and d.is_main:
        log.warning("%s was pretrained on sequences of at most %d tokens and these reach %d: positions %d-%d start "
                    "untrained (a shorter --max-seq-length keeps to what it learned)", model_dir, trained, longest,
                    trained, longest - 1)
