"""Masked language modelling, BERT's objective: 80/10/10 masking (:class:`bertforge.data.Masker`), with next
sentence prediction when the run asks for it (``--nsp``, the ``bert`` recipe's).  A model from ``--init``
without a masked-LM head gets a new one tied to its word embeddings (:func:`new_head_said`).

The training step runs the model's fast path (:func:`bertforge.ops.rows.pretraining_losses`): the last
encoder layer and the vocabulary projection only where the loss looks (the masked tokens, and [CLS] for
NSP); the loss equals the dense computation.  A family without next sentence prediction trains by masked LM
alone, through its own fast path (each pretraining model's ``pretraining_losses``)."""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import checkpoint as ckpt
from ..config import PretrainConfig
from ..errors import UserError
from ..models import BertConfig, family
from ..models.flops import flops_per_token
from ..ops.dropout import batch_keys
from .base import PretrainingObjective


class MaskedLM(PretrainingObjective):
    name = "mlm"
    meter_keys = ()

    @classmethod
    def check(cls, cfg: PretrainConfig, from_init: bool) -> None:
        fam = family(cfg.model.arch)
        if cfg.data.nsp and not fam.next_sentence:
            raise UserError(f"{fam.label} pretrains by masked LM alone (next sentence prediction needs BERT's pooler "
                            "and token types); pass --no-nsp")

    @classmethod
    def build(cls, cfg: PretrainConfig, config: BertConfig, from_init: bool) -> MaskedLM:
        model_cls = family(cfg.model.arch).head("pretraining" if cfg.data.nsp else "masked_lm")
        if from_init:
            return cls(model_cls.from_pretrained(cfg.model.init, config=config), cfg)
        return cls(model_cls(config), cfg)

    def forward(self, b: dict, step: int) -> dict:
        mlm, nsp = self.model.pretraining_losses(b["input_ids"], b["attention_mask"], b.get("token_type_ids"),
                                                 b["labels"], b.get("next_sentence_label"),
                                                 dropout_keys=batch_keys(b, self.seed, step))
        return {"mlm": mlm, "nsp": nsp}

    def loss(self, out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        # the MLM loss is a mean over the masked tokens of the global batch, NSP's over its sequences
        mlm, nsp = out["mlm"], out["nsp"]
        loss, parts = mlm.float() / totals["masked"], {"mlm": mlm.detach()}
        if nsp is not None:
            loss, parts["nsp"] = loss + nsp.float() / totals["sequences"], nsp.detach()
        return loss, parts

    def log_row(self, m: dict[str, float]) -> dict[str, float]:
        row = super().log_row(m)
        if self.cfg.data.nsp:
            row["nsp_loss"] = m["nsp"] / max(1, m["seqs"])
            row["loss"] = row["mlm_loss"] + row["nsp_loss"]
        return row

    def log_text(self, row: dict) -> str:
        return f" (mlm {row['mlm_loss']:.4f}, nsp {row['nsp_loss']:.4f})" if "nsp_loss" in row else ""

    def save_pretrained(self, out: str, tokenizer) -> None:
        ckpt.save_pretrained(self.model, out)

    def flops_per_token(self) -> float:
        dc = self.cfg.data
        return flops_per_token(self.model.config, dc.max_seq_length, dc.mask_prob)

    def start_said(self, init: str | None) -> str | None:
        return new_head_said(self.model, init)

    def describe(self) -> tuple[str, str]:
        nsp = self.cfg.data.nsp
        what = "masked language modelling" + (" and next sentence prediction" if nsp else "")
        return what, type(self.model).__name__


def new_head_said(model: nn.Module, path: str | None) -> str | None:
    """What the log says of a masked-LM head that the directory ``path`` the model was loaded from lacked (a bare
    ``BertModel``, such as a sentence-embedding checkpoint); None when it had one, or the model was not loaded.

    Such a head starts as a new BERT's (:meth:`~bertforge.models.bert.BertPreTrainedModel.init_weights`, then
    :func:`~bertforge.checkpoint.load_pretrained` ties it again after loading): its decoder is the word
    embeddings themselves, so that it predicts with what the model already knows of each word from the first
    step, and only its transform (dense at BERT's normal initialisation, LayerNorm at one and zero) and the output
    bias (zero) are new."""
    new = getattr(model, "loading_info", {}).get("newly_initialized", [])
    if path is None or not any(k.startswith(("cls.predictions.", "head.", "decoder.")) for k in new):
        return None
    start = model.initialisation_said()
    return (f"{path} has no masked-LM head: a new one starts with its decoder tied to the word embeddings, its "
            f"transform at {start} and its output bias at 0")
