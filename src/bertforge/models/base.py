"""What every model family shares (transformers' ``PretrainedConfig`` and ``PreTrainedModel`` in small): the
config.json base, with its label maps and the type and range checks of its sizes, one base class for the
models (loading, saving, tying, the token embeddings, the parameter count), and the output types.  A family
(:mod:`bertforge.models.bert`, :mod:`bertforge.models.modernbert`) brings its own fields, modules and
initialisation, and registers itself (:mod:`bertforge.models.registry`)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn

from .. import checkpoint
from ..errors import UserError, require_type, shown
from ..files import read_json_object


# ------------------------------------------------------------------------------------------------ config
def check_preset(name: str, presets: dict[str, tuple[int, int, int]], hint: str = "") -> tuple[int, int, int]:
    """(layers, hidden, heads) of preset ``name`` among a family's ``presets``; ``hint`` follows the error's name."""
    if name not in presets:
        raise UserError(f"unknown preset {shown(name)}{hint}; expected one of {', '.join(presets)}")
    return presets[name]


class ModelConfigJson:
    """A model family's config.json: each family writes its own keys (``to_dict``/``from_dict``); the fields,
    saving and loading, the label maps and the type and range checks of the sizes are shared.

    A family's config names its fields by kind: ``sizes`` (integers of at least 1), ``fractions`` (dropouts, in
    [0, 1) or None) and ``positives`` (floats above 0); :meth:`check_fields` checks them, before any size is
    used, in the family's ``__post_init__``."""

    extra: dict[str, Any]
    id2label: dict[int, str] | None
    label2id: dict[str, int] | None
    model_type: ClassVar[str]  # config.json's
    display_name: ClassVar[str]  # the family's, in messages
    dropout_fields: ClassVar[tuple[str, str]]  # the hidden states' dropout, the attention probabilities'
    sizes: ClassVar[tuple[str, ...]] = ()
    fractions: ClassVar[tuple[str, ...]] = ()
    positives: ClassVar[tuple[str, ...]] = ()

    def check_fields(self) -> None:
        """The shared checks: every size, dropout and positive number of its kind, the heads dividing the hidden
        size, and the label maps (id2label's keys label ids; label2id made from it when absent)."""
        for name in self.sizes:
            require_type(getattr(self, name), int, name, at_least=1)
        for name in self.fractions:
            v = getattr(self, name)
            if v is not None and not 0 <= require_type(v, float, name) < 1:
                raise UserError(f"{name} must be in [0, 1), not {shown(v)}")
        for name in self.positives:
            if not require_type(getattr(self, name), float, name) > 0:
                raise UserError(f"{name} must be positive, not {shown(getattr(self, name))}")
        hidden, heads = getattr(self, "hidden_size"), getattr(self, "num_attention_heads")
        if hidden % heads:
            raise UserError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        require_type(self.id2label, dict | None, "id2label")
        if self.id2label and not all(isinstance(k, int) or str(k).isdigit() for k in self.id2label):
            raise UserError(f"id2label's keys must be label ids (integers), not {shown(list(self.id2label))}")
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if sorted(self.id2label) != list(range(len(self.id2label))):  # (the head's rows: one per id, from 0)
                raise UserError(f"id2label's keys must be the ids 0 to {len(self.id2label) - 1}, not "
                                f"{shown(sorted(self.id2label))}")
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        require_type(self.label2id, dict | None, "label2id")
        if self.label2id and not all(isinstance(v, int) or str(v).isdigit() for v in self.label2id.values()):
            raise UserError(f"label2id's values must be label ids (integers), not "
                            f"{shown(list(self.label2id.values()))}")
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}

    @property
    def dropouts(self) -> tuple[float, float]:
        """(the hidden states' dropout, the attention probabilities'), whatever the family calls them."""
        return getattr(self, self.dropout_fields[0]), getattr(self, self.dropout_fields[1])

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    def adopt_special_ids(self, ids) -> None:
        """A new model's config takes its tokenizer's special ids (``ids``: :class:`~bertforge.tokenizer.SpecialIds`)
        where its family records them; BERT's records none but the padding's, which stays at its default."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """A config from config.json's keys: the family's own checks and renamings (:meth:`read_fields`), a token id
        of null left at its default, and every key not ours kept (``extra``)."""
        d = dict(d)
        model_type = d.pop("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise UserError(f"config model_type is {shown(model_type)}, not {cls.model_type!r}")
        kw = cls.read_fields(d)
        for name in [k for k, v in kw.items() if k.endswith("_token_id") and v is None]:
            kw.pop(name)
        labels = d.pop("num_labels", None)  # (transformers writes it beside id2label, which implies it)
        if labels is not None:
            if not isinstance(labels, int) or isinstance(labels, bool) or labels < 1:
                raise UserError(f"num_labels must be a positive integer, not {shown(labels)}")
            if kw.get("id2label") is None and labels != 2:  # (two: the default, with no names)
                kw["id2label"] = {i: f"LABEL_{i}" for i in range(labels)}  # (transformers' names)
            elif kw.get("id2label") is not None and len(kw["id2label"]) != labels:
                raise UserError(f"num_labels {labels} and the {len(kw['id2label'])} labels of id2label disagree")
        try:
            config = cls(**kw, extra=d)
        except TypeError as e:  # a field of the wrong type
            raise UserError(f"invalid {cls.display_name} config: {e}") from None
        problem, n = d.get("problem_type"), config.num_labels
        if problem is not None and problem != ("regression" if n == 1 else "single_label_classification"):
            raise UserError(f"problem_type {shown(problem)} with {n} label(s) is not supported: bertforge's "
                            "classifiers give a text one of several labels or, with one label, a score (regression)")
        # (a new model's default may lie outside a small vocabulary until its tokenizer's ids are adopted)
        if not 0 <= require_type(config.pad_token_id, int, "pad_token_id") < config.vocab_size:
            raise UserError(f"pad_token_id {config.pad_token_id} must be a token id below vocab_size "
                            f"{config.vocab_size}")
        return config

    @classmethod
    def read_fields(cls, d: dict[str, Any]) -> dict[str, Any]:
        """The fields' values, taken out of ``d``; a family checks or renames its keys around this."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}  # type: ignore[arg-type]
        return {k: d.pop(k) for k in list(d) if k in names}

    def fields_dict(self, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """The unread keys, then every field but ``extra`` and ``skip`` (the label maps when set, id2label's
        keys as strings, as JSON holds them)."""
        d: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == "extra" or f.name in skip or (f.name in ("id2label", "label2id") and v is None):
                continue
            d[f.name] = {str(k): lab for k, lab in v.items()} if f.name == "id2label" else v
        return d

    def to_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, path: str, architectures: list[str] | None = None) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(architectures), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> Any:
        """The config of the folder (or config.json) at ``path``, as this family reads it."""
        file = config_path(path)
        return cls.from_file(file, read_config(file))

    @classmethod
    def from_file(cls, file: str, d: dict[str, Any]) -> Any:
        """The config that ``d``, the contents of config.json ``file``, describes; an error names the file."""
        try:
            return cls.from_dict(d)
        except UserError as e:  # the file is what a user needs to know
            raise UserError(f"{file}: {e}") from None


