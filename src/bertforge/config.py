"""Configuration, split by concern as in cramming: the architecture (:class:`BertConfig`), and for each
command its data, training and implementation settings (dataclasses below).  Every one of them is plain
data, saved as JSON inside each checkpoint and model directory, and read back with ``from_dict``.

``BertConfig`` uses transformers' field names and writes a ``config.json`` that
``transformers.BertConfig`` reads, so that model directories interchange both ways.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

# name -> (layers, hidden, heads); intermediate = 4 x hidden.  tiny/mini/small/medium are the sizes of
# Turc et al. (2019) "Well-Read Students Learn Better"; base is BERT-base.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
}

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass
class BertConfig:
    """The BERT architecture.  Field names are transformers' so that ``config.json`` interchanges."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    initializer_range: float = 0.02
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    label2id: dict[str, int] | None = None
    # Keys of a config.json we do not interpret (transformers_version, use_cache, ...), kept so that a
    # directory we load and save again loses nothing.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise UserError(f"unsupported hidden_act {self.hidden_act!r}; expected one of {SUPPORTED_ACTIVATIONS}")
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
            if self.label2id is None:
                self.label2id = {v: k for k, v in self.id2label.items()}
        if self.label2id is not None:
            self.label2id = {str(k): int(v) for k, v in self.label2id.items()}

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size: tiny (2 layers/128), mini (4/256), small (4/512), medium (8/512), base (12/768)."""
        if name not in PRESETS:
            raise UserError(f"unknown preset {name!r}; expected one of {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        kw: dict[str, Any] = dict(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        kw.update(overrides)
        return cls(**kw)

    # ----------------------------------------------------------------------------------------- json
    def to_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        d: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if f.name in ("id2label", "label2id") and v is None:
                continue
            if f.name == "id2label":
                v = {str(k): lab for k, lab in v.items()}
            d[f.name] = v
        d["model_type"] = "bert"
        d["position_embedding_type"] = "absolute"
        if architectures:
            d["architectures"] = list(architectures)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        d = dict(d)
        model_type = d.pop("model_type", "bert")
        if model_type != "bert":
            raise UserError(f"config model_type is {model_type!r}, not 'bert'")
        if d.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(f"position_embedding_type {d['position_embedding_type']!r} is not supported")
        if d.get("is_decoder"):
            raise UserError("is_decoder=True (a causal BERT) is not supported")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kw = {k: d.pop(k) for k in list(d) if k in names}
        if kw.get("pad_token_id") is None:
            kw.pop("pad_token_id", None)
        # transformers writes num_labels implicitly through id2label; keep what is not ours untouched
        d.pop("num_labels", None)
        try:
            return cls(**kw, extra=d)
        except TypeError as e:  # a field of the wrong type
            raise UserError(f"invalid BERT config: {e}") from None

    def save(self, path: str, architectures: list[str] | None = None) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(architectures), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> BertConfig:
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise UserError(f"no config.json at {path}")
        from .textio import read_json_object

        return cls.from_dict(read_json_object(path, "config.json"))


def dataclass_from_dict(cls: type, d: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass ``cls`` from ``d``; an unknown key is a UserError naming it."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise UserError(f"unknown key(s) in {where}: {', '.join(unknown)}")
    return cls(**d)


# ================================================================================================ pretraining
@dataclass
class PretrainDataConfig:
    """What to train on and how instances are built."""

    data: list[str] = field(default_factory=list)
    eval_data: list[str] | None = None
    text_field: str = "text"
    doc_separator: str = "file"  # or "blank-line" (Google's one-sentence-per-line format)
    tokenizer: str | None = None  # a tokenizer or model directory, or a vocab.txt; None: train one
    vocab_size: int = 30522  # for a tokenizer trained on the data
    tokenizer_model: str = "wordpiece"  # or "wordlevel"
    lowercase: bool = True
    max_seq_length: int = 128
    mask_prob: float = 0.15
    short_seq_prob: float = 0.1
    whole_word_mask: bool = False
    nsp: bool = True
    max_eval_instances: int = 2048
    cache_dir: str | None = None


@dataclass
class PretrainModelConfig:
    """Which model: a preset, a config.json, or a BERT directory to continue from (``init``)."""

    preset: str = "mini"
    model_config: str | None = None
    init: str | None = None
    dropout: float | None = None  # overrides hidden and attention dropout when given


@dataclass
class TrainConfig:
    """Optimisation and the training loop; shared by pretraining and fine-tuning."""

    batch_size: int = 32  # global: all ranks and accumulation steps together
    grad_accum: int = 1
    lr: float = 1e-4
    warmup_steps: int | None = None
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float = 1.0
    max_steps: int | None = None
    max_time: float | None = None  # seconds
    eval_every: int | None = 500
    save_every: int | None = 1000
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0


@dataclass
class ImplConfig:
    """How to run (no effect on the results on a given machine): device, precision, compilation."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16
    compile: bool = False
    threads: int | None = None
    progress: bool = True


