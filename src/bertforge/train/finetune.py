"""Fine-tuning: one runner for every task, on the same engine and run lifecycle as pretraining.

A task (:class:`~bertforge.tasks.base.FinetuneTask`; :mod:`bertforge.tasks`) reads and checks its files, adapts
the model's config (labels), encodes its examples, evaluates a model and writes its predictions.  The runner
does the rest, the same for every task: the model directory and its tokenizer, the device, the seed, training
for a number of epochs or steps with evaluation after each epoch and every ``--eval-every`` steps (the best
evaluation kept; without validation data, none and the last weights), and the outputs.  They are written into
``--out`` itself, with a checkpoint every 15 minutes of the run (or ``--save-every`` steps) and at
Ctrl-C or SIGTERM, removed at the end; with ``--save-every 0``, into a temporary folder renamed into place.
A checkpointed run also keeps, beside its checkpoints, a copy of what it read of its base model besides the
weights (config, tokenizer, sentence-transformers settings): ``--resume`` reads that copy, so it needs only the
run's own folder, and a ``--model`` folder that still exists is checked by content (by a digest of those files,
recorded when the run started), never by its path.

Under ``torchrun`` every process trains on its share of each global batch (DistributedDataParallel); rank 0
alone evaluates, checkpoints and writes.  On the CPU each example's dropout masks are keyed by (seed, step,
its index in the training set), so one process, N processes and N accumulation steps compute the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file

from .. import checkpoint as ckpt
from .. import modelcard
from ..atomic import atomic_write_json
from ..batching import EpochBatches, plan_steps, to_device
from ..config import FinetuneConfig, by_content, dataclass_from_dict, finetune_lr, flag_of, validate_fields
from ..devices import Dist
from ..embeddings import ST_FILES, module_settings
from ..errors import TrainingError, UserError, shown
from ..loading import check_max_seq_length, warn_untrained_positions
from ..models import head_class, load_config
from ..outputs import MODEL_FILES, register_output
from ..plots import plot_finetuning
from ..settings import check_resumed, file_digest, say_schedule_changed
from ..tasks import FinetuneTask
from ..tasks.base import FINETUNE_EPOCHS, finetune_batch, finetune_epochs, finetune_updates
from ..tokenizer import check_vocab_fits, load_tokenizer
from .engine import Engine, LinearSchedule
from .lifecycle import TrainingRun, finish, preflight, recover, run_folder, start_run
from .runfolder import COMMAND, CORPUS, SETTINGS_FILES, TASK, RunFolder

log = logging.getLogger("bertforge")

SETTINGS_FILE = SETTINGS_FILES["finetune"]
register_output("finetune", MODEL_FILES | {SETTINGS_FILE, "metrics.jsonl", "metrics.json", "train.log", "plots",
                                           "tensorboard", "predictions.json", "predictions.jsonl", "README.md",
                                           "checkpoints"} | ST_FILES)
MIN_UPDATES = 100  # fewer optimizer updates than this rarely fine-tune a BERT well: warned
BASE_COPY = "started-from"  # in checkpoints/: the run's copy of what it read of its base model but the weights
# ... which is: the files a fine-tuning run reads of a model folder besides its weights, and the settings of a
# sentence-transformers folder's modules in folders of their own (embeddings.module_settings)
BASE_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
              "pretrain_config.json", *sorted(f for f in ST_FILES if f.endswith(".json")))


@dataclass
class EpochResult:
    epoch: int
    step: int
    metrics: dict[str, float]
    artifacts: Any = None
    unlearnt: str | None = None  # what in it shows that the model learnt nothing (the task's unlearnt)
    restored: bool = False  # read from a checkpoint: its predictions (artifacts) are not at hand


def finetune(task: FinetuneTask, cfg: FinetuneConfig, overwrite: bool = False, resume: bool = False) -> dict:
    """Fine-tune ``cfg.model`` on ``task``; return the best evaluation's metrics (also in OUT/metrics.json).

    An existing, non-empty ``cfg.out`` is refused, unless ``overwrite`` and it is an earlier fine-tuning
    output of bertforge's; or ``resume``, which continues the run checkpointed there (by default every
    15 minutes of the run, and when it was interrupted) from its newest checkpoint that loads (with the same
    settings and files, checked before anything is read).
    """
    folder = RunFolder(cfg.out, "finetune")
    recover(cfg.out)  # (what an interrupted write left beside the run is back before its checkpoints are counted)
    step = folder.newest_step()
    # a resumed run with a checkpoint reads its own copy of the base model's files: --model may have moved
    own = resume and step is not None and os.path.isfile(os.path.join(base_copy(cfg.out), "config.json"))
    if cfg.model and isinstance(cfg.model, str) and not os.path.isdir(cfg.model) and not own:
        raise UserError(f"model directory not found: {cfg.model}")  # (the rest: in validate)
    base = base_copy(cfg.out) if own else cfg.model  # the folder the run reads its config and tokenizer from
    config = load_config(base) if base and isinstance(base, str) else None  # (the one read of its config.json)
    why, epochs_by_data = by_model(task, cfg, config)
    cfg.validate()
    validate_fields(task.settings)
    if not resume and not overwrite and (step is not None or (folder.started and not folder.finished)):
        at = f" (step {step})" if step is not None else " (before its first checkpoint)"
        raise UserError(f"{cfg.out} holds an interrupted run{at}: add --resume to continue it, or --overwrite to "
                        "start again")
    # one rule with pretraining: a run killed before its first checkpoint starts again from step 0 on --resume
    output = preflight(folder, [cfg.model, cfg.data.train_file, cfg.data.validation_file], overwrite, resume,
                       restarts=True)
    files = files_content(cfg, task)
    schedule = check_resumed_files(folder, cfg, task, files, epochs_by_data) if resume else []
    length_by_base = cfg.data.max_seq_length is None
    if length_by_base:  # (a resumed run has its own: check_resumed_files)
        cfg.data.max_seq_length = task.length_of(base, config)
    with start_run(output, cfg.impl) as (d, device):
        if own and d.is_main:
            log.info("resuming from the run's own copy of its base model's config and tokenizer (%s)", base)
        reading = dataclasses.replace(cfg, model=base) if own else cfg
        # the base model's checks first: reading may take long (rerank mines negatives) and says what it did
        tok = load_tokenizer(base)
        model_class = head_class(config, task.model_class, base)  # the task's head, of the folder's family
        check_vocab_fits(tok, config.vocab_size, base)
        check_max_seq_length(config, cfg.data.max_seq_length, base)
        task.read(reading)  # (no line before: a file that cannot be read is one error line, and nothing else)
        reinit_head = task.configure(config)
        if d.is_main:  # a line as each long set-up phase starts: a large file takes a while to tokenize
            log.info("tokenizing the examples (--max-seq-length %d%s)", cfg.data.max_seq_length,
                     f": {task.length_rule}" if length_by_base and task.length_rule else "")
        features, collate = task.encode(tok, reading)
        said = by_data(task, cfg, len(features), d, epochs_by_data and not resume)
        warn_untrained_positions(base, max((len(f["input_ids"]) for f in features), default=0), d)
        torch.manual_seed(cfg.train.seed)
        if d.is_main:
            log.info("building %s from %s", model_class.__name__, "the checkpoint" if resume and step is not None
                     else cfg.model)
        if resume and step is not None:  # every weight from the checkpoint: none read from the base model
            model = model_class(config).to(device)
        else:
            model = model_class.from_pretrained(cfg.model, config=config, reinit_head=reinit_head).to(device)
        torch.manual_seed(cfg.train.seed + d.rank)  # the same new head everywhere; dropout streams differ by rank
        checkpointed = resume or cfg.train.save_every != 0
        with run_folder(output, d, resume, in_place=checkpointed) as out:
            if d.is_main:  # (here: into train.log too)
                for line in [settings_said(cfg, why, resume), *said]:
                    log.info("%s", line)
            if d.is_main and resume:
                say_schedule_changed(schedule)
            elif d.is_main and checkpointed:  # what a resumed run is checked against, before it reads its data
                copy_base(cfg.model, base_copy(out))  # (before the settings: a run with them has its copy)
                atomic_write_json(os.path.join(out, SETTINGS_FILE), run_record(cfg, task, d.world, files),
                                  faults=False)
            run = FineTuning(task, cfg, d, out, model, features, collate, device)
            # --resume of a run killed before its first checkpoint starts again from step 0, as pretraining's: only
            # when the model was read from the base model (a checkpoint listed but not loading leaves random weights)
            run.restarts = step is None
            best, history, train_seconds = run.train(resume)
            record = run_record(cfg, task, d.world, files, folder.command() if resume else modelcard.COMMAND)
            metrics = {} if best is None else write_outputs(out, task, cfg, model, tok, best, history,
                                                            train_seconds, record, checkpointed, run.warnings)
        d.barrier()  # the other processes wait until rank 0 has written the outputs
        return metrics


def by_model(task: FinetuneTask, cfg: FinetuneConfig, config) -> tuple[dict[str, str], bool]:
    """The learning rate of a run without one, by the width of its model; the recipe's epochs until the data
    decides them, for a task that takes them by its data (NER's; a resumed run: its own). Returns where the run's
    batch, length and learning rate come from, in words (by the data, by the model, the task's, or given), and
    whether its epochs are by its data."""
    t, own = cfg.train, task.config().train
    width = "by the model's width" + (f": hidden {config.hidden_size}" if config is not None else "")

    def source(value, default) -> str:
        return "the task's" if value == default else "given"

    epochs_by_data = t.epochs is None and own.epochs is None  # (None elsewhere: an error, in validate)
    by_rule = "the task's" if t.max_steps else "by the data"  # (a run counted in steps: the data's size matters not)
    why = {"batch": by_rule if t.batch_size is None else source(t.batch_size, own.batch_size),
           "epochs": "given" if t.max_steps else "by the data" if epochs_by_data else source(t.epochs, own.epochs),
           "lr": width if t.lr is None else source(t.lr, own.lr)}
    if t.lr is None and config is not None:
        t.lr = finetune_lr(config.hidden_size)
    if epochs_by_data:
        t.epochs = FINETUNE_EPOCHS
    return why, epochs_by_data


def settings_said(cfg: FinetuneConfig, why: dict[str, str], resume: bool) -> str:
    """The line that says what the run trains with and why (a resumed run: its settings, without the why)."""
    t = cfg.train
    said = dict.fromkeys(why, "") if resume else {k: f" ({v})" for k, v in why.items()}
    length = f"{t.max_steps} steps" if t.max_steps else f"{t.epochs} epoch(s)"
    clock = f", or --max-time {t.max_time:g}s" if t.max_time else ""
    warmup = f"{t.warmup_steps} steps" if t.warmup_steps is not None else f"{100 * t.warmup_ratio:g}% of the run"
    return (f"fine-tuning at batch {t.batch_size}{said['batch']}, {length}{said['epochs']}{clock}, lr {t.lr:g}"
            f"{said['lr']}, warmup {warmup}, weight decay {t.weight_decay:g}{' (resumed)' if resume else ''}")


def by_data(task: FinetuneTask, cfg: FinetuneConfig, examples: int, d: Dist, epochs: bool) -> list[str]:
    """The batch, and with ``epochs`` the epochs, that a run without them takes by its data (a resumed run has its
    own: :func:`check_resumed_files`); what was decided, in words, for the run's log."""
    said = []
    if cfg.train.batch_size is None:
        cfg.train.batch_size = data_batch(task, cfg, examples, d, said)
    if epochs and not cfg.train.max_steps:  # (a timed run ends at its epochs too, where its clock allows)
        cfg.train.epochs = data_epochs(task, cfg, examples, said)
    if cfg.train.batch_size < d.world * cfg.train.grad_accum:
        raise UserError(f"--batch-size {cfg.train.batch_size} is smaller than processes x --grad-accum")
    return said


def _examples(n: int) -> str:
    return f"{n:,} example{'s' * (n != 1)}"


def data_batch(task: FinetuneTask, cfg: FinetuneConfig, examples: int, d: Dist, said: list[str]) -> int:
    """The batch of a run without ``--batch-size``: the task's, halved for a run of few updates
    (:func:`~bertforge.tasks.base.finetune_batch`), said when it is; a multiple of processes x accumulation steps."""
    t = cfg.train
    batch = finetune_batch(task.batch, examples, None if t.max_steps else t.epochs, task.min_updates)
    step = d.world * t.grad_accum
    used = max(step, -(-batch // step) * step)
    if batch != task.batch:  # (halved: a run counted in epochs, or timed and ending at them)
        said.append(f"batch {batch}: {_examples(examples)} x {t.epochs} epoch(s) make "
                    f"{finetune_updates(examples, t.epochs, batch):,} updates at {batch}, "
                    f"{finetune_updates(examples, t.epochs, task.batch):,} at the task's {task.batch} ({task.name} "
                    f"fine-tunes to {task.min_updates:,} updates where it can; --batch-size sets it)")
    if used != batch:
        said.append(f"batch {used}: {batch} rounded up to a multiple of {d.world} process(es) x --grad-accum "
                    f"{t.grad_accum}")
    return used


def data_epochs(task: FinetuneTask, cfg: FinetuneConfig, examples: int, said: list[str]) -> int:
    """The epochs of a run whose task takes them by the data (:func:`~bertforge.tasks.base.finetune_epochs`), said
    when they are more than the recipe's."""
    t = cfg.train
    epochs = finetune_epochs(examples, t.batch_size, task.min_updates)
    if epochs != t.epochs:
        said.append(f"{epochs} epochs: {_examples(examples)} make {finetune_updates(examples, 1, t.batch_size):,} "
                    f"updates an epoch at batch {t.batch_size}; {task.name} fine-tunes to {task.min_updates:,} "
                    "updates where it can (--epochs sets it)")
    return epochs


def run_record(cfg: FinetuneConfig, task: FinetuneTask, processes: int, files: dict, command=None) -> dict:
    """finetune_config.json: the settings (a --config file that repeats the run), what the files held, and the
    command that started the run (not the --resume's)."""
    return {"finetune": cfg.to_dict(), "task": dataclasses.asdict(task.settings), TASK: task.name,
            "processes": processes, CORPUS: files, COMMAND: command or modelcard.COMMAND}


def files_content(cfg: FinetuneConfig, task: FinetuneTask) -> dict[str, str | None]:
    """What a run trains and validates on (:func:`~bertforge.settings.file_digest`, else the dataset's name), the
    task's own files and folders (its settings ``*_file`` or ``by_content``: NER's ``--labels``, reranking's
    ``--negatives``: :func:`content_digest`) and the base model (:func:`base_digest`; None once it moved), so that
    a resumed run is checked, by content, before it reads them."""
    files = {role: (file_digest(p) or p) if p else None
             for role, p in (("train", cfg.data.train_file), ("validation", cfg.data.validation_file))}
    files.update({f.name: content_digest(getattr(task.settings, f.name)) for f in content_fields(task.settings)})
    return {**files, "model": base_digest(cfg.model) if isinstance(cfg.model, str) and os.path.isdir(cfg.model)
            else None}


def content_fields(settings) -> list[dataclasses.Field]:
    """A task's settings that name what the run reads (:func:`~bertforge.config.by_content`)."""
    return [f for f in dataclasses.fields(settings) if by_content(f)]


def content_digest(value: str | None) -> str | None:
    """What a task's path setting names: a file's digest, a model folder's (:func:`base_digest` and its weights),
    or the value itself when it names neither (reranking's ``bm25``)."""
    if value and os.path.isdir(value):
        return f"{base_digest(value)}:{file_digest(os.path.join(value, 'model.safetensors'))}"
    return (file_digest(value) or value) if value else None


def base_copy(out: str) -> str:
    return os.path.join(out, ckpt.CHECKPOINTS, BASE_COPY)


def _base_files(model: str) -> list[str]:
    """The files of :data:`BASE_FILES` that the model folder ``model`` holds (paths inside it)."""
    return [name for name in BASE_FILES if os.path.isfile(os.path.join(model, name))]


def base_digest(model: str) -> str:
    """A digest of what a run reads of the model folder ``model`` besides its weights (:data:`BASE_FILES`)."""
    import hashlib

    h = hashlib.sha256()
    for name in _base_files(model):
        h.update(name.encode() + b"\0" + (file_digest(os.path.join(model, name)) or "").encode() + b"\0")
    return h.hexdigest()


def copy_base(model: str, dest: str) -> None:
    """:data:`BASE_FILES` of ``model`` and its modules' settings copied to ``dest`` (written whole or not at all;
    the modules' settings are not in :func:`base_digest`: a resumed run reads them from this copy)."""
    tmp = dest + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for name in [*_base_files(model), *module_settings(model)]:
        os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
        shutil.copy2(os.path.join(model, name), os.path.join(tmp, name))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


def check_resumed_files(folder: RunFolder, cfg: FinetuneConfig, task: FinetuneTask, files: dict,
                        epochs_by_data: bool = False) -> list[str]:
    """The resume rule (:func:`~bertforge.settings.check_resumed`) against the run's saved settings, and its files by
    content; returns the schedule's changes."""
    saved = folder.saved()
    if saved is None or not isinstance(saved.get("finetune"), dict):
        raise UserError(f"cannot resume the run in {cfg.out}: it has no {SETTINGS_FILE} to check this command against "
                        "(a run started by an older bertforge: resume it with that version, or start it again)")
    ran = saved.get(TASK)
    if isinstance(ran, str) and ran != task.name:
        raise UserError(f"the run in {cfg.out} is a finetune {ran} run; resume it with bertforge finetune {ran}")
    before = FinetuneConfig.from_dict(saved["finetune"])
    if cfg.train.batch_size is None:  # the batch the run chose by its data when it started
        cfg.train.batch_size = before.train.batch_size
    if cfg.data.max_seq_length is None:  # the length the run took from its base model when it started
        cfg.data.max_seq_length = before.data.max_seq_length
    if epochs_by_data:  # the epochs the run took by its data when it started
        cfg.train.epochs = before.train.epochs
    schedule = check_resumed(cfg.out, before, cfg, dataclass_from_dict(type(task.settings)(), saved.get("task") or {}),
                             task.settings)
    was = saved.get(CORPUS) or {}
    changed = [f"--{role} {shown(getattr(cfg.data, role + '_file'))}" for role in ("train", "validation")
               if was.get(role) != files[role]]
    if changed:
        raise UserError(f"--resume continues the run in {cfg.out} on the data it was started on, and "
                        f"{' and '.join(changed)} now holds other examples (the file changed since); restore it, or "
                        "start a new run")
    saved_task = saved.get("task") or {}  # a run recorded before a setting was compared by content: by its value
    changed = [f"{flag_of(f)} {getattr(task.settings, f.name)}" for f in content_fields(task.settings)
               if (was[f.name] != files[f.name] if f.name in was
                   else f.name in saved_task and saved_task[f.name] != getattr(task.settings, f.name))]
    if changed:
        raise UserError(f"--resume continues the run in {cfg.out} as it was started, and {' and '.join(changed)} "
                        "changed since (compared by content); restore it, or start a new run")
    if files["model"] is None:  # (the base model moved: the run resumes from its own copy, and keeps the record)
        files["model"] = was.get("model")
    if was.get("model") and files["model"] and was["model"] != files["model"]:
        raise UserError(f"--resume continues the run in {cfg.out} from the model it was started from, and --model "
                        f"{cfg.model} now holds another (its config, tokenizer or sentence-transformers "
                        "settings changed since); name the folder it started from, or one that no longer exists: "
                        "a checkpointed run resumes from its own copy of them")
    return schedule


def write_outputs(folder: str, task: FinetuneTask, cfg: FinetuneConfig, model, tok, best: EpochResult,
                  history: list[EpochResult], train_seconds: float, record: dict, checkpointed: bool,
                  warnings: list[str] = ()) -> dict:
    """The fine-tuned model, the task's predictions, metrics.json, finetune_config.json, card and plots (without
    validation data: the model and what it was trained on alone)."""
    ckpt.save_pretrained(model, folder, tokenizer=tok)
    task.write_model(folder, model.config)
    if history:
        extra = task.write_outputs(folder, best.artifacts)
        metrics = {**best.metrics, "best_epoch": best.epoch, "best_step": best.step,
                   "epochs": [{"epoch": h.epoch, "step": h.step, **h.metrics} for h in history],  # every evaluation
                   "train_seconds": train_seconds, **extra, **task.train_figures()}
    else:
        metrics = {"epoch": best.epoch, "step": best.step, "epochs": [], "train_seconds": train_seconds,
                   **task.train_figures()}
    if warnings:
        metrics["warnings"] = list(warnings)
    atomic_write_json(os.path.join(folder, SETTINGS_FILE), record)
    plots = os.path.join(folder, "plots")
    finish(folder, metrics, modelcard.finetuning_card(task, cfg, metrics, type(model).__name__),
           lambda: plot_finetuning(os.path.join(folder, "metrics.jsonl"), plots, task.plotted))
    if checkpointed:  # the run is complete: its checkpoints have served (damaged ones stay, for inspection)
        for _, path in ckpt.list_checkpoints(folder):
            shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(base_copy(folder), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(folder, ckpt.CHECKPOINTS))
    return metrics


class FineTuning(TrainingRun):
    """One fine-tuning run: the loop of :class:`~bertforge.train.lifecycle.TrainingRun` over the task's examples,
    evaluated after every epoch (and every ``eval_every`` steps); the best evaluation's weights are kept, and
    a checkpoint also holds the evaluations so far and the best one's weights, so that a resumed run ends with
    the weights of the uninterrupted one, bit for bit."""

    desc = "fine-tuning"
    required = ("epoch", "next", "order", "history")

    def __init__(self, task: FinetuneTask, cfg: FinetuneConfig, d: Dist, folder: str, model: torch.nn.Module,
                 features: list[dict], collate: Callable[[list[dict]], dict], device: torch.device):
        t = cfg.train
        if not features:
            raise TrainingError("no training examples")
        if cfg.freeze_embeddings:
            model.get_input_embeddings().weight.requires_grad_(False)
        self.epochs, total = plan_steps(len(features), t)
        schedule = LinearSchedule(t.lr, total, t.max_time, t.warmup_steps, t.warmup_ratio)
        engine = Engine(task.objective(model, t.seed, d.world), t, cfg.impl, device, d, schedule=schedule)
        super().__init__(folder, d, engine, t, cfg.impl.progress, cfg.impl.report_to == "tensorboard", total=total)
        self.checkpoints = t.save_every != 0  # (0: the outputs go to a temporary folder, where nothing resumes)
        self.validating = bool(cfg.data.validation_file or cfg.data.validation_split)
        self.task, self.cfg, self.model, self.n_examples = task, cfg, model, len(features)
        self.batches = EpochBatches(features, collate, t.batch_size, t.grad_accum, engine.generator("data", t.seed),
                                    d.rank, d.world, group=cfg.data.group_by_length)
        self.history: list[EpochResult] = []
        self.best: EpochResult | None = None
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.train_tokens = 0  # (next_batches)

    def train(self, resume: bool) -> tuple[EpochResult | None, list[EpochResult], float]:
        """(best evaluation, every evaluation, seconds of training across resumptions); the model holds the
        best evaluation's weights."""
        t = self.cfg.train
        self.checkpoints = self.checkpoints or resume  # (a resumed run is in its own folder)
        if resume:
            self.restore()
        if self.total < MIN_UPDATES and self.d.is_main:  # (in the outputs of a resumed run too; said once)
            few = (f"the run makes only {self.total} optimizer updates ({self.n_examples} examples, batch "
                   f"{t.batch_size}, {f'--max-steps {t.max_steps}' if t.max_steps else f'{t.epochs} epoch(s)'}); "
                   "fine-tuning usually needs a few hundred: " +
                   ("raise --max-steps" if t.max_steps else "lower --batch-size or raise --epochs"))
            self.warnings.append(few)
            if self.engine.state.step == 0:  # (said once: by the run that starts from step 0)
                log.warning("%s", few)
        if not self.validating and self.d.is_main:
            log.warning("no --validation file or --validation-split: the run is not evaluated, and the model kept is "
                        "its last step's")
        self.model.train()
        self.fit()
        if not self.d.is_main:
            return None, [], self.engine.tick()
        if not self.validating:
            return EpochResult(self.batches.epoch, self.engine.state.step, {}), [], self.engine.tick()
        self.model.load_state_dict(self.best_weights)
        if self.best.restored:  # the best evaluation came before a resumption: its predictions again
            self.best.artifacts = self.task.evaluate(self.model, self.engine.device)[1]
            self.best.unlearnt = self.task.unlearnt(self.best.metrics, self.best.artifacts)
        said = self.unlearnt()
        if said:
            log.warning(said)
            self.warnings.append(said)
        return self.best, self.history, self.engine.tick()

    def unlearnt(self) -> str | None:
        """The warning of a run whose best evaluation shows the model learnt nothing, or whose every evaluation
        after its first does (the first kept: a few updates' near-random predictions can score above none)."""
        t, later, done = self.cfg.train, [h.unlearnt for h in self.history[1:]], self.engine.state.step
        if t.max_time and done < self.total:  # stopped by the clock: more time, not a smaller batch
            more = f"a longer --max-time (it made {done} of its {self.total} updates)"
        else:
            more = "more --max-steps" if t.max_steps else "a smaller --batch-size (more updates), more --epochs"
        if self.best.unlearnt:  # (judged as it was evaluated; a best from before a resumption, at the run's end)
            return (f"the model learnt nothing: {self.best.unlearnt} (the best of {len(self.history)} evaluation(s), "
                    f"{done} updates of batch {t.batch_size}); try {more} or another --lr")
        if later and all(later):  # (the first evaluation passed: near-random predictions, or a start later lost)
            value = self.best.metrics[self.task.select]
            return (f"after its first evaluation the model learnt nothing more: {later[-1]} (evaluations "
                    f"2-{len(self.history)}); the model kept is the first's ({self.task.select} {value:.4g}): if "
                    f"that is low, try {more} or another --lr; if it is not, a lower --lr")
        return None

    # ---- the loop's hooks
    def next_batches(self) -> list[dict]:
        if self.batches.at_epoch_start():
            self.engine.state.take_meters()  # a logging line covers steps of its own epoch only
        taken = self.batches.take()
        if self.estimated is None:  # this process's real tokens until eval_estimate is made, counted on the host
            self.train_tokens += sum(int(v.sum()) for b in taken for k, v in b.items() if k.endswith("attention_mask"))
        return [to_device(b, self.engine.device) for b in taken]

    def eval_estimate(self) -> float:
        """Seconds an evaluation will take, before one is measured: its tokens at a third of a training token's
        time (the forward pass of each) where the task counts them, so that long validation texts beside short
        training ones are not taken for short (else by sequences, as the base estimate)."""
        tokens = self.task.eval_tokens() if self.validating else None
        if tokens is None or not self.train_tokens:
            return super().eval_estimate()
        return self.step_seconds / self.train_tokens * self.d.world * tokens / 3

    def record(self, out: dict, seconds: float) -> None:
        # out["examples"]: the global batch's examples, summed over processes by the engine
        self.engine.state.add(loss=out["loss"] / out["examples"], grad_norm=out["grad_norm"], n=1)

    def log_line(self, out: dict) -> tuple[dict, str, dict]:
        st, m = self.engine.state, self.engine.state.take_meters()
        loss, lr, epoch = m["loss"] / m["n"], out["lr"], self.batches.epoch
        row = {"type": "train", "step": st.step, "epoch": epoch, "loss": loss, "lr": lr, "elapsed": st.elapsed}
        text = f"epoch {epoch}  loss {loss:.4f}  lr {lr:.2e}  grad-norm {m['grad_norm'] / m['n']:.3f}"
        return row, text, dict(loss=f"{loss:.4f}", lr=f"{lr:.2e}")

    def epoch_ended(self) -> bool:
        return self.batches.epoch_ended()

    def epoch_steps(self) -> int:
        return -(-len(self.batches.features) // self.batches.batch_size)

    def evaluate(self) -> None:
        if not self.d.is_main or not self.validating:  # rank 0 evaluates; the others wait at the next all-reduce
            return
        res, artifacts = self.task.evaluate(self.model, self.engine.device)
        self.model.train()
        step, epoch = self.engine.state.step, self.batches.epoch
        self.history.append(EpochResult(epoch, step, res, artifacts, self.task.unlearnt(res, artifacts)))
        self.log_eval(res, f"epoch {epoch}, step {step}", epoch=epoch)
        if self.better(self.history[-1]):
            if self.best is not None:  # (only the best evaluation's predictions are written: the others' go)
                self.best.artifacts = None
            self.best = self.history[-1]
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
        else:
            self.history[-1].artifacts = None

    def better(self, new: EpochResult) -> bool:
        """Whether an evaluation beats the best so far: a model that learnt beats one that learnt nothing whatever
        their figures (a classifier that gives every example the validation set's most frequent label can be the
        more accurate), then the higher figure wins."""
        if self.best is None:
            return True
        if bool(new.unlearnt) != bool(self.best.unlearnt):
            return not new.unlearnt
        return new.metrics[self.task.select] > self.best.metrics[self.task.select]

    def eval_size(self) -> int:
        return self.task.eval_size() if self.validating else 0

    # ---- checkpoints
    def run_state(self) -> tuple[dict, dict | None]:
        b = self.best
        state = {**self.batches.state_dict(),
                 "history": [[h.epoch, h.step, h.metrics, h.unlearnt] for h in self.history],
                 "best": None if b is None else [b.epoch, b.step, b.metrics]}
        return state, None if b is None else {"best": self.best_weights}

    def load_run_state(self, state: dict, path: str) -> None:
        self.batches.load_state_dict(state)
        self.history = [EpochResult(*h[:3], unlearnt=h[3] if len(h) > 3 else None) for h in state["history"]]
        if state.get("best") is not None:
            # the best is one of the evaluations, its verdict with it (a tie is judged as without the resumption)
            self.best = next(h for h in self.history if h.step == state["best"][1])
            self.best.restored = True
            self.best_weights = load_file(os.path.join(path, "best.safetensors"))
