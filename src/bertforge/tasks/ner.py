"""Token classification (named entities): CoNLL-style column files and JSONL, fine-tuning, entity-level
figures as seqeval computes them, and evaluation of a saved model.

As transformers' ``run_ner``: a word's label sits on its first sub-token, the later ones are ignored (with
``--label-all-tokens`` they carry the I- form of the word's tag in training); the labels are the training
file's tags, sorted.  Every figure is per word (its first sub-token's prediction).  A sentence longer than the
model's window is split into windows that overlap by half; each word is predicted by the window where it has
the most context on both sides (SQuAD's rule), so every word is predicted once.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from ..batching import pad_batch
from ..commands import emit, one_line, positive_int, text_input_flags
from ..config import FinetuneConfig, progress_shown, setting
from ..errors import UserError, checked, shown
from ..evaluation import by_length
from ..inference import Pipeline, labelled_head
from ..files import json_lines, lines_of, read_text
from ..loading import check_max_seq_length, load_for_inference, model_dir
from ..models import BertConfig, BertForTokenClassification, for_folder
from ..tokenizer import copy_of, special_ids
from .base import FinetuneTask, given_settings, use_labels, validating
from .classify import input_texts

log = logging.getLogger("bertforge")


@dataclass
class NerConfig:
    token_column: int = setting(0, "column of the token in CoNLL-style files (0: the first)")
    tag_column: int = setting(-1, "column of the tag in CoNLL-style files (-1: the last)")
    labels_file: str = setting("", "the tag names of JSONL ner_tags integers, one per line, in id order",
                               flag="--labels")
    label_all_tokens: bool = setting(False, "train on every sub-token of a word (the later ones with the I- form of "
                                            "its tag), as run_ner's option; evaluation stays per word")
    strict: bool = setting(False, "score entities as seqeval's mode='strict' with the file's scheme (default: "
                                  "seqeval's default mode, as conlleval)")


PREFIXES = ("B", "I", "E", "S")


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str]


# ------------------------------------------------------------------------------------------------ reading
def _conll(path: str, text: str, settings: NerConfig) -> list[Sentence]:
    sentences, tokens, tags = [], [], []
    for n, line in enumerate(lines_of(text), 1):
        # tab-separated columns, else ASCII spaces (a no-break space inside a token, "10\u00a0000", is no separator);
        # a line of whitespace alone ends a sentence, as a blank one does
        fields = [] if not line.strip() else [f.strip(" ") for f in line.split("\t")] if "\t" in line else \
            [f for f in re.split(r"[ ]+", line.strip(" ")) if f]
        if not fields:
            if tokens:
                sentences.append(Sentence(tokens, tags))
            tokens, tags = [], []
            continue
        if fields[0] == "-DOCSTART-":
            continue
        if len(fields) < 2:
            raise UserError(f"{path}:{n}: {shown(line)} has no tag (a line is a token and its tag, tab- or "
                            "space-separated; a blank line ends a sentence)")
        try:
            tokens.append(fields[settings.token_column])
            tags.append(fields[settings.tag_column])
        except IndexError:
            raise UserError(f"{path}:{n}: {len(fields)} columns; --token-column {settings.token_column} and "
                            f"--tag-column {settings.tag_column} ask for others") from None
    if tokens:
        sentences.append(Sentence(tokens, tags))
    return sentences


def _jsonl(path: str, text: str, settings: NerConfig) -> list[Sentence]:
    names = None
    if settings.labels_file:
        names = [x.strip() for x in lines_of(read_text(settings.labels_file, "labels file")) if x.strip()]
    sentences = []
    for n, obj in json_lines(io.StringIO(text), path):
        tokens = obj.get("tokens")
        tags = obj.get("tags", obj.get("ner_tags"))
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise UserError(f"{path}:{n}: 'tokens' must be a list of strings, not {shown(tokens)}")
        if not isinstance(tags, list) or len(tags) != len(tokens):
            raise UserError(f"{path}:{n}: 'tags' (or 'ner_tags') must be a list of one tag per token, not "
                            f"{shown(tags)}")
        if any(isinstance(t, int) and not isinstance(t, bool) for t in tags):
            if names is None:
                raise UserError(f"{path}:{n}: integer ner_tags need their names: give --labels FILE (one per line, "
                                "in id order)")
            if not all(isinstance(t, int) and 0 <= t < len(names) for t in tags):
                raise UserError(f"{path}:{n}: ner_tags {shown(tags)} are not ids of the {len(names)} labels of "
                                f"{settings.labels_file}")
            tags = [names[t] for t in tags]
        if not all(isinstance(t, str) for t in tags):
            raise UserError(f"{path}:{n}: tags must be strings (or integer ner_tags with --labels)")
        if tokens:
            sentences.append(Sentence(tokens, tags))
    return sentences


LONG_SENTENCE = 1000  # tokens: a file's "sentence" this long is most likely several that lost their blank lines
CONLL_SUFFIXES = (".conll", ".conllu", ".iob", ".bio")  # what `predict ner --input` reads as sentences, not lines


def read_ner(path: str, settings: NerConfig) -> list[Sentence]:
    """The sentences of a CoNLL-style file (a token and its tag per line, a blank line between sentences) or a
    JSONL file of ``{"tokens", "tags"}`` (or ``ner_tags``); each tag checked, the scheme found."""
    text = read_text(path, "NER file")
    low = path.lower()
    sentences = (_jsonl if low.endswith((".jsonl", ".json")) else _conll)(path, text, settings)
    if not sentences:
        raise UserError(f"{path} holds no sentences")
    for s in sentences:
        for t in s.tags:
            if t != "O" and (len(t) < 3 or t[0] not in PREFIXES or t[1] not in "-_"):
                raise UserError(f"{path}: tag {shown(t)} is neither O nor B-, I-, E- or S- and a type")
    long = [(n, len(s.tokens)) for n, s in enumerate(sentences, 1) if len(s.tokens) > LONG_SENTENCE]
    if long:
        log.warning("%s: sentence %d has %d tokens%s: are the sentences apart (a blank line between two)?", path,
                    *long[0], f", and {len(long) - 1} more over {LONG_SENTENCE}" if len(long) > 1 else "")
    scheme_of(sentences, path)
    return sentences


def scheme_of(sentences: list[Sentence], path: str) -> str:
    """BIO (IOB2), IOB1 (I- opens an entity, B- only between two of one type) or BIOES; mixed is an error.  Between
    BIO and IOB1 the file's majority decides (BIO opens an entity with B-, IOB1 with I-): an annotation slip
    (``O I-per`` in a BIO file) is warned about with its sentence, not taken for the file's scheme."""
    bioes = any(t[0] in "ES" for s in sentences for t in s.tags if t != "O")
    by_i, by_b = [], []  # (sentence numbers of) entities opened by I-, and by B- after O or another type
    for n, s in enumerate(sentences, 1):
        prev = "O"
        for t in s.tags:
            if t[0] in "IB" and (prev == "O" or prev[2:] != t[2:]):
                (by_i if t[0] == "I" else by_b).append(n)
            prev = t
    if bioes and by_i:
        raise UserError(f"{path}: the tags mix schemes (E-/S- of BIOES, and I- opening entities as IOB1 does)")
    if bioes:
        return "BIOES"
    scheme, slips = ("IOB1", by_b) if len(by_i) > len(by_b) else ("BIO", by_i)
    if slips and by_i:
        opener = "B-" if scheme == "IOB1" else "I-"
        log.warning("%s: %d of %d entities open with %s, as %s does not: read as %s (sentence %s%s)", path,
                    len(slips), len(by_i) + len(by_b), opener, scheme, scheme, slips[0],
                    f" and {len(slips) - 1} more" if len(slips) > 1 else "")
    return scheme


