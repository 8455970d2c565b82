"""The model card (``README.md``) of every model directory bertforge writes: what the model is, what it
learned from, the command that made it, its figures, how to load it, and the license of the model it
started from (read from that model's own card), in the Hugging Face card format (YAML front matter).

A card travels with the model, so it holds no absolute local path (paths are shown relative to the working
directory, or by their last part), and ``base_model`` names a model anyone can fetch (a Hugging Face Hub id)
or is left out.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from . import models
from .files import json_object_or_none

COMMAND: list[str] | None = None  # the command line of this process (set by bertforge.cli.main)
CARD = "README.md"


def command_line(argv: list[str]) -> list[str]:
    """The command that ran ``bertforge ARGV``: under torchrun, torchrun's own (its nodes and processes per node;
    a rendezvous of several machines is each machine's to give)."""
    world, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if world <= 1:
        return ["bertforge", *argv]
    nodes = [f"--nnodes={world // max(1, local)}"] if world > local else []
    return ["torchrun", *nodes, f"--nproc_per_node={local}", "-m", "bertforge", *argv]


def base_license(model_dir: str | None) -> str | None:
    """The ``license`` of a model directory's own card (its README.md's front matter), if it states one."""
    if not model_dir:
        return None
    try:
        with open(os.path.join(model_dir, CARD), encoding="utf-8") as f:
            text = f.read(65536)
    except (OSError, UnicodeDecodeError):
        return None
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    if end < 0:
        return None
    import yaml

    try:
        meta = yaml.safe_load(text[3:end])
    except yaml.YAMLError:
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    return str(lic) if isinstance(lic, (str, int, float)) and str(lic).strip() else None


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # "bert-base-uncased", "org/name"
HUB_CACHE = re.compile(r"(?:^|/)models--([^/]+)/snapshots/")  # huggingface_hub's cache: models--org--name


def hub_id(model_dir: str | None) -> str | None:
    """The Hub id of a model directory, for ``base_model``: from the Hub cache's folder name, else the
    ``_name_or_path`` its config.json records when that is an id (transformers writes it on saving), else
    None (a model of one's own, in a local folder: no id to give)."""
    if not model_dir:
        return None
    found = HUB_CACHE.search(os.path.abspath(model_dir).replace(os.sep, "/"))
    if found:
        return found.group(1).replace("--", "/")
    name = (json_object_or_none(os.path.join(model_dir, "config.json")) or {}).get("_name_or_path")
    if not isinstance(name, str) or not HUB_ID.fullmatch(name) or ".." in name or os.path.exists(name):
        return None  # empty, or a local path (absolute, or a folder here)
    return name


