"""``bertforge pretrain``: masked-LM (+ next sentence) pretraining with evaluation, plots, atomic
checkpoints, exact resume, and DistributedDataParallel under ``torchrun``.

Output folder layout::

    DIR/config.json, model.safetensors, vocab.txt, tokenizer.json, ...   the model (a Hugging Face BERT
                                                                          directory, refreshed at each save)
    DIR/pretrain_config.json      the resolved configuration of the run
    DIR/metrics.jsonl             one line per logging step ("type": "train") and per evaluation ("eval")
    DIR/metrics.json              the final figures
    DIR/train.log                 the log, with sample fill-mask predictions at each evaluation
    DIR/plots/*.png               loss, accuracy and learning-rate curves
    DIR/checkpoints/step-NNNNNNNN/ model.safetensors, optimizer.pt, trainer_state.pt (the last K kept)

A checkpoint holds everything that decides the rest of the run (weights, optimizer moments, every RNG
state, the data position, the step, the logging accumulators), so a run killed at any point and resumed
from its newest checkpoint ends, on the CPU, with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from tqdm import tqdm

from . import checkpoint as ckpt
from .config import BertConfig, PretrainConfig
from .corpus import iter_texts
from .data import (
    Masker,
    MaskingConfig,
    PretrainingLoader,
    TokenizedCorpus,
    build_corpus,
    eval_batches,
    split_documents,
)
from .engine import (
    Dist,
    LinearSchedule,
    TrainingError,
    autocast_context,
    build_optimizer,
    init_distributed,
    maybe_compile,
    resolve_device,
    rng_state,
    set_lr,
    set_rng_state,
    setup_backend,
)
from .errors import UserError
from .evaluation import evaluate_pretraining, fill_mask_samples, to_device
from .model import BertForMaskedLM, BertForPreTraining, flops_per_token
from .plots import plot_pretraining
from .tokenizer import load_tokenizer, save_tokenizer, special_ids, train_tokenizer

log = logging.getLogger("bertforge")

CHECKPOINTS = "checkpoints"
CONFIG_FILE = "pretrain_config.json"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


# ------------------------------------------------------------------------------------------------ the step
class PretrainingObjective(torch.nn.Module):
    """The model's summed MLM (+ NSP) losses as one ``forward``: what DDP and ``torch.compile`` wrap."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None):
        return self.model.pretraining_loss(input_ids, attention_mask, token_type_ids, labels, next_sentence_label)


def train_step(objective, batches: list[dict], optimizer, n_mask: float, batch_size: int, world: int = 1,
               autocast=None, ddp=None, max_grad_norm: float = 1.0) -> tuple[float, float, float]:
    """One optimisation step over the micro-batches of this process.

    The loss is normalised over the global batch (masked tokens of all processes and micro-batches for MLM,
    sequences for NSP), so N processes with accumulation compute exactly the gradient of one process with
    the whole batch.  Returns this process's (summed MLM loss, summed NSP loss, gradient norm); the caller
    checks them for non-finite values before calling ``optimizer.step()``.
    """
    mlm_acc = nsp_acc = 0.0
    for i, b in enumerate(batches):
        # gradients are all-reduced once per step, after the last micro-batch
        sync = contextlib.nullcontext() if (ddp is None or i == len(batches) - 1) else ddp.no_sync()
        with sync:
            with autocast or contextlib.nullcontext():
                mlm_sum, nsp_sum = objective(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"],
                                             b.get("next_sentence_label"))
                loss = mlm_sum.float() / n_mask
                if nsp_sum is not None:
                    loss = loss + nsp_sum.float() / batch_size
            (loss * world).backward()  # DDP averages over processes; the loss is already a global mean
        mlm_acc += float(mlm_sum.detach())
        if nsp_sum is not None:
            nsp_acc += float(nsp_sum.detach())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True))
    return mlm_acc, nsp_acc, grad_norm


# ------------------------------------------------------------------------------------------------ checkpoints
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


