"""Sentence and sentence-pair classification: TSV (GLUE's layout, with a header), CSV and JSONL files,
integer or string labels, fine-tuning, evaluation and prediction."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..batching import pad_batch
from ..commands import emit, one_line, positive_int, text_input_flags
from ..config import FinetuneConfig, progress_shown, setting
from ..corpus import table_rows
from ..errors import UserError, checked, shown
from ..evaluation import by_length, classification_metrics
from ..files import json_lines, json_object_or_none, lines_of, read_text
from ..inference import Pipeline, labelled_head, paired
from ..loading import check_max_seq_length, load_for_inference, model_dir
from ..models import BertConfig, BertForSequenceClassification, for_folder
from ..tokenizer import copy_of, special_ids
from .base import FinetuneTask, given_settings, use_labels, validating

log = logging.getLogger("bertforge")


@dataclass
class ClassifyConfig:
    text_column: str | None = setting(None, "text column (default: sentence, text or sentence1, whichever exists)")
    text_pair_column: str | None = setting(None, "second sentence of a pair (e.g. sentence2)")
    label_column: str = setting("label", "label column")


TEXT_COLUMNS = ("sentence", "text", "sentence1", "question", "premise")
# the sentence pairs of GLUE's pair tasks (MRPC, STS-B, RTE, WNLI; QNLI; MNLI; QQP), read as pairs unless
# --text-column or --text-pair-column says otherwise, as run_glue reads them
PAIR_COLUMNS = (("sentence1", "sentence2"), ("question", "sentence"), ("premise", "hypothesis"),
                ("question1", "question2"))


# ------------------------------------------------------------------------------------------------ reading
def read_table(path: str) -> list[dict[str, str]]:
    """Rows of a .tsv/.csv (with a header), .jsonl or .parquet file, or of ``hf:NAME[:CONFIG][@SPLIT]`` (a
    Hugging Face dataset), as dicts (a null value as ""; :func:`resolve_columns` checks the types)."""
    low = path.lower()
    rows: list[dict[str, str]] = []
    found = table_rows(path)
    if found is not None:
        rows = [{k: ("" if v is None else v) for k, v in r.items()} for r in found]
        if not rows:
            raise UserError(f"{path} has no rows")
        return rows
    text = read_text(path, "data file")
    if low.endswith((".jsonl", ".json")):
        for _, obj in json_lines(io.StringIO(text), path):
            rows.append({k: ("" if v is None else v) for k, v in obj.items()})
    elif low.endswith((".tsv", ".csv")):
        delim = "\t" if low.endswith(".tsv") else ","
        # GLUE's TSV files are not CSV-quoted: read tab-separated fields literally
        quoting = csv.QUOTE_NONE if delim == "\t" else csv.QUOTE_MINIMAL
        reader = csv.reader(io.StringIO(text), delimiter=delim, quoting=quoting)
        try:
            header = next(reader)
        except StopIteration:
            raise UserError(f"{path} is empty") from None
        try:
            for n, fields in enumerate(reader, 2):
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) != len(header):
                    raise UserError(f"{path}:{n}: {len(fields)} fields, the header has {len(header)}")
                rows.append(dict(zip(header, fields)))
        except csv.Error as e:  # (a lone carriage return inside a field, an unclosed quote)
            raise UserError(f"{path}:{reader.line_num}: {e}") from None
    else:
        raise UserError(f"{path}: unknown format; expected .tsv, .csv, .jsonl, .parquet or hf:NAME")
    if not rows:
        raise UserError(f"{path} has no rows")
    return rows


def resolve_columns(rows: list[dict], cfg: ClassifyConfig, path: str, need_label: bool = True,
                    pairs: bool = True) -> tuple[str, str | None, str]:
    """(the text column, the second sentence's or None, the label column) of ``rows``, each row checked: those
    ``cfg`` names, else a GLUE pair of the table (where ``pairs``) or its first column of :data:`TEXT_COLUMNS`."""
    cols = list(rows[0])
    if pairs and cfg.text_column is None and cfg.text_pair_column is None:
        both = next(((a, b) for a, b in PAIR_COLUMNS if a in cols and b in cols), None)
        if both is not None:
            cfg = dataclasses.replace(cfg, text_column=both[0], text_pair_column=both[1])
    text = cfg.text_column or next((c for c in TEXT_COLUMNS if c in cols), None)
    if text is None or text not in cols:
        wanted = cfg.text_column or "/".join(TEXT_COLUMNS)
        raise UserError(f"{path}: no text column {wanted!r}; columns: {', '.join(cols)} (use --text-column)")
    pair = cfg.text_pair_column
    if pair and pair not in cols:
        raise UserError(f"{path}: no column {pair!r}; columns: {', '.join(cols)}")
    if need_label and cfg.label_column not in cols:
        raise UserError(f"{path}: no label column {cfg.label_column!r}; columns: {', '.join(cols)} "
                        "(use --label-column)")
    needed = [c for c in (text, pair, cfg.label_column if need_label else None) if c]
    for n, r in enumerate(rows, 1):
        absent = [c for c in needed if c not in r]
        if absent:
            raise UserError(f"{path}: record {n} has no {absent[0]!r} field")
        for c in (text, pair):
            if c and not isinstance(r[c], str):
                raise UserError(f"{path}: record {n}: {c!r} must be text, not {type(r[c]).__name__} {shown(r[c])}")
        if need_label:  # labels are names: "1" in a TSV, 1 in a Parquet file or JSONL
            if isinstance(r[cfg.label_column], (dict, list)):
                raise UserError(f"{path}: record {n}: label {shown(r[cfg.label_column])} must be a string or a number")
            r[cfg.label_column] = str(r[cfg.label_column])
            if not r[cfg.label_column].strip():  # a null or blank label is a row without one, not a class ""
                raise UserError(f"{path}: record {n}: the {cfg.label_column!r} field is empty")
    return text, pair, cfg.label_column


def saved_columns(model: str) -> dict[str, str]:
    """The columns a classifier was fine-tuned on (its folder's ``finetune_config.json``), which ``evaluate`` and
    ``predict`` read unless told otherwise; none for a folder that bertforge did not fine-tune."""
    saved = json_object_or_none(os.path.join(model, "finetune_config.json")) or {}
    task = saved.get("task") if isinstance(saved.get("task"), dict) else {}
    return {k: task[k] for k in ("text_column", "text_pair_column", "label_column") if isinstance(task.get(k), str)}


def is_table(path: str) -> bool:
    return path.lower().endswith((".tsv", ".csv", ".jsonl", ".json"))


def input_columns(a, pairs: bool = True) -> tuple[str, str | None, list[dict]]:
    """(the text column, the second sentence's column or None, the rows) of a ``predict`` command's ``--input``
    table: the columns given (``--text-column``, ``--text-pair-column``), else those the model was fine-tuned on,
    else the table's own (a pair only where ``pairs``)."""
    rows = read_table(a.input)
    saved = saved_columns(a.model)
    text = getattr(a, "text_column", None) or saved.get("text_column")
    pair = getattr(a, "text_pair_column", None) or (saved.get("text_pair_column") if text == saved.get("text_column")
                                                     else None)
    col, pair, _ = resolve_columns(rows, ClassifyConfig(text_column=text, text_pair_column=pair if pairs else None),
                                   a.input, need_label=False, pairs=pairs)
    return col, pair, rows


def input_texts(a, blank_lines: bool = True) -> list[str]:
    """The texts of a ``predict`` command (``a``, its flags): those given, or ``--input``'s, a line each of a text
    file (a blank line too, unless ``blank_lines`` is False: result i is line i's), or the text column
    (``--text-column``) of a table."""
    if a.input and a.text:
        raise UserError("give texts or --input, not both")
    if a.input:
        if is_table(a.input):
            col, _, rows = input_columns(a, pairs=False)
            return [r[col] for r in rows]
        lines = lines_of(read_text(a.input, "input file"))
        if not any(t.strip() for t in lines):
            raise UserError(f"{a.input} has no lines")
        return lines if blank_lines else [t for t in lines if t.strip()]
    if not a.text:
        raise UserError("give at least one text, or --input FILE")
    return a.text


def label_set(labels: list[str]) -> list[str]:
    """Labels in id order: numeric order when all are integers, else alphabetical."""
    uniq = set(labels)
    try:
        return sorted(uniq, key=lambda x: int(x))
    except ValueError:
        return sorted(uniq)


def _real_number(label: str) -> bool:
    """Whether ``label`` is a number that is no integer (0.5, 1.7: a regression target)."""
    try:
        return not float(label).is_integer()
    except ValueError:
        return False


def encode_rows(tok: Tokenizer, rows: list[dict], text: str, pair: str | None, max_len: int) -> tuple[list[dict], int]:
    """Token ids for each row, truncated to ``max_len`` (longest segment first); returns (features, truncated)."""
    t = copy_of(tok, max_len)
    inputs = [(r[text], r[pair]) if pair else r[text] for r in rows]
    encs = t.encode_batch(inputs)
    truncated = sum(1 for e in encs if e.overflowing)
    return [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in encs], truncated


# ------------------------------------------------------------------------------------------------ model use
def predict_probabilities(model, features: list[dict], pad_id: int, device, batch_size: int = 64) -> np.ndarray:
    """Class probabilities (N, num_labels), batches sorted by length, in eval mode."""
    rows = by_length(model, features, pad_id, device, batch_size,
                     lambda out, b: out.logits.float().softmax(-1).cpu().numpy())
    return np.asarray(rows, dtype=np.float32).reshape(len(features), model.num_labels)


def score(model, features: list[dict], labels: np.ndarray, pad_id: int, device,
          batch_size: int = 64) -> tuple[dict, np.ndarray]:
    probs = predict_probabilities(model, features, pad_id, device, batch_size)
    loss = float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)).mean())
    res = classification_metrics(labels, probs.argmax(-1), model.num_labels)
    res["loss"] = loss
    return res, probs