def shown_path(path: str) -> str:
    """A path as a card shows it: relative to the working directory when under it, else its last part
    (never an absolute local path)."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return path
    rel = os.path.relpath(path)
    return rel if rel != ".." and not rel.startswith(".." + os.sep) else os.path.basename(os.path.normpath(path))


def shown_command(argv: list[str]) -> str:
    """The command line that made the model, as a card shows it: without ``--resume`` (the run it continued was
    the same command) and without absolute paths."""
    out = []
    for arg in argv:
        if arg == "--resume":
            continue
        flag, eq, value = arg.partition("=")
        out.append(f"{flag}={shown_path(value)}" if eq and flag.startswith("--") else shown_path(arg))
    return shlex.join(out)


def _without_local_paths(text: str, paths: list[str | None]) -> str:
    """``text`` with each of ``paths`` (those given as absolute, or resolved so) as :func:`shown_path` shows it."""
    found = {os.path.abspath(p) for p in paths if isinstance(p, str) and p and not p.startswith("hf:")}
    for p in sorted(found | {os.path.realpath(p) for p in found}, key=len, reverse=True):
        if len(p) > 1:  # the whole path, or a folder of a longer one
            text = re.sub(re.escape(p) + r"(?=[/\s`'\"|),;]|$)", lambda _m, p=p: shown_path(p), text)
    return text


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def render(title: str, summary: str, pipeline_tag: str, metrics: dict[str, Any], settings: dict[str, Any],
           data: list[str], base_model: str | None = None, license: str | None = None,  # noqa: A002
           load: str = "AutoModel", command: list[str] | None = None) -> str:
    """The card's text; ``base_model`` is the directory the model started from (see :func:`hub_id`);
    ``command``, the command line that made it (default: this process's)."""
    front = ["---", "library_name: transformers", f"pipeline_tag: {pipeline_tag}", "tags:", "- bert", "- bertforge"]
    if license:
        front.append(f"license: {license}")
    base_id = hub_id(base_model)
    if base_id:
        front.append(f"base_model: {base_id}")
    front.append("---")
    lines = [*front, "", f"# {title}", "", summary, ""]
    if base_model:
        lines += [f"Started from `{shown_path(base_model)}`" + (f" (`{base_id}`)" if base_id else "")
                  + (f" (license: {license}, carried over)." if license else "."), ""]
    lines += ["## Training data", ""] + [f"- `{shown_path(d)}`" for d in data if d] + [""]
    lines += ["## How it was made", ""]
    if command or COMMAND:
        argv = command or COMMAND
        lines += ["```bash", shown_command(argv), "```", ""]
        if any(shown_path(a.partition("=")[2] or a) != (a.partition("=")[2] or a) for a in argv):
            lines += ["(Paths outside the folder the command ran in are shown by their last part: give yours to "
                      "run it again.)", ""]
    else:
        lines += ["Through bertforge's Python API, with the settings below.", ""]
    shown = {k: v for k, v in settings.items() if v not in (None, "", [])}
    lines += ["| setting | value |", "|---|---|"] + [f"| {k} | {_value(v)} |" for k, v in shown.items()] + [""]
    figures = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if figures:
        lines += ["## Results", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_value(v)} |" for k, v in figures.items()] + [""]
    lines += ["## Use", "", "```python", f"from transformers import {load}", "",
              f'model = {load}.from_pretrained("path/to/this/folder")', "```", "",
              "Written by bertforge with the model; every figure above was measured by the run that made it.", ""]
    return _without_local_paths("\n".join(lines), [base_model, *data, os.getcwd()])


def write(folder: str, text: str) -> None:
    from .atomic import atomic_write_text

    atomic_write_text(os.path.join(folder, CARD), text)


# ------------------------------------------------------------------------------------------------ the runs' cards
def warned(metrics: dict) -> str:
    """The run's warnings (metrics.json's ``warnings``), for a card's summary."""
    return "".join(f"\n\n**Warning:** {w}." for w in metrics.get("warnings") or ())


def pretraining_card(cfg, objective, final: dict, command: list[str] | None) -> str:
    """A pretraining run's card: ``cfg`` its PretrainConfig, ``final`` its metrics.json."""
    from .logs import duration

    c = objective.model.config
    what, load = objective.describe()
    family = models.family(cfg.model.arch).label
    summary = (f"A {family} of {c.num_hidden_layers} layers, hidden size {c.hidden_size}, {c.num_attention_heads} "
               f"heads ({final['parameters'] / 1e6:.1f}M parameters with its training heads), pretrained "
               f"{'from ' + cfg.model.init if cfg.model.init else 'from scratch'} by {what}: {final['steps']} "
               f"steps, {final['tokens_seen']:,} tokens, {duration(final['wall_seconds'])} on {final['device']} "
               f"({final['processes']} process(es)), the {cfg.recipe} recipe.{warned(final)}")
    t, dc, mc = cfg.train, cfg.data, cfg.model
    settings = {"recipe": cfg.recipe, "objective": mc.objective, "arch": mc.arch,
                "preset": mc.model_config or mc.preset,
                "max_seq_length": dc.max_seq_length, "batch_size": t.batch_size, "lr": t.lr,
                "max_steps": t.max_steps, "max_time (s)": t.max_time, "warmup_ratio": t.warmup_ratio,
                "mask_prob": dc.mask_prob, "nsp": dc.nsp, "dropout in pretraining": mc.dropout,
                "position_init": mc.position_init, "attention_init": mc.attention_init, "seed": t.seed,
                "precision": cfg.impl.precision}
    keys = ("mlm_accuracy", "mlm_accuracy_masked", "mlm_loss", "nsp_accuracy", "disc_accuracy",
            "disc_accuracy_replaced", "disc_accuracy_original", "tokens_per_second")
    return render(f"bertforge {family} ({cfg.out.rstrip('/').split('/')[-1]})", summary, objective.pipeline_tag,
                  {k: final[k] for k in keys if k in final}, settings, list(dc.data), mc.init,
                  base_license(mc.init), load=load, command=command)


def finetuning_card(task, cfg, metrics: dict, load: str | None = None) -> str:
    """A fine-tuning run's card: ``cfg`` its FinetuneConfig, ``metrics`` its metrics.json, ``load`` the class
    that loads the model (default: the task's BERT class)."""
    import dataclasses

    from .logs import duration

    t, dc = cfg.train, cfg.data
    length = f"{t.max_steps} steps" if t.max_steps else f"{t.epochs} epoch(s)"
    if t.max_time:
        length += f" or {duration(t.max_time)} (--max-time), whichever came first"
    kept = "not evaluated (no validation data): the last weights"
    if metrics["epochs"]:
        on = f"`{dc.validation_file}`" if dc.validation_file else f"{dc.validation_split:g} of the training examples"
        kept = (f"the weights of epoch {metrics['best_epoch']} (step {metrics['best_step']}) kept, the best by "
                f"{task.select} on {on}")
    summary = f"`{cfg.model}` fine-tuned for {task.name} on `{dc.train_file}` for {length}; {kept}."
    summary = f"{summary} {task.describe()}".rstrip() + warned(metrics)
    settings = {"task": task.name, "epochs": t.epochs, "max_steps": t.max_steps, "max_time (s)": t.max_time,
                "grad_accum": t.grad_accum, "eval_every": t.eval_every, "batch_size": t.batch_size, "lr": t.lr,
                "warmup_ratio": t.warmup_ratio, "weight_decay": t.weight_decay, "max_seq_length": dc.max_seq_length,
                "max_train_examples": dc.max_train_examples, "validation_split": dc.validation_split,
                "max_eval_examples": dc.max_eval_examples, "group_by_length": dc.group_by_length,
                "seed": t.seed, "precision": cfg.impl.precision, **dataclasses.asdict(task.settings)}
    shown = {k: v for k, v in metrics.items() if k not in ("epochs", "warnings")}
    return render(f"{task.name} model fine-tuned by bertforge", summary,
                  task.pipeline_tag, shown, settings,
                  [dc.train_file, dc.validation_file], cfg.model, base_license(cfg.model),
                  load=load or task.model_class.__name__)
