"""What a fine-tuning task supplies to the one runner (:func:`bertforge.train.finetune.finetune`).

Tasks import nothing of training, so that inference (:mod:`bertforge.predict`) can use their data
handling (SQuAD windows and post-processing) without the training engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from tokenizers import Tokenizer

from ..commands import add_setting_flags, positive_int
from ..config import FINETUNE_TRAIN_DEFAULTS, FinetuneConfig, FinetuneDataConfig, dataclass_from_dict, validate_fields
from ..errors import UserError
from ..models import BertConfig


# Fine-tuning's batch when none is given, by the data's size: a run of few optimizer updates fine-tunes badly
# (on WNUT-16 the batch of 32 tagged no entity, and 16 fell far short of 8; on 2,000 SST-2 sentences 8 did as
# well as 16 and 32: RESULTS.md), so the task's batch is halved while the epochs asked would make fewer than the
# task's floor of updates (FINETUNE_MIN_UPDATES unless it says otherwise), down to FINETUNE_MIN_BATCH
# (transformers' default batch); large data keeps the task's batch, whose steps run faster per example.
FINETUNE_MIN_UPDATES = 600
FINETUNE_MIN_BATCH = 8
# A task whose epochs are by the data (its default epochs None: NER) starts from the recipe's and takes more, up
# to FINETUNE_MAX_EPOCHS, while its batch would make fewer updates than its floor: on WNUT-16 the updates, not
# the passes, decided (6 epochs at 16 scored as 3 at 8, the same 636 updates; 10 at 8 made 2,120 and 6 points
# more: docs/log/defaults.md).
FINETUNE_EPOCHS = FINETUNE_TRAIN_DEFAULTS["epochs"]
FINETUNE_MAX_EPOCHS = 10


def finetune_updates(examples: int, epochs: int, batch: int) -> int:
    """Optimizer updates of ``epochs`` over ``examples`` in batches of ``batch`` (a short last batch is one)."""
    return epochs * -(-examples // batch)


def finetune_batch(start: int, examples: int, epochs: int | None, floor: int = FINETUNE_MIN_UPDATES) -> int:
    """The batch of a run of ``epochs`` over ``examples`` (at least ``floor`` updates where it can); ``start``
    when the run is counted in steps (``--max-steps``: ``epochs`` None).  Of the halved batches that make as many
    updates, the largest (a batch that holds all the examples is not halved for nothing)."""
    batch = start
    while epochs and batch > FINETUNE_MIN_BATCH and finetune_updates(examples, epochs, batch) < floor:
        batch = max(FINETUNE_MIN_BATCH, batch // 2)
    while epochs and batch < start and finetune_updates(examples, epochs, batch * 2) == \
            finetune_updates(examples, epochs, batch):
        batch *= 2
    return batch


def finetune_batch_rule(start: int, floor: int = FINETUNE_MIN_UPDATES) -> str:
    """:func:`finetune_batch` in words, for ``--help``."""
    return f"by the data: {start}, halved while the epochs would make fewer than {floor} updates, down to " \
           f"{FINETUNE_MIN_BATCH}"


def finetune_epochs(examples: int, batch: int, floor: int) -> int:
    """The epochs of a task that takes them by the data: :data:`FINETUNE_EPOCHS`, more while batches of ``batch``
    would make fewer than ``floor`` updates, up to :data:`FINETUNE_MAX_EPOCHS`."""
    epochs = FINETUNE_EPOCHS
    while epochs < FINETUNE_MAX_EPOCHS and finetune_updates(examples, epochs, batch) < floor:
        epochs += 1
    return epochs


def finetune_epochs_rule(floor: int) -> str:
    """:func:`finetune_epochs` in words, for ``--help``."""
    return f"by the data: {FINETUNE_EPOCHS}, more while they would make fewer than {floor} updates, up to " \
           f"{FINETUNE_MAX_EPOCHS}"


class FinetuneTask:
    """What a task supplies to :func:`~bertforge.train.finetune.finetune`.  Called in this order: ``read`` (before
    any model is loaded), ``configure``, ``encode``, then ``evaluate`` after every epoch, ``write_outputs`` at
    the end."""

    name: ClassVar[str] = ""
    model_class: ClassVar[type] = type(None)
    settings_class: ClassVar[type] = type(None)  # the task's own settings dataclass
    select: ClassVar[str] = ""  # the metric that picks the best epoch (higher is better)
    plotted: ClassVar[list[tuple[str, str]]] = []  # (metric, label) drawn per epoch
    defaults: ClassVar[dict[str, Any]] = {}  # this task's defaults of FinetuneConfig fields (by flat name)
    batch: ClassVar[int] = 32  # the batch of a run of enough updates, when --batch-size is not given (finetune_batch)
    min_updates: ClassVar[int] = FINETUNE_MIN_UPDATES  # the floor of updates of the rules by the data
    pipeline_tag: ClassVar[str] = ""  # the Hub's name of what the model does, for its card
    bench_files: ClassVar[tuple[str, str]] = ("", "")  # `bench --data-dir D`'s training and validation files in D
    # ---- the command line's rows and the API's (cli.py and api.py loop over the tasks and name none)
    help: ClassVar[str] = ""  # `finetune NAME`'s
    printed: ClassVar[tuple[str, ...]] = ()  # the validation figures `finetune NAME` prints
    evaluate_name: ClassVar[str] = ""  # `evaluate NAME`, the API's `evaluate(NAME, ...)`
    evaluate_help: ClassVar[str] = ""
    evaluate_settings: ClassVar[type | None] = None  # the settings dataclass whose flags `evaluate NAME` takes

    @classmethod
    def evaluation(cls) -> Callable[..., dict]:
        """The API function of ``evaluate NAME``: the task's metrics of a saved model on a file."""
        raise NotImplementedError

    evaluate_data_help: ClassVar[str | None] = None  # what `evaluate NAME --data` reads
    evaluate_flags: ClassVar[tuple[str, ...] | None] = None  # the settings `evaluate NAME` takes (None: all)
    evaluate_length: ClassVar[int | None] = None  # `evaluate NAME`'s tokens per input, where not the task's length

    @classmethod
    def evaluate_arguments(cls, p) -> None:
        """``evaluate NAME``'s flags (argparse ``p``): by default ``--model``, ``--data``, ``--max-seq-length`` (the
        task's length by default), ``--batch-size``, ``--device`` and :attr:`evaluate_settings`' flags."""
        length = cls.evaluate_length or cls.defaults.get("max_seq_length", FinetuneConfig().data.max_seq_length)
        p.add_argument("--model", required=True)
        p.add_argument("--data", required=True, help=cls.evaluate_data_help)
        p.add_argument("--max-seq-length", type=positive_int, help=f"default: {length}, or the model's positions if "
                                                                   "fewer")
        p.add_argument("--batch-size", type=positive_int, default=64)
        p.add_argument("--device", default="auto")
        if cls.evaluate_settings is not None:
            add_setting_flags(p, cls.evaluate_settings(), only=cls.evaluate_flags)

    predict_name: ClassVar[str] = ""  # `predict NAME`, the API's `pipeline(NAME, ...)`
    predict_help: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()  # transformers' names of the pipeline

    @classmethod
    def holds(cls, config: BertConfig) -> bool:
        """Whether a folder with this task's head (of ``config``) is one of this task's, where tasks share a head
        (``export onnx --check-data`` asks which evaluation scores a folder)."""
        return True

    @classmethod
    def pipeline_class(cls) -> type:
        """The task's pipeline (:class:`~bertforge.inference.Pipeline`): ``pipeline(NAME, model=DIR)``."""
        raise NotImplementedError

    @classmethod
    def predict_arguments(cls, p) -> None:
        """``predict NAME``'s flags and arguments (argparse ``p``) besides ``--model``, ``--json``, ``--batch-size``
        and ``--device``."""

    @classmethod
    def predict(cls, a) -> None:
        """``predict NAME``: print the predictions of the flags ``a`` (a table, or JSON with ``--json``)."""
        raise NotImplementedError

    def __init__(self, settings: Any):
        self.settings = settings  # the task's own dataclass (ClassifyConfig, SquadConfig)

    @classmethod
    def config(cls, **flat: Any) -> FinetuneConfig:
        """A FinetuneConfig with this task's defaults, then ``flat`` (fields by their flat names)."""
        cfg = FinetuneConfig()
        cfg.update_flat({**cls.defaults, **flat})
        return cfg

    def read(self, cfg: FinetuneConfig) -> None:
        """Read and check the training and validation files."""
        raise NotImplementedError

    def texts(self) -> list[str]:
        """The training examples' text, for a vocabulary (``bench``'s random model); after ``read``."""
        raise NotImplementedError

    @staticmethod
    def split_validation(train: list, cfg: FinetuneConfig, read: Callable[[str], list],
                         key: Callable[[Any], Any] | None = None) -> tuple[list, list]:
        """(training items, validation items): ``--validation``'s (``read`` from the file), else a
        ``--validation-split`` part of the training items held out at random by ``--seed`` (the items of one
        ``key``, such as the questions on one context, on the same side), else none; at most
        ``--max-eval-samples`` of them."""
        dc = cfg.data
        if dc.validation_file:
            val = read(dc.validation_file)
        elif dc.validation_split:
            train, val = held_out(train, dc.validation_split, cfg.train.seed, key)
        else:
            val = []
        return train, val[: dc.max_eval_examples] if dc.max_eval_examples else val

    flag_notes: ClassVar[dict[str, str]] = {}  # what `finetune NAME --help` adds to a setting's help
    length_rule: ClassVar[str] = ""  # --max-seq-length's default in words, where the task's is None (default_length)

    @classmethod
    def default_length(cls, base: str) -> int:
        """The tokens per example of a run on model folder ``base`` without ``--max-seq-length`` (a task whose
        default is None decides it by the folder); before the cap at the model's positions."""
        return cls.defaults.get("max_seq_length") or FinetuneDataConfig().max_seq_length

    @classmethod
    def length_of(cls, base: str, config: Any = None) -> int:
        """:meth:`default_length`, at most the positions of the model in ``base`` (its ``config`` when read)."""
        from ..loading import check_max_seq_length
        from ..models import load_config

        return check_max_seq_length(config or load_config(base), None, base, cls.default_length(base))

    def configure(self, config: BertConfig) -> bool:
        """Adapt the model's config to the task; True when the checkpoint's head must be re-initialised."""
        return False

    def objective(self, model, seed: int | None, world: int):
        """The module the engine trains around ``model``: the model's own loss, unless the task has another."""
        from .loss import TaskLoss

        return TaskLoss(model, seed)

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig) -> tuple[list[dict], Callable[[list[dict]], dict]]:
        """Training features and the function that makes a batch of them."""
        raise NotImplementedError

    def evaluate(self, model, device) -> tuple[dict, Any]:
        """Validation metrics, and the predictions behind them (what ``unlearnt`` reads and ``write_outputs`` writes
        of the best evaluation)."""
        raise NotImplementedError

    def eval_size(self) -> int:
        """Sequences that ``evaluate`` reads (after ``encode``)."""
        return 0

    def eval_tokens(self) -> int | None:
        """Tokens that ``evaluate`` reads, where the task knows them (its validation features): the run's clock
        estimates an evaluation by them, since validation texts can be far longer than training ones; None:
        by :meth:`eval_size`'s sequences."""
        return None

    def unlearnt(self, metrics: dict, artifacts: Any) -> str | None:
        """What in an evaluation (``evaluate``'s metrics and predictions) shows that the model learnt nothing (one
        class for every example, no entity at all, a reranker below its first stage), for the run's warning; None
        when nothing does."""
        return None

    def write_model(self, folder: str, config: BertConfig) -> None:
        """Files of the task's own beside the saved model (with validation data or without)."""

    def describe(self) -> str:
        """What the model card says of the task's model besides the run's settings."""
        return ""

    def write_outputs(self, folder: str, artifacts: Any) -> dict:
        """Write predictions into the output folder; return figures for metrics.json."""
        return {}

    # ---- `bench --task NAME`: its fine-tuning step against the reference library's, on the same batches
    @classmethod
    def bench_default_data(cls, folder: str) -> tuple[str, str] | None:
        """(training file, validation file) written to ``folder`` when no data is given (None: the task needs
        some)."""
        return None

    def bench_reference(self, folder: str, model_class: type, transformers, device):
        """The reference model of the bench: transformers' class of the same name, loaded from ``folder`` (our
        model saved)."""
        return getattr(transformers, model_class.__name__).from_pretrained(folder, attn_implementation="sdpa") \
            .to(device).train()

    def bench_step(self, theirs):
        """What the reference trains on one of our batches (a model whose output has the loss)."""
        return theirs

    def reference_difference(self, ours, theirs, batch: dict) -> float:
        """The largest difference of the two models' outputs on ``batch`` (in eval mode, without gradients)."""
        return float((ours(**batch).logits.float() - theirs(**batch).logits.float()).abs().max())

    def train_figures(self) -> dict:
        """What the run trained on, for metrics.json (with validation data or without)."""
        return {}