def _labels_to_ids(rows, label_col, label2id, path) -> np.ndarray:
    ids = []
    for n, r in enumerate(rows):
        lab = r[label_col]
        if lab not in label2id:
            raise UserError(f"{path}: label {lab!r} (row {n + 1}) was never seen in training; known labels: "
                            f"{', '.join(label2id)}")
        ids.append(label2id[lab])
    return np.asarray(ids, dtype=np.int64)


# ------------------------------------------------------------------------------------------------ fine-tuning
class ClassificationTask(FinetuneTask):
    """Sentence (pair) classification: labels from the training file, accuracy picks the best epoch."""

    name = "classify"
    model_class = BertForSequenceClassification
    settings_class = ClassifyConfig
    select = "accuracy"
    pipeline_tag = "text-classification"
    bench_files = ("sst2/train.tsv", "sst2/dev.tsv")
    plotted = [("accuracy", "accuracy"), ("macro_f1", "macro-F1")]
    defaults = {}

    help = "sentence or sentence-pair classification (TSV, CSV, JSONL)"
    printed = ("accuracy", "macro_f1", "loss")
    evaluate_name = "classify"
    evaluate_help = "accuracy and macro-F1 of a classifier on a labelled file"
    evaluate_settings = ClassifyConfig

    @classmethod
    def evaluation(cls):
        return evaluate_classifier

    predict_name = "classify"
    predict_help = "label probabilities"
    aliases = ("text-classification", "sentiment-analysis")

    @classmethod
    def holds(cls, config) -> bool:
        return config.num_labels > 1  # classes (one output is a reranker's score)

    @classmethod
    def pipeline_class(cls) -> type:
        return ClassifyPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        text_input_flags(p)
        p.add_argument("--text-pair-column", help="a table's second sentence of each pair (default: the model's, "
                                                  "or sentence2 beside sentence1 and GLUE's other pairs)")
        p.add_argument("--max-seq-length", type=positive_int, help="tokens read of each text (default: 128, as "
                                                                   "fine-tuning and evaluate classify read it)")
        p.add_argument("--top-k", type=positive_int, default=1, help="the k most probable labels of each text")
        p.add_argument("text", nargs="*")

    @classmethod
    def predict(cls, a) -> None:
        p = ClassifyPipeline(a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None),
                             max_seq_length=a.max_seq_length)
        pairs = None
        if a.input and is_table(a.input):
            col, pair, rows = input_columns(a)
            texts, pairs = [r[col] for r in rows], [r[pair] for r in rows] if pair else None
        elif a.text_pair_column:
            raise UserError("--text-pair-column names a column of an --input table")
        else:
            texts = input_texts(a)
        res = p(texts, pairs, top_k=a.top_k)
        shown_texts = texts if pairs is None else [f"{t} | {u}" for t, u in zip(texts, pairs)]

        def table(rows):
            for t, r in zip(shown_texts, rows):
                ranked = "  ".join(f"{x['label']} {x['score']:.3f}" for x in r) if a.top_k != 1 else None
                yield f"{ranked}  {one_line(t)}" if ranked else f"{r['label']:>12}  {r['score']:.3f}  {one_line(t)}"

        texts_of = [{"text": t} if pairs is None else {"text": t, "text_pair": u}
                    for t, u in zip(texts, pairs or texts)]
        emit(a, [{**x, **r} if a.top_k == 1 else {**x, "labels": r} for x, r in zip(texts_of, res)]
             if a.json else res, table)

    def read(self, cfg: FinetuneConfig) -> None:
        self.train_rows, self.val_rows = self.split_validation(read_table(cfg.data.train_file), cfg, read_table)
        self.text, self.pair, self.label_col = resolve_columns(self.train_rows, self.settings, cfg.data.train_file)
        same_text = dataclasses.replace(self.settings, text_column=self.text, text_pair_column=self.pair)
        if self.val_rows:  # (none: the run is not evaluated)
            resolve_columns(self.val_rows, same_text, cfg.data.validation_file or cfg.data.train_file)
        if cfg.data.max_train_examples:
            self.train_rows = self.train_rows[: cfg.data.max_train_examples]
        self.labels = label_set([r[self.label_col] for r in self.train_rows])
        real = [lab for lab in self.labels if _real_number(lab)]
        if real and len(real) == len(self.labels):
            raise UserError(f"{cfg.data.train_file}: the labels are real numbers ({', '.join(real[:3])}...), not "
                            "classes; classify learns named or integer classes, and does no regression")
        if len(self.labels) < 2:
            raise UserError(f"{cfg.data.train_file}: only one label ({self.labels[0]!r}); classification needs at "
                            "least two")
        label2id = {lab: i for i, lab in enumerate(self.labels)}
        self.y_train = _labels_to_ids(self.train_rows, self.label_col, label2id, cfg.data.train_file)
        self.y_val = _labels_to_ids(self.val_rows, self.label_col, label2id, cfg.data.validation_file)

    def texts(self) -> list[str]:
        return [r[self.text] for r in self.train_rows]

    def configure(self, config: BertConfig) -> bool:
        return use_labels(config, self.labels)

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig):
        n = cfg.data.max_seq_length
        self.pad, self.eval_batch_size = special_ids(tok).pad, cfg.data.eval_batch_size
        f_train, n_trunc = encode_rows(tok, self.train_rows, self.text, self.pair, n)
        self.f_val, v_trunc = encode_rows(tok, self.val_rows, self.text, self.pair, n)
        if n_trunc or v_trunc:
            log.warning("truncated to %d tokens: %d training and %d validation examples", n, n_trunc, v_trunc)
        for f, y in zip(f_train, self.y_train):
            f["labels"] = int(y)
        log.info("fine-tuning %s on %d examples (%d labels: %s)%s", cfg.model, len(f_train), len(self.labels),
                 ", ".join(self.labels), validating(len(self.f_val), "examples"))
        return f_train, lambda fs: pad_batch(fs, self.pad, ("labels",))

    def evaluate(self, model, device):
        return score(model, self.f_val, self.y_val, self.pad, device, self.eval_batch_size)

    def eval_size(self) -> int:
        return len(self.f_val)

    def eval_tokens(self) -> int:
        return sum(len(f["input_ids"]) for f in self.f_val)

    def unlearnt(self, metrics, artifacts) -> str | None:
        guesses = np.asarray(artifacts).argmax(-1)
        predicted = set(guesses.tolist())
        if len(set(self.y_val.tolist())) < 2:
            return None
        if len(predicted) == 1:
            return f"it gives every one of the {len(self.y_val)} validation examples {self.labels[predicted.pop()]!r}"
        # no better than the training data's most frequent label for every example, by accuracy and by macro-F1
        # (on rare classes a model that learnt can be less accurate than that, never worse by both)
        majority = np.full_like(self.y_val, np.bincount(self.y_train).argmax())
        ours, theirs = (classification_metrics(self.y_val, g, len(self.labels)) for g in (guesses, majority))
        if all(ours[k] <= theirs[k] for k in ours):
            return (f"its accuracy {ours['accuracy']:.3f} and macro-F1 {ours['macro_f1']:.3f} are no better than "
                    f"the {theirs['accuracy']:.3f} and {theirs['macro_f1']:.3f} of giving every validation example "
                    f"the training data's most frequent label, {self.labels[majority[0]]!r}")
        return None

    def write_outputs(self, folder: str, probs) -> dict:
        with open(os.path.join(folder, "predictions.jsonl"), "w", encoding="utf-8") as f:
            for r, p in zip(self.val_rows, probs):
                row = {"text": r[self.text]}
                if self.pair:
                    row["text_pair"] = r[self.pair]
                row.update(label=r[self.label_col], prediction=self.labels[int(p.argmax())],
                           probabilities={lab: round(float(q), 6) for lab, q in zip(self.labels, p)})
                f.write(json.dumps(row) + "\n")
        majority = float(np.mean(self.y_val == np.bincount(self.y_train).argmax()))
        return {"majority_baseline_accuracy": majority, "validation_examples": len(self.y_val)}

    @classmethod
    def bench_default_data(cls, folder: str) -> tuple[str, str]:
        from ..demo.corpus import write_sentiment

        paths = write_sentiment(folder, n_train=2000, seed=0)  # the demo's sentiment sentences
        return paths["train"], paths["validation"]

    def train_figures(self) -> dict:
        return {"train_examples": len(self.y_train)}


