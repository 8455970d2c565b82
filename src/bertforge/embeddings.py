"""Sentence embeddings from any BERT directory, and the sentence-transformers folder layout.

A model directory that sentence-transformers made (``modules.json``, ``1_Pooling/config.json``,
``sentence_bert_config.json``) says how it embeds a text: its pooling, whether it normalises, the tokens it
reads; :func:`read_settings` reads those files (the classic keys of every version since 2.x and 6.x's
``pooling_mode`` alike), never guessing.  A plain BERT directory embeds by the mean of its last layer over the
real tokens, L2-normalised.  :func:`write_settings` writes the classic layout beside a model that
``finetune embed`` saves, so that ``SentenceTransformer(folder)`` loads it and returns the same vectors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from .errors import UserError, shown
from .evaluation import by_length
from .files import json_object_or_none, read_json, read_json_object
from .tokenizer import copy_of

POOLINGS = ("mean", "cls")
# what finetune embed writes beside the model (the output rules list them as the run's own)
ST_FILES = frozenset({"modules.json", "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling",
                      "2_Normalize"})


@dataclass
class EmbeddingSettings:
    """How a directory turns a text into a vector."""

    pooling: str = "mean"  # mean of the last layer over real tokens, or the [CLS] token's state
    normalize: bool = True  # L2-normalised
    max_seq_length: int | None = None  # tokens read of a text (None: the model's positions)
    do_lower_case: bool = False  # sentence-transformers lower-cases the text itself before tokenizing


def read_settings(path: str) -> EmbeddingSettings | None:
    """The embedding settings of sentence-transformers folder ``path``; None when it is a plain BERT directory.
    A pooling other than mean or [CLS], or modules besides Transformer, Pooling and Normalize, are refused."""
    modules_file = os.path.join(path, "modules.json")
    if not os.path.isfile(modules_file):
        return None
    modules = read_json(modules_file, "sentence-transformers modules")
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise UserError(f"{modules_file}: expected a list of modules, each with a 'type'")
    types = [m["type"].rsplit(".", 1)[-1] for m in modules]  # (6.x moved the classes: the names stayed)
    if types not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise UserError(f"{path}: sentence-transformers modules {', '.join(types) or 'none'}; bertforge embeds with a "
                        "Transformer, a Pooling (mean or CLS) and optionally Normalize, in that order")
    settings = EmbeddingSettings(normalize="Normalize" in types)
    pooling_path = modules[1].get("path") or ""
    if not isinstance(pooling_path, str):
        raise UserError(f"{modules_file}: the Pooling module's path is {shown(pooling_path)}, not a folder's name")
    pool = read_json(os.path.join(path, pooling_path, "config.json"), "pooling configuration")
    mode = pool.get("pooling_mode") if isinstance(pool, dict) else None  # 6.x writes one string (or a list)
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode is None and isinstance(pool, dict):
        modes = [k for k in ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
                 if pool.get(f"pooling_mode_{k}_token" if k == "cls" else f"pooling_mode_{k}_tokens")
                 or (k == "lasttoken" and pool.get("pooling_mode_lasttoken"))]
        mode = modes[0] if len(modes) == 1 else "mean" if not modes else None  # none set: mean, as ST reads it
    if mode not in POOLINGS:
        raise UserError(f"{path}: pooling {shown(mode)} in {pooling_path or '.'}/config.json; bertforge embeds by the "
                        "mean or the [CLS] token")
    settings.pooling = mode
    # (as SentenceTransformer reads these: a file it cannot read is no file to skip)
    sbc = os.path.join(path, "sentence_bert_config.json")
    d = read_json_object(sbc, "sentence-transformers settings") if os.path.isfile(sbc) else {}
    settings.do_lower_case = bool(d.get("do_lower_case", False))
    if d.get("max_seq_length") is not None and not (isinstance(d["max_seq_length"], int) and d["max_seq_length"] > 0):
        raise UserError(f"{sbc}: max_seq_length {shown(d['max_seq_length'])} is not a positive integer")
    st = os.path.join(path, "config_sentence_transformers.json")
    prompt = (read_json_object(st, "sentence-transformers settings") if os.path.isfile(st) else {}) \
        .get("default_prompt_name")
    if prompt is not None:
        raise UserError(f"{st}: a default prompt ({shown(prompt)}) goes before every text in sentence-transformers; "
                        "bertforge embeds texts as they are given")
    # the classic key; 6.x keeps the length as the tokenizer's model_max_length
    for length in (d.get("max_seq_length"), (json_object_or_none(os.path.join(path, "tokenizer_config.json")) or {})
                   .get("model_max_length")):
        if isinstance(length, int) and 2 < length < 1_000_000:  # (transformers writes 1e30 for "no limit")
            settings.max_seq_length = length
            break
    return settings


def module_settings(path: str) -> list[str]:
    """The settings of the modules that sentence-transformers folder ``path`` keeps in folders of their own, as its
    modules.json lists them (``1_Pooling/config.json``), as paths inside it; none for a plain BERT folder."""
    try:
        with open(os.path.join(path, "modules.json"), encoding="utf-8") as f:
            modules = json.load(f)
    except (OSError, ValueError):
        return []
    found = []
    for m in modules if isinstance(modules, list) else []:
        sub = os.path.normpath(m["path"]) if isinstance(m, dict) and isinstance(m.get("path"), str) else "."
        inside = sub not in (".", "") and not os.path.isabs(sub) and not sub.startswith("..")
        if inside and os.path.isfile(os.path.join(path, sub, "config.json")):
            found.append(os.path.join(sub, "config.json"))
    return found


def settings_of(path: str, pooling: str | None = None) -> EmbeddingSettings:
    """How directory ``path`` embeds: its sentence-transformers settings, else mean pooling, normalised;
    ``pooling`` overrides the folder's."""
    settings = read_settings(path) or EmbeddingSettings()
    if pooling is not None:
        if pooling not in POOLINGS:
            raise UserError(f"--pooling must be one of {', '.join(POOLINGS)}, not {shown(pooling)}")
        settings.pooling = pooling
    return settings


