"""The model card (``README.md``) of every model directory bertforge writes: what the model is, what it
learned from, the command that made it, its figures, how to load it, and the license of the model it
started from (read from that model's own card), in the Hugging Face card format (YAML front matter)."""

from __future__ import annotations

import os
import shlex
from typing import Any

COMMAND: list[str] | None = None  # the command line of this process (set by bertforge.cli.main)
CARD = "README.md"


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


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def render(title: str, summary: str, pipeline_tag: str, metrics: dict[str, Any], settings: dict[str, Any],
           data: list[str], base_model: str | None = None, license: str | None = None,  # noqa: A002
           load: str = "AutoModel") -> str:
    """The card's text."""
    front = ["---", "library_name: transformers", f"pipeline_tag: {pipeline_tag}", "tags:", "- bert", "- bertforge"]
    if license:
        front.append(f"license: {license}")
    if base_model:
        front.append(f"base_model: {os.path.basename(os.path.normpath(base_model))}")
    front.append("---")
    lines = [*front, "", f"# {title}", "", summary, ""]
    if base_model:
        lines += [f"Started from `{base_model}`" + (f" (license: {license}, carried over)." if license else "."), ""]
    lines += ["## Training data", ""] + [f"- `{d}`" for d in data] + [""]
    lines += ["## How it was made", ""]
    if COMMAND:
        lines += ["```bash", shlex.join(COMMAND), "```", ""]
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
    return "\n".join(lines)


def write(folder: str, text: str) -> None:
    from .atomic import atomic_write_text

    atomic_write_text(os.path.join(folder, CARD), text)