def evaluate_classifier_model(path: str, data: str, task: ClassifyConfig, max_seq_length: int | None = None,
                              batch_size: int = 64, device: str = "auto") -> dict:
    """``bertforge evaluate classify``: accuracy, macro-F1 and loss of a saved classifier on a labelled file."""
    model_class, config = for_folder(model_dir(path), BertForSequenceClassification)
    if not config.id2label:
        raise UserError(f"{path} is not a classifier (its config.json has no id2label)")
    labelled_head(path, config, "ForSequenceClassification")  # (as predict classify: not a token classifier's)
    max_seq_length = check_max_seq_length(config, max_seq_length, path, default=128)
    rows = read_table(data)
    text, pair, label_col = resolve_columns(rows, task, data)
    y = _labels_to_ids(rows, label_col, config.label2id, data)
    m = load_for_inference(path, model_class, device, config,
                           head=("classifier.weight", f"{path} has no trained classification head"))
    feats, _ = encode_rows(m.tokenizer, rows, text, pair, max_seq_length)
    res, _ = score(m.model, feats, y, special_ids(m.tokenizer).pad, m.device, batch_size)
    res["examples"] = len(rows)
    return res


@checked(batch_size=1)
def evaluate_classifier(model: str | os.PathLike, data: str | os.PathLike, max_seq_length: int | None = None,
                        batch_size: int = 64, device: str = "auto", **columns: Any) -> dict:
    """``bertforge evaluate classify``: accuracy, macro-F1 and loss of a fine-tuned classifier on ``data``;
    ``columns``: ``text_column``, ``text_pair_column``, ``label_column``, by default the model's own (those it
    was fine-tuned on); ``max_seq_length`` by default 128, or the model's positions when it has fewer."""

    model, data = os.fspath(model), os.fspath(data)
    settings = given_settings(ClassifyConfig(**saved_columns(model)), columns, "evaluate_classifier's columns")
    return evaluate_classifier_model(model, data, settings, max_seq_length, batch_size, device)