def write_settings(folder: str, settings: EmbeddingSettings, hidden_size: int) -> None:
    """sentence-transformers' classic folder layout beside the model files of ``folder`` (read by every
    version since 2.x): Transformer (the folder itself), Pooling, and Normalize when the embeddings are."""
    st = "sentence_transformers.models."  # the classic names, which 6.x still reads
    modules = [{"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"}]
    if settings.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"})
        os.makedirs(os.path.join(folder, "2_Normalize"), exist_ok=True)
    pooling = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": settings.pooling == "cls",
               "pooling_mode_mean_tokens": settings.pooling == "mean", "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    os.makedirs(os.path.join(folder, "1_Pooling"), exist_ok=True)
    files = {"modules.json": modules, "1_Pooling/config.json": pooling,
             "sentence_bert_config.json": {"max_seq_length": settings.max_seq_length,
                                           "do_lower_case": settings.do_lower_case}}
    for name, obj in files.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, settings: EmbeddingSettings) -> torch.Tensor:
    """(B, T, C) last layer -> (B, C) sentence vectors: the mean over real tokens (``hidden`` holds zeros at
    padding) or the [CLS] state; L2-normalised when the settings say so."""
    if settings.pooling == "cls":
        x = hidden[:, 0]
    else:
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        x = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (B, C)
    return F.normalize(x, dim=-1) if settings.normalize else x


def tokenize(tok: Tokenizer, texts: list[str], settings: EmbeddingSettings, max_length: int) -> list[dict]:
    """Token ids of each text, cut at ``max_length`` tokens ([CLS] and [SEP] included) as sentence-transformers
    cuts them."""
    t = copy_of(tok, max_length)
    texts = [x.lower() for x in texts] if settings.do_lower_case else list(texts)
    return [{"input_ids": e.ids, "token_type_ids": [0] * len(e.ids)} for e in t.encode_batch(texts)]


def encode(model, features: list[dict], pad_id: int, device, settings: EmbeddingSettings, batch_size: int = 64,
           desc: str | None = None) -> np.ndarray:
    """(N, C) float32 vectors of ``features`` through ``model`` (a :class:`~bertforge.models.bert.BertModel`), in
    batches sorted by length."""
    def fn(out, b):
        return pool(out.last_hidden_state.float(), b["attention_mask"], settings).cpu().numpy()

    rows = by_length(model, features, pad_id, device, batch_size, fn, desc)
    C = model.config.hidden_size
    return np.asarray(rows, dtype=np.float32).reshape(len(features), C)
