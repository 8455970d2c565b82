"""Model directories and training checkpoints: reading and writing them, safely.

* A model directory is a Hugging Face BERT directory: ``config.json``, ``model.safetensors`` and the
  tokenizer files; transformers loads ours and we load theirs, with or without the ``bert.`` prefix.
* A training checkpoint (``DIR/checkpoints/step-NNNNNNNN/``) holds the weights (``model.safetensors``), the
  optimizer state (``optimizer.pt``) and the training state (``trainer_state.pt``: step, clock, data
  position, RNG states, meters; a readable copy in ``trainer_state.json``).
* Weights are safetensors, never pickle.  ``optimizer.pt`` and ``trainer_state.pt`` are torch pickles of
  tensors and plain values, read back with ``torch.load(weights_only=True)``, which refuses anything else.
  No code from a model directory is executed.
* Every write goes through a temporary file or folder that is renamed into place (:mod:`bertforge.files`).

This module knows models only through what every model family's base class has (``config``,
``config_class``, ``state_dict``, ``base_model_prefix``, ``encoder_prefixes``, ``head_prefixes``): it imports
nothing from :mod:`bertforge.models`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from .atomic import atomic_dir, fault_point, follow_umask, fsync, write_file
from .errors import UserError, require_type, shown

log = logging.getLogger("bertforge")

WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
# non-persistent buffers that some checkpoints carry
_BUFFER_SUFFIXES = ("embeddings.position_ids", "embeddings.token_type_ids")
_TIED = "cls.predictions.decoder.weight"


# ------------------------------------------------------------------------------------------------ save
def tied_keys(model: torch.nn.Module) -> set[str]:
    """State-dict keys that are views of other parameters: left out when saving, restored by tying."""
    own = getattr(model, "tied_keys", None)
    return {_TIED} | (own() if callable(own) else set())


def model_state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict as written: transformers' names, tied weights left out (as transformers does)."""
    sd = model.state_dict()
    for k in tied_keys(model):
        sd.pop(k, None)
    return {k: v.detach().to("cpu").contiguous() for k, v in sd.items()}


