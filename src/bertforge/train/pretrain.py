"""``bertforge pretrain``: pretraining by any objective of :mod:`bertforge.objectives`, with evaluation,
plots, atomic checkpoints, exact resume, and DistributedDataParallel under ``torchrun``; the run's life is
:mod:`bertforge.train.lifecycle`'s.

Output folder layout::

    DIR/config.json, model.safetensors, vocab.txt, tokenizer.json, ...   the model (a Hugging Face BERT
                                                                          directory, refreshed at each save)
    DIR/pretrain_config.json      the resolved configuration of the run, the corpus it trains on (a digest
                                  of its content: --resume refuses another) and the command that started it
    DIR/metrics.jsonl             one line per logging step ("type": "train") and per evaluation ("eval")
    DIR/metrics.json              the final figures
    DIR/train.log                 the log, with sample fill-mask predictions at each evaluation
    DIR/plots/*.png               loss, accuracy and learning-rate curves
    DIR/checkpoints/step-NNNNNNNN/ model.safetensors, optimizer.pt, trainer_state.pt (the last K kept)

The default recipe (``--recipe budget``, :data:`bertforge.config.RECIPES`) departs from BERT's settings for
short runs on one machine, after cramming, RoBERTa and MosaicBERT (docs/log/budget-recipe.md): masked LM
only, 30% of the tokens masked (80/10/10 as BERT), no dropout during pretraining (the saved ``config.json``
keeps the model's, for fine-tuning), peak learning rate 1e-3, Adam beta2 0.98, clipping at 0.5, and a new
model's starting values (:mod:`bertforge.models.initialization`): sinusoidal positions and first-layer heads that
look at the neighbouring tokens, where BERT starts every weight at random and leaves the most-frequent-token
plateau only after thousands of steps.  ``--recipe bert`` restores BERT's; the architecture is BERT's under
every recipe.  A run from a trained model (``--init``) defaults to ``--recipe continue``: masked LM only, 15%
masked, the model's own dropout, a short warmup (2% of the run), Adam beta2 0.999, peak lr 1e-4 (kept after a
screen of 3e-5, 1e-4 and 3e-4), and none of the new-model starting values; a masked-LM head the model lacks
starts tied to its word embeddings (the log says so).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from .. import checkpoint as ckpt
from .. import modelcard
from .. import vocabulary
from ..atomic import atomic_write_json
from ..batching import to_device
from ..config import PretrainConfig
from ..data import PretrainingData
from ..devices import Dist
from ..errors import UserError, shown
from ..evaluation import fill_mask_samples
from ..logs import duration
from ..models import load_config
from ..objectives import OBJECTIVES
from ..outputs import MODEL_FILES, Output, register_output
from ..plots import plot_pretraining
from ..prepared import tokenizer_fingerprint
from ..settings import as_run, check_resumed, recipe_said, say_schedule_changed
from ..tokenizer import load_tokenizer, save_tokenizer, special_ids
from .engine import Engine, LinearSchedule
from .lifecycle import TrainingRun, finish, preflight, run_folder, start_run
from .plan import (StartPlan, pretraining_config, pretraining_objective, pretraining_plan, pretraining_tokenizer,
                   resolve_arch, take_prepared_reading)
from .runfolder import COMMAND, CORPUS, SETTINGS_FILES, RunFolder

log = logging.getLogger("bertforge")

register_output("pretrain", MODEL_FILES | {SETTINGS_FILES["pretrain"], "metrics.jsonl", "metrics.json", "train.log",
                                           "plots", "checkpoints", "tensorboard", "README.md"}
                | {name for o in OBJECTIVES.values() for name in o.outputs})


def pretrain(cfg: PretrainConfig, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Pretrain as ``cfg`` says; return the final metrics (also written to DIR/metrics.json).

    ``resume`` continues the run in ``cfg.out`` from its newest loadable checkpoint (on the corpus it was
    started on; one killed before its first checkpoint starts again from step 0); ``overwrite`` replaces
    an earlier pretraining output there.  Any other existing, non-empty ``cfg.out`` is refused; everything
    that can fail on bad input fails before the output folder is written.
    """
    folder = RunFolder(cfg.out, "pretrain")
    output, schedule = check_run(cfg, folder, resume, overwrite)
    with start_run(output, cfg.impl) as (d, device):
        if resume and d.is_main:  # decided on the checkpoints that load whole
            ckpt.set_aside_incomplete(cfg.out)
        d.barrier()
        # (a run killed before its first checkpoint starts again from step 0, with the vocabulary it had trained:
        # one trained again may break its ties another way)
        plan = pretraining_plan(cfg, resume, folder)
        newest, max_steps = folder.newest_step(), cfg.train.max_steps
        # a run at --max-steps without its end files was killed before them: --resume finishes it
        if plan.continued and max_steps and (newest > max_steps or (newest == max_steps and folder.finished)):
            raise UserError(f"the run in {cfg.out} is at step {newest} already; --resume trains on to a larger "
                            f"--max-steps (not {cfg.train.max_steps})")
        tok = pretraining_tokenizer(cfg, plan, d)
        special_ids(tok)  # a vocabulary without [CLS], [SEP], [MASK]... fails here
        config = pretraining_config(cfg, plan, tok)
        data = PretrainingData(cfg, tok, d, plan.continued)
        corpus = corpus_identity(cfg, data, d, folder if resume else None)
        if d.is_main:  # (the set-up's last phase; reading and tokenizing the corpus said theirs)
            log.info("building the model (%d layers of width %d, %s)", config.num_hidden_layers, config.hidden_size,
                     "its weights from the checkpoint" if plan.continued
                     else f"from {cfg.model.init}" if plan.weights == "init" else "new weights")
        objective = pretraining_objective(cfg, plan, config, tok).to(device)
        torch.manual_seed(cfg.train.seed + d.rank)  # dropout streams differ by rank
        with run_folder(output, d, resume, in_place=True):
            if d.is_main:
                if not plan.continued:
                    save_tokenizer(tok, cfg.out, model_max_length=config.max_position_embeddings)
                    objective.save_pretrained(cfg.out, tok)
                else:
                    say_schedule_changed(schedule)
                started_by = folder.command() if resume else modelcard.COMMAND  # (not the --resume's)
                atomic_write_json(folder.settings_file, {**cfg.to_dict(), CORPUS: corpus, COMMAND: started_by})
            d.barrier()
            t = cfg.train
            steps = t.max_steps or (data.loader.steps_in_epochs(t.epochs) if t.epochs else None)  # as run_mlm's
            lr = LinearSchedule(t.lr, steps, t.max_time, t.warmup_steps, t.warmup_ratio)
            run = Pretraining(cfg, d, Engine(objective, t, cfg.impl, device, d, lr), data, tok, plan, folder)
            return run.train(resume)


