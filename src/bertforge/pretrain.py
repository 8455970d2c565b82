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
state, the data position, the step, the logging meters), so a run killed at any point and resumed
from its newest checkpoint ends, on the CPU, with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer
from tqdm import tqdm

from . import checkpoint as ckpt
from . import modelcard
from .batching import to_device
from .config import BertConfig, PretrainConfig
from .corpus import iter_texts
from .data import (
    Masker,
    MaskingConfig,
    PretrainingLoader,
    TokenizedCorpus,
    build_corpus,
    cut_into_documents,
    eval_batches,
    split_documents,
)
from .devices import Dist, init_distributed, resolve_device, setup_backend
from .electra import DISCRIMINATOR_WEIGHT, GENERATOR_DIR, ElectraPretraining, generator_config
from .electra import flops_per_token as electra_flops
from .engine import Engine, LinearSchedule, LossFn, NonFiniteLoss, gather_rng_states, restore_rng_state
from .errors import TrainingError, UserError
from .evaluation import evaluate_pretraining, evaluate_replaced_token_detection, fill_mask_samples
from .atomic import atomic_write_json, remove_stale_temporaries
from .files import read_json_object
from .outputs import (
    MODEL_FILES,
    OutputLock,
    check_inputs_outside,
    check_output,
    register_output,
    remove_output,
    write_marker,
)
from .logs import MetricsLog, duration, file_log, log_step, rounded
from .model import BertForMaskedLM, BertForPreTraining, flops_per_token, local_attention_heads_, sinusoidal_positions_
from .ops.dropout import batch_keys
from .plots import plot_pretraining
from .tokenizer import check_vocab_fits, load_tokenizer, save_tokenizer, special_ids, train_vocabulary

log = logging.getLogger("bertforge")

CONFIG_FILE = "pretrain_config.json"
register_output("pretrain", MODEL_FILES | {CONFIG_FILE, "metrics.jsonl", "metrics.json", "train.log", "plots",
                                           "checkpoints", "tensorboard", "generator", "README.md"})
CUT_PARTS = 20  # the documents a corpus of too few is cut into


