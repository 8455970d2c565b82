"""Where a run's settings come from, decided in one place for the command line and the Python API.

Pretraining: the recipe's defaults (``--recipe``; without one, ``continue`` for a run from ``--init``'s trained
model, ``budget`` for a new one), then a ``--config`` file, then the explicit settings
(flags, or keyword arguments of :func:`bertforge.run_pretraining`); on ``--resume`` the run's saved
``pretrain_config.json`` takes the recipe's place, so that a resumed run keeps its settings: one that changes
what is trained is refused (:func:`check_resumed_settings`), one that reshapes the schedule is said.

Fine-tuning: the task's defaults, then a ``--config`` file (or a run's own ``finetune_config.json``), then
the explicit settings; the learning rate, when none is given, follows the model's width
(:func:`~bertforge.config.finetune_lr`).

Each command takes the settings of its own sections (:class:`~bertforge.config.PretrainConfig`,
:class:`~bertforge.config.FinetuneConfig` and the task's), less the fields marked for another command
(``setting(only=...)``): there is no list of names to keep in step by hand.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

from .config import (
    PRETRAIN_CONFIG,
    RECIPE_WITH_INIT,
    RECIPES,
    BertConfig,
    FinetuneConfig,
    ImplConfig,
    PretrainConfig,
    finetune_lr,
    flag_of,
    parse_duration,
    read_config_file,
    taken_by,
)
from .errors import UserError, shown
from .files import read_json_object

log = logging.getLogger("bertforge")

CORPUS = "corpus"  # beside the settings in pretrain_config.json: what the run trains on (pretrain.corpus_identity)
COMMAND = "command"  # and the command line that started the run (its model card's, when it is resumed)


def progress_default(flag: bool | None) -> dict[str, bool]:
    """The command line's progress bar: without ``--progress``/``--no-progress``, none when stderr is not
    a terminal (over a config file's choice); else whatever the settings say."""
    return {"progress": False} if flag is None and not sys.stderr.isatty() else {}


# ------------------------------------------------------------------------------------------------ pretraining
def pretrain_settings(out: str, data: list[str] | str | None = None, resume: bool = False, config: str | None = None,
                      **settings: Any) -> PretrainConfig:
    """The configuration of ``bertforge pretrain``: the recipe's defaults (or, on ``resume``, the run saved
    in ``out``), then the ``config`` file's settings, then ``settings`` (flat names, as the flags)."""
    from_file = _pretrain_values(read_config_file(config)) if config else {}
    settings = _pretrain_values(settings)
    saved = _saved_pretraining(out) if resume else None  # none: pretrain.check_run says there is nothing to resume
    if saved is not None:
        cfg = PretrainConfig.from_dict(saved)
    else:  # the recipe's defaults, then the config file's and the explicit settings over them
        cfg = PretrainConfig.for_recipe(default_recipe({**from_file, **settings}))
    for flat, where in ((from_file, f"config file {config}"), (settings, "settings")):
        cfg.update_flat(flat, where=where)
    if data is not None:
        cfg.data.data = [data] if isinstance(data, str) else list(data)
    cfg.out = out
    _as_run(cfg)
    if saved is not None:
        check_resumed_settings(out, _as_run(PretrainConfig.from_dict(saved)), cfg)
    return cfg


def default_recipe(given: dict[str, Any]) -> Any:
    """The recipe whose defaults the run starts from, by the flat settings ``given`` (a config file's, then the
    explicit ones over them): the one named, else the continued-pretraining recipe for a run that starts from a
    trained model (``init``), else the budget recipe."""
    if given.get("recipe") is not None:
        return given["recipe"]
    return RECIPE_WITH_INIT if given.get("init") else "budget"


NEW_MODEL_ONLY = ("position_init", "attention_init")  # a new model's starting values: none applies to --init's


def recipe_said(cfg: PretrainConfig, config: BertConfig) -> str:
    """The run's recipe and the values it trains with, for the log: each setting the recipe decides, marked
    where a flag or a config file changed the recipe's value; ``config``, the model's, says what "the model's
    dropout" is."""
    own = config.hidden_dropout_prob, config.attention_probs_dropout_prob
    models = f"the model's ({own[0]:g}{'' if own[0] == own[1] else f', attention {own[1]:g}'})"
    index, parts = cfg.flat_fields(), []
    for name, value in RECIPES.get(cfg.recipe, {}).items():
        holder, f = index[name]
        now = getattr(holder, f.name)
        notes = [] if now == value else ["the recipe's: " + ("the model's" if value is None else _shown(value))]
        if name in NEW_MODEL_ONLY and cfg.model.init and now != "normal":
            notes.append("not used: --init's model starts from its own weights")
        parts.append(f"{name} {models if now is None else _shown(now)}" + (f" ({'; '.join(notes)})" if notes else ""))
    return f"the {cfg.recipe} recipe: {', '.join(parts)}"


def _as_run(cfg: PretrainConfig) -> PretrainConfig:
    """``cfg`` as the run has it: 0 for "only at the end" as None, and no preset when the model comes from
    ``--init`` or ``--model-config`` (a preset given then does not describe the model)."""
    if cfg.train.eval_every == 0:
        cfg.train.eval_every = None
    if cfg.train.save_every == 0:
        cfg.train.save_every = None
    if cfg.model.init or cfg.model.model_config:
        cfg.model.preset = None
    return cfg


# What --resume may change: the schedule (said when it changes), and when the run evaluates, logs and saves,
# and how it runs (a global batch is the same in any number of accumulation steps).  Every other setting decides
# what is trained, and a resumed run keeps the one it was started with.
SCHEDULE = ("lr", "max_steps", "max_time", "epochs", "warmup_steps", "warmup_ratio")
RESUMABLE = (*SCHEDULE, "out", "eval_every", "save_every", "keep_checkpoints", "log_every", "max_eval_instances",
             "cache_dir", "grad_accum")


def check_resumed_settings(out: str, saved: PretrainConfig, cfg: PretrainConfig) -> None:
    """Refuse, before anything is read, a resumed run whose settings change what is trained, naming each
    changed setting with the run's value and the new one."""
    before = saved.flat_fields()
    changed = []
    for name, (holder, f) in cfg.flat_fields().items():
        if name in RESUMABLE or isinstance(holder, ImplConfig):
            continue
        was, now = getattr(before[name][0], f.name), getattr(holder, f.name)
        if _comparable(name, was) != _comparable(name, now):
            if name == "lowercase":  # set by its flag --cased
                changed.append(f"--cased {not was} -> {not now}")
            else:
                changed.append(f"{flag_of(f)} {_shown(was)} -> {_shown(now)}")
    if changed:
        raise UserError(f"--resume continues the run in {out} as it was started, and this changes what it trains: "
                        f"{', '.join(changed)}; a resumed run may change only its schedule "
                        "(--max-steps, --max-time, --epochs, --lr, --warmup-steps, --warmup-ratio) and how it runs")


def _comparable(name: str, value: Any) -> Any:
    if name in ("data", "eval_data") and isinstance(value, list):  # ./a.txt is a.txt
        return [p if p.startswith("hf:") else os.path.normpath(p) for p in value if isinstance(p, str)]
    return value


def _shown(value: Any) -> str:
    """A setting's value in a message: as a flag takes it (a path without quotes), bounded."""
    text = shown(value)
    return text[1:-1] if isinstance(value, str) and text[:1] == text[-1:] and text[:1] in "'\"" else text


def _saved_pretraining(out: str) -> dict | None:
    """The settings a pretraining run saved in ``out`` (None when there are none)."""
    saved = _saved_run(out)
    return None if saved is None else {k: v for k, v in saved.items() if k not in (CORPUS, COMMAND)}


def saved_corpus(out: str) -> dict | None:
    """What the run saved in ``out`` trains on (:data:`CORPUS`; None when not recorded)."""
    saved = _saved_run(out)
    corpus = saved.get(CORPUS) if saved is not None else None
    return corpus if isinstance(corpus, dict) else None


def saved_command(out: str) -> list[str] | None:
    """The command line that started the run saved in ``out`` (:data:`COMMAND`; None when not recorded)."""
    saved = _saved_run(out)
    command = saved.get(COMMAND) if saved is not None else None
    return command if isinstance(command, list) and all(isinstance(a, str) for a in command) else None


def _saved_run(out: str) -> dict | None:
    path = os.path.join(out, PRETRAIN_CONFIG) if out else ""
    return read_json_object(path, PRETRAIN_CONFIG) if path and os.path.isfile(path) else None


def _pretrain_values(flat: dict[str, Any]) -> dict[str, Any]:
    """Flat settings as the configuration holds them: ``max_time`` in seconds, ``cased`` as ``lowercase``."""
    flat = {k.replace("-", "_"): v for k, v in flat.items()}
    if "max_time" in flat:
        flat["max_time"] = parse_duration(flat["max_time"])
    if "cased" in flat:
        flat["lowercase"] = not flat.pop("cased")
    return flat


# ------------------------------------------------------------------------------------------------ fine-tuning
def finetune_settings(task: str, model: str = "", train: str = "", validation: str = "", out: str = "",
                      config: str | None = None, **settings: Any) -> tuple[FinetuneConfig, Any]:
    """(configuration, the task's own settings) of ``bertforge finetune TASK``: the task's defaults, then
    the ``config`` file's, then ``settings`` (flat names, as the flags); the arguments name the model, the
    files and the output folder (over the file's)."""
    from .tasks import TASKS

    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    kind = TASKS[task]
    own = {f.name for f in dataclasses.fields(kind.settings_class)}
    if config:
        from_file = finetune_file_settings(read_config_file(config), config)
        unknown = sorted(set(from_file) - set(kind.config().flat_fields()) - own)
        if unknown:
            raise UserError(f"config file {config}: unknown key(s) for finetune {task}: {', '.join(unknown)}")
        given = {"model": model, "train_file": train, "validation_file": validation, "out": out}
        model, train, validation, out = (v or from_file.pop(k, "") for k, v in given.items())
        for k in given:
            from_file.pop(k, None)
        settings = {**from_file, **settings}
    task_settings = kind.settings_class(**{k: v for k, v in settings.items() if k in own})
    cfg = kind.config(model=model, train_file=train, validation_file=validation, out=out,
                      **{k: v for k, v in settings.items() if k not in own})
    if cfg.train.lr is None and cfg.model and isinstance(cfg.model, str) and os.path.isdir(cfg.model):
        cfg.train.lr = finetune_lr(BertConfig.load(cfg.model).hidden_size)  # the default: by the model's width
    return cfg, task_settings


def finetune_file_settings(d: dict[str, Any], path: str) -> dict[str, Any]:
    """A fine-tuning ``--config`` file's settings by their flat names.  The file holds the flags' names
    (``lr: 1e-4``, ``train: file``), ``data:``/``train:``/``impl:`` sections, or is a run's own
    ``finetune_config.json`` (``{"finetune": {...}, "task": {...}}``), so a run can be repeated from it."""
    d = dict(d)
    if isinstance(d.get("finetune"), dict):  # a run's finetune_config.json
        d.pop("processes", None)  # how the run was launched, not a setting
        d = {**d.pop("finetune"), **(d.pop("task", None) or {}), **d}
    flat: dict[str, Any] = {}
    alias = {"train": "train_file", "validation": "validation_file"}
    for k, v in d.items():
        key = k.replace("-", "_")
        if key in FinetuneConfig.SECTIONS and isinstance(v, dict):
            flat.update({alias.get(kk.replace("-", "_"), kk.replace("-", "_")): vv for kk, vv in v.items()})
        else:
            flat[alias.get(key, key)] = v
    fields = FinetuneConfig().flat_fields()
    other = {k for k, (_, f) in fields.items() if not taken_by(f, FinetuneConfig.COMMAND)}
    changed = sorted(k for k, v in flat.items() if k in other and v != getattr(fields[k][0], fields[k][1].name))
    if changed:  # saved with their defaults in finetune_config.json; not settings of fine-tuning
        raise UserError(f"config file {path}: {', '.join(changed)} cannot be set for fine-tuning")
    return {k: v for k, v in flat.items() if k not in other}


def warn_if_schedule_changed(out: str, cfg: PretrainConfig) -> None:
    """On resume: say so when the settings that shape the learning-rate schedule differ from the saved run's."""
    try:
        found = _saved_pretraining(out)
        saved = PretrainConfig.from_dict(found).train if found is not None else cfg.train
    except UserError:
        return
    changed = [f"--{k.replace('_', '-')} {_shown(getattr(saved, k))} -> {_shown(getattr(cfg.train, k))}"
               for k in SCHEDULE if getattr(saved, k) != getattr(cfg.train, k)]
    if changed:
        log.warning("resuming with %s: the learning-rate schedule is recomputed from this step on with the new "
                    "values, so the run no longer reproduces an uninterrupted run of either setting",
                    ", ".join(changed))