def check_run(cfg: PretrainConfig, folder: RunFolder, resume: bool, overwrite: bool = False
              ) -> tuple[Output, list[str]]:
    """Every check that needs no heavy work, done before anything is read or written; returns the run's output
    and the schedule's changes on ``resume``."""
    if not cfg.out:
        raise UserError("--out is required")
    if not resume and not overwrite and folder.checkpoints():
        raise UserError(f"{cfg.out} already holds a training run; pass --resume to continue it, --overwrite to "
                        "replace it, or choose another --out")
    m, dc = cfg.model, cfg.data
    inputs = [*dc.data, *(dc.eval_data or []), dc.tokenizer, m.init, m.model_config]
    output = preflight(folder, inputs, overwrite, resume, restarts=True)
    saved = folder.settings() if resume else None  # the resume rule first: it names what changed
    resolve_arch(cfg, saved)
    if saved is not None:
        before = as_run(PretrainConfig.from_dict(saved))
        before.model.arch = before.model.arch or "bert"  # (a run saved before there was a choice)
        schedule = check_resumed(cfg.out, before, cfg, continued=bool(folder.checkpoints()))
    else:
        schedule = []
    if resume and folder.has_tokenizer and dc.tokenizer and os.path.exists(dc.tokenizer):  # by content, not name
        if tokenizer_fingerprint(load_tokenizer(dc.tokenizer)) != tokenizer_fingerprint(load_tokenizer(cfg.out)):
            raise UserError(f"--resume continues the run in {cfg.out} with its own tokenizer, and --tokenizer "
                            f"{shown(dc.tokenizer)} is another; leave --tokenizer out")
    cfg.validate(resume)
    take_prepared_reading(cfg)
    plan = pretraining_plan(cfg, resume, folder)
    OBJECTIVES[m.objective].check(cfg, plan.weights == "init")
    if plan.weights == "init":  # (a checkpoint holds all a resumed run needs)
        if not os.path.isdir(m.init):
            raise UserError(f"--init directory not found: {m.init}")
        ckpt.require_weights(m.init)  # before the data is read
    return output, schedule


