"""ELECTRA (Clark et al., 2020) as a pretraining objective.  The model (the generator, the discriminator's head,
the objective's pass), the run's folder and the departures from the paper are :mod:`bertforge.models.electra`'s; the
generator it saves in ``generator/`` is also what ``predict fill-mask`` and ``evaluate mlm`` run
(:meth:`Electra.masked_lm_of`)."""

from __future__ import annotations

import contextlib
import os

import torch

from .. import checkpoint as ckpt
from ..batching import to_device
from ..config import PretrainConfig
from ..models.electra import (ElectraForMaskedLM, ElectraPretraining, generator_config, generator_config_of,
                       is_generator_dir)
from ..errors import UserError
from ..evaluation import eval_mode
from ..models import BertConfig, family
from ..models.flops import flops_per_token
from ..ops.dropout import batch_keys
from .base import PretrainingObjective

DISCRIMINATOR_WEIGHT = 50.0  # the paper's lambda
GENERATOR_DIR = "generator"
COUNTS = ("real", "replaced", "hit_replaced", "hit_original", "gen_hits")  # replaced_token_detection's statistics


class Electra(PretrainingObjective):
    name = "electra"
    meter_keys = ("disc", *COUNTS)
    pipeline_tag = "feature-extraction"
    outputs = frozenset({GENERATOR_DIR})

    @classmethod
    def check(cls, cfg: PretrainConfig, from_init: bool) -> None:
        fam = family(cfg.model.arch)
        if cls.name not in fam.objectives:
            raise UserError(f"--objective electra is BERT's here; {fam.label} pretrains by masked LM (--objective mlm)")
        if cfg.data.nsp:
            raise UserError("--objective electra trains without next sentence prediction; pass --no-nsp")
        if from_init:
            raise UserError("--objective electra starts from scratch; --init is not supported with it")

    @classmethod
    def build(cls, cfg: PretrainConfig, config: BertConfig, from_init: bool) -> Electra:
        return cls(ElectraPretraining(config, cfg.model.generator_size), cfg)

    @classmethod
    def masked_lm_of(cls, path: str) -> tuple[type, BertConfig, str] | None:
        if not is_generator_dir(path):
            return None
        return ElectraForMaskedLM, generator_config_of(path), "generator_predictions.dense.weight"

    @property
    def masked_lm(self) -> torch.nn.Module:
        return self.model.generator  # an ELECTRA run's masked LM is its generator

    def forward(self, b: dict, step: int) -> dict:
        """On the CPU the replacements are sampled from generators keyed like the dropout masks."""
        gen, disc, counts = self.model.replaced_token_detection(b["input_ids"], b["attention_mask"],
                                                                b["token_type_ids"], b["labels"],
                                                                dropout_keys=batch_keys(b, self.seed, step))
        return {"gen": gen, "disc": disc, "counts": counts}

    def loss(self, out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        """The generator's MLM loss over the masked tokens plus 50 times the discriminator's over the real
        tokens."""
        gen, disc, counts = out["gen"], out["disc"], out["counts"]
        loss = gen.float() / totals["masked"] + DISCRIMINATOR_WEIGHT * disc.float() / totals["tokens"]
        return loss, {"mlm": gen.detach(), "disc": disc.detach(), **dict(zip(COUNTS, counts))}

    def log_row(self, m: dict[str, float]) -> dict[str, float]:
        row = super().log_row(m)
        row["disc_loss"] = m["disc"] / max(1, m["real"])
        row["disc_accuracy"] = (m["hit_replaced"] + m["hit_original"]) / max(1, m["real"])
        row["replaced_fraction"] = m["replaced"] / max(1, m["real"])
        row["loss"] = row["mlm_loss"] + DISCRIMINATOR_WEIGHT * row["disc_loss"]
        return row

    def log_text(self, row: dict) -> str:
        return (f" (generator mlm {row['mlm_loss']:.4f}, discriminator {row['disc_loss']:.4f}, "
                f"accuracy {row['disc_accuracy']:.3f}, replaced {row['replaced_fraction']:.3f})")

    def evaluate(self, eval_set: list[dict], device, autocast, baseline_token: int | None, mask_id: int) -> dict:
        res = super().evaluate(eval_set, device, autocast, baseline_token, mask_id)
        res.update(replaced_token_detection(self.model, eval_set, device, autocast, self.seed))
        return res

    def save_pretrained(self, out: str, tokenizer) -> None:
        ckpt.save_pretrained(self.model.bert, out)
        ckpt.save_pretrained(self.model.generator, os.path.join(out, GENERATOR_DIR), tokenizer=tokenizer)

    def flops_per_token(self) -> float:
        """Training FLOPs per token (2 per multiply-add, x3 with the backward pass): the discriminator over
        every token with its head, the generator's encoder, its embedding projection, and its head at the
        masked tokens."""
        config, dc = self.model.config, self.cfg.data
        generator = generator_config(config, self.cfg.model.generator_size)
        H, G, V = config.hidden_size, generator.hidden_size, config.vocab_size
        per_token = 2 * H * H + 2 * H + (2 * H * G if G != H else 0) + dc.mask_prob * 2 * (G * H + H * V)
        L = dc.max_seq_length
        return flops_per_token(config, L, None) + flops_per_token(generator, L, None) + 3 * per_token

    def describe(self) -> tuple[str, str]:
        return "ELECTRA's replaced-token detection (the discriminator; its generator in generator/)", "BertModel"


def replaced_token_detection(model: ElectraPretraining, batches: list[dict], device, autocast=None,
                             seed: int = 0) -> dict:
    """The discriminator over fixed batches (replacements sampled from the generator with a generator seeded
    by ``seed``, the same at every evaluation): its loss and accuracy over the real tokens, on the replaced
    and on the original ones, and the fraction replaced."""
    sampler = torch.Generator().manual_seed(seed)
    disc = 0.0
    counts = torch.zeros(5, dtype=torch.float64)
    with eval_mode(model):
        for b in batches:
            b = to_device(b, device)
            with autocast or contextlib.nullcontext():
                _, d, c = model.replaced_token_detection(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                                                         b["labels"], sampler=sampler)
            disc += float(d)
            counts += c.double().cpu()
    real, replaced, hit_replaced, hit_original, _ = counts.tolist()
    return {"disc_loss": disc / max(1, real), "disc_accuracy": (hit_replaced + hit_original) / max(1, real),
            "disc_accuracy_replaced": hit_replaced / max(1, replaced),
            "disc_accuracy_original": hit_original / max(1, real - replaced),
            "replaced_fraction": replaced / max(1, real)}
