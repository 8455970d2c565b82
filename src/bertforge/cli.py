"""The ``bertforge`` command line: a thin layer of argparse over the Python API.

``main(argv) -> int`` is what the console script and the tests call.  Bad input ends with one line
``error: ...`` on stderr and exit status 2; a run that cannot go on (a non-finite loss) with exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from .errors import UserError

log = logging.getLogger("bertforge")


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``error:`` line and exit status 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


class _TqdmHandler(logging.Handler):
    """Log lines that do not break a progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # logging must never raise
            self.handleError(record)


def setup_logging(quiet: bool = False) -> None:
    for h in list(log.handlers):
        if isinstance(h, _TqdmHandler):
            log.removeHandler(h)
    h = _TqdmHandler()
    h.setFormatter(logging.Formatter("%(message)s"))
    h.setLevel(logging.WARNING if quiet else logging.INFO)
    log.addHandler(h)
    log.setLevel(logging.INFO)  # a run's train.log gets everything, whatever stderr shows
    log.propagate = False


# ------------------------------------------------------------------------------------------------ tokenizer
def _add_corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-field", help="JSONL/parquet field holding the text (default: text)")
    p.add_argument("--doc-separator", choices=["file", "blank-line"],
                   help="txt files: one document per file (default), or one sentence per line with blank lines between documents")


def cmd_tokenizer_train(a: argparse.Namespace) -> int:
    from .corpus import iter_texts
    from .tokenizer import save_tokenizer, train_tokenizer

    tok = train_tokenizer(
        iter_texts(a.input, a.text_field or "text", a.doc_separator or "file"),
        a.vocab_size, kind=a.model, lowercase=not a.cased, min_frequency=a.min_frequency, show_progress=sys.stderr.isatty(),
    )
    from .checkpoint import atomic_dir

    with atomic_dir(a.out) as tmp:
        save_tokenizer(tok, tmp)
    log.info("wrote a %s vocabulary of %d tokens to %s", a.model, tok.get_vocab_size(), a.out)
    return 0


# ------------------------------------------------------------------------------------------------ pretrain
# flag -> (dest in the flat config, type); every flag defaults to None so that only explicit flags override
_PRETRAIN_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--data", "data", "paths", "training corpus: .txt/.jsonl/.gz/.parquet files, directories, globs, hf:NAME"),
    ("--eval-data", "eval_data", "paths", "held-out corpus (default: documents held out of --data)"),
    ("--preset", "preset", str, "model size: tiny, mini, small, medium, base (default mini)"),
    ("--model-config", "model_config", str, "a BERT config.json to build the model from"),
    ("--init", "init", str, "continue from a BERT directory (ours or a transformers checkpoint)"),
    ("--tokenizer", "tokenizer", str, "tokenizer or model directory, or vocab.txt (default: train one on --data)"),
    ("--vocab-size", "vocab_size", int, "vocabulary size of a tokenizer trained on --data (default 30522)"),
    ("--tokenizer-model", "tokenizer_model", str, "wordpiece (default) or wordlevel, for a trained tokenizer"),
    ("--max-seq-length", "max_seq_length", int, "tokens per sequence (default 128)"),
    ("--mask-prob", "mask_prob", float, "fraction of tokens masked (default 0.15)"),
    ("--short-seq-prob", "short_seq_prob", float, "probability of a shorter target length (default 0.1)"),
    ("--batch-size", "batch_size", int, "global batch size in sequences (default 32)"),
    ("--grad-accum", "grad_accum", int, "gradient accumulation steps (default 1)"),
    ("--lr", "lr", float, "peak learning rate (default 1e-4)"),
    ("--warmup-steps", "warmup_steps", int, "warmup steps"),
    ("--warmup-ratio", "warmup_ratio", float, "warmup as a fraction of the run (default 0.06)"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay (default 0.01)"),
    ("--max-grad-norm", "max_grad_norm", float, "gradient clipping norm (default 1.0)"),
    ("--dropout", "dropout", float, "hidden and attention dropout (default: the model's, 0.1)"),
    ("--max-steps", "max_steps", int, "optimizer steps"),
    ("--max-time", "max_time", "duration", "time budget, e.g. 90s, 30m, 2h: the schedule ends on time"),
    ("--eval-every", "eval_every", int, "evaluate every N steps (default 500; 0 = only at the end)"),
    ("--save-every", "save_every", int, "checkpoint every N steps (default 1000; 0 = only at the end)"),
    ("--keep-checkpoints", "keep_checkpoints", int, "how many checkpoints to keep (default 2)"),
    ("--log-every", "log_every", int, "log training metrics every N steps (default 10)"),
    ("--max-eval-instances", "max_eval_instances", int, "held-out sequences per evaluation (default 2048)"),
    ("--seed", "seed", int, "random seed (default 0)"),
    ("--device", "device", str, "auto (default), cpu, cuda, cuda:N"),
    ("--precision", "precision", str, "auto (bf16 autocast on CUDA, fp32 on CPU), fp32, bf16"),
    ("--threads", "threads", int, "CPU threads (default: all cores, shared among local processes)"),
    ("--cache-dir", "cache_dir", str, "where tokenized corpora are cached (default ~/.cache/bertforge)"),
]


