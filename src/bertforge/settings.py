"""Where a run's settings come from, decided in one place for the command line and the Python API.

Pretraining: the recipe's defaults (``--recipe``; without one, ``continue`` for a run from ``--init``'s trained
model, ``budget`` for a new one), then a ``--config`` file, then the explicit settings
(flags, or keyword arguments of :func:`bertforge.run_pretraining`); on ``--resume`` the run's saved
``pretrain_config.json`` takes the recipe's place, so that a resumed run keeps its settings.

``--resume``, for every command: one table of what may change (:data:`RESUMABLE`); a change to anything else is
refused (:func:`check_resumed`) before any data is read, one that reshapes the schedule is said once
(:func:`say_schedule_changed`).

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
from typing import Any

from .config import (
    RECIPE_WITH_INIT,
    RECIPES,
    FinetuneConfig,
    ImplConfig,
    PretrainConfig,
    by_content,
    flag_of,
    parse_duration,
    read_config_file,
    Sections,
    taken_by,
)
from .errors import UserError, shown
from .models import family
from .train.runfolder import COMMAND, CORPUS, TASK, RunFolder

log = logging.getLogger("bertforge")


# ------------------------------------------------------------------------------------------------ pretraining
def pretrain_settings(out: str, data: list[str] | str | None = None, resume: bool = False, config: str | None = None,
                      **settings: Any) -> PretrainConfig:
    """The configuration of ``bertforge pretrain``: the recipe's defaults (or, on ``resume``, the run saved
    in ``out``), then the ``config`` file's settings, then ``settings`` (flat names, as the flags)."""
    from .train.lifecycle import recover

    recover(out)  # (an output an interrupted run left aside is back before a file of it is read: --config's)
    from_file = sectioned_settings(read_config_file(config), PretrainConfig.SECTIONS) if config else {}
    from_file = _pretrain_values(from_file)
    if not out and from_file.get("out"):  # (the flag over the file's)
        out = from_file["out"]
        recover(out)  # (before the run's saved settings are read)
    from_file.pop("out", None)
    settings = _pretrain_values(settings)
    saved = RunFolder(out, "pretrain").settings() if resume else None  # none: as a new run (pretrain.check_run)
    if saved is not None:
        cfg = PretrainConfig.from_dict(saved)
    else:  # the recipe's defaults, then the config file's and the explicit settings over them
        cfg = PretrainConfig.for_recipe(default_recipe({**from_file, **settings}))
    for flat, where in ((from_file, f"config file {config}"), (settings, "settings")):
        cfg.update_flat(flat, where=where)
    if data is not None:
        cfg.data.data = [data] if isinstance(data, str) else list(data)
    cfg.out = out
    _absolute_paths(cfg, ("data", "eval_data", "tokenizer", "init", "model_config"))
    return as_run(cfg)


def default_recipe(given: dict[str, Any]) -> Any:
    """The recipe whose defaults the run starts from, by the flat settings ``given`` (a config file's, then the
    explicit ones over them): the one named, else the continued-pretraining recipe for a run that starts from a
    trained model (``init``), else the budget recipe."""
    if given.get("recipe") is not None:
        return given["recipe"]
    return RECIPE_WITH_INIT if given.get("init") else "budget"


NEW_MODEL_ONLY = ("position_init", "attention_init")  # a new model's starting values: none applies to --init's


def recipe_said(cfg: PretrainConfig, config: Any) -> str:
    """The run's recipe and the values it trains with, for the log: each setting the recipe decides, marked
    where a flag or a config file changed the recipe's value; ``config``, the model's, says what "the model's
    dropout" is."""
    own = config.dropouts
    models = f"the model's ({own[0]:g}{'' if own[0] == own[1] else f', attention {own[1]:g}'})"
    index, parts = cfg.flat_fields(), []
    for name, value in RECIPES.get(cfg.recipe, {}).items():
        holder, f = index[name]
        now = getattr(holder, f.name)
        notes = [] if now == value else ["the recipe's: " + ("the model's" if value is None else _shown(value))]
        if name in NEW_MODEL_ONLY and cfg.model.init and now != "normal":
            notes.append("not used: --init's model starts from its own weights")
        elif name in NEW_MODEL_ONLY and not family(cfg.model.arch).position_table and now != "normal":
            label = family(cfg.model.arch).label
            notes.append(f"not used: {label} has no position table to start" if name == "position_init" else
                         f"not used: it starts heads from a position table's sines and cosines, which {label} "
                         "has not (rotary positions)")
        parts.append(f"{name} {models if now is None else _shown(now)}" + (f" ({'; '.join(notes)})" if notes else ""))
    return f"the {cfg.recipe} recipe: {', '.join(parts)}"


