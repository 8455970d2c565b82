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

import numpy as np
from tokenizers import Tokenizer

from .checkpoint import has_weight
from .tasks.squad import SquadConfig
from .errors import UserError, checked, require_type, shown
from .evaluation import by_length
from .loading import check_max_seq_length, for_folder, load_for_inference, masked_lm, model_dir, refuse_other_head
from .models import (BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification, BertModel, head_class)
from .tokenizer import special_ids

log = logging.getLogger("bertforge")

_HEADS = {
    "fill-mask": ("cls.predictions.transform.dense.weight", "masked-LM head (cls.predictions)",
                  "pretrain it with bertforge pretrain"),
    "next-sentence": ("cls.seq_relationship.weight", "next-sentence head (cls.seq_relationship)",
                      "pretrain it with next sentence prediction (bertforge pretrain --nsp, or --recipe bert: the "
                      "default recipe trains without it)"),
    "classify": ("classifier.weight", "classification head (classifier)",
                 "fine-tune it with bertforge finetune classify"),
    "qa": ("qa_outputs.weight", "question-answering head (qa_outputs)", "fine-tune it with bertforge finetune squad"),
    "embed": ("embeddings.word_embeddings.weight", "encoder weights", "give a BERT directory"),
    "ner": ("classifier.weight", "token-classification head (classifier)", "fine-tune it with bertforge finetune ner"),
}
TASKS = tuple(_HEADS)


class Pipeline:
    """A model directory loaded for one task; call it on inputs, get plain Python objects back."""

    task = ""
    model_class: type = type(None)

    default_length = 512  # tokens read of an input (a pair) without max_seq_length, or the model's positions

    @checked(batch_size=1)
    def __init__(self, model: str | os.PathLike, device: str = "auto", batch_size: int = 32, progress: bool = False,
                 max_seq_length: int | None = None):
        self.dir = model = model_dir(model)
        model_class, config, key = self._model_class(model)
        _, what, how = _HEADS[self.task]
        if not has_weight(model, key):
            raise UserError(f"{model} has no {what}, so it cannot do {self.task}; {how} first")
        self._check(config)
        loaded = load_for_inference(model, model_class, device, config)
        self.config, self.tok, self.model, self.device = loaded.config, loaded.tokenizer, loaded.model, loaded.device
        self.sp = special_ids(self.tok)
        self.batch_size = batch_size
        self.progress = progress
        self.max_length = check_max_seq_length(self.config, max_seq_length, model, self.default_length)
        self._truncating = Tokenizer.from_str(self.tok.to_str())  # a copy: fill-mask needs the untruncated one
        self._truncating.enable_truncation(self.max_length, strategy="longest_first")

    def _model_class(self, path: str) -> tuple[type, BertConfig, str]:
        """(model class, config, the weight of the task's head) of directory ``path``: the class of the folder's
        model family that does what ``model_class`` does."""
        cls, config = for_folder(path, self.model_class)
        return cls, config, _HEADS[self.task][0] if cls is self.model_class else cls.head_weight

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


class FillMaskPipeline(Pipeline):
    task = "fill-mask"

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

    @checked
    def __call__(self, first: str | list[str], second: str | list[str]) -> Any:
        """``{"is_next": P(IsNext), "label": "IsNext" | "NotNext"}`` for a pair, or a list for lists."""
        single = isinstance(first, str)
        a, b = _paired(first, second, "second")

        def fn(out, batch):
            p = out.seq_relationship_logits.float().softmax(-1)[:, 0].tolist()  # index 0 = IsNext
            return [{"is_next": q, "label": "IsNext" if q >= 0.5 else "NotNext"} for q in p]

        res = self._run(self._encode(a, b), fn)
        return res[0] if single else res


class ClassifyPipeline(Pipeline):
    task = "classify"
    model_class = BertForSequenceClassification
    default_length = 128  # as fine-tuning and evaluate classify cut a text: the same review, the same label

    def _check(self, config: BertConfig) -> None:
        _labelled_head(self.dir, config, "ForSequenceClassification")

    @checked(top_k=1)
    def __call__(self, texts: str | list[str], pairs: str | list[str] | None = None, top_k: int | None = 1) -> Any:
        """``{"label", "score", "probabilities": {label: p}}`` for a text (and ``pairs``, its second sentence),
        or a list for lists; with another ``top_k`` (None: every label), as transformers' pipeline gives it: a
        list of ``{"label", "score"}``, the most probable first."""
        single = isinstance(texts, str)
        texts, pairs = _paired(texts, pairs, "pairs") if pairs is not None else ([texts] if single else texts, None)
        labels = [self.config.id2label[i] for i in sorted(self.config.id2label)]

        def fn(out, b):
            rows = []
            for p in out.logits.float().softmax(-1).tolist():
                if top_k != 1:
                    ranked = sorted(range(len(p)), key=lambda i: -p[i])[:top_k]
                    rows.append([{"label": labels[i], "score": p[i]} for i in ranked])
                    continue
                k = int(np.argmax(p))
                rows.append({"label": labels[k], "score": p[k], "probabilities": dict(zip(labels, p))})
            return rows

        res = self._run(self._encode(texts, pairs), fn)
        return res[0] if single else res