def _add_pretrain_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="output directory (a Hugging Face BERT directory, with metrics and checkpoints)")
    p.add_argument("--config", help="YAML or JSON file with the same settings as the flags (flags override it)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    for flag, dest, typ, help_ in _PRETRAIN_FLAGS:
        if typ == "paths":
            p.add_argument(flag, dest=dest, nargs="+", metavar="PATH", help=help_)
        elif typ == "duration":
            p.add_argument(flag, dest=dest, metavar="DURATION", help=help_)
        else:
            p.add_argument(flag, dest=dest, type=typ, help=help_)
    _add_corpus_args(p)
    p.add_argument("--nsp", dest="nsp", action=argparse.BooleanOptionalAction, default=None,
                   help="next sentence prediction (default on; --no-nsp trains MLM only)")
    p.add_argument("--whole-word-mask", dest="whole_word_mask", action=argparse.BooleanOptionalAction, default=None,
                   help="mask whole words (all WordPiece pieces of a word together)")
    p.add_argument("--cased", dest="cased", action="store_true", default=None, help="a cased vocabulary (trained tokenizer)")
    p.add_argument("--compile", dest="compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the model")
    p.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=None, help="show a progress bar")


def pretrain_config_from_args(a: argparse.Namespace):
    """defaults <- saved config (on --resume) <- --config file <- explicit flags."""
    from .config import PretrainConfig, parse_duration, read_config_file
    from .pretrain import CONFIG_FILE

    cfg = PretrainConfig()
    if a.resume and a.out and os.path.isfile(os.path.join(a.out, CONFIG_FILE)):
        import json

        with open(os.path.join(a.out, CONFIG_FILE), encoding="utf-8") as f:
            cfg = PretrainConfig.from_dict(json.load(f))
    if a.config:
        flat = read_config_file(a.config)
        if "max_time" in flat or "max-time" in flat:
            key = "max_time" if "max_time" in flat else "max-time"
            flat[key] = parse_duration(flat[key])
        if "cased" in flat:
            flat["lowercase"] = not flat.pop("cased")
        cfg.update_flat(flat, where=f"config file {a.config}")
    explicit = {dest: getattr(a, dest) for _, dest, _, _ in _PRETRAIN_FLAGS if getattr(a, dest) is not None}
    for dest in ("nsp", "whole_word_mask", "compile", "progress", "text_field", "doc_separator"):
        if getattr(a, dest) is not None:
            explicit[dest] = getattr(a, dest)
    if a.cased:
        explicit["lowercase"] = False
    if "max_time" in explicit:
        explicit["max_time"] = parse_duration(explicit["max_time"])
    if a.out:
        explicit["out"] = a.out
    cfg.update_flat(explicit, where="flags")
    if cfg.train.eval_every == 0:
        cfg.train.eval_every = None
    if cfg.train.save_every == 0:
        cfg.train.save_every = None
    if cfg.impl.progress and not sys.stderr.isatty() and a.progress is None:
        cfg.impl.progress = False
    return cfg


def cmd_pretrain(a: argparse.Namespace) -> int:
    from .pretrain import run_pretraining

    cfg = pretrain_config_from_args(a)
    metrics = run_pretraining(cfg, resume=a.resume)
    if metrics:
        import json

        print(json.dumps({k: metrics[k] for k in ("mlm_accuracy", "nsp_accuracy", "mlm_loss", "nsp_loss", "steps",
                                                   "tokens_per_second") if k in metrics}))
    return 0