def config_path(path: str) -> str:
    """The config.json of a model folder, or ``path`` itself when it names the file."""
    return os.path.join(path, "config.json") if os.path.isdir(path) else path


def read_config(file: str) -> dict[str, Any]:
    """The object a config.json holds (one read of it); a UserError when it is missing or no JSON object."""
    if not os.path.isfile(file):
        raise UserError(f"no config.json at {file}")
    return read_json_object(file, "config.json")


# ------------------------------------------------------------------------------------------------ outputs
@dataclass
class BaseModelOutput:
    last_hidden_state: torch.Tensor  # (B, T, C)
    pooler_output: torch.Tensor | None = None  # (B, C)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None = None  # mlm_loss + nsp_loss, each present when its labels are given
    prediction_logits: torch.Tensor | None = None  # (B, T, V), or (N_labelled, V) when sparse
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


@dataclass
class MaskedLMOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, V), or (N_labelled, V) when sparse


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, num_labels)


@dataclass
class TokenClassifierOutput:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None  # (B, T, num_labels)


@dataclass
class QuestionAnsweringOutput:
    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)


def span_output(start_logits, end_logits, attention_mask, start_positions, end_positions) -> QuestionAnsweringOutput:
    """A span head's output from its (B, T) start and end logits: padding is no answer (the dtype's lowest, out of
    the loss's softmax and of any probability); the loss when both positions are given."""
    if attention_mask is not None:
        pad, lowest = ~attention_mask.bool(), torch.finfo(start_logits.dtype).min
        start_logits, end_logits = start_logits.masked_fill(pad, lowest), end_logits.masked_fill(pad, lowest)
    loss = None
    if start_positions is not None and end_positions is not None:
        T = start_logits.shape[1]  # as transformers: positions outside the input are clamped to T and ignored
        s, e = start_positions.reshape(-1).clamp(0, T), end_positions.reshape(-1).clamp(0, T)
        loss = (nn.functional.cross_entropy(start_logits, s, ignore_index=T)
                + nn.functional.cross_entropy(end_logits, e, ignore_index=T)) / 2
    return QuestionAnsweringOutput(loss, start_logits.contiguous(), end_logits.contiguous())


