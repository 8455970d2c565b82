"""Using a trained model: ``bertforge.pipeline(task, model=DIR)`` and ``bertforge predict``.

Tasks: ``fill-mask`` (each [MASK] filled, top-k tokens with probabilities), ``next-sentence`` (IsNext
probability of a sentence pair), ``classify`` (label probabilities), ``qa`` (extractive answer, widened to
whole words, scored by its probability), ``ner`` (entities as transformers' token-classification pipeline
gives them, for each of its aggregation strategies), ``embed`` (sentence vectors, as
``SentenceTransformer.encode`` gives them for a sentence-transformers folder; :mod:`bertforge.embeddings`).
They work on any BERT directory, ours or a transformers checkpoint, and refuse clearly when the directory
lacks the head a task needs (all-MiniLM-L6-v2 has no MLM head) instead of predicting from random weights.
Calls take and shape what transformers' pipelines do (one text in, one result out; a list in, a list out;
fill-mask's candidates a flat list for a text with one [MASK]; question answering from ``question=``/``context=``
or ``{"question", "context"}`` dicts), and every argument is checked
(:func:`bertforge.errors.checked`): a wrong type or an empty text is one message naming it.

Inference runs in eval mode under ``torch.inference_mode()``, in batches sorted by length, on the GPU when
one is present.  Input longer than the model's maximum length is truncated with a warning (classify,
next-sentence, ner); fill-mask refuses a [MASK] that truncation would cut off; qa splits long contexts into
windows as fine-tuning does.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .errors import UserError, checked, shown
from .inference import Pipeline, paired
from .loading import masked_lm
from .models import BertConfig, BertForPreTraining

log = logging.getLogger("bertforge")


class FillMaskPipeline(Pipeline):
    task = "fill-mask"
    head = ("masked-LM head (cls.predictions)",
            "pretrain it with bertforge pretrain")

    def _model_class(self, path: str) -> tuple[type, BertConfig, str]:
        return masked_lm(path)  # BERT's or an ELECTRA run's generator/

    @checked(top_k=1)
    def __call__(self, texts: str | list[str], top_k: int = 5) -> list:
        """The top-k candidates of a text's [MASK], shaped as transformers' fill-mask pipeline shapes them: a
        list of ``{"score", "token" (the id), "token_str", "sequence" (the text with that [MASK] filled)}`` (and
        ``token_id``, the id again, as bertforge 0.1 named it) for a text with one [MASK], a list of such lists
        (one per [MASK]) for a text with several; for a list of texts, a list of those."""
        rows = [r[0] if len(r) == 1 else r for r in self.per_mask(texts, top_k)]
        return rows[0] if isinstance(texts, str) else rows

    @checked(top_k=1)
    def per_mask(self, texts: str | list[str], top_k: int = 5) -> list[list[list[dict]]]:
        """For each text, for each of its [MASK]s, the top-k candidates: one shape whatever the number of
        masks (what ``bertforge predict fill-mask`` prints)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        encs = self.tok.encode_batch(texts)
        feats = []
        for t, e in zip(texts, encs):
            ids = e.ids
            if self.sp.mask not in ids:
                raise UserError(f"no [MASK] in {shown(t)}")
            if len(ids) > self.max_length:
                if self.sp.mask in ids[self.max_length - 1 :]:
                    raise UserError(f"a [MASK] lies beyond the model's {self.max_length} tokens in {shown(t)}")
                log.warning("an input longer than %d tokens was truncated", self.max_length)
                ids = ids[: self.max_length - 1] + [self.sp.sep]
            feats.append({"input_ids": ids, "token_type_ids": [0] * len(ids)})

        def fn(out, b):
            probs = out.logits.float().softmax(-1)  # (B, T, V)
            rows = []
            for i in range(probs.shape[0]):
                ids = b["input_ids"][i][b["attention_mask"][i].bool()].tolist()
                where = [p for p, t in enumerate(ids) if t == self.sp.mask]
                per_mask = []
                for p in where:
                    top = probs[i, p].topk(min(top_k, probs.shape[-1]))
                    # as transformers' pipeline: the token decoded alone (a byte-level piece as text), and the
                    # sequence without special tokens only when the text has one [MASK]
                    per_mask.append([{"score": float(s), "token": int(t),
                                      "token_str": self.tok.decode([int(t)], skip_special_tokens=False),
                                      "sequence": self.tok.decode(ids[:p] + [int(t)] + ids[p + 1 :],
                                                                  skip_special_tokens=len(where) == 1),
                                      "token_id": int(t)}
                                     for s, t in zip(top.values, top.indices)])
                rows.append(per_mask)
            return rows

        return self._run(feats, fn)


class NextSentencePipeline(Pipeline):
    task = "next-sentence"
    model_class = BertForPreTraining
    head = ("next-sentence head (cls.seq_relationship)",
            "pretrain it with next sentence prediction (bertforge pretrain --nsp, or --recipe bert: the default recipe "
            "trains without it)")

    @checked
    def __call__(self, first: str | list[str], second: str | list[str]) -> Any:
        """``{"is_next": P(IsNext), "label": "IsNext" | "NotNext"}`` for a pair, or a list for lists."""
        single = isinstance(first, str)
        a, b = paired(first, second, "second")

        def fn(out, batch):
            p = out.seq_relationship_logits.float().softmax(-1)[:, 0].tolist()  # index 0 = IsNext
            return [{"is_next": q, "label": "IsNext" if q >= 0.5 else "NotNext"} for q in p]

        res = self._run(self._encode(a, b), fn)
        return res[0] if single else res


def _pipelines() -> tuple[dict[str, type], dict[str, str]]:
    """({task: pipeline class}, {transformers' name: task}): the pretraining heads', then each fine-tuning task's."""
    from .tasks import TASKS

    found: dict[str, type] = {"fill-mask": FillMaskPipeline, "next-sentence": NextSentencePipeline}
    aliases: dict[str, str] = {}
    for kind in TASKS.values():
        if kind.predict_name:
            found[kind.predict_name] = kind.pipeline_class()
            aliases.update({name: kind.predict_name for name in kind.aliases})
    return found, aliases


@checked(batch_size=1)
def pipeline(task: str, model: str | os.PathLike, device: str = "auto", batch_size: int = 32,
             progress: bool = False, max_seq_length: int | None = None, backend: str | None = None) -> Pipeline:
    """A ready pipeline: ``pipeline("fill-mask", model="runs/demo/pretrained")("the [MASK] sat")``.  Task names
    are transformers' (``text-classification``, ``question-answering``) or ours (``classify``, ``qa``).
    ``backend="onnx"`` (or ``"onnx-int8"``) runs the graph ``bertforge export onnx`` wrote in ``model``."""
    found, aliases = _pipelines()
    task = aliases.get(task, task)
    if task not in found:
        raise UserError(f"unknown task {shown(task)}; expected one of {', '.join([*found, *aliases])}")
    return found[task](model, device=device, batch_size=batch_size, progress=progress, max_seq_length=max_seq_length,
                       backend=backend)


__all__ = ["pipeline", "FillMaskPipeline", "NextSentencePipeline"]