# ------------------------------------------------------------------------------------------------ windows
def windows(tok: Tokenizer, sentences: list[Sentence], max_len: int) -> tuple[list[dict], list[list[int]], int]:
    """(features, each sentence's first-sub-token piece index per word (-1: the word has no piece), the number of
    sentences split): each feature is [CLS] + a window of pieces + [SEP], with ``sentence``, ``start`` (its first
    piece) and ``words`` (the word of each of its pieces)."""
    sp = special_ids(tok)
    tok = copy_of(tok)  # (without the folder's truncation or padding: windows instead)
    encs = tok.encode_batch([s.tokens for s in sentences], is_pretokenized=True, add_special_tokens=False)
    width = max_len - 2
    feats, firsts, split = [], [], 0
    for i, e in enumerate(encs):
        words = [w if w is not None else -1 for w in e.word_ids]
        first = [-1] * len(sentences[i].tokens)
        for p, w in enumerate(words):
            if w >= 0 and first[w] < 0:
                first[w] = p
        firsts.append(first)
        step = max(1, width // 2)
        starts = [0] if len(words) <= width else list(range(0, len(words) - step, step))
        if starts[-1] + width < len(words):  # (a window of one piece: the halves' steps stop short of the end)
            starts.append(len(words) - width)
        split += len(starts) > 1
        for s in starts:
            ids = e.ids[s : s + width]
            feats.append({"input_ids": [sp.cls, *ids, sp.sep], "token_type_ids": [0] * (len(ids) + 2),
                          "sentence": i, "start": s, "words": words[s : s + width]})
    return feats, firsts, split


def best_windows(feats: list[dict], firsts: list[list[int]]) -> list[list[tuple[int, int]]]:
    """Per sentence, per word: (feature index, position in it) of the window where the word's first piece has
    the most context on both sides; (-1, -1) for a word without pieces."""
    best: list[list[tuple[float, int, int]]] = [[(-1.0, -1, -1)] * len(f) for f in firsts]
    for k, f in enumerate(feats):
        n, first, start = len(f["words"]), firsts[f["sentence"]], f["start"]
        for q, w in enumerate(f["words"]):  # the window's own pieces: linear in the sentence's length
            if w >= 0 and first[w] == start + q:  # a word's first piece
                score = min(q, n - 1 - q) + 0.01 * n
                if score > best[f["sentence"]][w][0]:
                    best[f["sentence"]][w] = (score, k, q + 1)  # (+1: [CLS])
    return [[(k, q) for _, k, q in row] for row in best]


def _inside(tag: str) -> str:
    """run_ner's label of a word's later sub-tokens: B-X becomes I-X (when I-X is a label); the others stay."""
    return "I" + tag[1:] if tag[0] == "B" else tag


def training_features(tok: Tokenizer, sentences: list[Sentence], label2id: dict[str, int], max_len: int,
                      all_tokens: bool) -> tuple[list[dict], int]:
    feats, firsts, split = windows(tok, sentences, max_len)
    for f in feats:
        tags, first = sentences[f["sentence"]].tags, firsts[f["sentence"]]
        labels = [-100]
        for q, w in enumerate(f["words"]):
            if w < 0:
                labels.append(-100)
            elif first[w] == f["start"] + q:
                labels.append(label2id[tags[w]])
            else:
                labels.append(label2id.get(_inside(tags[w]), label2id[tags[w]]) if all_tokens else -100)
        f["labels"] = labels + [-100]
    return feats, split


def collate(fs: list[dict], pad: int) -> dict:
    b = pad_batch(fs, pad)
    labels = torch.full(b["input_ids"].shape, -100, dtype=torch.long)
    for i, f in enumerate(fs):
        labels[i, : len(f["labels"])] = torch.tensor(f["labels"])
    b["labels"] = labels
    return b


# ------------------------------------------------------------------------------------------------ model use
def predict_tags(model, tok: Tokenizer, sentences: list[Sentence], id2label: dict[int, str], max_len: int, device,
                 batch_size: int = 64) -> list[list[str]]:
    """Each word's predicted tag (its first sub-token's, from its best window; O for a word without pieces)."""
    feats, firsts, _ = windows(tok, sentences, max_len)
    ids = by_length(model, feats, special_ids(tok).pad, device, batch_size,
                    lambda out, b: list(out.logits.argmax(-1).cpu().numpy()))
    return [[id2label[int(ids[k][q])] if k >= 0 else "O" for k, q in row] for row in best_windows(feats, firsts)]


def ner_metrics(true: list[list[str]], pred: list[list[str]], strict_scheme: str | None = None) -> dict:
    """Entity-level precision, recall and F1 (overall, micro-averaged, and per type) and token accuracy, by
    seqeval (its default mode, or ``mode="strict"`` with ``strict_scheme``)."""
    metrics, scheme = _seqeval()
    kw = {}
    if strict_scheme:
        schemes = {"BIO": scheme.IOB2, "IOB1": scheme.IOB1, "BIOES": scheme.IOBES}
        kw = {"mode": "strict", "scheme": schemes[strict_scheme]}
    report = metrics.classification_report(true, pred, output_dict=True, zero_division=0, **kw)
    per_type = {t: {"precision": float(r["precision"]), "recall": float(r["recall"]), "f1": float(r["f1-score"]),
                    "number": int(r["support"])} for t, r in report.items() if not t.endswith(" avg")}
    return {"precision": float(metrics.precision_score(true, pred, zero_division=0, **kw)),
            "recall": float(metrics.recall_score(true, pred, zero_division=0, **kw)),
            "f1": float(metrics.f1_score(true, pred, zero_division=0, **kw)),
            "accuracy": float(metrics.accuracy_score(true, pred)), "per_type": per_type}


def _seqeval():
    try:
        from seqeval import metrics, scheme
    except ImportError:
        raise UserError("NER figures need the seqeval library: pip install 'bertforge[ner]'") from None
    return metrics, scheme


# ------------------------------------------------------------------------------------------------ fine-tuning
class NerTask(FinetuneTask):
    """Token classification: the training file's tags, entity F1 (seqeval) picks the best epoch."""

    name = "ner"
    model_class = BertForTokenClassification
    settings_class = NerConfig
    select = "f1"
    plotted = [("f1", "entity F1"), ("precision", "precision"), ("recall", "recall")]
    pipeline_tag = "token-classification"
    bench_files = ("wnut16/train.conll", "wnut16/dev.conll")
    # its batch and epochs are the data's (finetune_batch, finetune_epochs), to 2,000 updates where it can: on a small
    # file such as WNUT-16 the batch of 32 makes too few updates and the model learns to tag nothing, and 636
    # updates at 8 scored 6 points under 2,120 (docs/log/defaults.md)
    defaults = {"max_seq_length": 128, "epochs": None}
    min_updates = 2000

    help = "token classification (named entities) from CoNLL-style columns or JSONL; entity F1 by seqeval"
    printed = ("f1", "precision", "recall", "accuracy")
    evaluate_name = "ner"
    evaluate_help = "entity precision, recall and F1 (seqeval) of a token classifier on a tagged file"
    evaluate_settings = NerConfig
    evaluate_data_help = "CoNLL-style columns or JSONL of {tokens, tags}"
    evaluate_flags = ("token_column", "tag_column", "labels_file", "strict")

    @classmethod
    def evaluation(cls):
        return evaluate_ner

    predict_name = "ner"
    predict_help = "named entities (as transformers' token-classification pipeline finds them)"
    aliases = ("token-classification",)

    @classmethod
    def pipeline_class(cls) -> type:
        return NerPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        text_input_flags(p, f", or a tagged CoNLL file ({', '.join(CONLL_SUFFIXES)}): one text per sentence")
        p.add_argument("--aggregation", choices=AGGREGATIONS, default="simple",
                       help="how sub-tokens become entities, as transformers' aggregation_strategy")
        p.add_argument("--max-seq-length", type=positive_int, help="tokens read of a text (default: 512, or the "
                                                                   "model's positions if fewer)")
        p.add_argument("text", nargs="*")

    @classmethod
    def predict(cls, a) -> None:
        if a.input and a.input.lower().endswith(CONLL_SUFFIXES):  # its sentences, not its lines (issue 66)
            if a.text:
                raise UserError("give texts or --input, not both")
            texts = [" ".join(s.tokens) for s in read_ner(a.input, NerConfig())]
        else:
            texts = input_texts(a)
        p = NerPipeline(a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None),
                        max_seq_length=a.max_seq_length)
        res = p(texts, aggregation_strategy=a.aggregation)

        def table(rows):
            for t, found in zip(texts, rows):
                yield one_line(t)
                for x in found:
                    label = x.get("entity_group", x.get("entity"))
                    yield f"  {label:<14} {x['score']:.3f}  {x['word']}  ({x['start']}-{x['end']})"

        emit(a, res, table)  # (one list per text, whatever their number: result i is text i's)

    def read(self, cfg: FinetuneConfig) -> None:
        train = read_ner(cfg.data.train_file, self.settings)
        self.train, self.val = self.split_validation(train, cfg, lambda p: read_ner(p, self.settings))
        self.labels = sorted({t for s in self.train for t in s.tags})  # as run_ner: before --max-train-examples
        if cfg.data.max_train_examples:
            self.train = self.train[: cfg.data.max_train_examples]
        if len(self.labels) < 2:
            raise UserError(f"{cfg.data.train_file}: only one tag ({self.labels[0]!r}); NER needs entities to learn")
        unseen = sorted({t for s in self.val for t in s.tags} - set(self.labels))
        if unseen:
            where = cfg.data.validation_file or cfg.data.train_file
            raise UserError(f"{where}: tag(s) {', '.join(unseen)} never seen in training")
        if self.val and all(t == "O" for s in self.val for t in s.tags):
            log.warning("%s: the validation sentences hold no entity, so entity F1 is 0 whatever the model tags: it "
                        "cannot tell evaluations apart (the first is kept)", cfg.data.validation_file or "validation")
        self.scheme = scheme_of(self.train, cfg.data.train_file)
        _seqeval()  # (missing: said before any training)

    def texts(self) -> list[str]:
        return [" ".join(s.tokens) for s in self.train]

    def configure(self, config: BertConfig) -> bool:
        return use_labels(config, self.labels)

    def objective(self, model, seed: int | None, world: int):
        from .loss import TokenLoss

        return TokenLoss(model, seed)

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig):
        n, self.tok = cfg.data.max_seq_length, tok
        if n < 3:
            raise UserError(f"--max-seq-length {n}: a window holds [CLS], at least one token and [SEP]")
        self.max_len, self.eval_batch_size, self.pad = n, cfg.data.eval_batch_size, special_ids(tok).pad
        label2id = {lab: i for i, lab in enumerate(self.labels)}
        feats, split = training_features(tok, self.train, label2id, n, self.settings.label_all_tokens)
        if split:
            log.warning("%d training sentence(s) longer than %d tokens: split into overlapping windows", split, n)
        log.info("fine-tuning %s for NER on %d sentences (%d windows; %s tags: %s)%s", cfg.model, len(self.train),
                 len(feats), self.scheme, ", ".join(self.labels), validating(len(self.val), "sentences"))
        return feats, lambda fs: collate(fs, self.pad)

    def evaluate(self, model, device):
        id2label = dict(enumerate(self.labels))
        pred = predict_tags(model, self.tok, self.val, id2label, self.max_len, device, self.eval_batch_size)
        res = ner_metrics([s.tags for s in self.val], pred, self.scheme if self.settings.strict else None)
        return res, pred

    def eval_size(self) -> int:
        return len(self.val)

    def unlearnt(self, metrics, artifacts) -> str | None:
        tagged = {t for p in artifacts for t in p}
        if len({t for s in self.val for t in s.tags}) < 2:
            return None  # (no entity to find: entity F1 cannot tell)
        if tagged == {"O"}:
            return f"it tags no entity in the {len(self.val)} validation sentences (every token O)"
        if len(tagged) == 1:
            return f"it tags every token of the {len(self.val)} validation sentences {tagged.pop()}"
        if metrics["f1"] == 0:  # (a stray tag here and there, not one entity found)
            return f"it finds none of the entities of the {len(self.val)} validation sentences (entity F1 0)"
        return None

    def write_outputs(self, folder: str, preds) -> dict:
        with open(os.path.join(folder, "predictions.jsonl"), "w", encoding="utf-8") as f:
            for s, p in zip(self.val, preds):
                f.write(json.dumps({"tokens": s.tokens, "tags": s.tags, "predicted": p}, ensure_ascii=False) + "\n")
        return {"validation_sentences": len(self.val)}

    def reference_difference(self, ours, theirs, batch: dict) -> float:
        real = batch["attention_mask"].bool()  # (padding's logits are no one's)
        return float((ours(**batch).logits[real].float() - theirs(**batch).logits[real].float()).abs().max())

    def train_figures(self) -> dict:
        return {"train_sentences": len(self.train), "scheme": self.scheme}