def write_model_files(model, folder: str, tokenizer=None) -> None:
    """Write config.json, model.safetensors and tokenizer files into an existing folder (not atomic)."""
    if hasattr(model, "config_dict"):  # a model that is not a BERT (ELECTRA's generator)
        with open(os.path.join(folder, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(model.config_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
    else:
        model.config.save(os.path.join(folder, CONFIG_NAME), architectures=[type(model).__name__])
    _save_weights(model_state_for_saving(model), os.path.join(folder, WEIGHTS_NAME), {"format": "pt"})
    if tokenizer is not None:
        from .tokenizer import save_tokenizer

        save_tokenizer(tokenizer, folder)


def save_pretrained(model, path: str, tokenizer=None) -> None:
    """Save a model directory at ``path`` atomically.

    A new ``path`` appears whole or not at all.  An existing ``path`` (a pretraining output folder, with
    metrics and checkpoints beside the model) keeps its other files: each model file is replaced by an
    atomic rename of a complete file.
    """
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        with atomic_dir(path) as tmp:
            write_model_files(model, tmp, tokenizer)
        return
    tmp = tempfile.mkdtemp(prefix=".save-tmp-", dir=path)
    try:
        write_model_files(model, tmp, tokenizer)
        fault_point("write", path)
        for name in sorted(os.listdir(tmp)):
            src = os.path.join(tmp, name)
            follow_umask(src)
            fsync(src)
            os.replace(src, os.path.join(path, name))
            fault_point("rename", os.path.join(path, name))
        fsync(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ load
def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """Read the safetensors weights of a model directory (single file or sharded)."""
    single = os.path.join(path, WEIGHTS_NAME)
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    try:
        if os.path.isfile(single):
            return load_file(single)
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                names = json.load(f)["weight_map"].values()
            shards = sorted(set(names))
            if not all(isinstance(n, str) and n and os.path.basename(n) == n for n in shards):
                raise UserError(f"{index}: its weight_map must name shard files of the folder, not "
                                f"{shown(shards[:3])}")
            sd: dict[str, torch.Tensor] = {}
            for shard in shards:
                sd.update(load_file(os.path.join(path, shard)))
            return sd
    except (SafetensorError, OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"cannot read weights in {path}: {e}") from None
    require_weights(path)
    raise UserError(f"no model.safetensors in {path}")


def require_weights(path: str) -> None:
    """Raise UserError unless the model directory ``path`` holds safetensors weights (checked before a run
    reads its data, so that a folder without them fails at once)."""
    if os.path.isfile(os.path.join(path, WEIGHTS_NAME)) or os.path.isfile(os.path.join(path, WEIGHTS_INDEX_NAME)):
        return
    if any(os.path.isfile(os.path.join(path, n)) for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")):
        raise UserError(
            f"{path} has no model.safetensors; bertforge reads safetensors only (pickled weights can run code). "
            "Convert it with transformers: AutoModel.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    raise UserError(f"no model.safetensors in {path}")


def normalize_state_dict(sd: dict[str, torch.Tensor], cls, is_task_model: bool) -> dict[str, torch.Tensor]:
    """Map a checkpoint's names onto those of model class ``cls``: old ``gamma``/``beta`` LayerNorm names,
    buffers, tied decoder weights, and the encoder's prefix (``bert.``, ``model.``) that a bare encoder's
    checkpoint (all-MiniLM-L6-v2) lacks and a task model's has."""
    prefix = cls.base_model_prefix + "."
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if k.endswith(_BUFFER_SUFFIXES) or k == _TIED:
            continue
        if is_task_model and k.startswith(cls.encoder_prefixes):
            k = prefix + k
        elif not is_task_model and k.startswith(prefix):
            k = k[len(prefix) :]
        out[k] = v
    if "cls.predictions.decoder.bias" in out:
        bias = out.pop("cls.predictions.decoder.bias")
        out.setdefault("cls.predictions.bias", bias)
    return out


def load_pretrained(cls, path, config=None, reinit_head: bool = False, map_location="cpu"):
    """Build ``cls`` from a model directory.  See :meth:`BertPreTrainedModel.from_pretrained`.

    Weights the checkpoint lacks are allowed only for the task head (``cls.head_prefixes``), which is then
    freshly initialised and reported.  Missing encoder weights, or any shape that does not fit, raise one
    UserError naming them (with ``reinit_head``, head weights of the wrong shape are re-initialised instead,
    e.g. a classifier fine-tuned again on a different label set).
    """
    path = os.fspath(require_type(path, (str, os.PathLike), "path"))
    if not os.path.isdir(path):
        raise UserError(f"model directory not found: {path}")
    config = config or cls.config_class.load(path)
    model = cls(config)
    is_task_model = hasattr(model, cls.base_model_prefix)  # BertForX wraps self.bert; a bare BertModel does not
    sd = normalize_state_dict(read_state_dict(path), cls, is_task_model)
    expected = model.state_dict()
    for k in tied_keys(model):
        expected.pop(k, None)
    heads = cls.head_prefixes

    def is_head(k: str) -> bool:
        return k.startswith(heads)

    mismatched = [k for k in sd if k in expected and sd[k].shape != expected[k].shape]
    if mismatched and reinit_head and all(is_head(k) for k in mismatched):
        for k in mismatched:
            del sd[k]
        mismatched = []
    if mismatched:
        detail = ", ".join(f"{k} {tuple(sd[k].shape)} vs {tuple(expected[k].shape)}" for k in mismatched[:6])
        raise UserError(f"weights in {path} do not fit {cls.__name__} (checkpoint vs model): {detail}")
    missing = [k for k in expected if k not in sd]
    fatal = [k for k in missing if not is_head(k)]
    if fatal:
        more = f" and {len(fatal) - 6} more" if len(fatal) > 6 else ""
        raise UserError(f"{path} lacks weights that {cls.__name__} needs: {', '.join(fatal[:6])}{more}")
    unused = sorted(k for k in sd if k not in expected)
    for k in unused:
        del sd[k]
    model.load_state_dict(sd, strict=False)
    model.tie_weights()
    model.loading_info = {"newly_initialized": missing, "unused": unused}
    # the bare encoder's pooler is read by no task that loads the encoder alone (embeddings pool the last layer)
    said = [k for k in missing if not (getattr(cls, "role", None) == "encoder" and k.startswith("pooler."))]
    if said:
        log.warning("%s: newly initialised from %s (train before use): %s", cls.__name__, path, ", ".join(said))
    if unused:
        log.debug("%s: weights in %s not used: %s", cls.__name__, path, ", ".join(unused))
    return model.to(map_location)


def checkpoint_keys(path: str) -> set[str]:
    """Names of the tensors stored in a model directory (without reading the tensors)."""
    single = os.path.join(path, WEIGHTS_NAME)
    index = os.path.join(path, WEIGHTS_INDEX_NAME)
    try:
        if os.path.isfile(single):
            with safe_open(single, "pt") as f:
                return set(f.keys())
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as f:
                return set(json.load(f)["weight_map"])
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"cannot read weights in {path}: {e}") from None
    return set()


def has_weight(path: str, name: str) -> bool:
    """Whether a model directory stores ``name`` (with or without an encoder's ``bert.`` or ``model.``
    prefix), read without loading."""
    keys = checkpoint_keys(path)
    return name in keys or f"bert.{name}" in keys or f"model.{name}" in keys


# ------------------------------------------------------------------------------------------------ training
CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def list_checkpoints(out: str) -> list[tuple[int, str]]:
    """Complete checkpoints in ``out``, oldest first (temporary folders of an interrupted save are ignored)."""
    folder = os.path.join(out, CHECKPOINTS)
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        m = _STEP_DIR.match(name)
        if m and os.path.isfile(os.path.join(folder, name, "trainer_state.pt")):
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return sorted(found)


def _save_weights(tensors: dict[str, torch.Tensor], path: str, metadata: dict | None = None) -> None:
    """safetensors, written by us (:func:`~bertforge.atomic.write_file`)."""
    write_file(path, lambda f: f.write(safetensors_bytes(tensors, metadata=metadata)))


def save_checkpoint(out: str, step: int, model, engine_state: dict, run_state: dict, keep: int,
                    extra_weights: dict[str, dict[str, torch.Tensor]] | None = None) -> str:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep``: the weights, the engine's state
    (:meth:`~bertforge.train.engine.Engine.state_dict`: the optimizer in ``optimizer.pt``, the rest with the run's own
    ``run_state`` in ``trainer_state.pt``), and each of ``extra_weights`` as ``NAME.safetensors``."""
    final = os.path.join(out, CHECKPOINTS, f"step-{step:08d}")
    state = {**engine_state["train"], "rng": engine_state["rng"], "generators": engine_state["generators"],
             **run_state}
    if "scaler" in engine_state:
        state["scaler"] = engine_state["scaler"]
    with atomic_dir(final) as tmp:
        _save_weights(model_state_for_saving(model), os.path.join(tmp, WEIGHTS_NAME), {"format": "pt"})
        fault_point("write", os.path.join(final, WEIGHTS_NAME))
        for name, tensors in (extra_weights or {}).items():
            _save_weights({k: v.contiguous() for k, v in tensors.items()}, os.path.join(tmp, f"{name}.safetensors"))
            fault_point("write", os.path.join(final, f"{name}.safetensors"))
        write_file(os.path.join(tmp, "optimizer.pt"), lambda f: torch.save(engine_state["optimizer"], f))
        fault_point("write", os.path.join(final, "optimizer.pt"))
        write_file(os.path.join(tmp, "trainer_state.pt"), lambda f: torch.save(state, f))
        fault_point("write", os.path.join(final, "trainer_state.pt"))
        readable = {k: v for k, v in state.items() if isinstance(v, (int, float, str, dict)) and k != "rng"}
        with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump(readable, f, indent=2, default=str)
        fault_point("write", os.path.join(final, "trainer_state.json"))
    for _, old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _read(path: str) -> tuple[dict, dict, dict]:
    """(weights, optimizer state, trainer state) of checkpoint folder ``path``."""
    weights = load_file(os.path.join(path, WEIGHTS_NAME))
    opt_state = torch.load(os.path.join(path, "optimizer.pt"), weights_only=True, map_location="cpu")
    state = torch.load(os.path.join(path, "trainer_state.pt"), weights_only=True, map_location="cpu")
    return weights, opt_state, state


def _engine_state(opt_state: dict, state: dict) -> dict:
    """The engine's part of a checkpoint, as :meth:`~bertforge.train.engine.Engine.load_state_dict` takes it."""
    # TrainState's keys, as the save flattened them in (an untimed run's older checkpoints have no time_progress)
    train = {k: state[k] for k in ("step", "elapsed", "time_progress", "tokens_seen", "meters") if k in state}
    return {"optimizer": opt_state, "train": train, "rng": state["rng"], "generators": state["generators"],
            "scaler": state.get("scaler")}


def restore_newest(out: str, model, required: tuple[str, ...] = ()) -> tuple[int, str, dict, dict]:
    """Load into ``model`` the newest checkpoint in ``out`` that reads whole (its state holding the ``required``
    keys); return (step, folder, the engine's state, the whole trainer state).  Newer ones that do not read
    (a save interrupted by a kill, a truncated file) are moved aside as ``.damaged-*``, with a warning, and
    never considered again.  A checkpoint that reads but does not fit the model is an error, never damage.
    A ``step-N`` that is no checkpoint folder at all (a file, a link, a folder without its state) is moved aside
    too, so that the run's own save of step N later has nothing to replace."""
    set_aside_incomplete(out)
    for step, path in reversed(list_checkpoints(out)):
        try:
            weights, opt_state, state = _read(path)
            missing = [k for k in ("rng", "generators", *required) if k not in state]
            if missing:
                raise KeyError(f"no {', '.join(missing)} in its state")
        except Exception as e:  # a truncated or corrupt file of an interrupted or damaged save
            aside = _set_aside(path)
            log.warning("skipping checkpoint %s, which does not load (%s: %s); moved to %s", path,
                        type(e).__name__, str(e)[:200], aside)
            continue
        _apply(path, model, weights)
        return step, path, _engine_state(opt_state, state), state
    raise UserError(f"no checkpoint in {os.path.join(out, CHECKPOINTS)} loads; nothing to resume")


def _set_aside(path: str) -> str:
    """Move a damaged checkpoint to ``.damaged-step-N-TIME`` beside it: kept for inspection, never considered
    again, and never in the way of a new save of its step."""
    aside = os.path.join(os.path.dirname(path), f".damaged-{os.path.basename(path)}-{int(time.time())}")
    while os.path.lexists(aside):
        aside += "-"
    os.rename(path, aside)
    return aside


def set_aside_incomplete(out: str) -> None:
    """Move aside every ``step-N`` in ``out`` that is no whole checkpoint folder (:func:`_set_aside`)."""
    folder = os.path.join(out, CHECKPOINTS)
    listed = {path for _, path in list_checkpoints(out)}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        path = os.path.join(folder, name)
        if _STEP_DIR.match(name) and (path not in listed or os.path.islink(path)):
            log.warning("%s is not a whole checkpoint (the remains of a damaged one); moved to %s", path,
                        _set_aside(path))


def _apply(path: str, model, weights: dict) -> None:
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except Exception as e:  # shapes of another model
        raise UserError(f"checkpoint {path} does not fit this run's model ({' '.join(str(e).split())[:200]})") from None
    if unexpected or [k for k in missing if k not in tied_keys(model)]:
        raise UserError(f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()


def load_checkpoint(path: str, model) -> tuple[dict, dict]:
    """Load checkpoint folder ``path`` into ``model``; return (the engine's state, the whole trainer state)."""
    weights, opt_state, state = _read(path)
    _apply(path, model, weights)
    return _engine_state(opt_state, state), state
