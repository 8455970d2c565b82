"""What the commands' parsers share: a flag for each setting of a dataclass (its help and default from the field,
transformers' names as aliases), integer types, and how a command prints its results (a table, or ``--json``).
Each task's own rows (:mod:`bertforge.tasks`) and the command line (:mod:`bertforge.cli`) are built of these."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from .config import Sections, flag_of, taken_by, validate_fields


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
        # (a string under `from __future__ import annotations`, else the type itself: a plug-in's settings)
        typ = (f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))).replace(" | None", "")
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


def task_settings(a: argparse.Namespace, kind: type):
    """The task's settings dataclass from its flags (see :func:`add_setting_flags`), checked."""
    settings = kind(**explicit_flags(a, [f.name for f in dataclasses.fields(kind)]))
    validate_fields(settings)
    return settings


def one_line(text: str, width: int = 100) -> str:
    """A text as a table shows it: one line, shortened (a review of several paragraphs is one row; --json has it
    whole)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def emit(a: argparse.Namespace, results: Any, table) -> None:
    if a.json:
        print(json.dumps(results, ensure_ascii=False))
    else:
        for line in table(results):
            print(line)


def text_input_flags(p: argparse.ArgumentParser, more: str = "") -> None:
    """``--input`` and ``--text-column`` of a ``predict`` command that reads texts (``more``: other files it reads)."""
    p.add_argument("--input", help=f"a .txt file (one text per line) or a .tsv/.csv/.jsonl file{more}")
    p.add_argument("--text-column")
