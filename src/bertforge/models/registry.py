"""The model families, keyed by config.json's ``model_type`` (transformers' ``models/auto`` in small): each
family registers once what the rest of bertforge asks of it, so that nothing outside :mod:`bertforge.models`
names a family or asks which one it has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UserError, shown
from ..files import json_object_or_none
from .base import check_preset as _check_preset
from .base import config_path, read_config

# What a head class does, whatever its family: the role a task or a pipeline asks a folder's family for.
ROLES = ("encoder", "pretraining", "masked_lm", "sequence_classification", "token_classification",
         "question_answering")
# What a role's head gives at inference, by transformers' names (the outputs of an exported graph; Optimum's
# ONNX configs name them so); a pretraining folder exports as its masked LM (next sentence has no exported head).
OUTPUTS = {"encoder": ("last_hidden_state",), "pretraining": ("prediction_logits", "seq_relationship_logits"),
           "masked_lm": ("logits",),
           "sequence_classification": ("logits",), "token_classification": ("logits",),
           "question_answering": ("start_logits", "end_logits")}


@dataclass(frozen=True)
class Family:
    """One model family: its ``name`` (config.json's ``model_type``, ``--arch``), the ``label`` the logs and model
    cards give it, its config class, its head classes by role (:data:`ROLES`), its presets, and what it
    supports."""

    name: str
    label: str
    summary: str  # what it is, in --arch's help
    config_class: type
    heads: dict[str, type]
    presets: dict[str, tuple[int, int, int]]
    objectives: tuple[str, ...]  # the pretraining objectives it trains by (bertforge.objectives)
    next_sentence: bool  # a pooler and token types: next sentence prediction
    position_table: bool  # learned positions, which a new model's starting values (--position-init) set
    pretraining_dropout: float | None  # None: the model's own in pretraining; else this, unless --dropout asks
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")  # what its models read (export)

    def head(self, role: str, where: str = "the model") -> type:
        """The class of this family that does ``role``; a UserError naming ``where`` when it has none."""
        found = self.heads.get(role)
        if found is None:
            uses = ", ".join(r.replace("_", " ") for r in self.heads)
            raise UserError(f"{where} holds a {self.label}, which bertforge does not use for "
                            f"{role.replace('_', ' ')} yet ({self.label} folders: {uses})")
        return found


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> None:
    FAMILIES[family.name] = family


def family(name: str | None) -> Family:
    """The family named ``name`` (None: BERT, the default)."""
    found = FAMILIES.get(name or "bert")
    if found is None:
        raise UserError(f"unknown model family {shown(name)}; expected one of {', '.join(FAMILIES)}")
    return found


def family_of_config(config: Any) -> Family:
    """The family of a config object."""
    for f in FAMILIES.values():
        if type(config) is f.config_class:
            return f
    raise TypeError(f"no model family has config class {type(config).__name__}")


def _of_type(d: dict) -> Family:
    """The family a config.json's contents name (``model_type``): BERT when they name none of ours (BERT's
    reading then says what is wrong)."""
    return FAMILIES.get(d.get("model_type")) or family("bert")


def family_of(path: str) -> Family:
    """The family of the folder (or config.json) at ``path``, BERT when it cannot be read (the loading that
    follows says why)."""
    return _of_type(json_object_or_none(config_path(path)) or {})


def load_config(path: str) -> Any:
    """The config of the folder (or config.json) at ``path``, of its family, from one read of config.json."""
    file = config_path(path)
    d = read_config(file)
    return _of_type(d).config_class.from_file(file, d)


def role_of_config(config: Any) -> str | None:
    """The role of the head a folder of ``config`` holds, by the class its config.json names (``architectures``, as
    transformers writes it); None when it names none of its family's classes."""
    named = (getattr(config, "extra", None) or {}).get("architectures") or []
    heads = family_of_config(config).heads
    return next((role for role, cls in heads.items() if named and cls.__name__ == named[0]), None)


def head_class(config: Any, role_of: type | str, where: str = "the model") -> type:
    """The class of ``config``'s family that does what ``role_of`` does (a role, or a head class of any family)."""
    role = role_of if isinstance(role_of, str) else role_of.role
    return family_of_config(config).head(role, where)


def for_folder(path: str, role_of: type | str) -> tuple[type, Any]:
    """(the class of folder ``path``'s family that does what ``role_of`` does, the folder's config)."""
    config = load_config(path)
    return head_class(config, role_of, path), config


def check_preset(name: str, arch: str | None) -> tuple[int, int, int]:
    """(layers, hidden, heads) of preset ``name`` of family ``arch``; the error names the family that has it."""
    own = family(arch)
    others = [f for f in FAMILIES.values() if f is not own and name in f.presets]
    hint = f" (with --arch {others[0].name})" if others and name not in own.presets else ""
    return _check_preset(name, own.presets, hint)


# ------------------------------------------------------------------------------------------------ help texts
def presets_said() -> str:
    """The presets, BERT's first, then what each other family adds (``--preset``'s help)."""
    own = family("bert").presets
    more = [(f.name, [p for p in f.presets if p not in own]) for f in FAMILIES.values()]
    return ", ".join(own) + "".join(f", and with --arch {n} also {', '.join(ps)}" for n, ps in more if ps)


def families_said() -> str:
    """Each family and what it is (``--arch``'s help)."""
    return " or ".join(f"{f.name} ({f.summary})" for f in FAMILIES.values())


def pretraining_dropouts_said() -> str:
    """The families that pretrain with a dropout of their own (``--dropout``'s help)."""
    return "".join(f"; a {f.label}'s: {f.pretraining_dropout:g}, as its recipe" for f in FAMILIES.values()
                   if f.pretraining_dropout is not None)