# ------------------------------------------------------------------------------------------------ the loss
class PretrainingObjective(torch.nn.Module):
    """The model's ``pretraining_loss`` as one ``forward``: what DDP and ``torch.compile`` wrap (summed MLM
    and NSP losses; for ELECTRA, :meth:`~bertforge.electra.ElectraPretraining.replaced_token_detection`'s)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None, dropout_keys=None):
        return self.model.pretraining_loss(input_ids, attention_mask, token_type_ids, labels, next_sentence_label,
                                           dropout_keys)


ELECTRA_COUNTS = ("real", "replaced", "hit_replaced", "hit_original", "gen_hits")


def electra_loss_fn(n_mask: float, n_tokens: float, seed: int | None = None, step: int = 0) -> LossFn:
    """ELECTRA's loss of one micro-batch, normalised over the global batch: the generator's MLM loss over
    the masked tokens (``n_mask``) plus 50 times the discriminator's over the real tokens (``n_tokens``).
    On the CPU the replacements are sampled from generators keyed like the dropout masks."""

    def loss_fn(objective, b: dict):
        gen, disc, counts = objective(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"],
                                      dropout_keys=batch_keys(b, seed, step))
        loss = gen.float() / n_mask + DISCRIMINATOR_WEIGHT * disc.float() / n_tokens
        return loss, {"mlm": gen.detach(), "disc": disc.detach(), **dict(zip(ELECTRA_COUNTS, counts))}

    return loss_fn


def pretraining_loss_fn(n_mask: float, batch_size: int, seed: int | None = None, step: int = 0) -> LossFn:
    """The loss of one micro-batch, normalised over the global batch: the MLM loss over the masked tokens
    of all processes and micro-batches (``n_mask``), the NSP loss over its sequences (``batch_size``).

    With ``seed``, on the CPU, dropout masks are keyed by (seed, ``step``, each sequence's index in the
    epoch, the batch's ``sequence_ids``), so that they do not depend on how sequences are split among
    processes and micro-batches (on CUDA the fused attention kernels draw their own)."""

    def loss_fn(objective, b: dict):
        mlm, nsp = objective(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"],
                             b.get("next_sentence_label"), dropout_keys=batch_keys(b, seed, step))
        loss, parts = mlm.float() / n_mask, {"mlm": mlm.detach()}
        if nsp is not None:
            loss, parts["nsp"] = loss + nsp.float() / batch_size, nsp.detach()
        return loss, parts

    return loss_fn


# ------------------------------------------------------------------------------------------------ set-up
def check_run(cfg: PretrainConfig, resume: bool, overwrite: bool = False) -> bool:
    """Every check that needs no heavy work, done before anything is read or written; True when an earlier
    pretraining output in ``cfg.out`` is to be replaced (``overwrite``)."""
    if not cfg.out:
        raise UserError("--out is required")
    if resume and overwrite:
        raise UserError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    has_run = bool(ckpt.list_checkpoints(cfg.out))
    if resume and not has_run:
        raise UserError(f"nothing to resume: no complete checkpoint in {os.path.join(cfg.out, ckpt.CHECKPOINTS)}")
    if not resume and has_run and not overwrite:
        raise UserError(f"{cfg.out} already holds a training run; pass --resume to continue it, --overwrite to "
                        "replace it, or choose another --out")
    replace = check_output(cfg.out, "pretrain", overwrite=overwrite, resume=resume)
    if replace:
        m, dc = cfg.model, cfg.data
        check_inputs_outside(cfg.out, [*dc.data, *(dc.eval_data or []), dc.tokenizer, m.init, m.model_config])
    cfg.validate(resume)
    if cfg.model.init and not os.path.isdir(cfg.model.init):
        raise UserError(f"--init directory not found: {cfg.model.init}")
    return replace


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
        tok = train_vocabulary(
            iter_texts(dc.data, dc.text_field, dc.doc_separator), dc.vocab_size, kind=dc.tokenizer_model,
            lowercase=dc.lowercase, show_progress=cfg.impl.progress,
        )
        size = tok.get_vocab_size(with_added_tokens=True)
        if size < dc.vocab_size:
            log.warning("asked for a vocabulary of %d tokens; the corpus gave %d (too little text or too few "
                        "distinct words): the model is built for %d", dc.vocab_size, size, size)
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
    check_vocab_fits(tok, config.vocab_size, "--tokenizer and the model")
    if cfg.data.max_seq_length > config.max_position_embeddings:
        raise UserError(
            f"--max-seq-length {cfg.data.max_seq_length} exceeds the model's max_position_embeddings "
            f"{config.max_position_embeddings}"
        )
    return config


SCHEDULE = ("lr", "max_steps", "max_time", "warmup_steps", "warmup_ratio", "batch_size")


def warn_if_schedule_changed(out: str, cfg: PretrainConfig) -> None:
    """On resume: say so when the settings that shape the learning-rate schedule differ from the saved run's."""
    try:
        saved = PretrainConfig.from_dict(read_json_object(os.path.join(out, CONFIG_FILE), CONFIG_FILE)).train
    except UserError:
        return
    changed = [f"--{k.replace('_', '-')} {getattr(saved, k)} -> {getattr(cfg.train, k)}" for k in SCHEDULE
               if getattr(saved, k) != getattr(cfg.train, k)]
    if changed:
        log.warning("resuming with %s: the learning-rate schedule is recomputed from here with the new values, so "
                    "the run no longer reproduces an uninterrupted run of either setting", ", ".join(changed))


def most_frequent_token(corpus: TokenizedCorpus, exclude: set[int], sample: int = 20_000_000) -> int:
    counts = np.bincount(np.asarray(corpus.tokens[:sample], dtype=np.int64))
    for t in exclude:
        if t < len(counts):
            counts[t] = 0
    return int(counts.argmax())


# ------------------------------------------------------------------------------------------------ the run
def pretrain(cfg: PretrainConfig, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Pretrain as ``cfg`` says; return the final metrics (also written to DIR/metrics.json).

    ``resume`` continues the run in ``cfg.out`` from its newest loadable checkpoint; ``overwrite`` replaces
    an earlier pretraining output there.  Any other existing, non-empty ``cfg.out`` is refused.
    """
    replace = check_run(cfg, resume, overwrite)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    new = not resume and (replace or not os.path.exists(cfg.out) or not os.listdir(cfg.out))
    with OutputLock(cfg.out, enabled=main_rank), ckpt.removed_unless_checkpointed(cfg.out, "pretrain", main_rank and new):
        run = Pretraining(cfg, resume, replace)
        with file_log(cfg.out, run.d.is_main):
            return run.train()


class Pretraining:
    """One pretraining run: set up on construction (everything that can fail on bad input fails before the
    output folder is written), then :meth:`train`."""

    def __init__(self, cfg: PretrainConfig, resume: bool, replace: bool = False):
        self.cfg, self.resume, t, dc = cfg, resume, cfg.train, cfg.data
        self.d = d = init_distributed(cfg.impl)
        self.device = resolve_device(cfg.impl, d)
        setup_backend(self.device, cfg.impl, d)

        self.tok = prepare_tokenizer(cfg, resume, d)
        self.sp = special_ids(self.tok)  # a vocabulary without [CLS], [SEP], [MASK]... fails here
        self.config = prepare_model_config(cfg, self.tok, resume)
        self.masker = Masker(self.tok, MaskingConfig(dc.max_seq_length, dc.mask_prob, dc.short_seq_prob, dc.nsp,
                                                     dc.whole_word_mask))
        self.corpus = self._corpus(dc.data)
        need = (2 if dc.nsp else 1) + (0 if dc.eval_data else 1)  # training documents, and one to hold out
        if self.corpus.n_documents < need:
            self.corpus = self._cut(self.corpus, need)
        if dc.eval_data:
            self.eval_corpus = self._corpus(dc.eval_data)
            self.train_docs, self.eval_docs = np.arange(self.corpus.n_documents), np.arange(self.eval_corpus.n_documents)
        else:
            self.eval_corpus = self.corpus
            self.train_docs, self.eval_docs = split_documents(self.corpus, t.seed, need_train=2 if dc.nsp else 1)
        self.loader = PretrainingLoader(self.corpus, self.train_docs, self.masker, t.batch_size, t.seed, d.rank, d.world)
        self.micro = t.batch_size // d.world // t.grad_accum
        if self.micro < 1:
            raise UserError(f"--batch-size {t.batch_size} is smaller than processes x --grad-accum")
        n_instances = len(self.loader.instances(0)[0]) if not resume else t.batch_size
        if n_instances < t.batch_size:  # before anything is written
            raise UserError(f"the training data yields {n_instances} instances per epoch, fewer than one batch of "
                            f"{t.batch_size}; lower --batch-size or add data")

        torch.manual_seed(t.seed)
        self.electra = cfg.model.objective == "electra"
        model_cls = BertForPreTraining if dc.nsp else BertForMaskedLM
        if self.electra:
            self.model = ElectraPretraining(self.config, cfg.model.generator_size)
        elif cfg.model.init and not resume:
            self.model = model_cls.from_pretrained(cfg.model.init, config=self.config)
        else:
            self.model = model_cls(self.config)
        if cfg.model.position_init == "sinusoidal" and not cfg.model.init and not resume:
            sinusoidal_positions_(self.model)
            if cfg.model.attention_init == "local":
                local_attention_heads_(self.model)
        if cfg.model.dropout is not None:  # pretraining's own; config.json keeps the model's, for fine-tuning
            self.model.set_dropout(cfg.model.dropout)
        self.model.to(self.device)
        torch.manual_seed(t.seed + d.rank)  # dropout streams differ by rank

        out = cfg.out
        self.metrics = MetricsLog(out, d.is_main, tensorboard=cfg.impl.report_to == "tensorboard")
        if d.is_main:
            if replace:
                remove_output(out, "pretrain")
            os.makedirs(out, exist_ok=True)
            for p in remove_stale_temporaries(out) + remove_stale_temporaries(os.path.join(out, ckpt.CHECKPOINTS)):
                log.warning("removed %s, left by an interrupted save", p)
            if not resume:
                save_tokenizer(self.tok, out, model_max_length=self.config.max_position_embeddings)
                self._save_model()
                write_marker(out, "pretrain")
            else:
                warn_if_schedule_changed(out, cfg)
            atomic_write_json(os.path.join(out, CONFIG_FILE), cfg.to_dict())
        d.barrier()
        schedule = LinearSchedule(t.lr, t.max_steps, t.max_time, t.warmup_steps, t.warmup_ratio)
        self.engine = Engine(self.model, t, cfg.impl, self.device, d, PretrainingObjective(self.model), schedule)
        self.session_tokens, self.session_time = 0, 0.0

    def _cut(self, corpus: TokenizedCorpus, need: int) -> TokenizedCorpus:
        """A corpus of fewer documents than the run needs (a single text file): cut at sentence boundaries."""
        n_sent = len(corpus.sent_ends)
        parts = min(CUT_PARTS, n_sent)
        if parts < need:
            raise UserError(
                f"the corpus holds {corpus.n_documents} document(s) of {n_sent} sentence(s) in all; this run needs at "
                f"least {need} documents or sentences ({'2 for next sentence prediction' if self.cfg.data.nsp else '1'} "
                f"to train on{', 1 to hold out for evaluation' if not self.cfg.data.eval_data else ''}): add text, "
                "give --eval-data, or pass --no-nsp"
            )
        cut = cut_into_documents(corpus, parts)
        log.warning("the corpus holds %d document(s): cut into %d parts of about %d sentences at sentence boundaries "
                    "(NotNext segments come from other parts of the same text)%s", corpus.n_documents,
                    cut.n_documents, n_sent // cut.n_documents,
                    "" if self.cfg.data.eval_data else "; the held-out evaluation text is drawn from these parts")
        return cut

    def _corpus(self, paths: list[str]) -> TokenizedCorpus:
        dc, c = self.cfg.data, None
        if self.d.is_main:
            c = build_corpus(paths, self.tok, dc.cache_dir, dc.text_field, dc.doc_separator, progress=self.cfg.impl.progress)
        self.d.barrier()
        return c or build_corpus(paths, self.tok, dc.cache_dir, dc.text_field, dc.doc_separator)

    # ---- the loop
    def train(self) -> dict[str, Any]:
        cfg, t, e, st = self.cfg, self.cfg.train, self.engine, self.engine.state
        if self.resume:
            self._restore()
        self._prepare_evaluation()
        e.start_clock()  # the run's clock counts training, evaluation and saves, not the set-up
        self.start_elapsed, self.start_progress = st.elapsed, e.schedule.progress(st.step, st.elapsed)  # for the ETA
        bar = tqdm(total=t.max_steps, initial=st.step, desc="pretraining", unit="step",
                   disable=not (cfg.impl.progress and self.d.is_main), dynamic_ncols=True)
        last_eval = None
        try:
            while not e.done():
                t0 = time.perf_counter()
                epoch, rows = self.loader.next_rows()
                batches = [to_device(self.loader.build(epoch, p), self.device) for p in np.array_split(rows, t.grad_accum)]
                n_mask, n_tok = self.d.all_sum([sum(float((b["labels"] != -100).sum()) for b in batches),
                                                sum(float(b["attention_mask"].sum()) for b in batches)], self.device)
                loss_fn = (electra_loss_fn(n_mask, n_tok, t.seed, st.step) if self.electra
                           else pretraining_loss_fn(n_mask, t.batch_size, t.seed, st.step))
                try:
                    out = e.step(batches, loss_fn)
                except NonFiniteLoss as err:
                    raise TrainingError(f"{err}{self._last_checkpoint()}; try a lower --lr or a longer warmup") from None
                dt = time.perf_counter() - t0
                st.tokens_seen += int(n_tok)
                st.add(mlm=out["mlm"], masked=n_mask, nsp=out.get("nsp", 0.0), seqs=float(t.batch_size), tokens=n_tok,
                       time=dt, steps=1, grad_norm=out["grad_norm"], **{k: out[k] for k in ("disc", *ELECTRA_COUNTS) if k in out})
                self.session_tokens, self.session_time = self.session_tokens + int(n_tok), self.session_time + dt
                e.tick()
                bar.update(1)
                if st.step % t.log_every == 0 or e.done():
                    self._log_train(out["lr"], bar)
                if t.eval_every and st.step % t.eval_every == 0:
                    last_eval = self.evaluate()
                    e.tick()
                if t.save_every and st.step % t.save_every == 0:
                    self.save()
                    e.tick()
        except KeyboardInterrupt:
            bar.close()
            where = self._last_checkpoint("; continue with --resume (from step {step})") or " before the first checkpoint"
            raise TrainingError(f"interrupted at step {st.step}{where}") from None
        bar.close()
        return self._finish(last_eval)

    def _log_train(self, lr: float, bar) -> None:
        st, m = self.engine.state, self.engine.state.take_meters()
        row = {"type": "train", "step": st.step, "tokens_seen": st.tokens_seen, "mlm_loss": m["mlm"] / max(1, m["masked"]),
               "lr": lr, "grad_norm": m["grad_norm"] / max(1, m["steps"]),
               "tokens_per_second": m["tokens"] / max(1e-9, m["time"]), "elapsed": st.elapsed}
        if self.cfg.data.nsp:
            row["nsp_loss"] = m["nsp"] / max(1, m["seqs"])
            row["loss"] = row["mlm_loss"] + row["nsp_loss"]
        if self.electra:
            row["disc_loss"] = m["disc"] / max(1, m["real"])
            row["disc_accuracy"] = (m["hit_replaced"] + m["hit_original"]) / max(1, m["real"])
            row["replaced_fraction"] = m["replaced"] / max(1, m["real"])
            row["loss"] = row["mlm_loss"] + DISCRIMINATOR_WEIGHT * row["disc_loss"]
        self.metrics.write(row)
        bar.set_postfix(loss=f"{row.get('loss', row['mlm_loss']):.3f}", tok_s=f"{row['tokens_per_second']:.0f}", lr=f"{lr:.2e}")
        t = self.cfg.train
        if t.max_time and not t.max_steps:
            bar.set_postfix_str(bar.postfix + f", left={max(0, t.max_time - st.elapsed):.0f}s")
        done = self.engine.schedule.progress(st.step, st.elapsed)
        run_time = st.elapsed - self.start_elapsed
        eta = run_time * (1 - done) / max(done - self.start_progress, 1e-9) if done > self.start_progress else 0.0
        parts = f" (mlm {row['mlm_loss']:.4f}, nsp {row['nsp_loss']:.4f})" if "nsp_loss" in row else ""
        if self.electra:
            parts = (f" (generator mlm {row['mlm_loss']:.4f}, discriminator {row['disc_loss']:.4f}, "
                     f"accuracy {row['disc_accuracy']:.3f}, replaced {row['replaced_fraction']:.3f})")
        log_step(f"step {st.step}{f'/{t.max_steps}' if t.max_steps else ''}  loss {row.get('loss', row['mlm_loss']):.4f}{parts}  "
                 f"lr {lr:.2e}  grad-norm {row['grad_norm']:.3f}  {row['tokens_per_second']:,.0f} tokens/s  "
                 f"elapsed {duration(st.elapsed)}  eta {duration(eta)}", bar_shown=not bar.disable)

    # ---- evaluation, checkpoints, the end
    def _prepare_evaluation(self) -> None:
        self.eval_set, self.baseline_token = None, None
        if self.d.is_main:
            dc, t = self.cfg.data, self.cfg.train
            self.eval_set = eval_batches(self.eval_corpus, self.eval_docs, self.masker, max(self.micro, 32), t.seed,
                                         dc.max_eval_instances,
                                         random_pool=self.train_docs if self.eval_corpus is self.corpus else None)
            self.baseline_token = most_frequent_token(self.corpus, self.sp.as_set())
        log.info(
            "pretraining %s (%.1fM parameters, %s) on %d documents (%d tokens), %d held out; batch %d = %d process(es) x %d accumulation x %d",
            type(self.model).__name__, self.model.num_parameters() / 1e6, self.device, len(self.train_docs),
            self.corpus.n_tokens, len(self.eval_docs), self.cfg.train.batch_size, self.d.world, self.cfg.train.grad_accum, self.micro,
        )

    def evaluate(self) -> dict:
        res: dict = {}
        step = self.engine.state.step
        if self.d.is_main:
            mlm = self.model.generator if self.electra else self.model  # an ELECTRA run's masked LM is its generator
            res = evaluate_pretraining(mlm, self.eval_set, self.device, self.engine.autocast, self.baseline_token,
                                       mask_id=self.sp.mask)
            if self.electra:
                res.update(evaluate_replaced_token_detection(self.model, self.eval_set, self.device, self.engine.autocast,
                                                             self.cfg.train.seed))
            self.metrics.write({"type": "eval", "step": step, **res})
            log.info("eval step %d: %s", step, rounded(res))
            if self.eval_set:
                samples = fill_mask_samples(mlm, self.tok, self.eval_set[0], self.device)
                log.info("sample predictions (top-5) at step %d:\n%s", step, "\n".join(samples))
        self.d.barrier()
        return res

    def save(self) -> None:
        """A checkpoint of everything that decides the rest of the run, and the refreshed model directory."""
        states = gather_rng_states(self.d)
        if self.d.is_main:
            e = self.engine
            state = {**e.state.state_dict(), "loader": self.loader.state_dict(), "rng": states}
            if e.scaler.is_enabled():
                state["scaler"] = e.scaler.state_dict()
            ckpt.save_checkpoint(self.cfg.out, e.state.step, self.model, e.optimizer, state, self.cfg.train.keep_checkpoints)
            self._save_model()
        self.d.barrier()

    def _save_model(self) -> None:
        """The run's model directory: the model (for ELECTRA the discriminator, a BERT), and ELECTRA's generator
        in ``generator/``."""
        if self.electra:
            ckpt.save_pretrained(self.model.bert, self.cfg.out)
            ckpt.save_pretrained(self.model.generator, os.path.join(self.cfg.out, GENERATOR_DIR), tokenizer=self.tok)
        else:
            ckpt.save_pretrained(self.model, self.cfg.out)

    def _restore(self) -> None:
        """Continue from the newest checkpoint that loads whole; damaged newer ones are skipped, with a warning."""
        step, path, state = ckpt.restore_newest(self.cfg.out, self.model, self.engine.optimizer, required=("loader", "rng"))
        self.engine.state.load_state_dict(state)
        if "scaler" in state and self.engine.scaler.is_enabled():
            self.engine.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["loader"])
        restore_rng_state(state["rng"], self.d.rank)
        self.metrics.truncate_after(step)
        log.info("resumed from %s (step %d)", path, step)

    def _last_checkpoint(self, fmt: str = "; the last good checkpoint is {path}") -> str:
        found = ckpt.list_checkpoints(self.cfg.out)
        return fmt.format(step=found[-1][0], path=found[-1][1]) if found else ""

    def _write_card(self, final: dict) -> None:
        cfg, c = self.cfg, self.config
        what = ("ELECTRA's replaced-token detection (the discriminator; its generator in generator/)" if self.electra
                else "masked language modelling" + (" and next sentence prediction" if cfg.data.nsp else ""))
        summary = (f"A BERT of {c.num_hidden_layers} layers, hidden size {c.hidden_size}, {c.num_attention_heads} heads "
                   f"({final['parameters'] / 1e6:.1f}M parameters with its training heads), pretrained "
                   f"{'from ' + cfg.model.init if cfg.model.init else 'from scratch'} by {what}: {final['steps']} steps, "
                   f"{final['tokens_seen']:,} tokens, {duration(final['wall_seconds'])} on {final['device']} "
                   f"({final['processes']} process(es)), the {cfg.recipe} recipe.")
        t, dc, mc = cfg.train, cfg.data, cfg.model
        settings = {"recipe": cfg.recipe, "objective": mc.objective, "preset": mc.model_config or mc.preset,
                    "max_seq_length": dc.max_seq_length, "batch_size": t.batch_size, "lr": t.lr, "max_steps": t.max_steps,
                    "max_time (s)": t.max_time, "warmup_ratio": t.warmup_ratio, "mask_prob": dc.mask_prob, "nsp": dc.nsp,
                    "dropout in pretraining": mc.dropout, "position_init": mc.position_init,
                    "attention_init": mc.attention_init, "seed": t.seed}
        keys = ("mlm_accuracy", "mlm_accuracy_masked", "mlm_loss", "nsp_accuracy", "disc_accuracy", "disc_accuracy_replaced",
                "disc_accuracy_original", "tokens_per_second")
        load = "BertModel" if self.electra else "BertForPreTraining" if dc.nsp else "BertForMaskedLM"
        modelcard.write(cfg.out, modelcard.render(
            f"bertforge BERT ({cfg.out.rstrip('/').split('/')[-1]})", summary,
            "feature-extraction" if self.electra else "fill-mask", {k: final[k] for k in keys if k in final}, settings,
            list(dc.data), mc.init, modelcard.base_license(mc.init), load=load))

    def _flops_per_token(self) -> float:
        dc = self.cfg.data
        if not self.electra:
            return flops_per_token(self.config, dc.max_seq_length, dc.mask_prob)
        mc = self.cfg.model
        return electra_flops(self.config, generator_config(self.config, mc.generator_size), dc.max_seq_length,
                             dc.mask_prob)

    def _finish(self, last_eval: dict | None) -> dict[str, Any]:
        """Final evaluation and checkpoint (unless the last step just made them), metrics.json, plots."""
        t, st, d, out = self.cfg.train, self.engine.state, self.d, self.cfg.out
        if last_eval is None or not (t.eval_every and st.step % t.eval_every == 0):
            last_eval = self.evaluate()
        if not (t.save_every and st.step % t.save_every == 0):
            self.save()
        final: dict[str, Any] = {}
        if d.is_main:
            final = {
                **last_eval,
                "steps": st.step,
                "tokens_seen": st.tokens_seen,
                "tokens_per_second": self.session_tokens / max(1e-9, self.session_time),
                "wall_seconds": self.engine.tick(),
                "train_seconds_this_session": self.session_time,
                "model_flops_per_token": self._flops_per_token(),
                "parameters": self.model.num_parameters(),
                "device": str(self.device),
                "processes": d.world,
            }
            atomic_write_json(os.path.join(out, "metrics.json"), final)
            self._write_card(final)
            self.metrics.close()
            try:
                plot_pretraining(self.metrics.path, os.path.join(out, "plots"))
            except Exception as e:  # a plot must never cost a finished run
                log.warning("could not draw plots: %s", e)
            log.info("done: %s", rounded(final))
        d.barrier()
        if d.enabled:
            dist.destroy_process_group()
        return final