# ------------------------------------------------------------------------------------------------ set-up
def corpus_identity(cfg: PretrainConfig, data: PretrainingData, d: Dist, folder: RunFolder | None) -> dict[str, Any]:
    """What the run trains on, by content, whatever the files are called: a digest of the tokenized corpus's
    checksums (the cache's, of its tokens and its sentence and document boundaries, checked when it was
    opened: no second reading of the corpus) and of its counts.  A resumed run (its ``folder``) whose corpus
    differs in content is refused, before anything of the run is loaded."""
    found = None
    if d.is_main:  # the others take rank 0's: one answer for all
        found = json.dumps(data.corpus.identity())
    now = json.loads(d.broadcast(found))
    saved = folder.corpus() if folder is not None else None
    if saved is not None and saved.get("digest") != now["digest"]:
        raise UserError(f"--resume continues the run in {cfg.out} on the corpus it was started on, and --data "
                        f"{shown(cfg.data.data)} now reads as another: {_corpus_said(saved)} -> {_corpus_said(now)}")
    return now


def _corpus_said(c: dict) -> str:
    n = {k: f"{v:,}" if isinstance(v, int) else shown(v) for k, v in c.items()}
    return f"{n.get('documents')} documents, {n.get('tokens')} tokens, digest {str(c.get('digest'))[:12]}"