def as_run(cfg: PretrainConfig) -> PretrainConfig:
    """``cfg`` as the run has it: no preset when the model comes from ``--init`` or ``--model-config`` (a preset
    given then does not describe the model)."""
    if cfg.model.init or cfg.model.model_config:
        cfg.model.preset = None
    return cfg


def absolute(path: Any) -> Any:
    """A path as the saved settings hold it: absolute, so that a run resumes from any working folder (a dataset
    name, ``hf:...``, and what is no path stay as they are)."""
    if isinstance(path, list):
        return [absolute(p) for p in path]
    return os.path.abspath(path) if isinstance(path, str) and path and not path.startswith("hf:") else path


def _absolute_paths(cfg: Any, names: tuple[str, ...]) -> None:
    for name, (holder, f) in cfg.flat_fields().items():
        if name in names:
            setattr(holder, f.name, absolute(getattr(holder, f.name)))


# ------------------------------------------------------------------------------------------------ --resume
# What --resume may change, for every command: the schedule (said when it changes), when the run evaluates, logs and
# saves, and how it runs (every implementation setting: device, precision, threads...; a global batch is the same in
# any number of accumulation steps).  Every other setting decides what is trained, and a resumed run keeps the one it
# was started with.
SCHEDULE = ("lr", "max_steps", "max_time", "epochs", "warmup_steps", "warmup_ratio")
RESUMABLE = (*SCHEDULE, "out", "eval_every", "save_every", "keep_checkpoints", "log_every", "max_eval_instances",
             "cache_dir", "grad_accum", "eval_batch_size")
# compared by what they hold, not by their names: the files a run trains and validates on (a digest of their
# bytes or of the tokenized corpus), a task's own files and folders (every setting named ``*_file`` or marked
# ``by_content``: reranking's mining model), the tokenizer (its fingerprint, against the run's own) and
# fine-tuning's base model (a digest of its config and tokenizer)
BY_CONTENT = ("train_file", "validation_file", "data", "tokenizer", "model")
# read again only by a run that starts again from step 0 (a continued run's model and config come from its
# checkpoint and folder): compared, as the folders they name, only then
AT_START = ("init", "model_config")


def check_resumed(out: str, saved: Sections, now: Sections, saved_task: Any = None, now_task: Any = None,
                  continued: bool = True) -> list[str]:
    """Refuse, before anything is read, a resumed run whose settings (and task settings) change what is trained,
    naming each changed setting with the run's value and the new one; return the schedule's changes (for
    :func:`say_schedule_changed`)."""
    before, fields = saved.flat_fields(), list(now.flat_fields().items())
    if now_task is not None:
        fields += [(f.name, (now_task, f)) for f in dataclasses.fields(now_task)]
        before = {**before, **{f.name: (saved_task, f) for f in dataclasses.fields(saved_task)}}
    refused, schedule = [], []
    for name, (holder, f) in fields:
        if (name in BY_CONTENT or by_content(f) or isinstance(holder, ImplConfig)
                or (name in RESUMABLE and name not in SCHEDULE) or (continued and name in AT_START)):
            continue
        was, now_value = getattr(before[name][0], f.name), getattr(holder, f.name)
        if _comparable(name, was) != _comparable(name, now_value):
            said = (f"--cased {not was} -> {not now_value}" if name == "lowercase"  # set by its flag --cased
                    else f"{flag_of(f)} {_shown(was)} -> {_shown(now_value)}")
            (schedule if name in SCHEDULE else refused).append(said)
    if refused:
        raise UserError(f"--resume continues the run in {out} as it was started, and this changes what it trains: "
                        f"{', '.join(refused)}; a resumed run may change only its schedule "
                        "(--max-steps, --max-time, --epochs, --lr, --warmup-steps, --warmup-ratio) and how it runs")
    return schedule