# ------------------------------------------------------------------------------------------------ models
class PreTrainedModel(nn.Module):
    """Loading, saving, tying and the token embeddings of every family's models.  A family's base sets
    ``config_class``, ``base_model_prefix`` (the encoder's attribute in task models, its checkpoints' prefix),
    ``encoder_prefixes`` (a bare encoder's names), ``embeddings_name`` (the token table's attribute in its
    embeddings) and ``_init_weights``; a head sets ``head_prefixes`` (weights a checkpoint may lack: the task
    head, freshly initialised), and a family says which output layer is tied to the embeddings
    (``tied_decoder``)."""

    config_class: ClassVar[type]
    base_model_prefix: ClassVar[str]
    encoder_prefixes: ClassVar[tuple[str, ...]]
    embeddings_name: ClassVar[str]
    head_prefixes: ClassVar[tuple[str, ...]] = ()
    head_weight: ClassVar[str] = ""  # a weight that a folder able to do this class's job stores (pipelines check it)

    def __init__(self, config):
        super().__init__()
        self.config = config

    def _init_weights(self, module: nn.Module) -> None:
        raise NotImplementedError

    def init_weights(self) -> None:
        self.apply(self._init_weights)
        self.tie_weights()

    def tied_decoder(self) -> nn.Linear | None:
        """The output layer tied to the token embeddings (None: this model has none, or its config unties it)."""
        return None

    def tie_weights(self) -> None:
        """Tie the masked-LM decoder to the token embeddings (no-op for models without one)."""
        decoder = self.tied_decoder()
        if decoder is not None:
            decoder.weight = self.get_input_embeddings().weight

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding table (transformers' name for it, in every family)."""
        return getattr(self.base_model.embeddings, self.embeddings_name)

    def set_input_embeddings(self, table: nn.Embedding) -> None:
        setattr(self.base_model.embeddings, self.embeddings_name, table)

    def grow_output_layer(self, rows) -> None:
        """With a masked-LM head, its output layer grown to the token table's new rows (the table is grown first):
        ``rows(t)`` is a weight or bias ``t`` with the new rows appended.  Without one, nothing."""

    @property
    def base_model(self) -> nn.Module:
        return getattr(self, self.base_model_prefix, self)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, path, config=None, reinit_head: bool = False, **kw):
        """Load a model directory (ours or transformers', a task model's or a bare encoder's, with or without the
        encoder's prefix); a head the directory lacks starts fresh and is reported
        (:func:`bertforge.checkpoint.load_pretrained`)."""
        return checkpoint.load_pretrained(cls, path, config=config, reinit_head=reinit_head, **kw)

    def save_pretrained(self, path, tokenizer=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (and tokenizer files) atomically to ``path``."""
        checkpoint.save_pretrained(self, path, tokenizer=tokenizer)