# ------------------------------------------------------------------------------------------------ finetune
def _add_finetune_common(p: argparse.ArgumentParser, max_len: int, lr: float, epochs: int, batch: int) -> None:
    p.add_argument("--model", required=True, help="a BERT directory: pretrained by bertforge, or a transformers checkpoint")
    p.add_argument("--train", required=True, help="training file")
    p.add_argument("--validation", required=True, help="validation file (evaluated after every epoch)")
    p.add_argument("--out", required=True, help="output directory (the fine-tuned model, metrics, predictions, plots)")
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--batch-size", type=int, default=batch)
    p.add_argument("--eval-batch-size", type=int, default=64)
    p.add_argument("--max-seq-length", type=int, default=max_len)
    p.add_argument("--warmup-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-train-examples", type=int, help="use only the first N training examples")
    p.add_argument("--freeze-embeddings", action="store_true",
                   help="keep the word embeddings as pretrained (helps when the labels cover few of the words)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def _finetune_config(a: argparse.Namespace):
    from .config import FinetuneConfig

    if os.path.exists(a.out):
        raise UserError(f"--out {a.out} already exists; choose a new directory")
    progress = a.progress if a.progress is not None else sys.stderr.isatty()
    return FinetuneConfig(
        model=a.model, train=a.train, validation=a.validation, out=a.out, epochs=a.epochs, lr=a.lr,
        batch_size=a.batch_size, eval_batch_size=a.eval_batch_size, max_seq_length=a.max_seq_length,
        warmup_ratio=a.warmup_ratio, weight_decay=a.weight_decay, max_train_examples=a.max_train_examples,
        seed=a.seed, device=a.device, precision=a.precision, progress=progress, freeze_embeddings=a.freeze_embeddings,
    )


def _print_json(d: dict) -> None:
    import json

    print(json.dumps(d))


def cmd_finetune_classify(a: argparse.Namespace) -> int:
    from .config import ClassifyConfig
    from .tasks.classify import run_classification

    m = run_classification(_finetune_config(a), ClassifyConfig(a.text_column, a.text_pair_column, a.label_column))
    _print_json({k: m[k] for k in ("accuracy", "macro_f1", "loss", "best_epoch", "train_seconds")})
    return 0


def cmd_finetune_squad(a: argparse.Namespace) -> int:
    from .config import SquadConfig
    from .tasks.squad import run_squad

    m = run_squad(_finetune_config(a), SquadConfig(a.doc_stride, a.max_query_length, a.n_best, a.max_answer_length))
    _print_json({k: m[k] for k in ("exact_match", "f1", "precision", "recall", "best_epoch", "train_seconds")})
    return 0


def _add_classify_columns(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text-column", help="default: sentence, text or sentence1, whichever exists")
    p.add_argument("--text-pair-column", help="second sentence of a pair (e.g. sentence2)")
    p.add_argument("--label-column", default="label")


def _add_squad_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--doc-stride", type=int, default=128, help="tokens shared by consecutive windows of a long context")
    p.add_argument("--max-query-length", type=int, default=64)
    p.add_argument("--n-best", type=int, default=20)
    p.add_argument("--max-answer-length", type=int, default=30)


def _add_finetune_parsers(sub) -> None:
    ft = sub.add_parser("finetune", help="fine-tune a BERT for classification or SQuAD question answering")
    fts = ft.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    fts.required = True
    c = fts.add_parser("classify", help="sentence or sentence-pair classification (TSV, CSV, JSONL)")
    _add_finetune_common(c, max_len=128, lr=5e-5, epochs=3, batch=32)
    _add_classify_columns(c)
    c.set_defaults(func=cmd_finetune_classify)
    q = fts.add_parser("squad", help="SQuAD v1.1 extractive question answering")
    _add_finetune_common(q, max_len=384, lr=5e-5, epochs=2, batch=16)
    _add_squad_args(q)
    q.set_defaults(func=cmd_finetune_squad)


# ------------------------------------------------------------------------------------------------ evaluate
def cmd_evaluate_squad(a: argparse.Namespace) -> int:
    from .config import SquadConfig
    from .tasks import squad

    if a.predictions and a.model:
        raise UserError("give --predictions or --model, not both")
    if a.predictions:
        res = squad.evaluate_predictions_file(a.data, a.predictions)
    elif a.model:
        res = squad.evaluate_squad_model(a.model, a.data, SquadConfig(a.doc_stride, a.max_query_length, a.n_best, a.max_answer_length),
                                         a.max_seq_length, a.batch_size, a.device, a.write_predictions)
    else:
        raise UserError("give --predictions FILE or --model DIR")
    _print_json(res)
    return 0


def cmd_evaluate_classify(a: argparse.Namespace) -> int:
    from .config import ClassifyConfig
    from .tasks.classify import evaluate_classifier

    res = evaluate_classifier(a.model, a.data, ClassifyConfig(a.text_column, a.text_pair_column, a.label_column),
                              a.max_seq_length, a.batch_size, a.device)
    _print_json(res)
    return 0


def _add_evaluate_parsers(sub) -> None:
    ev = sub.add_parser("evaluate", help="score predictions or a saved model")
    evs = ev.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    evs.required = True
    q = evs.add_parser("squad", help="official SQuAD v1.1 exact match and F1")
    q.add_argument("--data", required=True, help="SQuAD v1.1 JSON with reference answers")
    q.add_argument("--predictions", help="predictions JSON {question id: answer}")
    q.add_argument("--model", help="a fine-tuned question-answering model directory")
    q.add_argument("--write-predictions", help="with --model: also write its predictions to this file")
    q.add_argument("--max-seq-length", type=int, default=384)
    q.add_argument("--batch-size", type=int, default=64)
    q.add_argument("--device", default="auto")
    _add_squad_args(q)
    q.set_defaults(func=cmd_evaluate_squad)
    c = evs.add_parser("classify", help="accuracy and macro-F1 of a classifier on a labelled file")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--max-seq-length", type=int, default=128)
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--device", default="auto")
    _add_classify_columns(c)
    c.set_defaults(func=cmd_evaluate_classify)


# ------------------------------------------------------------------------------------------------ predict
def _read_lines(path: str) -> list[str]:
    from .textio import read_text

    lines = [line for line in read_text(path, "input file").splitlines() if line.strip()]
    if not lines:
        raise UserError(f"{path} has no lines")
    return lines


def _texts(a: argparse.Namespace) -> list[str]:
    if a.input and a.text:
        raise UserError("give texts or --input, not both")
    if a.input:
        if a.input.endswith((".tsv", ".csv", ".jsonl", ".json")):
            from .config import ClassifyConfig
            from .tasks.classify import read_table, resolve_columns

            rows = read_table(a.input)
            col, _, _ = resolve_columns(rows, ClassifyConfig(text_column=getattr(a, "text_column", None)), a.input, need_label=False)
            return [r[col] for r in rows]
        return _read_lines(a.input)
    if not a.text:
        raise UserError("give at least one text, or --input FILE")
    return a.text


def _emit(a: argparse.Namespace, results: Any, table) -> None:
    import json

    if a.json:
        print(json.dumps(results, ensure_ascii=False))
    else:
        for line in table(results):
            print(line)


def cmd_predict(a: argparse.Namespace) -> int:
    from .predict import pipeline

    progress = sys.stderr.isatty()
    p = pipeline(a.task, a.model, device=a.device, batch_size=a.batch_size, progress=progress)
    if a.task == "fill-mask":
        texts = _texts(a)
        res = p(texts, top_k=a.top_k)

        def table(rows):
            for t, masks in zip(texts, rows):
                yield t
                for k, cands in enumerate(masks):
                    yield f"  [MASK] {k + 1}: " + "  ".join(f"{c['token']} {c['score']:.3f}" for c in cands)

        _emit(a, [{"text": t, "masks": m} for t, m in zip(texts, res)] if a.json else res, table)
    elif a.task == "next-sentence":
        res = p(a.first, a.second)
        _emit(a, res, lambda r: [f"{r['label']}  P(IsNext) = {r['is_next']:.3f}"])
    elif a.task == "classify":
        texts = _texts(a)
        res = p(texts)

        def table(rows):
            for t, r in zip(texts, rows):
                yield f"{r['label']:>12}  {r['score']:.3f}  {t}"

        _emit(a, [{"text": t, **r} for t, r in zip(texts, res)] if a.json else res, table)
    else:
        from .config import SquadConfig

        cfg = SquadConfig(a.doc_stride, a.max_query_length, a.n_best, a.max_answer_length)
        if a.input:
            if a.question or a.context:
                raise UserError("give --question/--context or --input, not both")
            from .tasks.squad import read_examples

            examples, _ = read_examples(a.input)
            res = p(examples=examples, squad=cfg, max_seq_length=a.max_seq_length)
            _emit(a, res, lambda r: [f"{k}\t{v}" for k, v in r.items()])
        else:
            if not (a.question and a.context):
                raise UserError("give --question and --context, or --input squad.json")
            res = p(a.question, a.context, squad=cfg, max_seq_length=a.max_seq_length)
            _emit(a, res, lambda r: [f"{r['answer']}  (score {r['score']:.2f}, characters {r['start']}-{r['end']})"])
    return 0


def _add_predict_parsers(sub) -> None:
    pr = sub.add_parser("predict", help="use a trained model: fill-mask, next-sentence, classify, qa")
    prs = pr.add_subparsers(dest="task", metavar="TASK", parser_class=_Parser)
    prs.required = True

    def common(p):
        p.add_argument("--model", required=True, help="a BERT model directory")
        p.add_argument("--json", action="store_true", help="JSON on stdout instead of a table")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--device", default="auto")
        p.set_defaults(func=cmd_predict)

    fm = prs.add_parser("fill-mask", help="fill each [MASK] with the top-k tokens")
    common(fm)
    fm.add_argument("--top-k", type=int, default=5)
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
    c.add_argument("text", nargs="*")
    q = prs.add_parser("qa", help="extractive question answering")
    common(q)
    q.add_argument("--question")
    q.add_argument("--context")
    q.add_argument("--input", help="a SQuAD v1.1 JSON file: predictions {id: answer}")
    q.add_argument("--max-seq-length", type=int, default=384)
    _add_squad_args(q)


# ------------------------------------------------------------------------------------------------ parser
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bertforge", description="Pretrain BERT from scratch and fine-tune it.")
    p.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    tk = sub.add_parser("tokenizer", help="train a WordPiece or word-level vocabulary")
    tks = tk.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    tks.required = True
    tt = tks.add_parser("train", help="train a vocabulary on a corpus")
    tt.add_argument("--input", nargs="+", required=True, metavar="PATH")
    tt.add_argument("--vocab-size", type=int, required=True)
    tt.add_argument("--out", required=True)
    tt.add_argument("--cased", action="store_true", help="keep case (default: lower-case, as bert-base-uncased)")
    tt.add_argument("--model", choices=["wordpiece", "wordlevel"], default="wordpiece")
    tt.add_argument("--min-frequency", type=int, default=2)
    _add_corpus_args(tt)
    tt.set_defaults(func=cmd_tokenizer_train)

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
    dm.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    dm.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="pretraining and inference speed against transformers, side by side")
    b.add_argument("--preset", default="mini")
    b.add_argument("--batch-size", type=int, default=32)
    b.add_argument("--seq-len", type=int, default=128)
    b.add_argument("--steps", type=int, default=3, help="training steps per timed round")
    b.add_argument("--rounds", type=int, default=7, help="alternating rounds (the median is reported)")
    b.add_argument("--vocab-size", type=int, default=30522)
    b.add_argument("--device", default="auto")
    b.add_argument("--threads", type=int)
    b.add_argument("--data-dir", default=os.environ.get("BERTFORGE_DATA"), help="for SST-2 sentences (inference)")
    b.add_argument("--no-inference", dest="inference", action="store_false")
    b.set_defaults(func=cmd_bench)
    return p


def cmd_demo(a: argparse.Namespace) -> int:
    from .demo import run_demo, summary_lines

    progress = a.progress if a.progress is not None else sys.stderr.isatty()
    summary = run_demo(a.out, quick=a.quick, wordpiece=a.wordpiece, progress=progress)
    for line in summary_lines(summary, a.out):
        print(line)
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from .bench import run_bench

    run_bench(a.preset, a.batch_size, a.seq_len, a.steps, a.rounds, a.vocab_size, a.device, a.data_dir, a.inference,
              a.threads, out=lambda line: print(line, flush=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from .engine import TrainingError

    parser = build_parser()
    try:
        a = parser.parse_args(argv)
    except SystemExit as e:  # --help, or a usage error already printed
        return int(e.code or 0)
    setup_logging(a.quiet)
    try:
        return int(a.func(a) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def console_main() -> None:
    raise SystemExit(main())
