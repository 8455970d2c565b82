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


from .commands import (NOT_THE_SAME, add_setting_flags, emit, explicit_flags, non_negative_int, one_line, positive_int,
                       shown, task_settings)
from .config import progress_shown
from .errors import TrainingError, UserError
from .logs import setup_logging
from .usage import COMMANDS
from .usage import Parser as _Parser
from .usage import top_parser

log = logging.getLogger("bertforge")


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

    pp = sub.add_parser("prepare", help=COMMANDS["prepare"])
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


def cmd_finetune(a: argparse.Namespace) -> int:
    """The settings as :func:`bertforge.settings.finetune_settings` decides them, from the explicit flags."""
    from .api import run_finetuning
    from .tasks import TASKS

    flags = explicit_flags(a, a.setting_flags)
    given = [flags.pop(k, None) or "" for k in ("model", "train_file", "validation_file", "out")]
    m = run_finetuning(a.task, *given, overwrite=a.overwrite, resume=a.resume, config=a.config, **flags,
                       **explicit_flags(a, a.task_flags))
    if not m:  # a process other than rank 0 under torchrun: rank 0 reports
        return 0
    printed = (*TASKS[a.task].printed, "best_epoch", "epoch", "step", "train_seconds")
    print(json.dumps({k: m[k] for k in printed if k in m}))  # (without validation: no figures of it)
    return 0


def _add_finetune_parsers(sub) -> None:
    from .config import finetune_lr_rule
    from .tasks.base import finetune_batch_rule, finetune_epochs_rule
    from .train.lifecycle import SAVE_INTERVAL
    from .tasks import TASKS

    ft = sub.add_parser("finetune", help=COMMANDS["finetune"])
    fts = ft.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    fts.required = True
    for name, kind in TASKS.items():
        p = fts.add_parser(name, help=kind.help)
        cfg = kind.config()
        by_data = {"batch_size": finetune_batch_rule(kind.batch, kind.min_updates) if cfg.train.batch_size is None
                   else None, "epochs": finetune_epochs_rule(kind.min_updates) if cfg.train.epochs is None else None}
        flags = add_setting_flags(p, cfg, notes=kind.flag_notes, defaults={"save_every": (
            f"every {SAVE_INTERVAL // 60} minutes of the run"), **{k: v for k, v in by_data.items() if v},
            **({"lr": finetune_lr_rule()} if cfg.train.lr is None else {}),
            **({"max_seq_length": kind.length_rule} if cfg.data.max_seq_length is None else {})})
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
    """``evaluate TASK``: the JSON of the task's API function ``a.api``, called with the flags named as its parameters
    (those not given take its defaults) and the task's settings, checked before anything is read."""
    import inspect

    from .evaluation import inference_progress
    from .runtime import inference_backend

    fn = a.api
    params = {k for k, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_KEYWORD}
    kw = {k: v for k, v in vars(a).items() if k in params and v is not None}
    if a.settings_kind is not None:  # checked whole; those given passed on (the others: the model's own, or defaults)
        task_settings(a, a.settings_kind)
        kw.update(explicit_flags(a, [f.name for f in dataclasses.fields(a.settings_kind)]))
    with inference_backend(a.backend), inference_progress():
        print(json.dumps(fn(**kw)))
    return 0


def _add_evaluate_parsers(sub) -> None:
    from .api import evaluate_mlm
    from .config import PretrainDataConfig
    from .runtime import add_backend_flag
    from .tasks import TASKS

    ev = sub.add_parser("evaluate", help=COMMANDS["evaluate"])
    evs = ev.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    evs.required = True
    for kind in TASKS.values():
        p = evs.add_parser(kind.evaluate_name, help=kind.evaluate_help)
        kind.evaluate_arguments(p)
        add_backend_flag(p)
        p.set_defaults(func=cmd_evaluate, api=kind.evaluation(), settings_kind=kind.evaluate_settings)
    m = evs.add_parser("mlm", help="held-out masked-LM accuracy on a fixed protocol (any model with an MLM head)")
    m.add_argument("--model", required=True, help="a BERT directory with a masked-LM head, ours or transformers'")
    m.add_argument("--data", required=True, nargs="+", metavar="PATH", help="held-out text: .txt/.jsonl/.gz files")
    m.add_argument("--max-seq-length", type=positive_int, default=128)
    m.add_argument("--seed", type=non_negative_int, default=0, help="seed of the masked positions")
    m.add_argument("--batch-size", type=positive_int, default=32)
    m.add_argument("--max-blocks", type=positive_int, help="evaluate only the first N blocks")
    m.add_argument("--device", default="auto")
    add_backend_flag(m)
    add_setting_flags(m, PretrainDataConfig(), only=("text_field", "doc_separator"))
    m.set_defaults(func=cmd_evaluate, api=evaluate_mlm, settings_kind=None)


# ------------------------------------------------------------------------------------------------ predict
def cmd_predict(a: argparse.Namespace) -> int:
    """``predict TASK``: a fine-tuning task's own rows, or a pretraining head's (fill-mask, next-sentence)."""
    from .evaluation import inference_progress
    from .runtime import inference_backend

    with inference_backend(a.backend), inference_progress():
        return _predict(a)