def say_schedule_changed(changes: list[str]) -> None:
    if changes:
        log.warning("resuming with %s: the learning-rate schedule is recomputed from this step on with the new "
                    "values, so the run no longer reproduces an uninterrupted run of either setting",
                    ", ".join(changes))


def _comparable(name: str, value: Any) -> Any:
    """A setting's value as a resumed run compares it: a path as the file it names (./a.txt is a.txt)."""
    if name in ("init", "model_config") and isinstance(value, str) and value:
        return os.path.realpath(value)
    if name == "eval_data" and isinstance(value, list):
        return [p if p.startswith("hf:") else os.path.realpath(p) for p in value]
    return value


def file_digest(path: str) -> str | None:
    """What a fine-tuning run trains or validates on, recorded when it starts and compared on --resume before it is
    read: the sha256 of a file's bytes; a local dataset folder's file signature; None for a dataset on the hub,
    known by its name."""
    import hashlib

    from .corpus import hf_spec, input_signature

    if path.startswith("hf:") and os.path.isdir(hf_spec(path)[0]):
        return ":".join(map(str, input_signature([path])[0]))
    if not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _shown(value: Any) -> str:
    """A setting's value in a message: as a flag takes it (a path without quotes), bounded."""
    text = shown(value)
    return text[1:-1] if isinstance(value, str) and text[:1] == text[-1:] and text[:1] in "'\"" else text


def sectioned_settings(d: dict[str, Any], sections: tuple[str, ...], alias: dict[str, str] | None = None
                       ) -> dict[str, Any]:
    """A config file's settings by their flat names: the flags' names (``lr: 1e-4``), sections as a run saves
    its settings (``train: {lr: 1e-4}``), or both; what a saved run records besides its settings (the command
    that started it, what its files held, its processes) left out, so that a run is repeated from its file."""
    alias, flat = alias or {}, {}
    for k, v in d.items():
        key = k.replace("-", "_")
        if key in ("processes", CORPUS, COMMAND, TASK):
            continue
        if key in sections and isinstance(v, dict):
            flat.update({alias.get(kk.replace("-", "_"), kk.replace("-", "_")): vv for kk, vv in v.items()})
        else:
            flat[alias.get(key, key)] = v
    return flat


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
    from .train.lifecycle import recover
    from .tasks import TASKS

    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    recover(out)  # (an output an interrupted run left aside is back before a file of it is read: --config's)
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
    if "max_time" in settings:  # (as pretraining's: 90s, 30m, 2h or seconds)
        settings["max_time"] = parse_duration(settings["max_time"])
    task_settings = kind.settings_class(**{k: v for k, v in settings.items() if k in own})
    cfg = kind.config(model=model, train_file=train, validation_file=validation, out=out,
                      **{k: v for k, v in settings.items() if k not in own})
    _absolute_paths(cfg, ("model", "train_file", "validation_file"))  # (lr None: by the model's width, at the start)
    return cfg, task_settings


def finetune_file_settings(d: dict[str, Any], path: str) -> dict[str, Any]:
    """A fine-tuning ``--config`` file's settings by their flat names.  The file holds the flags' names
    (``lr: 1e-4``, ``train: file``), ``data:``/``train:``/``impl:`` sections, or is a run's own
    ``finetune_config.json`` (``{"finetune": {...}, "task": {...}}``), so a run can be repeated from it."""
    d = dict(d)
    if isinstance(d.get("finetune"), dict):  # a run's finetune_config.json
        d = {**d.pop("finetune"), **(d.pop("task", None) or {}), **d}
    flat = sectioned_settings(d, FinetuneConfig.SECTIONS, {"train": "train_file", "validation": "validation_file"})
    fields = FinetuneConfig().flat_fields()
    other = {k for k, (_, f) in fields.items() if not taken_by(f, FinetuneConfig.COMMAND)}
    changed = sorted(k for k, v in flat.items() if k in other and v != getattr(fields[k][0], fields[k][1].name))
    if changed:  # saved with their defaults in finetune_config.json; not settings of fine-tuning
        raise UserError(f"config file {path}: {', '.join(changed)} cannot be set for fine-tuning")
    return {k: v for k, v in flat.items() if k not in other}