def evaluate_ner_model(path: str, data: str, settings: NerConfig, max_seq_length: int | None = None,
                       batch_size: int = 64, device: str = "auto") -> dict:
    """``bertforge evaluate ner``: entity-level precision, recall, F1 (overall and per type) and token accuracy
    of a fine-tuned token classifier on a tagged file; a tag the model lacks is warned about and counted as
    missed."""
    model_class, config = for_folder(model_dir(path), BertForTokenClassification)
    if not config.id2label:
        raise UserError(f"{path} is not a token classifier (its config.json has no id2label)")
    labelled_head(path, config, "ForTokenClassification")  # (as predict ner: not a sentence classifier's head)
    max_len = check_max_seq_length(config, max_seq_length, path, default=128)
    sentences = read_ner(data, settings)
    unknown = sorted({t for s in sentences for t in s.tags} - set(config.id2label.values()))
    if unknown:
        log.warning("%s: tag(s) %s are not among the model's labels: their entities count as missed", data,
                    ", ".join(unknown))
    m = load_for_inference(path, model_class, device, config,
                           head=("classifier.weight", f"{path} has no trained token-classification head"))
    pred = predict_tags(m.model, m.tokenizer, sentences, config.id2label, max_len, m.device, batch_size)
    scheme = scheme_of(sentences, data) if settings.strict else None
    return ner_metrics([s.tags for s in sentences], pred, scheme)