# ------------------------------------------------------------------------------------------------ the run
class Pretraining(TrainingRun):
    """One pretraining run: the loop of :class:`~bertforge.train.lifecycle.TrainingRun` over the loader's batches."""

    desc = "pretraining"
    required = ("loader",)
    restarts = True  # the model is built from the run's settings as a new run builds it

    def __init__(self, cfg: PretrainConfig, d: Dist, engine: Engine, data: PretrainingData, tok: Tokenizer,
                 plan: StartPlan, folder: RunFolder):
        super().__init__(cfg.out, d, engine, cfg.train, cfg.impl.progress, cfg.impl.report_to == "tensorboard",
                         total=cfg.train.max_steps)
        self.cfg, self.data, self.tok, self.objective = cfg, data, tok, engine.objective
        self.plan, self.folder = plan, folder
        self.session_tokens, self.session_time, self.last_eval = 0, 0.0, {}

    def train(self, resume: bool) -> dict[str, Any]:
        if resume:
            self.restore()
        self.eval_set, self.baseline_token = None, None
        if self.d.is_main:
            self.eval_set, self.baseline_token = self.data.eval_set(), self.data.most_frequent_token()
        t, data, model = self.cfg.train, self.data, self.objective.model
        held = sum(data.eval_corpus.doc_tokens(int(d)) for d in data.eval_docs)
        trained = data.corpus.n_tokens - (held if data.eval_corpus is data.corpus else 0)
        log.info("pretraining %s (%.1fM parameters, %s) on %d documents (%d tokens), %d held out for evaluation (%d "
                 "tokens); batch %d = %d process(es) x %d accumulation x %d", type(model).__name__,
                 model.num_parameters() / 1e6, self.engine.device, len(data.train_docs), trained, len(data.eval_docs),
                 held, t.batch_size, self.d.world, t.grad_accum, data.micro)
        for said in (recipe_said(self.cfg, model.config), self.objective.start_said(self.cfg.model.init)):
            if said:  # in train.log, which opens only now
                log.info("%s", said)
        if self.cfg.model.add_vocab and self.d.is_main and not self.plan.continued:  # (a continued run said it,
            before = load_config(self.cfg.model.init).vocab_size  # and needs nothing of --init's folder)
            log.info("%s", vocabulary.describe(self.tok, before, self.cfg.model.add_vocab))
        return self.fit()

    # ---- the loop's hooks
    def epoch_steps(self) -> int:
        return self.data.loader.steps_in_epoch(0)

    def next_batches(self) -> list[dict]:
        epoch, rows = self.data.loader.next_rows()
        parts = np.array_split(rows, self.cfg.train.grad_accum)
        return [to_device(self.data.loader.build(epoch, p), self.engine.device) for p in parts]

    def record(self, out: dict, seconds: float) -> None:
        st = self.engine.state
        st.tokens_seen += int(out["tokens"])
        st.add(mlm=out["mlm"], masked=out["masked"], nsp=out.get("nsp", 0.0), seqs=out["sequences"],
               tokens=out["tokens"], time=seconds, steps=1, grad_norm=out["grad_norm"],
               **{k: out[k] for k in self.objective.meter_keys})
        self.session_tokens, self.session_time = self.session_tokens + int(out["tokens"]), self.session_time + seconds

    def log_line(self, out: dict) -> tuple[dict, str, dict]:
        st, m, t = self.engine.state, self.engine.state.take_meters(), self.cfg.train
        row = {"type": "train", "step": st.step, "tokens_seen": st.tokens_seen, **self.objective.log_row(m),
               "lr": out["lr"], "grad_norm": m["grad_norm"] / max(1, m["steps"]),
               "tokens_per_second": m["tokens"] / max(1e-9, m["time"]), "elapsed": st.elapsed}
        loss, lr = row.get("loss", row["mlm_loss"]), out["lr"]
        postfix = dict(loss=f"{loss:.3f}", tok_s=f"{row['tokens_per_second']:.0f}", lr=f"{lr:.2e}")
        if t.max_time and not t.max_steps:
            postfix["left"] = f"{max(0, t.max_time - st.elapsed):.0f}s"
        text = (f"loss {loss:.4f}{self.objective.log_text(row)}  lr {lr:.2e}  grad-norm {row['grad_norm']:.3f}  "
                f"{row['tokens_per_second']:,.0f} tokens/s")
        return row, text, postfix

    def evaluate(self) -> None:
        if self.d.is_main:
            step, device, sp = self.engine.state.step, self.engine.device, self.data.masker.sp
            res = self.objective.evaluate(self.eval_set, device, self.engine.autocast, self.baseline_token, sp.mask)
            self.last_eval = res
            self.log_eval(res, f"eval step {step}")
            if self.eval_set:
                samples = fill_mask_samples(self.objective.masked_lm, self.tok, self.eval_set[0], device)
                log.info("sample predictions (top-5) at step %d:\n%s", step, "\n".join(samples))
        self.d.barrier()

    def nonfinite_hint(self) -> str:
        return f"{self.last_checkpoint()}; try a lower --lr or a longer warmup"

    def eval_size(self) -> int:
        return sum(len(b["input_ids"]) for b in self.eval_set or ())

    def eval_estimate(self) -> float:
        """Its first batch evaluated and timed, times the number of batches (the held-out sequences can be
        longer than the training ones); the random streams as they were (an objective may sample from them)."""
        if not self.eval_set:
            return 0.0
        t0, sp = time.perf_counter(), self.data.masker.sp
        with torch.random.fork_rng(devices=[self.engine.device] if self.engine.device.type == "cuda" else []):
            self.objective.evaluate(self.eval_set[:1], self.engine.device, self.engine.autocast, self.baseline_token,
                                    sp.mask)
        return (time.perf_counter() - t0) * len(self.eval_set)

    def run_state(self) -> tuple[dict, dict | None]:
        return {"loader": self.data.loader.state_dict()}, None

    def load_run_state(self, state: dict, path: str) -> None:
        self.data.loader.load_state_dict(state["loader"])

    def save_model(self) -> None:
        self.objective.save_pretrained(self.cfg.out, self.tok)

    # ---- the end
    def finish(self) -> dict[str, Any]:
        """The final checkpoint, metrics.json, the model card and the plots."""
        self.save()
        if not self.d.is_main:
            return {}
        st = self.engine.state
        final = {**self.last_eval, "steps": st.step, "tokens_seen": st.tokens_seen,
                 "tokens_per_second": self.session_tokens / max(1e-9, self.session_time),
                 "wall_seconds": self.engine.tick(), "train_seconds_this_session": self.session_time,
                 "model_flops_per_token": self.objective.flops_per_token(),
                 "parameters": self.objective.model.num_parameters(), "device": str(self.engine.device),
                 "processes": self.d.world, **({"warnings": self.warnings} if self.warnings else {})}
        self.metrics.close()
        out = self.cfg.out
        card = modelcard.pretraining_card(self.cfg, self.objective, final, self.folder.command())
        finish(out, final, card, lambda: plot_pretraining(self.metrics.path, os.path.join(out, "plots")))
        # the figures themselves: metrics.json, and the command's one line on stdout
        log.info("done: %d steps, %s tokens in %s; figures in %s", st.step, f"{st.tokens_seen:,}",
                 duration(final["wall_seconds"]), os.path.join(out, "metrics.json"))
        return final