def _predict(a: argparse.Namespace) -> int:
    from .predict import pipeline
    from .tasks import TASKS
    from .tasks.classify import input_texts

    kind = next((t for t in TASKS.values() if t.predict_name == a.task), None)
    if kind is not None:
        kind.predict(a)
        return 0
    p = pipeline(a.task, a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None))
    if a.task == "fill-mask":
        texts = input_texts(a, blank_lines=False)  # (each result carries its text: a blank line has no [MASK])
        res = p.per_mask(texts, top_k=a.top_k)  # one list per [MASK], whatever their number

        def table(rows):
            for t, masks in zip(texts, rows):
                yield one_line(t)
                for k, cands in enumerate(masks):
                    yield f"  [MASK] {k + 1}: " + "  ".join(f"{c['token_str']} {c['score']:.3f}" for c in cands)

        emit(a, [{"text": t, "masks": m} for t, m in zip(texts, res)] if a.json else res, table)
    elif a.task == "next-sentence":
        res = p(a.first, a.second)
        emit(a, res, lambda r: [f"{r['label']}  P(IsNext) = {r['is_next']:.3f}"])
    return 0


def _add_predict_parsers(sub) -> None:
    from .runtime import add_backend_flag
    from .tasks import TASKS

    pr = sub.add_parser("predict", help=COMMANDS["predict"])
    prs = pr.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    prs.required = True

    def common(p):
        p.add_argument("--model", required=True, help="a BERT model directory")
        p.add_argument("--json", action="store_true", help="JSON on stdout instead of a table")
        p.add_argument("--batch-size", type=positive_int, default=32)
        p.add_argument("--device", default="auto")
        add_backend_flag(p)
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
    for kind in TASKS.values():
        if kind.predict_name:
            p = prs.add_parser(kind.predict_name, help=kind.predict_help)
            common(p)
            kind.predict_arguments(p)


# ------------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    from .bench import add_bench_parser
    from .config import TOKENIZER_MODELS, PretrainDataConfig
    from .export import add_export_parser

    p, sub = top_parser()

    tk = sub.add_parser("tokenizer", help=COMMANDS["tokenizer"])
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

    pt = sub.add_parser("pretrain", help=COMMANDS["pretrain"])
    _add_pretrain_args(pt)
    pt.set_defaults(func=cmd_pretrain)

    _add_finetune_parsers(sub)
    _add_evaluate_parsers(sub)

    _add_predict_parsers(sub)
    add_export_parser(sub)

    dm = sub.add_parser("demo", help=COMMANDS["demo"])
    dm.add_argument("--out", default="demo-output", help="output directory (default demo-output)")
    dm.add_argument("--quick", action="store_true", help="a shorter run (under a minute on two cores)")
    dm.add_argument("--wordpiece", action="store_true", help="a WordPiece vocabulary instead of whole words")
    dm.add_argument("--seed", type=non_negative_int, default=0,
                    help="the stories, the initialisation and the data order (default 0)")
    dm.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    dm.set_defaults(func=cmd_demo)

    add_bench_parser(sub)
    return p


def cmd_demo(a: argparse.Namespace) -> int:
    from .demo.run import run_demo, summary_lines

    summary = run_demo(a.out, quick=a.quick, wordpiece=a.wordpiece, progress=progress_shown(a.progress), seed=a.seed)
    for text in summary_lines(summary, a.out):
        print(text)
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


# the arguments that hold texts to predict on (predict's), as opposed to paths and settings
TEXTS = ("text", "first", "second", "question", "context", "query", "passage")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        a, extra = parser.parse_known_args(argv)
        if extra:
            print(f"error: {_unknown(extra, a)}", file=sys.stderr)
            return 2
    except SystemExit as e:  # --help, --version, or a usage error already printed
        return int(e.code or 0)
    except BrokenPipeError:
        return _reader_gone()
    # under torchrun every process meets the same inputs and the same errors: one of them says so per machine
    replica = os.environ.get("LOCAL_RANK", "0") != "0"
    setup_logging(a.quiet, replica)
    say = (lambda text: None) if replica else (lambda text: print(text, file=sys.stderr))
    from . import modelcard
    from .atomic import path_shown, write_failure

    modelcard.COMMAND = modelcard.command_line(list(sys.argv[1:] if argv is None else argv))  # for the model cards
    from .files import command_line_text

    for name in TEXTS:  # (texts only: a path's bytes name its file as they are)
        if isinstance(getattr(a, name, None), (str, list)):
            setattr(a, name, command_line_text(getattr(a, name), name))
    from .train.lifecycle import sigterm_as_interrupt

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
    except BrokenPipeError:  # `bertforge predict ... --json | head`: the reader has what it wanted
        return _reader_gone()
    except Exception as e:  # a failed write that no save named (each names its output itself)
        code = write_failure(e)
        if code is None:
            raise
        where = f" {path_shown(e.filename)}" if getattr(e, "filename", None) else ""
        say(f"error: cannot write{where}: {os.strerror(code)}")
        return 2


def _reader_gone() -> int:
    """Stdout's reader closed the pipe: end quietly as Unix tools do (128 + SIGPIPE, what a shell reports for one
    that a pipe's end stopped), with stdout pointed at nothing so that the interpreter's last flush fails no more."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


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