@dataclass
class PretrainConfig:
    out: str = ""
    model: PretrainModelConfig = field(default_factory=PretrainModelConfig)
    data: PretrainDataConfig = field(default_factory=PretrainDataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    impl: ImplConfig = field(default_factory=ImplConfig)

    SECTIONS = ("model", "data", "train", "impl")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PretrainConfig:
        d = dict(d)
        kinds = {"model": PretrainModelConfig, "data": PretrainDataConfig, "train": TrainConfig, "impl": ImplConfig}
        kw: dict[str, Any] = {}
        for name, kind in kinds.items():
            kw[name] = dataclass_from_dict(kind, d.pop(name, {}) or {}, where=f"config section {name!r}")
        out = d.pop("out", "")
        if d:
            raise UserError(f"unknown key(s) in config: {', '.join(sorted(d))}")
        return cls(out=out, **kw)

    def update_flat(self, flat: dict[str, Any], where: str = "config") -> None:
        """Set fields by their flat names (the command-line flags' names, '-' or '_')."""
        index = {f.name: sec for sec in self.SECTIONS for f in dataclasses.fields(getattr(self, sec))}
        index["out"] = None
        unknown = []
        for k, v in flat.items():
            key = k.replace("-", "_")
            if key not in index:
                unknown.append(k)
            elif index[key] is None:
                self.out = v
            else:
                setattr(getattr(self, index[key]), key, v)
        if unknown:
            raise UserError(f"unknown key(s) in {where}: {', '.join(sorted(unknown))}")


def parse_duration(text: str | float | int | None) -> float | None:
    """'90', '90s', '30m', '2h', '1h30m' -> seconds."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    import re

    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        return float(s)
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", s)
    if not parts or "".join(a + b for a, b in parts) != s:
        raise UserError(f"cannot read duration {text!r}; write e.g. 90s, 30m, 2h or 1h30m")
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(a) * unit[b] for a, b in parts)


def read_config_file(path: str) -> dict[str, Any]:
    """A YAML or JSON mapping from a file; bad input is a UserError."""
    from .textio import read_text

    text = read_text(path, "config file")
    try:
        if path.endswith(".json"):
            d = json.loads(text)
        else:
            import yaml

            d = yaml.safe_load(text)
    except Exception as e:  # json or yaml syntax errors
        raise UserError(f"cannot parse config file {path}: {e}") from None
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise UserError(f"config file {path} must hold a mapping of settings")
    return d


# ================================================================================================ fine-tuning
@dataclass
class FinetuneConfig:
    """What every fine-tuning run shares (the task's own settings are in its own dataclass)."""

    model: str = ""
    train: str = ""
    validation: str = ""
    out: str = ""
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32
    eval_batch_size: int = 64
    max_seq_length: int = 128
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    max_train_examples: int | None = None  # a prefix of the training file, for quick runs
    freeze_embeddings: bool = False  # keep the word embeddings as pretrained (few labels, large vocabulary)
    seed: int = 0
    log_every: int = 20
    device: str = "auto"
    precision: str = "auto"
    progress: bool = True


@dataclass
class ClassifyConfig:
    text_column: str | None = None  # default: sentence, text or sentence1
    text_pair_column: str | None = None
    label_column: str = "label"


@dataclass
class SquadConfig:
    doc_stride: int = 128  # tokens of overlap between windows (transformers' convention)
    max_query_length: int = 64
    n_best: int = 20
    max_answer_length: int = 30