def save_checkpoint(out: str, step: int, model, optimizer, state: dict, keep: int) -> str:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep``."""
    final = os.path.join(out, CHECKPOINTS, f"step-{step:08d}")
    with ckpt.atomic_dir(final) as tmp:
        from safetensors.torch import save_file

        save_file(ckpt.model_state_for_saving(model), os.path.join(tmp, ckpt.WEIGHTS_NAME), metadata={"format": "pt"})
        torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
        torch.save(state, os.path.join(tmp, "trainer_state.pt"))
        readable = {k: v for k, v in state.items() if isinstance(v, (int, float, str)) or k in ("loader",)}
        with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump(readable, f, indent=2)
    for _, old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str, model, optimizer) -> dict:
    from safetensors.torch import load_file

    sd = load_file(os.path.join(path, ckpt.WEIGHTS_NAME))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if k != "cls.predictions.decoder.weight"]:
        raise UserError(f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), weights_only=True, map_location="cpu"))
    return torch.load(os.path.join(path, "trainer_state.pt"), weights_only=True, map_location="cpu")


# ------------------------------------------------------------------------------------------------ metrics log
class MetricsLog:
    """metrics.jsonl (and TensorBoard when installed), written by rank 0 only."""

    def __init__(self, out: str, enabled: bool):
        self.path = os.path.join(out, "metrics.jsonl")
        self.enabled = enabled
        self.tb = None
        if enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(out, "tensorboard"))
            except Exception:  # tensorboard not installed
                self.tb = None

    def truncate_after(self, step: int) -> None:
        """Drop lines written after ``step`` (by a run that was interrupted before its next checkpoint)."""
        if not self.enabled or not os.path.isfile(self.path):
            return
        with open(self.path, encoding="utf-8") as f:
            keep = [line for line in f if line.strip() and json.loads(line).get("step", 0) <= step]
        ckpt.atomic_write_text(self.path, "".join(keep))

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k not in ("step", "type"):
                    self.tb.add_scalar(f"{row.get('type', 'train')}/{k}", v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


# ------------------------------------------------------------------------------------------------ set-up
def _broadcast_str(d: Dist, text: str | None) -> str:
    if not d.enabled:
        return text or ""
    obj = [text]
    dist.broadcast_object_list(obj, src=0)
    return obj[0]


def prepare_tokenizer(cfg: PretrainConfig, resume: bool, d: Dist) -> Tokenizer:
    """The run's tokenizer: the output folder's on resume, then --tokenizer, then --init's, else trained."""
    dc = cfg.data
    if resume:
        return load_tokenizer(cfg.out)
    if dc.tokenizer:
        return load_tokenizer(dc.tokenizer)
    if cfg.model.init:
        return load_tokenizer(cfg.model.init)
    text = None
    if d.is_main:
        log.info("training a %s vocabulary of %d tokens on the data", dc.tokenizer_model, dc.vocab_size)
        tok = train_tokenizer(
            iter_texts(dc.data, dc.text_field, dc.doc_separator), dc.vocab_size, kind=dc.tokenizer_model,
            lowercase=dc.lowercase, show_progress=cfg.impl.progress,
        )
        text = tok.to_str()
    return Tokenizer.from_str(_broadcast_str(d, text))


def prepare_model_config(cfg: PretrainConfig, tok: Tokenizer, resume: bool) -> BertConfig:
    mc = cfg.model
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    if resume:
        config = BertConfig.load(cfg.out)
    elif mc.init:
        config = BertConfig.load(mc.init)
    elif mc.model_config:
        config = BertConfig.load(mc.model_config)
    else:
        config = BertConfig.preset(mc.preset, vocab_size=n_vocab)
    if mc.dropout is not None and not resume:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = mc.dropout
    if n_vocab > config.vocab_size:
        raise UserError(
            f"the tokenizer has {n_vocab} tokens but the model's vocabulary holds {config.vocab_size}: "
            "they do not belong together"
        )
    if cfg.data.max_seq_length > config.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {cfg.data.max_seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}"
        )
    return config


def validate(cfg: PretrainConfig, resume: bool) -> None:
    """Checks that need no heavy work, done before anything is written."""
    if not cfg.out:
        raise UserError("--out is required")
    has_run = bool(list_checkpoints(cfg.out))
    if resume and not has_run:
        raise UserError(f"nothing to resume: no complete checkpoint in {os.path.join(cfg.out, CHECKPOINTS)}")
    if not resume and has_run:
        raise UserError(f"{cfg.out} already holds a training run; pass --resume to continue it, or choose another --out")
    if not cfg.data.data and not resume:
        raise UserError("--data is required")
    t = cfg.train
    if t.max_steps is None and t.max_time is None:
        raise UserError("give --max-steps or --max-time")
    if t.batch_size < 1 or t.grad_accum < 1 or t.batch_size % t.grad_accum:
        raise UserError(f"--batch-size {t.batch_size} must be a positive multiple of --grad-accum {t.grad_accum}")
    if not 0 < cfg.data.mask_prob < 1:
        raise UserError(f"--mask-prob must lie in (0, 1), not {cfg.data.mask_prob}")
    if cfg.data.tokenizer_model not in ("wordpiece", "wordlevel"):
        raise UserError(f"unknown tokenizer model {cfg.data.tokenizer_model!r}")
    if cfg.model.init and not os.path.isdir(cfg.model.init):
        raise UserError(f"--init directory not found: {cfg.model.init}")
    from .config import PRESETS

    if cfg.model.preset not in PRESETS:
        raise UserError(f"unknown preset {cfg.model.preset!r}; expected one of {', '.join(PRESETS)}")
    if not resume and os.path.exists(cfg.out) and not os.path.isdir(cfg.out):
        raise UserError(f"--out {cfg.out} exists and is not a directory")