def validating(n: int, what: str) -> str:
    """", validating on N <what>" for a task's first log line, or nothing when the run is not evaluated (the runner
    says so in a line of its own)."""
    return f", validating on {n} {what}" if n else ""


def given_settings(base: Any, given: dict[str, Any], where: str) -> Any:
    """A task's settings dataclass: ``base`` with the fields ``given`` (paths as ``os.PathLike`` too), checked as
    the flags are; an unknown name is refused naming ``where``."""
    given = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in given.items()}
    settings = dataclass_from_dict(base, given, where)
    validate_fields(settings)
    return settings


def use_labels(config: BertConfig, labels: list[str]) -> bool:
    """Name the model's outputs ``labels`` (``id2label``); True when the checkpoint's were others (a new head)."""
    same = config.id2label and [config.id2label[i] for i in sorted(config.id2label)] == labels
    config.id2label, config.label2id = {i: lab for i, lab in enumerate(labels)}, None
    config.__post_init__()
    return not same


def held_out(items: list, fraction: float, seed: int, key: Callable[[Any], Any] | None = None) -> tuple[list, list]:
    """(the rest, the held-out part) of ``items``, each in the file's order: groups of items (by ``key``; each
    item its own without one) drawn at random until ``fraction`` of the items are held out, one group at
    least, and one left to train on."""
    groups: dict[Any, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item) if key else i, []).append(i)
    if len(groups) < 2:
        raise UserError(f"--validation-split {fraction:g}: the training data holds {len(items)} example(s) "
                        f"({len(groups)} to draw from): nothing to hold out; give --validation FILE")
    names = list(groups)
    held: set[int] = set()
    for g in np.random.default_rng([seed, 0x5E1D]).permutation(len(names))[:-1]:
        if held and len(held) >= fraction * len(items):
            break
        held.update(groups[names[g]])
    return [x for i, x in enumerate(items) if i not in held], [x for i, x in enumerate(items) if i in held]
