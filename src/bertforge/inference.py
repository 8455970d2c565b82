"""A model directory loaded for one task and run over inputs: the base of every pipeline (the pretraining heads'
in :mod:`bertforge.predict`, each fine-tuning task's in its module of :mod:`bertforge.tasks`)."""

from __future__ import annotations

import logging
import os

from .checkpoint import has_weight
from .errors import UserError, checked, shown
from .evaluation import by_length
from .loading import check_max_seq_length, load_for_inference, model_dir
from .models import BertConfig, for_folder
from .tokenizer import copy_of, special_ids

log = logging.getLogger("bertforge")


class Pipeline:
    """A model directory loaded for one task; call it on inputs, get plain Python objects back.  ``backend``:
    ``torch``, ``onnx`` or ``onnx-int8`` (a graph ``bertforge export onnx`` wrote; :mod:`bertforge.runtime`)."""

    task = ""
    model_class: type = type(None)
    head: tuple[str, str] = ("", "")  # (what the head the folder must store is, how to get one; its weight: the
    # model class's ``head_weight``)

    default_length = 512  # tokens read of an input (a pair) without max_seq_length, or the model's positions

    @checked(batch_size=1)
    def __init__(self, model: str | os.PathLike, device: str = "auto", batch_size: int = 32, progress: bool = False,
                 max_seq_length: int | None = None, backend: str | None = None):
        self.dir = model = model_dir(model)
        model_class, config, key = self._model_class(model)
        what, how = self.head
        if not has_weight(model, key):
            raise UserError(f"{model} has no {what}, so it cannot do {self.task}; {how} first")
        self._check(config)
        loaded = load_for_inference(model, model_class, device, config, backend=backend)
        self.config, self.tok, self.model, self.device = loaded.config, loaded.tokenizer, loaded.model, loaded.device
        self.sp = special_ids(self.tok)
        self.batch_size = batch_size
        self.progress = progress
        self.max_length = check_max_seq_length(self.config, max_seq_length, model, self.default_length)
        self._truncating = copy_of(self.tok, self.max_length)  # (a copy: fill-mask needs the untruncated one)

    def _model_class(self, path: str) -> tuple[type, BertConfig, str]:
        """(model class, config, the weight of the task's head) of directory ``path``: the class of the folder's
        model family that does what ``model_class`` does."""
        cls, config = for_folder(path, self.model_class)
        return cls, config, cls.head_weight

    def _check(self, config: BertConfig) -> None:
        """Refuse a config the task cannot use."""

    def _encode(self, texts, pairs=None) -> list[dict]:
        encs = self._truncating.encode_batch(list(zip(texts, pairs)) if pairs is not None else list(texts))
        cut = sum(1 for e in encs if e.overflowing)
        if cut:
            log.warning("%d input(s) longer than %d tokens were truncated", cut, self.max_length)
        return [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in encs]

    def _run(self, feats: list[dict], fn) -> list:
        """fn(model output, batch) -> per-row results, over length-sorted batches; results in input order."""
        return by_length(self.model, feats, self.sp.pad, self.device, self.batch_size, fn,
                         self.task if self.progress else None)


def paired(first: str | list[str], second: str | list[str], name: str) -> tuple[list[str], list[str]]:
    """Two strings, or two lists of one length, as two lists."""
    if isinstance(first, str):
        if isinstance(second, str):
            return [first], [second]
        expected = "a string, as the first text is one"
    else:
        if not isinstance(second, str) and len(second) == len(first):
            return list(first), list(second)
        expected = f"a list of {len(first)} strings, one per text"
    raise UserError(f"{name} must be {expected}, not {type(second).__name__} {shown(second)}")


def labelled_head(path: str, config: BertConfig, kind: str) -> None:
    """Refuse a folder without labels, or whose config.json names another head of the same shape (a sentence
    classifier's ``classifier`` read as a token classifier's, or the reverse)."""
    if not config.id2label:
        raise UserError(f"{path} has no labels (id2label) in its config.json")
    named = config.extra.get("architectures") or []
    if named and not any(str(a).endswith(kind) for a in named):
        wanted = "a token classifier" if kind == "ForTokenClassification" else "a sentence classifier"
        raise UserError(f"{path} holds a {named[0]} (its config.json says), not {wanted}")