def most_frequent_token(corpus: TokenizedCorpus, exclude: set[int], sample: int = 20_000_000) -> int:
    counts = np.bincount(np.asarray(corpus.tokens[:sample], dtype=np.int64))
    for t in exclude:
        if t < len(counts):
            counts[t] = 0
    return int(counts.argmax())


# ------------------------------------------------------------------------------------------------ the run
def run_pretraining(cfg: PretrainConfig, resume: bool = False) -> dict[str, Any]:
    """Pretrain as ``cfg`` says; return the final metrics (also written to DIR/metrics.json)."""
    validate(cfg, resume)
    device_kind = "cuda" if cfg.impl.device.startswith("cuda") or (cfg.impl.device == "auto" and torch.cuda.is_available()) else "cpu"
    d = init_distributed(device_kind)
    device = resolve_device(cfg.impl, d)
    setup_backend(device, cfg.impl, d)
    t = cfg.train
    dc = cfg.data

    # ---- tokenizer, corpus, model: everything that can fail on bad input, before DIR is written
    tok = prepare_tokenizer(cfg, resume, d)
    special_ids(tok)  # a vocabulary without [CLS], [SEP], [MASK]... fails here, before anything is written
    config = prepare_model_config(cfg, tok, resume)
    mcfg = MaskingConfig(dc.max_seq_length, dc.mask_prob, dc.short_seq_prob, dc.nsp, dc.whole_word_mask)
    masker = Masker(tok, mcfg)

    def corpus_of(paths: list[str]) -> TokenizedCorpus:
        c = None
        if d.is_main:
            c = build_corpus(paths, tok, dc.cache_dir, dc.text_field, dc.doc_separator, progress=cfg.impl.progress)
        d.barrier()
        return c or build_corpus(paths, tok, dc.cache_dir, dc.text_field, dc.doc_separator)

    corpus = corpus_of(dc.data)
    if dc.eval_data:
        eval_corpus = corpus_of(dc.eval_data)
        train_docs = np.arange(corpus.n_documents)
        eval_docs = np.arange(eval_corpus.n_documents)
        if dc.nsp and corpus.n_documents < 2:
            raise UserError("next sentence prediction needs at least 2 training documents (or --no-nsp)")
    else:
        eval_corpus = corpus
        train_docs, eval_docs = split_documents(corpus, t.seed, need_train=2 if dc.nsp else 1)
    loader = PretrainingLoader(corpus, train_docs, masker, t.batch_size, t.seed, d.rank, d.world)
    micro = t.batch_size // d.world // t.grad_accum
    if micro < 1:
        raise UserError(f"--batch-size {t.batch_size} is smaller than processes x --grad-accum")

    torch.manual_seed(t.seed)
    model_cls = BertForPreTraining if dc.nsp else BertForMaskedLM
    if cfg.model.init and not resume:
        model = model_cls.from_pretrained(cfg.model.init, config=config)
    else:
        model = model_cls(config)
    model.to(device)
    torch.manual_seed(t.seed + d.rank)  # dropout streams differ by rank

    # ---- the output folder
    out = cfg.out
    metrics = MetricsLog(out, d.is_main)
    if d.is_main:
        os.makedirs(out, exist_ok=True)
        if not resume:
            save_tokenizer(tok, out, model_max_length=config.max_position_embeddings)
            model.save_pretrained(out)
        ckpt.atomic_write_json(os.path.join(out, CONFIG_FILE), cfg.to_dict())
    d.barrier()
    run = _Run(cfg, resume, d, device, tok, config, masker, corpus, eval_corpus, train_docs, eval_docs, loader, micro,
               model, metrics)
    with _file_log(out, d.is_main):
        return _train(run)


@dataclass
class _Run:
    """What the set-up hands to the training loop."""

    cfg: PretrainConfig
    resume: bool
    d: Dist
    device: torch.device
    tok: Tokenizer
    config: BertConfig
    masker: Masker
    corpus: TokenizedCorpus
    eval_corpus: TokenizedCorpus
    train_docs: np.ndarray
    eval_docs: np.ndarray
    loader: PretrainingLoader
    micro: int
    model: torch.nn.Module
    metrics: MetricsLog