# ------------------------------------------------------------------------------------------------ pipeline
class ClassifyPipeline(Pipeline):
    task = "classify"
    model_class = BertForSequenceClassification
    head = ("classification head (classifier)", "fine-tune it with bertforge finetune classify")
    default_length = 128  # as fine-tuning and evaluate classify cut a text: the same review, the same label

    def _check(self, config: BertConfig) -> None:
        labelled_head(self.dir, config, "ForSequenceClassification")

    @checked(top_k=1)
    def __call__(self, texts: str | list[str], pairs: str | list[str] | None = None, top_k: int | None = 1) -> Any:
        """``{"label", "score", "probabilities": {label: p}}`` for a text (and ``pairs``, its second sentence),
        or a list for lists; with another ``top_k`` (None: every label), as transformers' pipeline gives it: a
        list of ``{"label", "score"}``, the most probable first."""
        single = isinstance(texts, str)
        texts, pairs = paired(texts, pairs, "pairs") if pairs is not None else ([texts] if single else texts, None)
        labels = [self.config.id2label[i] for i in sorted(self.config.id2label)]

        regression = self.config.extra.get("problem_type") == "regression"

        def scored(logits):  # as transformers' pipeline: one label is a score, through a sigmoid but a regression's
            return logits.softmax(-1) if len(labels) > 1 else logits if regression else logits.sigmoid()

        def fn(out, b):
            rows = []
            for p in scored(out.logits.float()).tolist():
                if top_k != 1:
                    ranked = sorted(range(len(p)), key=lambda i: -p[i])[:top_k]
                    rows.append([{"label": labels[i], "score": p[i]} for i in ranked])
                    continue
                k = int(np.argmax(p))
                rows.append({"label": labels[k], "score": p[k], "probabilities": dict(zip(labels, p))})
            return rows

        res = self._run(self._encode(texts, pairs), fn)
        return res[0] if single else res
