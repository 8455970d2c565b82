"""Configuration, split by concern as in cramming: the architecture (:class:`BertConfig`), and for each
command its data, training and implementation settings (dataclasses below).  Every one of them is plain
data, saved as JSON inside each checkpoint and model directory, and read back with ``from_dict``.

``BertConfig`` uses transformers' field names and writes a ``config.json`` that
``transformers.BertConfig`` reads, so that model directories interchange both ways.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError, require_type, shown, type_parts
from .models import FAMILIES, check_preset, family
from .models.registry import families_said, presets_said, pretraining_dropouts_said

TOKENIZER_MODELS = ("wordpiece", "wordlevel")
OBJECTIVES = ("mlm", "electra")
DOC_SEPARATORS = ("file", "blank-line", "line")


def dataclass_from_dict(base: Any, d: dict[str, Any], where: str = "config") -> Any:
    """A copy of dataclass instance ``base`` with the fields ``d`` gives (the others keep ``base``'s values);
    an unknown key is a UserError naming it."""
    names = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise UserError(f"unknown key(s) in {where}: {', '.join(unknown)}")
    return dataclasses.replace(base, **d)


def setting(default: Any = None, help: str = "", factory=None, flag: bool | str = True,  # noqa: A002
            choices: tuple[str, ...] | None = None, check: str | None = None, only: str | None = None,
            by_content: bool = False) -> Any:
    """A configuration field with its help text, from which the command line's flag and help are made
    (each default is written once, in its field; ``flag=False`` keeps it out of the command line, a string names
    its flag).  ``check`` names the range its value must lie in (see :data:`CHECKS`), enforced by
    :func:`validate_fields`.  ``only`` names the one command that takes it, in a section that several share
    (the others keep its default).  ``by_content``: a path that ``--resume`` compares by what it names (a file's
    bytes, a model folder's files), as it compares every setting named ``*_file``."""
    meta = {"help": help, "flag": flag, "choices": choices, "check": check, "only": only, "by_content": by_content}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def by_content(f: dataclasses.Field) -> bool:
    """Whether ``--resume`` compares setting ``f`` by what it names: every ``*_file``, and those marked so."""
    return f.name.endswith("_file") or bool(f.metadata.get("by_content"))


# name -> (test, description) of the ranges a numeric setting may be restricted to
CHECKS: dict[str, tuple[Any, str]] = {
    "positive": (lambda v: v > 0, "positive"),
    "non-negative": (lambda v: v >= 0, "zero or more"),
    "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "open-fraction": (lambda v: 0 < v < 1, "in (0, 1)"),
    "probability": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def taken_by(f: dataclasses.Field, command: str) -> bool:
    """Whether ``command`` takes setting ``f`` (as a flag, or a config file's key)."""
    return f.metadata.get("only") in (None, command)


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of a setting."""
    named = f.metadata.get("flag")
    return named if isinstance(named, str) else "--" + f.name.replace("_", "-")


def validate_fields(obj: Any) -> None:
    """Type and range of every field of dataclass ``obj`` (values from flags, config files or Python), each error
    naming the flag; the types are checked by :func:`~bertforge.errors.require_type`, as the API's arguments."""
    import typing

    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v, hint, flag = getattr(obj, f.name), hints[f.name], flag_of(f)
        if isinstance(v, float) and v.is_integer() and int in type_parts(hint) and float not in type_parts(hint):
            v = int(v)  # a config file's 2.0: the 2 that the code after takes
            setattr(obj, f.name, v)
        require_type(v, hint, flag)
        if isinstance(v, float) and not math.isfinite(v):
            raise UserError(f"{flag} must be a finite number, not {shown(v)}")
        check, choices = f.metadata.get("check"), f.metadata.get("choices")
        if check and v is not None and not CHECKS[check][0](v):
            raise UserError(f"{flag} must be {CHECKS[check][1]}, not {shown(v)}")
        if choices and v is not None and v not in choices:  # (None: where the type allows it, the default)
            raise UserError(f"{flag} must be one of {', '.join(choices)}, not {shown(v)}")


# ================================================================================================ shared
@dataclass
class TrainConfig:
    """Optimisation and the training loop; shared by pretraining and fine-tuning (whose defaults differ:
    :data:`FINETUNE_TRAIN_DEFAULTS` and each task's own)."""

    batch_size: int | None = setting(32, "global batch size in sequences (all processes and accumulation steps)",
                                     check="positive")  # (None: fine-tuning's by the data, finetune_batch)
    grad_accum: int = setting(1, "gradient accumulation steps per optimizer step", check="positive")
    lr: float | None = setting(1e-4, "peak learning rate", check="positive")
    warmup_steps: int | None = setting(None, "warmup steps (default: --warmup-ratio of the run)", check="non-negative")
    warmup_ratio: float = setting(0.06, "warmup as a fraction of the run", check="fraction")
    weight_decay: float = setting(0.01, "AdamW weight decay (none on biases and LayerNorm weights)",
                                  check="probability")
    adam_beta1: float = setting(0.9, "AdamW beta1", check="fraction")
    adam_beta2: float = setting(0.999, "AdamW beta2", check="fraction")
    adam_eps: float = setting(1e-6, "AdamW epsilon", check="positive")
    max_grad_norm: float = setting(1.0, "gradient clipping norm", check="positive")
    max_steps: int | None = setting(None, "optimizer steps", check="positive")
    max_time: float | None = setting(None, "time budget of the whole run, e.g. 90s, 30m, 2h: its set-up, final "
                                           "evaluation and save included, the learning rate decaying to zero on time",
                                     check="positive")
    epochs: int | None = setting(None, "passes over the training data (--max-steps, when given, decides instead)",
                                 check="positive")
    eval_every: int | None = setting(500, "evaluate every N steps (0 = only at the end)", check="non-negative")
    save_every: int | None = setting(1000, "checkpoint every N steps (0 = none before the end; none given: every 15 "
                                           "minutes of the run)", check="non-negative")
    keep_checkpoints: int = setting(2, "how many checkpoints to keep (0 = all)", check="non-negative")
    log_every: int = setting(10, "log training metrics every N steps", check="positive")
    seed: int = setting(0, "random seed", check="non-negative")

    def validate(self) -> None:
        validate_fields(self)
        if self.lr is None:
            raise UserError("--lr needs a value")
        if self.batch_size is not None and self.batch_size % self.grad_accum:
            raise UserError(f"--batch-size {self.batch_size} must be a positive multiple of "
                            f"--grad-accum {self.grad_accum}")
        if self.max_steps is None and self.max_time is None and self.epochs is None:
            raise UserError("give --max-steps, --max-time or --epochs")


@dataclass
class ImplConfig:
    """How to run (no effect on the results on a given machine): device, precision, compilation."""

    device: str = setting("auto", "auto, cpu, cuda or cuda:N")
    precision: str = setting("auto", "auto (bf16 autocast on CUDA and on CPUs with native bf16, fp16 with loss "
                                     "scaling on GPUs without bf16, else fp32), fp32, bf16 or fp16")
    report_to: str = setting("none", "where metrics go besides metrics.jsonl", choices=("none", "tensorboard"))
    compile: bool = setting(False, "torch.compile the model", only="pretrain")
    threads: int | None = setting(None, "CPU threads (default: the available cores shared among local processes)",
                                  check="positive")
    progress: bool | None = setting(None, "show a progress bar (default: when stderr is a terminal)")


def progress_shown(progress: bool | None) -> bool:
    """Whether progress bars show: as ``progress`` asks, else (None) when stderr is a terminal, from the command
    line and the Python API alike (no bars in the log of a job)."""
    return sys.stderr.isatty() if progress is None else bool(progress)


class Sections:
    """A run's configuration: a few top-level fields and sections (dataclasses), readable by flat names."""

    SECTIONS: tuple[str, ...] = ()
    COMMAND = ""  # the command these settings are of (see ``setting(only=...)``)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        d = dict(d)
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in cls.SECTIONS:  # the section's own defaults (fine-tuning's differ), then the given keys
                given = d.pop(f.name, {}) or {}
                if not isinstance(given, dict):
                    raise UserError(f"config section {f.name!r} must be a mapping, not {shown(given)}")
                kw[f.name] = dataclass_from_dict(f.default_factory(), given, where=f"config section {f.name!r}")
            elif f.name in d:
                kw[f.name] = d.pop(f.name)
        if d:
            raise UserError(f"unknown key(s) in config: {', '.join(sorted(d))}")
        return cls(**kw)

    def flat_fields(self) -> dict[str, tuple[Any, dataclasses.Field]]:
        """{flat name: (the object holding it, its field)} over the top level and every section."""
        out = {f.name: (self, f) for f in dataclasses.fields(self) if f.name not in self.SECTIONS}
        for name in self.SECTIONS:
            sec = getattr(self, name)
            for g in dataclasses.fields(sec):
                assert g.name not in out, f"setting {g.name!r} is named twice"
                out[g.name] = (sec, g)
        return out

    def update_flat(self, flat: dict[str, Any], where: str = "config") -> None:
        """Set fields by their flat names (the command-line flags' names, '-' or '_')."""
        index = self.flat_fields()
        unknown = []
        for k, v in flat.items():
            key = k.replace("-", "_")
            if key not in index:
                unknown.append(k)
            else:
                holder, f = index[key]
                setattr(holder, f.name, v)
        if unknown:
            raise UserError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}")


# ================================================================================================ pretraining
@dataclass
class PretrainDataConfig:
    """What to train on and how instances are built."""

    data: list[str] = setting(help="training corpus: .txt/.jsonl/.gz/.parquet files, directories, globs, hf:NAME",
                              factory=list)
    eval_data: list[str] | None = setting(None, "held-out corpus (default: documents held out of --data)")
    text_field: str = setting("text", "JSONL/parquet field holding the text")
    doc_separator: str = setting("file", "txt files: one document per file; blank-line (one sentence per line, a "
                                         "blank line between documents); line (one example per line)",
                                 choices=DOC_SEPARATORS)
    tokenizer: str | None = setting(None, "tokenizer or model directory, or vocab.txt (default: train one on --data)")
    vocab_size: int = setting(30522, "vocabulary size of a tokenizer trained on --data", check="positive")
    tokenizer_model: str = setting("wordpiece", "the kind of a tokenizer trained on --data",
                                   choices=TOKENIZER_MODELS)
    lowercase: bool = setting(True, "lower-case a trained tokenizer's input (--cased: keep case)", flag=False)
    max_seq_length: int = setting(128, "tokens per sequence", check="positive")
    mask_prob: float = setting(0.15, "fraction of tokens masked", check="open-fraction")
    short_seq_prob: float = setting(0.1, "probability of a shorter target length", check="probability")
    whole_word_mask: bool = setting(False, "mask whole words (all pieces of a word together: WordPiece's ## pieces "
                                           "with the token before them, or a BPE token up to the next word start)")
    nsp: bool = setting(True, "next sentence prediction (--no-nsp: masked LM only)")
    max_eval_instances: int = setting(2048, "held-out sequences per evaluation", check="positive")
    cache_dir: str | None = setting(None, "where tokenized corpora are cached and each epoch's instance plan kept "
                                       "(default ~/.cache/bertforge)")

    def validate(self) -> None:
        validate_fields(self)


@dataclass
class PretrainModelConfig:
    """Which model: a preset, a config.json, or a BERT directory to continue from (``init``)."""

    preset: str | None = setting("mini", f"model size: {presets_said()} (a model from --init or --model-config has its "
                                 "own; the run records none)")
    arch: str | None = setting(None, f"model family: {families_said()} (default: the family of --init or "
                                     "--model-config, else bert)", choices=tuple(FAMILIES))
    model_config: str | None = setting(None, "a BERT config.json to build the model from")
    init: str | None = setting(None, "continue from a BERT directory (ours or a transformers checkpoint), by "
                                     "--recipe continue unless another is given")
    add_vocab: int | None = setting(None, "with --init: add up to N words and subwords of --data that its vocabulary "
                                          "lacks (the most used first), each starting as the mean of the pieces "
                                          "it was split into", check="positive")
    objective: str = setting("mlm", "mlm (masked LM, with --nsp also next sentence prediction) or electra (ELECTRA's "
                                    "replaced-token detection: a small generator fills the masks, the model finds "
                                    "the replaced tokens)", choices=OBJECTIVES)
    generator_size: float = setting(0.25, "ELECTRA: the generator's width as a fraction of the model's",
                                    check="open-fraction")
    dropout: float | None = setting(None, "hidden and attention dropout during pretraining (none = the model's"
                                          f"{pretraining_dropouts_said()}); the saved config.json keeps the model's "
                                          "own, for fine-tuning", check="fraction")
    position_init: str = setting("normal", "how a new model's position embeddings start: normal (BERT's: random) or "
                                           "sinusoidal (the Transformer's sines and cosines at the same scale, still "
                                           "learned); not used with --init or --resume",
                                 choices=("normal", "sinusoidal"))
    attention_init: str = setting("normal", "how a new model's attention starts: normal (BERT's: random) or local "
                                            "(the first layer's heads 0 and 1 start looking at the previous and the "
                                            "next token; needs --position-init sinusoidal; ELECTRA: the "
                                            "discriminator's and the generator's first layers); not used "
                                            "with --init or --resume", choices=("normal", "local"))

    def validate(self) -> None:
        validate_fields(self)
        if self.preset is not None or not (self.init or self.model_config):
            check_preset(self.preset, self.arch)
        if self.attention_init == "local" and self.position_init != "sinusoidal" and not self.init \
                and family(self.arch).position_table:  # (neither starting value applies to rotary positions)
            raise UserError("--attention-init local (the budget recipe's) reads the positions' sines and cosines: "
                            "with --position-init normal, pass --attention-init normal too")
        if self.add_vocab is not None and not self.init:
            raise UserError("--add-vocab extends the vocabulary of the model that --init names; pass --init MODEL")
        if self.init and self.model_config:  # a new model's architecture: --init's is its own config.json
            raise UserError(f"--model-config {shown(self.model_config)} describes a new model, and --init "
                            f"{shown(self.init)} has its own; give one of them")


# ------------------------------------------------------------------------------------------------ recipes
# The pretraining settings that decide what a compute budget buys, by recipe (flat names, as the flags).
# "budget" (the default) is chosen for the best model per hour of a small machine (benchmarks/README.md,
# "The budget recipe"); "bert" is BERT's (Devlin et al., 2019), as bertforge ran it before 0.3.  Explicit
# flags and config-file keys win over the recipe; the resolved values are saved with the run.  "continue" (the
# default with --init) goes on from a trained model: masked LM only at BERT's 15%, the model's own dropout (what it
# was trained with), BERT's Adam beta2 and clipping, none of the budget recipe's starting values (they would
# overwrite trained weights), and a short warmup: the weights have no random start to leave, only Adam's moments
# start anew.  Its lr, 1e-4, won a screen of 3e-5, 1e-4 and 3e-4 (`benchmarks/domain_adaptation.py --try lr-screen`,
# RESULTS.md, "Continued pretraining").
RECIPES: dict[str, dict[str, Any]] = {
    "budget": dict(lr=1e-3, warmup_ratio=0.06, adam_beta2=0.98, max_grad_norm=0.5, dropout=0.0, nsp=False,
                   mask_prob=0.3, position_init="sinusoidal", attention_init="local"),
    "bert": dict(lr=1e-4, warmup_ratio=0.06, adam_beta2=0.999, max_grad_norm=1.0, dropout=None, nsp=True,
                 mask_prob=0.15, position_init="normal", attention_init="normal"),
    "continue": dict(lr=1e-4, warmup_ratio=0.02, adam_beta2=0.999, max_grad_norm=1.0, dropout=None, nsp=False,
                     mask_prob=0.15, position_init="normal", attention_init="normal"),
}
RECIPE_WITH_INIT = "continue"  # the default recipe of a run that starts from a trained model (--init)


def recipe_section(name: str, section: type) -> dict[str, Any]:
    """The values recipe ``name`` gives to the fields of dataclass ``section``."""
    own = {f.name for f in dataclasses.fields(section)}
    return {k: v for k, v in RECIPES[name].items() if k in own}


def _budget(section: type) -> Any:
    """Section ``section`` with the budget recipe's values."""
    return section(**recipe_section("budget", section))


@dataclass
class PretrainConfig(Sections):
    """A pretraining run.  ``PretrainConfig()`` holds the budget recipe's defaults;
    :meth:`for_recipe` another recipe's (``recipe`` records which one the defaults came from)."""

    out: str = setting("", "output directory (a Hugging Face BERT directory, with metrics and checkpoints)")
    recipe: str = setting("budget", "the defaults of the settings that decide what a budget buys: budget (for the "
                                    "best model per hour: masked LM only, 30% masked, lr 1e-3, dropout off, heads "
                                    "that start on the neighbouring tokens, ...), bert "
                                    "(BERT's: NSP, lr 1e-4, dropout 0.1, ...) or continue (continued pretraining of "
                                    "--init's model: masked LM only, 15% masked, the model's own dropout, warmup 2%, "
                                    "beta2 0.999, lr 1e-4, kept after a screen of 3e-5, 1e-4 and 3e-4); explicit "
                                    "flags win (default: "
                                    "continue with --init, else budget)",
                          choices=tuple(RECIPES))
    model: PretrainModelConfig = field(default_factory=lambda: _budget(PretrainModelConfig))
    data: PretrainDataConfig = field(default_factory=lambda: _budget(PretrainDataConfig))
    train: TrainConfig = field(default_factory=lambda: _budget(TrainConfig))
    impl: ImplConfig = field(default_factory=ImplConfig)

    @classmethod
    def for_recipe(cls, name: str) -> PretrainConfig:
        """The defaults of recipe ``name``."""
        if not isinstance(name, str) or name not in RECIPES:
            raise UserError(f"--recipe must be one of {', '.join(RECIPES)}, not {shown(name)}")
        cfg = cls()
        cfg.update_flat(RECIPES[name])
        cfg.recipe = name
        return cfg

    SECTIONS = ("model", "data", "train", "impl")
    COMMAND = "pretrain"

    def validate(self, resume: bool = False) -> None:
        """Every check of values alone (no file system), before anything is read or written."""
        if not self.data.data and not resume:
            raise UserError("--data is required")
        if self.recipe == RECIPE_WITH_INIT and not self.model.init:
            raise UserError(f"--recipe {RECIPE_WITH_INIT} continues pretraining a trained model: give --init MODEL (a "
                            "BERT directory), or --recipe budget or bert for a new one")
        for sec in (self.model, self.data, self.train):
            sec.validate()
        validate_fields(self.impl)


def parse_duration(text: str | float | int | None) -> float | None:
    """'90', '90s', '30m', '2h', '1h30m' (or a ``datetime.timedelta``) -> seconds."""
    import datetime

    if isinstance(text, datetime.timedelta):
        return text.total_seconds()
    if text is None or isinstance(text, (int, float)) and not isinstance(text, bool):
        return None if text is None else float(text)
    if not isinstance(text, str):  # (True would be a one-second budget; a list or bytes no duration at all)
        raise UserError(f"max_time must be a duration (90s, 30m, 2h), a number of seconds or a timedelta, not "
                        f"{type(text).__name__} {shown(text)}")
    import re

    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", s)
    if not parts or "".join(a + b for a, b in parts) != s:
        raise UserError(f"cannot read duration {shown(text)}; write e.g. 90s, 30m, 2h or 1h30m")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(a) * unit[b] for a, b in parts)


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON mapping from a file; bad input is a UserError."""
    from .files import read_text

    text = read_text(path, "config file")
    try:
        if path.endswith(".json"):
            d = json.loads(text)
        else:
            d = _yaml_load(text)
    except Exception as e:  # json or yaml syntax errors
        raise UserError(f"cannot parse config file {path}: {' '.join(str(e).split())}") from None
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise UserError(f"config file {path} must hold a mapping of settings")
    if _values(d) > MAX_CONFIG_VALUES:
        raise UserError(f"config file {path} expands to more than {MAX_CONFIG_VALUES:,} values (through YAML anchors "
                        "and aliases?); a configuration holds a few dozen settings")
    keys = [*d, *(k for v in d.values() if isinstance(v, dict) for k in v)]  # the settings', and the sections'
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise UserError(f"config file {path}: {shown(bad[0])} is not a setting's name")
    return d


MAX_CONFIG_VALUES = 100_000


def _values(obj, memo: dict | None = None) -> int:
    """How many values ``obj`` holds once every shared part (a YAML alias) is counted where it appears: counted
    without expanding it, so that a few lines of aliases standing for billions of values cost nothing."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    memo[id(obj)] = 1  # a cycle (a recursive alias) counts once
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    memo[id(obj)] = 1 + sum(_values(x, memo) for x in items)
    return memo[id(obj)]


def _yaml_load(text: str):
    """YAML with YAML 1.2's numbers: ``lr: 1e-4`` is a float (PyYAML's YAML 1.1 reads it as a string)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    number = re.compile(r"^[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+$")
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", number, list("-+0123456789"))
    return yaml.load(text, Loader=Loader)


# ================================================================================================ fine-tuning
# What fine-tuning changes in TrainConfig's defaults (BERT's fine-tuning recipe); tasks may change more.
# lr None: by the model's width (finetune_lr).
FINETUNE_TRAIN_DEFAULTS: dict[str, Any] = dict(
    lr=None, batch_size=None, warmup_ratio=0.1, epochs=3, log_every=20, eval_every=None, save_every=None,
    keep_checkpoints=1,  # save_every None: by time (lifecycle.SAVE_INTERVAL); a checkpoint serves only to resume
)

# Fine-tuning's learning rate when none is given, by the model's hidden size: narrow models take larger
# steps (as ELECTRA's fine-tuning: 3e-4 for its small model, 1e-4 for base; BERT's grid for base and large:
# 2e-5 to 5e-5); see benchmarks/README.md, "Fine-tuning's learning rate by width".
FINETUNE_LR_BY_WIDTH: tuple[tuple[int, float], ...] = ((256, 3e-4), (1 << 30, 5e-5))


def finetune_lr(hidden_size: int) -> float:
    """The default fine-tuning learning rate of a model ``hidden_size`` wide (:data:`FINETUNE_LR_BY_WIDTH`)."""
    return next(lr for width, lr in FINETUNE_LR_BY_WIDTH if hidden_size <= width)


def finetune_lr_rule() -> str:
    """:data:`FINETUNE_LR_BY_WIDTH` in words, for ``--help``."""
    *narrow, (_, wide) = FINETUNE_LR_BY_WIDTH
    narrow_lrs = ", ".join(f"{lr:g} up to hidden size {w}" for w, lr in narrow)
    return f"by the model's width: {narrow_lrs}, {wide:g} above"


@dataclass
class FinetuneDataConfig:
    """The labelled files and how examples become model inputs."""

    train_file: str = setting("", "training file", flag="--train")
    validation_file: str = setting("", "validation file, evaluated after every epoch (default: --validation-split of "
                                       "the training file; without either, no evaluation)", flag="--validation")
    validation_split: float | None = setting(None, "without --validation: hold out this fraction of the training "
                                                   "examples (at random, by --seed) to validate on",
                                             check="open-fraction")
    max_eval_examples: int | None = setting(None, "validate on the first N validation examples only",
                                            check="positive")
    max_seq_length: int | None = setting(128, "tokens per example (longer ones are truncated or windowed)",
                                         check="positive")  # (None: the task's by its base model, default_length)
    max_train_examples: int | None = setting(None, "use only the first N training examples", check="positive")
    eval_batch_size: int = setting(64, "batch size for evaluation", check="positive")
    group_by_length: bool = setting(False, "batches of examples of similar length (less padding; as the Trainer's "
                                           "option): the epoch's random order, sorted by length within each run of 50 "
                                           "batches")


@dataclass
class FinetuneConfig(Sections):
    """A fine-tuning run: the base model, the data, and the same train/impl settings as pretraining."""

    model: str = setting("", "a BERT directory: pretrained by bertforge, or a transformers checkpoint")
    out: str = setting("", "output directory (the fine-tuned model, metrics, predictions, plots)")
    freeze_embeddings: bool = setting(False, "keep the word embeddings as pretrained (few labels, large vocabulary)")
    data: FinetuneDataConfig = field(default_factory=FinetuneDataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(**FINETUNE_TRAIN_DEFAULTS))
    impl: ImplConfig = field(default_factory=ImplConfig)

    SECTIONS = ("data", "train", "impl")
    COMMAND = "finetune"

    def validate(self) -> None:
        for name in ("model", "out"):
            if not getattr(self, name):
                raise UserError(f"--{name} is required")
        if not self.data.train_file:
            raise UserError("--train is required")
        if self.data.validation_file and self.data.validation_split is not None:
            raise UserError("give --validation FILE or --validation-split FRACTION, not both")
        if self.train.epochs is None:
            raise UserError("--epochs needs a value")
        for sec in (self, self.data, self.impl):
            validate_fields(sec)
        self.train.validate()
