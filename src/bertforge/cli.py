"""The ``bertforge`` command line: a thin layer of argparse over the Python API.

``main(argv) -> int`` is what the console script and the tests call.  Bad input ends with one line
``error: ...`` on stderr and exit status 2; a run that cannot go on (a non-finite loss) with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import gc
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from .config import progress_shown
from .errors import TrainingError, UserError

log = logging.getLogger("bertforge")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error:`` line and exit status 2, and whose help shows defaults."""

    def set_defaults(self, **kw):
        if "func" in kw:
            kw.setdefault("_parser", self)  # the command's own parser, for hints on unknown flags
        super().set_defaults(**kw)

    def add_argument(self, *args, **kw):
        """A flag's help ends with its default (flags made from settings carry it in their help already)."""
        h = kw.get("help") or ""
        if (args[0].startswith("-") and kw.get("default") not in (None, False, argparse.SUPPRESS)
                and "(default" not in h and h != argparse.SUPPRESS):
            kw["help"] = h + (" " if h else "") + "(default: %(default)s)"
        return super().add_argument(*args, **kw)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


class _TqdmHandler(logging.Handler):
    """Log lines that do not break a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)


def setup_logging(quiet: bool = False, replica: bool = False) -> None:
    """Log lines on stderr: from INFO, or WARNING when ``quiet``; a ``replica`` (a process of torchrun other than
    its machine's first, which says the same) shows errors only."""
    for h in list(log.handlers):
        if isinstance(h, _TqdmHandler):
            log.removeHandler(h)
    h = _TqdmHandler()
    h.addFilter(lambda r: not getattr(r, "bar_shown", False))  # what the progress bar already shows
    h.setFormatter(logging.Formatter("%(message)s"))
    h.setLevel(logging.ERROR if replica else logging.WARNING if quiet else logging.INFO)
    log.addHandler(h)
    log.setLevel(logging.INFO)  # a run's train.log gets everything, whatever stderr shows
    log.propagate = False


# ------------------------------------------------------------------------------------------------ flags
_TYPES = {"int": int, "float": float, "str": str}

# transformers' names (TrainingArguments, run_mlm.py, run_glue.py, run_qa.py) for the same settings
TRANSFORMERS_NAMES = {
    "out": "--output_dir", "epochs": "--num_train_epochs", "lr": "--learning_rate", "log_every": "--logging_steps",
    "save_every": "--save_steps", "eval_every": "--eval_steps", "keep_checkpoints": "--save_total_limit",
    "grad_accum": "--gradient_accumulation_steps", "model": "--model_name_or_path", "mask_prob": "--mlm_probability",
    "eval_batch_size": "--per_device_eval_batch_size", "warmup_steps": "--warmup_steps", "report_to": "--report_to",
    "max_eval_instances": "--max_eval_samples", "max_train_examples": "--max_train_samples",
    "max_eval_examples": "--max_eval_samples", "init": "--model_name_or_path",  # (pretraining: the model to start from)
}
# names that look alike but mean something else in bertforge: answered with a hint, not taken
NOT_THE_SAME = {
    "--per_device_train_batch_size": "--batch-size (the global batch: all processes and accumulation steps together)",
    "--train_batch_size": "--batch-size (the global batch)",
    "--line_by_line": "--doc-separator line",
    "--do_train": "the command itself (bertforge pretrain / finetune)",
    "--fp16": "--precision fp16",
    "--train_file": "--data (pretraining) or --train (fine-tuning)",
    "--validation_file": "--eval-data (pretraining) or --validation (fine-tuning)",
    "--bf16": "--precision bf16",
}


def shown(value: Any) -> str:
    """A setting's value as ``--help`` writes it (on/off for switches)."""
    return "on" if value is True else "off" if value is False else str(value)


def add_setting_flags(p: argparse.ArgumentParser, cfg: Any, only: Sequence[str] | None = None,
                      notes: dict[str, str] | None = None, defaults: dict[str, str] | None = None) -> list[str]:
    """A flag for each field of ``cfg`` (a dataclass, or a :class:`~bertforge.config.Sections` run config:
    the fields its command takes), its help text and default taken from the field: ``--max-seq-length`` sets
    ``max_seq_length``.  Every flag defaults to None, so that only explicit flags override.  ``only`` keeps
    those fields alone; ``defaults`` describes in words the defaults decided at run time.  Returns the flags'
    destinations."""
    from .config import Sections, taken_by

    if isinstance(cfg, Sections):
        fields = {k: hf for k, hf in cfg.flat_fields().items() if taken_by(hf[1], cfg.COMMAND)}
    else:
        fields = {f.name: (cfg, f) for f in dataclasses.fields(cfg)}
    dests = []
    for name, (holder, f) in fields.items():
        if not f.metadata.get("flag", True) or (only is not None and name not in only):
            continue
        help_ = _setting_help(f, getattr(holder, f.name), (defaults or {}).get(name), (notes or {}).get(name))
        kw: dict[str, Any] = dict(dest=name, default=None, help=help_.replace("%", "%%"))
        typ = str(f.type).replace(" | None", "")
        if typ == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        elif typ == "list[str]":
            kw.update(nargs="+", metavar="PATH")
        elif name == "max_time":
            kw["metavar"] = "DURATION"
        else:
            kw["type"] = _TYPES[typ]
            if f.metadata.get("choices"):
                kw["choices"] = f.metadata["choices"]
        p.add_argument(*_flag_names(p, f), **kw)
        dests.append(name)
    return dests


def _setting_help(f: dataclasses.Field, default: Any, described: str | None, note: str | None) -> str:
    """A setting's ``--help`` line: its help text, its default (or ``described``: one decided at run time)
    and a ``note``."""
    help_ = f.metadata.get("help", "")
    if described:
        help_ += f" (default: {described})"
    elif "(default" not in help_ and default not in (None, "", []):
        help_ += f" (default: {shown(default)})"
    return help_ + (f" [{note}]" if note else "")


def _flag_names(p: argparse.ArgumentParser, f: dataclasses.Field) -> list[str]:
    """A setting's flag, then its aliases: underscores as in config files, and transformers' name (with
    underscores, and hyphens as bertforge's own flags)."""
    from .config import flag_of

    names = [flag_of(f)]
    theirs = TRANSFORMERS_NAMES.get(f.name)
    for alias in ("--" + f.name, "--" + flag_of(f)[2:].replace("-", "_"), theirs,
                  theirs and "--" + theirs[2:].replace("_", "-")):
        if alias and alias not in names and alias not in p._option_string_actions:
            names.append(alias)
    return names


def _count(minimum: int):
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, not {text!r}") from None
        if v < minimum:
            least = "positive" if minimum == 1 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {least}, not {v}")
        return v

    return parse


positive_int, non_negative_int = _count(1), _count(0)


def explicit_flags(a: argparse.Namespace, dests: Sequence[str]) -> dict[str, Any]:
    return {d: getattr(a, d) for d in dests if getattr(a, d, None) is not None}


# ------------------------------------------------------------------------------------------------ tokenizer
def cmd_tokenizer_train(a: argparse.Namespace) -> int:
    from .api import train_tokenizer

    train_tokenizer(a.input, a.out, a.vocab_size, a.model, bool(a.cased), a.min_frequency, a.text_field or "text",
                    a.doc_separator or "file", a.overwrite, progress=progress_shown(None))
    return 0


# ------------------------------------------------------------------------------------------------ prepare
def cmd_prepare(a: argparse.Namespace) -> int:
    from .api import prepare

    found = prepare(a.data, a.tokenizer, a.out, a.workers, a.text_field or "text", a.doc_separator or "file",
                    a.dedup, a.overwrite, progress=False if a.no_progress else None)
    dup = found["duplicates"]
    print(f"{found['out']}: {found['documents']:,} documents, {found['sentences']:,} sentences, "
          f"{found['tokens']:,} tokens in {found['shards']} shards; exact duplicates: {dup['documents']:,} documents, "
          f"{dup['paragraphs']:,} paragraphs ({'dropped' if dup['dropped'] else 'kept: --dedup drops them'})")
    return 0


def _add_prepare_parser(sub) -> None:
    from .config import PretrainDataConfig

    pp = sub.add_parser("prepare", help="tokenize a corpus once into shards that pretraining runs reuse")
    pp.add_argument("--data", nargs="+", required=True, metavar="PATH",
                    help="the corpus: .txt/.jsonl/.gz/.parquet files, directories, globs, hf:NAME")
    pp.add_argument("--tokenizer", required=True, help="tokenizer or model directory, or vocab.txt")
    pp.add_argument("--out", required=True, help="the prepared folder (run again: finishes what a killed run left)")
    pp.add_argument("--workers", type=positive_int, help="processes that read and tokenize (default: the cores "
                                                         "this process may use)")
    pp.add_argument("--dedup", action="store_true", help="drop exact duplicate documents, then paragraphs (always "
                                                         "counted in the manifest)")
    pp.add_argument("--overwrite", action="store_true", help="replace a folder prepared from other inputs or "
                                                             "settings")
    pp.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    add_setting_flags(pp, PretrainDataConfig(), only=("text_field", "doc_separator"))
    pp.set_defaults(func=cmd_prepare)


# ------------------------------------------------------------------------------------------------ pretrain
def _add_pretrain_args(p: argparse.ArgumentParser) -> None:
    from .config import RECIPES, PretrainConfig

    p.add_argument("--config", help="YAML or JSON file with the same settings as the flags (flags override it)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier pretraining output that bertforge wrote in --out")
    p.add_argument("--cased", dest="cased", action="store_true", default=None,
                   help="a cased vocabulary (trained tokenizer)")
    notes: dict[str, list[str]] = {}  # each other recipe's value where it is not the default's (budget's)
    for name, values in RECIPES.items():
        for k, v in values.items():
            if v != RECIPES["budget"][k]:
                notes.setdefault(k, []).append(f"--recipe {name}: " + ("the model's" if v is None else shown(v)))
    p.set_defaults(setting_flags=add_setting_flags(p, PretrainConfig(), notes={k: "; ".join(v) for k, v in
                                                                               notes.items()}))


PRETRAIN_PRINTED = ("mlm_accuracy", "mlm_accuracy_masked", "nsp_accuracy", "mlm_loss", "nsp_loss", "steps",
                    "tokens_per_second")


def cmd_pretrain(a: argparse.Namespace) -> int:
    """The settings as :func:`bertforge.settings.pretrain_settings` decides them, from the explicit flags."""
    from .api import run_pretraining

    explicit = explicit_flags(a, a.setting_flags)
    out = explicit.pop("out", None) or ""  # (or the --config file's)
    if a.cased:
        explicit["cased"] = True
    metrics = run_pretraining(out, resume=a.resume, overwrite=a.overwrite, config=a.config, **explicit)
    if metrics:
        print(json.dumps({k: metrics[k] for k in PRETRAIN_PRINTED if k in metrics}))
    return 0


# ------------------------------------------------------------------------------------------------ finetune


FINETUNE_PRINTED = {"classify": ("accuracy", "macro_f1", "loss"), "squad": ("exact_match", "f1", "precision", "recall"),
                    "embed": ("mrr@10", "recall@1", "recall@10", "ndcg@10"),
                    "ner": ("f1", "precision", "recall", "accuracy")}


def cmd_finetune(a: argparse.Namespace) -> int:
    """The settings as :func:`bertforge.settings.finetune_settings` decides them, from the explicit flags."""
    from .api import run_finetuning

    flags = explicit_flags(a, a.setting_flags)
    given = [flags.pop(k, None) or "" for k in ("model", "train_file", "validation_file", "out")]
    m = run_finetuning(a.task, *given, overwrite=a.overwrite, resume=a.resume, config=a.config, **flags,
                       **explicit_flags(a, a.task_flags))
    if not m:  # a process other than rank 0 under torchrun: rank 0 reports
        return 0
    printed = (*FINETUNE_PRINTED[a.task], "best_epoch", "epoch", "step", "train_seconds")
    print(json.dumps({k: m[k] for k in printed if k in m}))  # (without validation: no figures of it)
    return 0


def _add_finetune_parsers(sub) -> None:
    from .config import finetune_lr_rule
    from .lifecycle import SAVE_INTERVAL
    from .tasks import TASKS

    ft = sub.add_parser("finetune", help="fine-tune a BERT: classification, SQuAD, embeddings, NER")
    fts = ft.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    fts.required = True
    helps = {"classify": "sentence or sentence-pair classification (TSV, CSV, JSONL)",
             "squad": "SQuAD v1.1 extractive question answering",
             "embed": "sentence embeddings from query/passage pairs (JSONL, TSV or SQuAD JSON), in-batch negatives; "
                      "the output is also a sentence-transformers folder",
             "ner": "token classification (named entities) from CoNLL-style columns or JSONL; entity F1 by seqeval"}
    for name, kind in TASKS.items():
        p = fts.add_parser(name, help=helps[name])
        flags = add_setting_flags(p, kind.config(), defaults={"lr": finetune_lr_rule(), "save_every": (
            f"every {SAVE_INTERVAL // 60} minutes of the run")})
        p.add_argument("--config", help="YAML or JSON file with the same settings as the flags, or a run's "
                                        "finetune_config.json (flags override it)")
        p.add_argument("--overwrite", action="store_true",
                       help="replace an earlier fine-tuning output that bertforge wrote in --out")
        p.add_argument("--resume", action="store_true", help="continue the interrupted run in --out from its "
                                                             "checkpoint (the same command, plus --resume)")
        p.set_defaults(func=cmd_finetune, setting_flags=flags, task_settings=kind.settings_class,
                       task_flags=add_setting_flags(p, kind.settings_class()))


# ------------------------------------------------------------------------------------------------ evaluate
def cmd_evaluate(a: argparse.Namespace) -> int:
    """``evaluate TASK``: the JSON of the API function ``a.api``, called with the flags named as its parameters
    (those not given take its defaults) and the task's settings, checked before anything is read."""
    import inspect

    from . import api

    fn = getattr(api, a.api)
    params = {k for k, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_KEYWORD}
    kw = {k: v for k, v in vars(a).items() if k in params and v is not None}
    if a.settings_kind is not None:
        kw.update(dataclasses.asdict(_task_settings(a, a.settings_kind)))
    print(json.dumps(fn(**kw)))
    return 0


def _task_settings(a: argparse.Namespace, kind: type):
    """The task's settings dataclass from its flags (see :func:`add_setting_flags`), checked."""
    from .config import validate_fields

    settings = kind(**explicit_flags(a, [f.name for f in dataclasses.fields(kind)]))
    validate_fields(settings)
    return settings


def _embedding_flags(p) -> None:
    from .embeddings import POOLINGS

    p.add_argument("--pooling", choices=POOLINGS, help="default: the folder's sentence-transformers pooling, "
                                                             "else mean")
    p.add_argument("--max-seq-length", type=positive_int, help="tokens read of a text (default: the folder's "
                                                                "max_seq_length, else 512)")


def _add_evaluate_parsers(sub) -> None:
    from .config import PretrainDataConfig
    from .tasks.classify import ClassifyConfig
    from .tasks.ner import NerConfig
    from .tasks.squad import SquadConfig

    ev = sub.add_parser("evaluate", help="score predictions or a saved model")
    evs = ev.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    evs.required = True
    q = evs.add_parser("squad", help="official SQuAD v1.1 exact match and F1")
    q.add_argument("--data", required=True, help="SQuAD v1.1 JSON with reference answers")
    q.add_argument("--predictions", help="predictions JSON {question id: answer}")
    q.add_argument("--model", help="a fine-tuned question-answering model directory")
    q.add_argument("--write-predictions", help="with --model: also write its predictions to this file")
    q.add_argument("--max-seq-length", type=positive_int, help="default: 384, or the model's positions if fewer")
    q.add_argument("--batch-size", type=positive_int, default=64)
    q.add_argument("--overwrite", action="store_true", help="with --write-predictions: replace an existing file")
    q.add_argument("--device", default="auto")
    add_setting_flags(q, SquadConfig())
    q.set_defaults(func=cmd_evaluate, api="evaluate_squad", settings_kind=SquadConfig)
    c = evs.add_parser("classify", help="accuracy and macro-F1 of a classifier on a labelled file")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--max-seq-length", type=positive_int, help="default: 128, or the model's positions if fewer")
    c.add_argument("--batch-size", type=positive_int, default=64)
    c.add_argument("--device", default="auto")
    add_setting_flags(c, ClassifyConfig())
    c.set_defaults(func=cmd_evaluate, api="evaluate_classifier", settings_kind=ClassifyConfig)
    n = evs.add_parser("ner", help="entity precision, recall and F1 (seqeval) of a token classifier on a tagged file")
    n.add_argument("--model", required=True)
    n.add_argument("--data", required=True, help="CoNLL-style columns or JSONL of {tokens, tags}")
    n.add_argument("--max-seq-length", type=positive_int, help="default: 128, or the model's positions if fewer")
    n.add_argument("--batch-size", type=positive_int, default=64)
    n.add_argument("--device", default="auto")
    add_setting_flags(n, NerConfig(), only=("token_column", "tag_column", "labels_file", "strict"))
    n.set_defaults(func=cmd_evaluate, api="evaluate_ner", settings_kind=NerConfig)
    r = evs.add_parser("retrieval", help="MRR@10, recall@1/10 and nDCG@10 of a model's embeddings (or BM25)")
    r.add_argument("--model", required=True, help="a BERT or sentence-transformers directory, or bm25 (BM25 through "
                                                  "the bm25s library: k1 1.5, b 0.75, Lucene's idf, English stop "
                                                  "words)")
    r.add_argument("--data", required=True, help="a SQuAD JSON file (each question against every paragraph), a BEIR "
                                                 "folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) or a JSONL "
                                                 "file of {query, positive} (against the distinct positives)")
    r.add_argument("--batch-size", type=positive_int, default=64)
    _embedding_flags(r)
    r.add_argument("--device", default="auto")
    r.set_defaults(func=cmd_evaluate, api="evaluate_retrieval", settings_kind=None)
    m = evs.add_parser("mlm", help="held-out masked-LM accuracy on a fixed protocol (any model with an MLM head)")
    m.add_argument("--model", required=True, help="a BERT directory with a masked-LM head, ours or transformers'")
    m.add_argument("--data", required=True, nargs="+", metavar="PATH", help="held-out text: .txt/.jsonl/.gz files")
    m.add_argument("--max-seq-length", type=positive_int, default=128)
    m.add_argument("--seed", type=non_negative_int, default=0, help="seed of the masked positions")
    m.add_argument("--batch-size", type=positive_int, default=32)
    m.add_argument("--max-blocks", type=positive_int, help="evaluate only the first N blocks")
    m.add_argument("--device", default="auto")
    add_setting_flags(m, PretrainDataConfig(), only=("text_field", "doc_separator"))
    m.set_defaults(func=cmd_evaluate, api="evaluate_mlm", settings_kind=None)


# ------------------------------------------------------------------------------------------------ predict
def _read_lines(path: str) -> list[str]:
    from .files import read_text

    lines = [line for line in read_text(path, "input file").splitlines() if line.strip()]
    if not lines:
        raise UserError(f"{path} has no lines")
    return lines


def _texts(a: argparse.Namespace) -> list[str]:
    if a.input and a.text:
        raise UserError("give texts or --input, not both")
    if a.input:
        if a.input.endswith((".tsv", ".csv", ".jsonl", ".json")):
            from .tasks.classify import ClassifyConfig
            from .tasks.classify import read_table, resolve_columns

            rows = read_table(a.input)
            columns = ClassifyConfig(text_column=getattr(a, "text_column", None))
            col, _, _ = resolve_columns(rows, columns, a.input, need_label=False)
            return [r[col] for r in rows]
        return _read_lines(a.input)
    if not a.text:
        raise UserError("give at least one text, or --input FILE")
    return a.text


def _line(text: str, width: int = 100) -> str:
    """A text as a table shows it: one line, shortened (a review of several paragraphs is one row; --json has it
    whole)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _emit(a: argparse.Namespace, results: Any, table) -> None:
    if a.json:
        print(json.dumps(results, ensure_ascii=False))
    else:
        for line in table(results):
            print(line)


def cmd_predict_embed(a: argparse.Namespace) -> int:
    from .api import embed

    texts = _texts(a)
    vecs = embed(a.model, texts, a.batch_size, a.device, a.pooling, a.max_seq_length)

    def table(rows):
        for t, v in zip(texts, rows):
            head = " ".join(f"{x:+.3f}" for x in v[:4])
            yield f"[{head} ...] ({len(v)} values, norm {float((v ** 2).sum()) ** 0.5:.3f})  {_line(t, 60)}"

    _emit(a, vecs.tolist() if a.json else vecs, table)
    return 0


def cmd_predict_ner(a: argparse.Namespace) -> int:
    from .predict import NerPipeline

    texts = _texts(a)
    p = NerPipeline(a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None),
                    max_seq_length=a.max_seq_length)
    res = p(texts, aggregation_strategy=a.aggregation)

    def table(rows):
        for t, found in zip(texts, rows):
            yield _line(t)
            for x in found:
                label = x.get("entity_group", x.get("entity"))
                yield f"  {label:<14} {x['score']:.3f}  {x['word']}  ({x['start']}-{x['end']})"

    _emit(a, res[0] if len(texts) == 1 and a.json else res, table)
    return 0


def cmd_predict(a: argparse.Namespace) -> int:
    from .predict import pipeline

    p = pipeline(a.task, a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None),
                 max_seq_length=getattr(a, "max_seq_length", None) if a.task == "classify" else None)
    if a.task == "fill-mask":
        texts = _texts(a)
        res = p.per_mask(texts, top_k=a.top_k)  # one list per [MASK], whatever their number

        def table(rows):
            for t, masks in zip(texts, rows):
                yield _line(t)
                for k, cands in enumerate(masks):
                    yield f"  [MASK] {k + 1}: " + "  ".join(f"{c['token_str']} {c['score']:.3f}" for c in cands)

        _emit(a, [{"text": t, "masks": m} for t, m in zip(texts, res)] if a.json else res, table)
    elif a.task == "next-sentence":
        res = p(a.first, a.second)
        _emit(a, res, lambda r: [f"{r['label']}  P(IsNext) = {r['is_next']:.3f}"])
    elif a.task == "classify":
        texts = _texts(a)
        res = p(texts, top_k=a.top_k)

        def table(rows):
            for t, r in zip(texts, rows):
                ranked = "  ".join(f"{x['label']} {x['score']:.3f}" for x in r) if a.top_k != 1 else None
                yield f"{ranked}  {_line(t)}" if ranked else f"{r['label']:>12}  {r['score']:.3f}  {_line(t)}"

        _emit(a, [{"text": t, **r} if a.top_k == 1 else {"text": t, "labels": r} for t, r in zip(texts, res)]
              if a.json else res, table)
    else:
        from .tasks.squad import SquadConfig

        cfg = _task_settings(a, SquadConfig)
        if a.input:
            if a.question is not None or a.context is not None:
                raise UserError("give --question/--context or --input, not both")
            from .tasks.squad import read_examples

            examples, _ = read_examples(a.input)
            res = p(examples=examples, squad=cfg, max_seq_length=a.max_seq_length)
            _emit(a, res, lambda r: [f"{k}\t{v}" for k, v in r.items()])
        else:
            if a.question is None or a.context is None:  # given but empty: the pipeline says which
                raise UserError("give --question and --context, or --input squad.json")
            res = p(a.question, a.context, squad=cfg, max_seq_length=a.max_seq_length, top_k=a.top_k)
            _emit(a, res, lambda r: [f"{x['answer']}  (score {x['score']:.2f}, characters {x['start']}-{x['end']})"
                                     for x in (r if a.top_k > 1 else [r])])
    return 0


def _add_predict_parsers(sub) -> None:
    from .tasks.squad import SquadConfig
    from .predict import AGGREGATIONS

    pr = sub.add_parser("predict", help="use a trained model: fill-mask, next-sentence, classify, qa, ner, embed")
    prs = pr.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    prs.required = True

    def common(p):
        p.add_argument("--model", required=True, help="a BERT model directory")
        p.add_argument("--json", action="store_true", help="JSON on stdout instead of a table")
        p.add_argument("--batch-size", type=positive_int, default=32)
        p.add_argument("--device", default="auto")
        p.set_defaults(func=cmd_predict)

    fm = prs.add_parser("fill-mask", help="fill each [MASK] with the top-k tokens")
    common(fm)
    fm.add_argument("--top-k", type=positive_int, default=5)
    fm.add_argument("--input", help="a text file, one text per line")
    fm.add_argument("text", nargs="*")
    ns = prs.add_parser("next-sentence", help="probability that B follows A")
    common(ns)
    ns.add_argument("first")
    ns.add_argument("second")
    c = prs.add_parser("classify", help="label probabilities")
    common(c)
    c.add_argument("--input", help="a .txt file (one text per line) or a .tsv/.csv/.jsonl file")
    c.add_argument("--text-column")
    c.add_argument("--max-seq-length", type=positive_int, help="tokens read of each text (default: 128, as "
                                                                 "fine-tuning and evaluate classify read it)")
    c.add_argument("--top-k", type=positive_int, default=1, help="the k most probable labels of each text")
    c.add_argument("text", nargs="*")
    q = prs.add_parser("qa", help="extractive question answering")
    common(q)
    q.add_argument("--question")
    q.add_argument("--context")
    q.add_argument("--input", help="a SQuAD v1.1 JSON file: predictions {id: answer}")
    q.add_argument("--max-seq-length", type=positive_int, default=384)
    q.add_argument("--top-k", type=positive_int, default=1, help="the k best answers to the question")
    add_setting_flags(q, SquadConfig())
    n = prs.add_parser("ner", help="named entities (as transformers' token-classification pipeline finds them)")
    common(n)
    n.add_argument("--input", help="a .txt file (one text per line) or a .tsv/.csv/.jsonl file")
    n.add_argument("--text-column")
    n.add_argument("--aggregation", choices=AGGREGATIONS, default="simple",
                   help="how sub-tokens become entities, as transformers' aggregation_strategy")
    n.add_argument("--max-seq-length", type=positive_int, help="tokens read of a text (default: 512, or the model's "
                                                                "positions if fewer)")
    n.add_argument("text", nargs="*")
    n.set_defaults(func=cmd_predict_ner)
    e = prs.add_parser("embed", help="sentence vectors (as SentenceTransformer.encode gives them)")
    common(e)
    e.add_argument("--input", help="a .txt file (one text per line) or a .tsv/.csv/.jsonl file")
    e.add_argument("--text-column")
    _embedding_flags(e)
    e.add_argument("text", nargs="*")
    e.set_defaults(func=cmd_predict_embed)


# ------------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .config import TOKENIZER_MODELS, PretrainDataConfig
    from .models import FAMILIES

    p = _Parser(prog="bertforge", description="Pretrain BERT from scratch and fine-tune it.")
    p.add_argument("--version", action="version", version=f"bertforge {__version__}")
    p.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    tk = sub.add_parser("tokenizer", help="train a WordPiece or word-level vocabulary")
    tks = tk.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    tks.required = True
    tt = tks.add_parser("train", help="train a vocabulary on a corpus")
    tt.add_argument("--input", nargs="+", required=True, metavar="PATH")
    tt.add_argument("--vocab-size", type=positive_int, required=True)
    tt.add_argument("--out", required=True)
    tt.add_argument("--overwrite", action="store_true", help="replace an earlier tokenizer folder that bertforge wrote")
    tt.add_argument("--cased", action="store_true", help="keep case (default: lower-case, as bert-base-uncased)")
    tt.add_argument("--model", choices=TOKENIZER_MODELS, default=TOKENIZER_MODELS[0])
    tt.add_argument("--min-frequency", type=non_negative_int, default=2)
    add_setting_flags(tt, PretrainDataConfig(), only=("text_field", "doc_separator"))
    tt.set_defaults(func=cmd_tokenizer_train)

    _add_prepare_parser(sub)

    pt = sub.add_parser("pretrain", help="pretrain BERT with masked LM (+ next sentence prediction)")
    _add_pretrain_args(pt)
    pt.set_defaults(func=cmd_pretrain)

    _add_finetune_parsers(sub)
    _add_evaluate_parsers(sub)

    _add_predict_parsers(sub)

    dm = sub.add_parser("demo", help="the whole pipeline end to end on the built-in corpus, in minutes")
    dm.add_argument("--out", default="demo-output", help="output directory (default demo-output)")
    dm.add_argument("--quick", action="store_true", help="a shorter run (under a minute on two cores)")
    dm.add_argument("--wordpiece", action="store_true", help="a WordPiece vocabulary instead of whole words")
    dm.add_argument("--seed", type=non_negative_int, default=0,
                    help="the stories, the initialisation and the data order (default 0)")
    dm.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    dm.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="pretraining, inference or fine-tuning speed against transformers, side by side")
    b.add_argument("--task", default="pretrain", choices=("pretrain", "classify", "squad", "embed", "ner"),
                   help="pretrain (training step and inference), or a fine-tuning step of classify, squad, ner or "
                        "embed (against sentence-transformers)")
    b.add_argument("--preset", default="mini")
    b.add_argument("--arch", choices=tuple(FAMILIES),
                   help="the model family of the random --preset model (default: bert; pretrain with a family "
                        "without next sentence prediction: its masked-LM step, training only)")
    b.add_argument("--model",
                   help="fine-tuning tasks: a model directory of any family to fine-tune (default: a random --preset "
                        "model of --arch)")
    b.add_argument("--train", help="fine-tuning tasks: the training file (default: SST-2, SQuAD train-8k or WNUT-16 "
                                   "under --data-dir)")
    b.add_argument("--group-by-length", action="store_true", help="fine-tuning tasks: batches of similar lengths")
    b.add_argument("--batch-size", type=positive_int, default=32)
    b.add_argument("--seq-len", type=positive_int, help="default: 128 (384 for squad)")
    b.add_argument("--steps", type=positive_int, default=3, help="training steps per timed round")
    b.add_argument("--rounds", type=positive_int, default=7, help="alternating rounds (the median is reported)")
    b.add_argument("--vocab-size", type=positive_int, help="default: the tokenizer's with --tokenizer, else 30522")
    b.add_argument("--device", default="auto")
    b.add_argument("--precision", default="auto", help="auto (bf16 autocast on CUDA, fp32 on CPU), fp32, bf16")
    b.add_argument("--text",
                   help="build the training batch from this corpus file (with --tokenizer) instead of random tokens")
    b.add_argument("--tokenizer", help="tokenizer or model directory, or vocab.txt, for --text")
    b.add_argument("--threads", type=positive_int)
    b.add_argument("--data-dir", default=os.environ.get("BERTFORGE_DATA"), help="for SST-2 sentences (inference)")
    b.add_argument("--no-inference", dest="inference", action="store_false")
    b.add_argument("--compile", action="store_true",
                   help="also time the pretraining step under torch.compile against the same step eager")
    b.set_defaults(func=cmd_bench)
    return p


def cmd_demo(a: argparse.Namespace) -> int:
    from .demo import run_demo, summary_lines

    summary = run_demo(a.out, quick=a.quick, wordpiece=a.wordpiece, progress=progress_shown(a.progress), seed=a.seed)
    for line in summary_lines(summary, a.out):
        print(line)
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from .bench import run_bench, run_finetune_bench

    if a.task != "pretrain":
        if a.arch is not None and a.model:
            raise UserError("bench --arch names the family of a random --preset model; --model's family is read "
                            "from its config.json")
        run_finetune_bench(a.task, a.model, a.preset, a.batch_size, a.seq_len, a.steps, a.rounds, a.device, a.data_dir,
                           a.train, group_by_length=a.group_by_length, threads=a.threads, precision=a.precision,
                           arch=a.arch or "bert", out=lambda line: print(line, flush=True))
        return 0
    run_bench(a.preset, a.batch_size, a.seq_len or 128, a.steps, a.rounds, a.vocab_size, a.device, a.data_dir,
              a.inference, a.threads, out=lambda line: print(line, flush=True), text=a.text, tokenizer=a.tokenizer,
              precision=a.precision, compile=a.compile, arch=a.arch or "bert")
    return 0


def _unknown(extra: list[str], a: argparse.Namespace) -> str:
    """The error for unknown arguments, with the flag meant where one is near (or known by another name)."""
    parser = getattr(a, "_parser", None)
    known = list(parser._option_string_actions) if parser is not None else []
    hints = []
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        if flag in NOT_THE_SAME:
            hints.append(f"{flag}: here it is {NOT_THE_SAME[flag]}")
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7)
        if not close:
            close = difflib.get_close_matches(flag.replace("_", "-"), known, n=1, cutoff=0.7)
        if close:
            hints.append(f"{flag}: did you mean {close[0]}?")
    return "unrecognized arguments: " + " ".join(extra) + (f" ({'; '.join(hints)})" if hints else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        a, extra = parser.parse_known_args(argv)
        if extra:
            print(f"error: {_unknown(extra, a)}", file=sys.stderr)
            return 2
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return int(e.code or 0)
    # under torchrun every process meets the same inputs and the same errors: one of them says so per machine
    replica = os.environ.get("LOCAL_RANK", "0") != "0"
    setup_logging(a.quiet, replica)
    say = (lambda text: None) if replica else (lambda text: print(text, file=sys.stderr))
    from . import modelcard
    from .atomic import path_shown, write_failure

    modelcard.COMMAND = modelcard.command_line(list(sys.argv[1:] if argv is None else argv))  # for the model cards
    from .lifecycle import sigterm_as_interrupt

    try:  # one signal handler for every command: SIGTERM cleans up as Ctrl-C does (a training loop: StopSignals)
        with _file_size_limit_as_error(), sigterm_as_interrupt():
            return int(a.func(a) or 0)
    except UserError as e:
        say(f"error: {e}")
        return 2
    except TrainingError as e:
        say(f"error: {e}")
        return 1
    except KeyboardInterrupt as e:  # (with what to do next, where the interrupted work says it)
        say(f"error: {e.args[0] if e.args else 'interrupted'}")
        return 130
    except Exception as e:  # a failed write that no save named (each names its output itself)
        code = write_failure(e)
        if code is None:
            raise
        where = f" {path_shown(e.filename)}" if getattr(e, "filename", None) else ""
        say(f"error: cannot write{where}: {os.strerror(code)}")
        return 2


@contextlib.contextmanager
def _file_size_limit_as_error():
    """Under a file-size limit (``ulimit -f``) a write past it would kill the process with SIGXFSZ, mid-save and
    without a word; ignored, the write fails with EFBIG instead, and the save reports it and cleans up.  The
    python command ignores it already; an interpreter embedded without Python's signal handlers may not."""
    import signal

    sig = getattr(signal, "SIGXFSZ", None)
    try:
        previous = signal.signal(sig, signal.SIG_IGN) if sig is not None else None
    except ValueError:  # not the main thread: signals stay as they are
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(sig, previous)


def console_main() -> None:
    code = main()
    # the run's reference cycles (a DDP reducer and its gloo work among them) are freed now, while the interpreter
    # is whole: freed during its finalization, gloo's work can abort the process (pytorch/pytorch#179291)
    gc.collect()
    raise SystemExit(code)