def _train(run: _Run) -> dict[str, Any]:
    cfg, resume, d, device, tok, config = run.cfg, run.resume, run.d, run.device, run.tok, run.config
    corpus, eval_corpus, train_docs, eval_docs = run.corpus, run.eval_corpus, run.train_docs, run.eval_docs
    loader, micro, model, metrics, masker = run.loader, run.micro, run.model, run.metrics, run.masker
    model_cls, sp = type(model), special_ids(tok)
    t, dc, out = cfg.train, cfg.data, cfg.out

    optimizer = build_optimizer(model, t, device)
    schedule = LinearSchedule(t.lr, t.max_steps, t.max_time, t.warmup_steps, t.warmup_ratio)
    step, elapsed, tokens_seen = 0, 0.0, 0
    acc = _new_acc()
    if resume:
        last_step, path = list_checkpoints(out)[-1]
        state = load_checkpoint(path, model, optimizer)
        step, elapsed, tokens_seen = int(state["step"]), float(state["elapsed"]), int(state["tokens_seen"])
        acc = {k: float(v) for k, v in state["acc"].items()}
        loader.load_state_dict(state["loader"])
        set_rng_state(state["rng"][d.rank] if d.rank < len(state["rng"]) else state["rng"][0])
        metrics.truncate_after(step)
        log.info("resumed from %s (step %d)", path, step)

    objective, ddp = PretrainingObjective(model), None
    if d.enabled:
        from torch.nn.parallel import DistributedDataParallel as DDP

        objective = ddp = DDP(objective, device_ids=[device.index] if device.type == "cuda" else None)
    objective = maybe_compile(objective, cfg.impl)
    autocast = autocast_context(device, cfg.impl)
    eval_set = None
    baseline_tok = None
    if d.is_main:
        eval_set = eval_batches(eval_corpus, eval_docs, masker, max(micro, 32), t.seed, dc.max_eval_instances,
                                random_pool=train_docs if eval_corpus is corpus else None)
        baseline_tok = most_frequent_token(corpus, sp.as_set())
    log.info(
        "pretraining %s (%.1fM parameters, %s) on %d documents (%d tokens), %d held out; batch %d = %d process(es) x %d accumulation x %d",
        model_cls.__name__, model.num_parameters() / 1e6, device, len(train_docs), corpus.n_tokens, len(eval_docs),
        t.batch_size, d.world, t.grad_accum, micro,
    )

    def evaluate(step_now: int) -> dict:
        res: dict = {}
        if d.is_main:
            res = evaluate_pretraining(model, eval_set, device, autocast_context(device, cfg.impl), baseline_tok)
            metrics.write({"type": "eval", "step": step_now, **res})
            log.info("eval step %d: %s", step_now, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in res.items()}))
            if eval_set:
                log.info("sample predictions (top-5) at step %d:\n%s", step_now, "\n".join(fill_mask_samples(model, tok, eval_set[0], device)))
        d.barrier()
        return res

    def checkpoint(step_now: int) -> None:
        states = [rng_state()]
        if d.enabled:
            states = [None] * d.world
            dist.all_gather_object(states, rng_state())
        if d.is_main:
            state = {"step": step_now, "elapsed": elapsed, "tokens_seen": tokens_seen, "loader": loader.state_dict(),
                     "rng": states, "acc": dict(acc)}
            save_checkpoint(out, step_now, model, optimizer, state, t.keep_checkpoints)
            ckpt.save_pretrained(model, out)
        d.barrier()

    # ---- the loop
    bar = tqdm(total=t.max_steps, initial=step, desc="pretraining", unit="step",
               disable=not (cfg.impl.progress and d.is_main), dynamic_ncols=True)
    session_tokens, session_time, last_eval = 0, 0.0, None
    start = time.perf_counter() - elapsed
    try:
        while not schedule.done(step, elapsed):
            t0 = time.perf_counter()
            epoch, rows = loader.next_rows()
            parts = np.array_split(rows, t.grad_accum)
            batches = [to_device(loader.build(epoch, p), device) for p in parts]
            n_mask, n_tok = d.all_sum([sum(float((b["labels"] != -100).sum()) for b in batches),
                                       sum(float(b["attention_mask"].sum()) for b in batches)], device)
            lr = schedule.lr(step, elapsed)
            set_lr(optimizer, lr)
            mlm_local, nsp_local, grad_norm = train_step(objective, batches, optimizer, n_mask, t.batch_size, d.world,
                                                         autocast, ddp, t.max_grad_norm)
            mlm_total, nsp_total = d.all_sum([mlm_local, nsp_local], device)
            seqs = float(t.batch_size)
            if not (math.isfinite(grad_norm) and math.isfinite(mlm_total) and math.isfinite(nsp_total)):
                last = list_checkpoints(out)
                where = f"; the last good checkpoint is {last[-1][1]}" if last else ""
                raise TrainingError(f"the loss is not finite at step {step + 1} (lr {lr:.3g}){where}; "
                                    "try a lower --lr or a longer warmup")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            dt = time.perf_counter() - t0
            tokens_seen += int(n_tok)
            session_tokens += int(n_tok)
            session_time += dt
            elapsed = time.perf_counter() - start
            acc["mlm"] += mlm_total
            acc["masked"] += n_mask
            acc["nsp"] += nsp_total
            acc["seqs"] += seqs
            acc["tokens"] += n_tok
            acc["time"] += dt
            acc["steps"] += 1
            acc["grad_norm"] += grad_norm
            bar.update(1)
            if step % t.log_every == 0 or schedule.done(step, elapsed):
                row = {
                    "type": "train", "step": step, "tokens_seen": tokens_seen,
                    "mlm_loss": acc["mlm"] / max(1, acc["masked"]),
                    "lr": lr, "grad_norm": acc["grad_norm"] / max(1, acc["steps"]),
                    "tokens_per_second": acc["tokens"] / max(1e-9, acc["time"]), "elapsed": elapsed,
                }
                if dc.nsp:
                    row["nsp_loss"] = acc["nsp"] / max(1, acc["seqs"])
                    row["loss"] = row["mlm_loss"] + row["nsp_loss"]
                metrics.write(row)
                bar.set_postfix(loss=f"{row.get('loss', row['mlm_loss']):.3f}", tok_s=f"{row['tokens_per_second']:.0f}", lr=f"{lr:.2e}")
                if t.max_time and not t.max_steps:
                    bar.set_postfix_str(bar.postfix + f", left={max(0, t.max_time - elapsed):.0f}s")
                acc = _new_acc()
            if t.eval_every and step % t.eval_every == 0:
                last_eval = evaluate(step)
                elapsed = time.perf_counter() - start
            if t.save_every and step % t.save_every == 0:
                checkpoint(step)
                elapsed = time.perf_counter() - start
    except KeyboardInterrupt:
        bar.close()
        last = list_checkpoints(out)
        raise TrainingError(
            f"interrupted at step {step}; continue with --resume" + (f" (from step {last[-1][0]})" if last else "")
        ) from None
    bar.close()

    # ---- the end: final evaluation, checkpoint, model directory, metrics.json, plots
    if last_eval is None or not (t.eval_every and step % t.eval_every == 0):
        last_eval = evaluate(step)
    if not (t.save_every and step % t.save_every == 0):
        checkpoint(step)
    final: dict[str, Any] = {}
    if d.is_main:
        tps = session_tokens / max(1e-9, session_time)
        final = {
            **{k: v for k, v in last_eval.items()},
            "steps": step,
            "tokens_seen": tokens_seen,
            "tokens_per_second": tps,
            "wall_seconds": time.perf_counter() - start,
            "train_seconds_this_session": session_time,
            "model_flops_per_token": flops_per_token(config, dc.max_seq_length, dc.mask_prob),
            "parameters": model.num_parameters(),
            "device": str(device),
            "processes": d.world,
        }
        ckpt.atomic_write_json(os.path.join(out, "metrics.json"), final)
        metrics.close()
        try:
            plot_pretraining(metrics.path, os.path.join(out, "plots"))
        except Exception as e:  # a plot must never cost a finished run
            log.warning("could not draw plots: %s", e)
        log.info("done: %s", json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in final.items()}))
    d.barrier()
    if d.enabled:
        dist.destroy_process_group()
    return final


def _new_acc() -> dict[str, float]:
    return {k: 0.0 for k in ("mlm", "masked", "nsp", "seqs", "tokens", "time", "steps", "grad_norm")}


@contextlib.contextmanager
def _file_log(out: str, enabled: bool):
    """Copy the log to DIR/train.log for the duration of the run."""
    if not enabled:
        yield
        return
    h = logging.FileHandler(os.path.join(out, "train.log"), encoding="utf-8")
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    h.setLevel(logging.INFO)
    old_level = log.level
    log.addHandler(h)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(h)
        h.close()
        log.setLevel(old_level)