__all__ = ["NerTask", "Sentence", "evaluate_ner_model", "ner_metrics", "read_ner"]


@checked(batch_size=1)
def evaluate_ner(model: str | os.PathLike, data: str | os.PathLike, max_seq_length: int | None = None,
                 batch_size: int = 64, device: str = "auto", **settings: Any) -> dict:
    """``bertforge evaluate ner``: entity precision, recall and F1 (overall and ``per_type``, by seqeval) and token
    accuracy of a fine-tuned token classifier on ``data``; ``settings``: ``token_column``, ``tag_column``,
    ``labels_file``, ``strict``."""

    cfg = given_settings(NerConfig(), settings, "evaluate_ner's settings")
    return evaluate_ner_model(os.fspath(model), os.fspath(data), cfg, max_seq_length, batch_size, device)


# ------------------------------------------------------------------------------------------------ pipeline
AGGREGATIONS = ("none", "simple", "first", "average", "max")


class NerPipeline(Pipeline):
    """Entities as transformers' token-classification pipeline finds them: each sub-token's label
    probabilities, then by ``aggregation_strategy``: ``none`` (every sub-token not labelled O), ``simple``
    (adjacent sub-tokens of one type grouped), or ``first`` / ``average`` / ``max`` (a word's label from its
    first sub-token, the mean of its sub-tokens' probabilities, or its most confident sub-token; then grouped).
    Words are re-formed from the word pieces, offsets are characters of the given text."""

    task = "ner"
    model_class = BertForTokenClassification
    head = ("token-classification head (classifier)", "fine-tune it with bertforge finetune ner")

    def _check(self, config: BertConfig) -> None:
        labelled_head(self.dir, config, "ForTokenClassification")

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