class QAPipeline(Pipeline):
    task = "qa"
    model_class = BertForQuestionAnswering

    def _check(self, config: BertConfig) -> None:
        refuse_other_head(self.dir, head_class(config, self.model_class), config)

    @checked(max_seq_length=3, top_k=1)
    def __call__(self, *inputs: Any, question: str | list[str] | None = None, context: str | list[str] | None = None,
                 examples: list | None = None, squad: SquadConfig | None = None, max_seq_length: int = 384,
                 top_k: int = 1) -> Any:
        """The calls of transformers' question-answering pipeline: ``qa(question, context)``,
        ``qa(question=..., context=...)`` or ``qa({"question": ..., "context": ...})`` give ``{"answer",
        "score" (the answer's probability), "start", "end" (character offsets in the context)}``, or with
        ``top_k`` above 1 a list of up to ``top_k`` of them, the best first; lists of questions (with a context
        each, or one for all) or a list of such dicts give a list of them.  ``examples``, a list of
        :class:`~bertforge.tasks.squad.Example`, gives ``{id: answer}``."""
        from .tasks.squad import Example

        squad = squad or SquadConfig()
        if examples is not None:
            if inputs or question is not None or context is not None:
                raise UserError("give examples, or questions and contexts, not both")
            for i, ex in enumerate(examples):
                require_type(ex, Example, f"examples[{i}]")
            return {k: rows[0]["answer"] for k, rows in self._answer(examples, squad, max_seq_length, 1).items()}
        pairs, single = _qa_inputs(inputs, question, context)
        examples = [Example(str(i), q, c, []) for i, (q, c) in enumerate(pairs)]
        answers = self._answer(examples, squad, max_seq_length, top_k)
        res = [answers[ex.id] if top_k > 1 else answers[ex.id][0] for ex in examples]
        return res[0] if single else res

    def _answer(self, examples: list, squad: SquadConfig, max_seq_length: int, top_k: int) -> dict[str, list]:
        """{id: [{"answer", "score", "start", "end"}, ...]}, the ``top_k`` best of each of ``examples``, the
        answers widened to whole words."""
        from .tasks.squad import build_features, postprocess, qa_logits

        max_len = min(max_seq_length, self.max_length)
        feats, _ = build_features(self.tok, examples, max_len, min(squad.doc_stride, max_len // 4),
                                  squad.max_query_length, training=False)
        s, e = qa_logits(self.model, feats, self.sp.pad, self.device, self.batch_size)
        ranked: dict = {}
        postprocess(examples, feats, s, e, squad.n_best, squad.max_answer_length, ranked=ranked, top_k=top_k)
        found = {}
        for ex in examples:  # whole words, as transformers' QA pipeline gives them (SQuAD scoring keeps the spans)
            found[ex.id] = []
            for score, span in ranked[ex.id]:
                a, b = whole_words(ex.context, *span)
                found[ex.id].append({"answer": ex.context[a:b] if a >= 0 else "", "score": score, "start": a,
                                     "end": b})
        return found


AGGREGATIONS = ("none", "simple", "first", "average", "max")


class NerPipeline(Pipeline):
    """Entities as transformers' token-classification pipeline finds them: each sub-token's label
    probabilities, then by ``aggregation_strategy``: ``none`` (every sub-token not labelled O), ``simple``
    (adjacent sub-tokens of one type grouped), or ``first`` / ``average`` / ``max`` (a word's label from its
    first sub-token, the mean of its sub-tokens' probabilities, or its most confident sub-token; then grouped).
    Words are re-formed from the word pieces, offsets are characters of the given text."""

    task = "ner"
    model_class = BertForTokenClassification

    def _check(self, config: BertConfig) -> None:
        _labelled_head(self.dir, config, "ForTokenClassification")

    @checked
    def __call__(self, texts: str | list[str], aggregation_strategy: str = "none") -> list:
        """For a text, a list of ``{"entity", "score", "index", "word", "start", "end"}`` (``none``) or of
        ``{"entity_group", "score", "word", "start", "end"}``; for a list of texts, a list of those."""
        if aggregation_strategy not in AGGREGATIONS:
            raise UserError(f"aggregation_strategy must be one of {', '.join(AGGREGATIONS)}, not "
                            f"{shown(aggregation_strategy)}")
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        encs = self._truncating.encode_batch(texts)
        if any(e.overflowing for e in encs):
            log.warning("input(s) longer than %d tokens were truncated", self.max_length)
        feats = [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in encs]
        logits = self._run(feats, lambda out, b: [row[: int(m.sum())].float().cpu().numpy()
                                                  for row, m in zip(out.logits, b["attention_mask"])])
        res = [self._entities(t, e, x, aggregation_strategy) for t, e, x in zip(texts, encs, logits)]
        return res[0] if single else res

    def _entities(self, text: str, enc, logits: np.ndarray, strategy: str) -> list[dict]:
        scores = np.exp(logits - logits.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)  # (T, labels)
        word_aware = getattr(self.tok.model, "continuing_subword_prefix", None)
        pieces = []
        for i, (tid, (a, b), special) in enumerate(zip(enc.ids, enc.offsets, enc.special_tokens_mask)):
            if special:
                continue
            piece, ref = self.tok.id_to_token(tid), text[a:b]
            inside = len(piece) != len(ref) if word_aware else a > 0 and " " not in text[a - 1 : a + 1]
            if tid == self.sp.unk:
                piece, inside = ref, False
            pieces.append({"word": piece, "scores": scores[i], "start": a, "end": b, "index": i, "inside": inside})
        labels = self.config.id2label
        if strategy in ("none", "simple"):
            found = [{"entity": labels[int(p["scores"].argmax())], "score": float(p["scores"].max()),
                      "index": p["index"], "word": p["word"], "start": p["start"], "end": p["end"]} for p in pieces]
        else:
            found = [self._word(group, strategy) for group in _words(pieces)]
        if strategy != "none":
            found = [self._group(g) for g in _groups(found)]
        return [x for x in found if x.get("entity", x.get("entity_group")) != "O"]

    def _text(self, pieces: list[str]) -> str:
        """Word pieces as text, as the tokenizer's decoder joins them (transformers' convert_tokens_to_string)."""
        return self.tok.decoder.decode(pieces) if self.tok.decoder is not None else " ".join(pieces)

    def _word(self, pieces: list[dict], strategy: str) -> dict:
        if strategy == "average":
            scores = np.nanmean(np.stack([p["scores"] for p in pieces]), axis=0)
        elif strategy == "first":
            scores = pieces[0]["scores"]
        else:  # the most confident piece's
            scores = max(pieces, key=lambda p: p["scores"].max())["scores"]
        k = int(scores.argmax())
        return {"entity": self.config.id2label[k], "score": float(scores[k]),
                "word": self._text([p["word"] for p in pieces]), "start": pieces[0]["start"], "end": pieces[-1]["end"]}

    def _group(self, items: list[dict]) -> dict:
        return {"entity_group": items[0]["entity"].split("-", 1)[-1],
                "score": float(np.nanmean([x["score"] for x in items])),
                "word": self._text([x["word"] for x in items]), "start": items[0]["start"], "end": items[-1]["end"]}


def _words(pieces: list[dict]) -> list[list[dict]]:
    """Pieces in runs of one word: a piece inside a word joins the run before it."""
    runs: list[list[dict]] = []
    for p in pieces:
        if runs and p["inside"]:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _bio(label: str) -> tuple[str, str]:
    """(B or I, type) of a label; one without a B-/I- prefix (O) continues as I."""
    return (label[0], label[2:]) if label[:2] in ("B-", "I-") else ("I", label)


def _groups(items: list[dict]) -> list[list[dict]]:
    """Adjacent items of one type, a B- starting a new group."""
    groups: list[list[dict]] = []
    for x in items:
        bi, kind = _bio(x["entity"])
        if groups and bi != "B" and _bio(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(x)
        else:
            groups.append([x])
    return groups


class EmbedPipeline(Pipeline):
    task = "embed"
    model_class = BertModel

    def __init__(self, model: str | os.PathLike, device: str = "auto", batch_size: int = 32, progress: bool = False,
                 max_seq_length: int | None = None, pooling: str | None = None):
        from .embeddings import settings_of

        self.settings = settings_of(model_dir(model), pooling)
        self.default_length = self.settings.max_seq_length or Pipeline.default_length  # the folder's, as ST reads it
        super().__init__(model, device, batch_size, progress, max_seq_length)

    @checked
    def __call__(self, texts: str | list[str]) -> np.ndarray:
        """(C,) float32 vector of a text, or (N, C) of a list, cut at the folder's ``max_seq_length`` tokens."""
        from .embeddings import encode, tokenize

        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        for i, t in enumerate(texts):
            require_type(t, str, f"texts[{i}]")
        vecs = encode(self.model, tokenize(self.tok, texts, self.settings, self.max_length), self.sp.pad, self.device,
                      self.settings, self.batch_size, self.task if self.progress else None)
        return vecs[0] if single else vecs


def _labelled_head(path: str, config: BertConfig, kind: str) -> None:
    """Refuse a folder without labels, or whose config.json names another head of the same shape (a sentence
    classifier's ``classifier`` read as a token classifier's, or the reverse)."""
    if not config.id2label:
        raise UserError(f"{path} has no labels (id2label) in its config.json")
    named = config.extra.get("architectures") or []
    if named and not any(str(a).endswith(kind) for a in named):
        wanted = "a token classifier" if kind == "ForTokenClassification" else "a sentence classifier"
        raise UserError(f"{path} holds a {named[0]} (its config.json says), not {wanted}")


def _qa_inputs(inputs: tuple, question, context) -> tuple[list[tuple[str, str]], bool]:
    """((question, context) pairs, whether one question was asked) of a question-answering call, each checked:
    two strings, ``question=`` and ``context=`` (strings, lists, or a list of questions and one context for
    all, as transformers allows), a ``{"question", "context"}`` dict or a list of them."""
    if inputs and (question is not None or context is not None):
        raise UserError("give the question and context as arguments or as question= and context=, not both")
    if len(inputs) == 2:
        question, context = inputs
    elif len(inputs) == 1 and isinstance(inputs[0], (dict, list, tuple)):
        single = isinstance(inputs[0], dict)
        items = [inputs[0]] if single else list(inputs[0])
        for i, item in enumerate(items):
            where = "the input" if single else f"input[{i}]"
            if not isinstance(item, dict) or set(item) != {"question", "context"}:
                raise UserError(f"{where} must be a dict of 'question' and 'context', not {shown(item)}")
        return [_qa_pair(d["question"], d["context"], "" if single else f"[{i}]") for i, d in enumerate(items)], single
    elif inputs:
        raise UserError(f"qa takes a question and a context, question= and context=, or a dict of them or a list "
                        f"of dicts, not {shown(inputs)}")
    require_type(question, str | list[str], "question")
    require_type(context, str | list[str], "context")
    single = isinstance(question, str)
    if isinstance(context, str) and not single:
        context = [context] * len(question)
    questions, contexts = _paired(question, context, "context")
    return [_qa_pair(q, c, "" if single else f"[{i}]") for i, (q, c) in enumerate(zip(questions, contexts))], single


def _qa_pair(question, context, where: str) -> tuple[str, str]:
    """(question, context), refused when either is no string or holds no text."""
    for name, v in (("question", question), ("context", context)):
        require_type(v, str, f"{name}{where}")
        if not v.strip():
            raise UserError(f"{name}{where} is empty" + ("; qa needs a text to find the answer in"
                                                          if name == "context" else ""))
    return question, context


def _paired(first: str | list[str], second: str | list[str], name: str) -> tuple[list[str], list[str]]:
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


def whole_words(context: str, start: int, end: int) -> tuple[int, int]:
    """The span [start, end) of ``context`` widened to whole words where it cuts one (subword tokens can
    start or end inside a word: "##ing"); (-1, -1) stays as it is."""
    if start < 0 or end <= start:
        return start, end
    while start > 0 and context[start - 1].isalnum() and context[start].isalnum():
        start -= 1
    while end < len(context) and context[end].isalnum() and context[end - 1].isalnum():
        end += 1
    return start, end


_PIPELINES = {"fill-mask": FillMaskPipeline, "next-sentence": NextSentencePipeline, "classify": ClassifyPipeline,
              "qa": QAPipeline, "embed": EmbedPipeline, "ner": NerPipeline}
# transformers' names
ALIASES = {"text-classification": "classify", "sentiment-analysis": "classify", "question-answering": "qa",
           "feature-extraction": "embed", "sentence-similarity": "embed", "token-classification": "ner"}


@checked(batch_size=1)
def pipeline(task: str, model: str | os.PathLike, device: str = "auto", batch_size: int = 32,
             progress: bool = False, max_seq_length: int | None = None) -> Pipeline:
    """A ready pipeline: ``pipeline("fill-mask", model="runs/demo/pretrained")("the [MASK] sat")``.  Task names
    are transformers' (``text-classification``, ``question-answering``) or ours (``classify``, ``qa``)."""
    task = ALIASES.get(task, task)
    if task not in _PIPELINES:
        raise UserError(f"unknown task {shown(task)}; expected one of {', '.join([*TASKS, *ALIASES])}")
    return _PIPELINES[task](model, device=device, batch_size=batch_size, progress=progress,
                            max_seq_length=max_seq_length)


__all__ = ["pipeline", "TASKS"]
