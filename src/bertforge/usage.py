"""The command line's top level, which needs no torch: ``bertforge --help`` (and ``bertforge`` alone, and
``--version``) answer from here at once, where building every command's flags imports torch and the models
(:func:`bertforge.cli.build_parser`, which starts from the same parser and the same lines)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

DESCRIPTION = "Pretrain BERT from scratch and fine-tune it."
# each command's line of `bertforge --help`, in its order (the commands add their flags in bertforge.cli)
COMMANDS = {
    "tokenizer": "train a WordPiece or word-level vocabulary",
    "prepare": "tokenize a corpus once into shards that pretraining runs reuse",
    "pretrain": "pretrain an encoder: masked LM (+ next sentence prediction), or ELECTRA",
    "finetune": "fine-tune a model for a task (bertforge finetune --help lists them)",
    "evaluate": "score predictions or a saved model",
    "predict": "use a trained model (bertforge predict --help lists what for)",
    "export": "export a model folder for serving: ONNX, fp32 and int8",
    "demo": "the whole pipeline end to end on the built-in corpus, in minutes",
    "bench": "pretraining, inference or fine-tuning speed against transformers, side by side",
}


class Parser(argparse.ArgumentParser):
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


def top_parser() -> tuple[Parser, argparse._SubParsersAction]:
    """(the ``bertforge`` parser with its own flags, the action its commands are added to)."""
    from . import __version__

    p = Parser(prog="bertforge", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"bertforge {__version__}")
    p.add_argument("--quiet", action="store_true", help="only warnings and errors on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    return p, sub


def answers(argv: Sequence[str]) -> bool:
    """Whether the top level alone answers ``argv``: no command, only ``--help`` or ``--version``."""
    return len(argv) <= 1 and all(a in ("-h", "--help", "--version") for a in argv)


def parser() -> Parser:
    """The top level with one line per command (:data:`COMMANDS`) and none of their flags."""
    p, sub = top_parser()
    for name, line in COMMANDS.items():
        sub.add_parser(name, help=line)
    return p


def main(argv: Sequence[str]) -> int:
    """``bertforge [--help | --version]``: argparse answers (help, version, or the missing command's error)."""
    try:
        parser().parse_args(list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 0
    return 0
