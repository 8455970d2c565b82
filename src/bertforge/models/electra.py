"""ELECTRA pretraining (Clark et al., 2020): replaced-token detection, with a BERT as the discriminator.

A small masked-LM *generator* fills the masked positions with tokens sampled from its predictions; the
*discriminator*, a BERT of the run's size, tells at every real token whether it is the original or a
replacement.  It learns from every token, where masked LM learns from the 15% it masks.  Both train together
in one step on ``generator loss + 50 * discriminator loss`` (the paper's lambda); no gradient flows through
the sampling.  Afterwards the discriminator is the model: the run's folder is a BERT directory (its
embeddings are as wide as its hidden states, so it loads in transformers' ``BertModel``), and the generator
is saved beside it in ``generator/`` as a directory transformers loads as ``ElectraForMaskedLM``.  The
objective around these modules (its loss, log, evaluation, outputs and FLOPs) is
:mod:`bertforge.objectives.electra`.

Shapes of the paper and Google's code (``get_generator_config``): the generator has the discriminator's
depth, a quarter of its width (``generator_size``), ``width // 64`` heads (at least one) and a 4x
feed-forward block; the two share the token, position and segment embeddings and their LayerNorm; the
generator projects the shared embeddings to its width (``embeddings_project``) and back before its tied
output layer (``generator_predictions``), the names of transformers' ``ElectraForMaskedLM``.

Departures from the paper (the model's are listed in :mod:`bertforge.models.bert`): the shared embeddings are
as wide as the discriminator (ELECTRA-Small's are 128 for a 256-wide model), so that the discriminator is a
plain BERT; the default generator is a quarter of the model's width (the paper's Small and Base settings;
its released Base used a third); the masked positions are
chosen by bertforge's masker (80% [MASK], 10% random, 10% kept; ELECTRA's code uses 85% [MASK], 15% kept);
the discriminator has no pooler (nothing in this objective would train it; a classifier fine-tuned from it
starts its pooler fresh, as from a BERT pretrained without NSP).
On the CPU, each sequence's replacements are sampled from a generator keyed like its dropout masks
(seed, step, the sequence's index in the epoch), so that the number of processes does not change a run (up
to float rounding: logits that differ in the last bit between two batch layouts could, rarely, flip a draw).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import checkpoint
from .bert import BertConfig
from ..errors import UserError
from ..files import json_object_or_none, read_json_object
from .bert import ACT2FN, BertEmbeddings, BertModel, BertPreTrainedModel, MaskedLMOutput, _mlm_logits
from ..ops.rows import hidden_at


def generator_config(disc: BertConfig, size: float) -> BertConfig:
    """The generator's shape for a discriminator ``disc``: ``size`` of its width, the same depth."""
    hidden = max(1, round(disc.hidden_size * size))
    heads = max(h for h in range(1, max(1, hidden // 64) + 1) if hidden % h == 0)  # Google's hidden // 64, dividing
    return dataclasses.replace(disc, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                               id2label=None, label2id=None, extra={})


# ------------------------------------------------------------------------------------------------ generator
class ElectraModel(BertModel):
    """A BERT encoder whose embeddings (``embedding_size`` wide) are projected to its hidden size; no pooler."""

    def __init__(self, config: BertConfig, embedding_size: int):
        super().__init__(config, add_pooling_layer=False)
        self.embeddings = BertEmbeddings(dataclasses.replace(config, hidden_size=embedding_size,
                                                             num_attention_heads=1))
        if embedding_size != config.hidden_size:  # as transformers and Google: a projection only where widths differ
            self.embeddings_project = nn.Linear(embedding_size, config.hidden_size)
        self.init_weights()

    def embed(self, input_ids, token_type_ids=None, position_ids=None, layout=None):
        x = self.embeddings(input_ids, token_type_ids, position_ids, layout)  # (N, E)
        return self.embeddings_project(x) if hasattr(self, "embeddings_project") else x  # (N, H)


class ElectraGeneratorPredictions(nn.Module):
    def __init__(self, config: BertConfig, embedding_size: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, embedding_size)
        self.activation = ACT2FN["gelu"]
        self.LayerNorm = nn.LayerNorm(embedding_size, eps=config.layer_norm_eps)

    def forward(self, h):  # (..., H) -> (..., E)
        return self.LayerNorm(self.activation(self.dense(h)))


class OutputBias(nn.Module):
    """The output layer's bias; its weight is the word embeddings (tied)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))


class ElectraForMaskedLM(BertPreTrainedModel):
    """The generator: a masked LM with transformers' ``ElectraForMaskedLM`` names.  ``logits`` (B, T, V), or
    with ``labels`` only at the labelled positions (as :class:`~bertforge.models.bert.BertForMaskedLM`)."""

    base_model_prefix = "electra"

    def __init__(self, config: BertConfig, embedding_size: int | None = None):
        super().__init__(config)
        embedding_size = embedding_size or config.embedding_size  # (a generator directory's config carries it)
        self.embedding_size = embedding_size
        self.electra = ElectraModel(config, embedding_size)
        self.generator_predictions = ElectraGeneratorPredictions(config, embedding_size)
        self.generator_lm_head = OutputBias(config.vocab_size)
        self.init_weights()

    def logits(self, h: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        w = self.electra.embeddings.word_embeddings.weight
        return F.linear(self.generator_predictions(h), w, self.generator_lm_head.bias)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None, labels=None,
                dense_logits=False, loss_reduction: str = "mean") -> MaskedLMOutput:
        seq = self.electra(input_ids, attention_mask, token_type_ids, position_ids).last_hidden_state  # (B, T, H)
        logits, loss = _mlm_logits(self.logits, seq, labels, dense_logits, loss_reduction)
        return MaskedLMOutput(loss, logits)

    # ---- a directory transformers loads as ElectraForMaskedLM
    def config_dict(self) -> dict:
        d = self.config.to_dict(["ElectraForMaskedLM"])
        d.update(model_type="electra", embedding_size=self.embedding_size, tie_word_embeddings=True)
        return d

def load_generator(path) -> ElectraForMaskedLM:
    """The generator a run saved beside its discriminator (``<run>/generator``)."""
    return ElectraForMaskedLM.from_pretrained(path, config=generator_config_of(path))


# ------------------------------------------------------------------------------------------------ discriminator
class ElectraDiscriminatorPredictions(nn.Module):
    """Per-token logit of "replaced" (transformers' names)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, h):  # (N, C) -> (N,)
        return self.dense_prediction(self.activation(self.dense(h))).squeeze(-1)


class ElectraPretraining(BertPreTrainedModel):
    """The training objective: ``bert`` (the discriminator, what the run produces), its replaced-token head,
    and the generator, which shares ``bert``'s embeddings."""

    head_prefixes = ("discriminator_predictions.", "generator.")

    def __init__(self, config: BertConfig, generator_size: float = 0.25):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)  # nothing in this objective trains a pooler
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        self.generator = ElectraForMaskedLM(generator_config(config, generator_size), config.hidden_size)
        self.init_weights()

    def tie_weights(self) -> None:
        """The generator's embeddings are the discriminator's (one module, trained by both)."""
        self.generator.electra.embeddings = self.bert.embeddings

    def tied_keys(self) -> set[str]:
        """State-dict keys that are views of others (left out of checkpoints, restored by tying)."""
        return {f"generator.electra.embeddings.{k}" for k in self.bert.embeddings.state_dict()}

    def replaced_token_detection(self, input_ids, attention_mask, token_type_ids, labels, dropout_keys=None,
                                 sampler: torch.Generator | None = None):
        """One ELECTRA pass over a masked batch (``labels``: the original tokens at the masked positions).

        Returns (summed generator MLM loss over the masked tokens, summed discriminator loss over the real
        tokens, statistics (5,): real tokens, replaced tokens, correct on replaced, correct on original,
        generator hits at the masked tokens).  Replacements come from ``dropout_keys``' per-sequence
        generators when given, else from ``sampler`` (or the global generator)."""
        B, T = input_ids.shape
        flat = labels.reshape(-1)
        masked = (flat != -100).nonzero().squeeze(1)  # (M,) flat positions
        target = flat[masked]
        h = hidden_at(self.generator.electra, masked, input_ids, attention_mask, token_type_ids, dropout_keys)
        logits = self.generator.logits(h)  # (M, V) from (M, Hg)
        gen_loss = F.cross_entropy(logits.float(), target, reduction="sum")
        with torch.no_grad():
            seq_of_row = torch.div(masked, T, rounding_mode="floor")
            sampled = sample(logits.detach().float(), seq_of_row, dropout_keys, sampler)
            disc_ids = input_ids.reshape(-1).clone()
            disc_ids[masked] = sampled
            replaced = torch.zeros(B * T, dtype=torch.bool, device=input_ids.device)
            replaced[masked] = sampled != target
        layout = self.bert.layout(input_ids, attention_mask, dropout_keys).flat()
        x = self.bert.embed(disc_ids.view(B, T), token_type_ids, None, layout)  # (N, C) real tokens
        x = self.bert.encoder(x, layout)
        disc_logits = self.discriminator_predictions(x)  # (N,)
        is_replaced = layout.unpad(replaced.view(B, T, 1).float()).squeeze(-1)  # (N,)
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits.float(), is_replaced, reduction="sum")
        with torch.no_grad():
            said = disc_logits > 0
            rep = is_replaced.bool()
            stats = torch.stack([torch.tensor(float(len(rep)), device=rep.device), rep.sum().float(),
                                 (said & rep).sum().float(), (~said & ~rep).sum().float(),
                                 (logits.argmax(-1) == target).sum().float()])
        return gen_loss, disc_loss, stats


def sample(logits: torch.Tensor, seq_of_row: torch.Tensor, keys=None, sampler: torch.Generator | None = None):
    """One token per row of ``logits`` (M, V) from softmax(logits), by inverse CDF: one uniform number per row,
    looked up in the rows' cumulative probabilities all at once.  With ``keys``
    (:class:`~bertforge.ops.dropout.DropoutKeys`), the uniform numbers of sequence b's rows (``seq_of_row``)
    come from its own generator, so a sequence's draws do not depend on the rest of the batch; else from
    ``sampler``.  (``torch.multinomial`` per sequence would cost a call and a pass over the vocabulary per
    sequence, a large part of an ELECTRA step on the CPU.)"""
    cdf = logits.float().softmax(-1).cumsum_(-1)  # (M, V)
    M = cdf.shape[0]
    if keys is None:
        # rand_like draws from the global generator as torch.rand(M) would, and traces with a symbolic M
        if sampler is not None:
            u = torch.rand(M, generator=sampler, device=sampler.device)
        else:
            u = torch.rand_like(cdf[:, 0])
    else:
        gens = keys.generators()
        # rows come sorted by position, so each sequence's rows are consecutive
        seqs, counts = torch.unique_consecutive(seq_of_row.cpu(), return_counts=True)
        u = torch.cat([torch.rand(n, generator=gens[b]) for b, n in zip(seqs.tolist(), counts.tolist())])
    u = u.to(cdf.device).unsqueeze(1) * cdf[:, -1:]  # (M, 1): the total is 1 up to rounding
    # the first token whose cumulative probability exceeds u: never one of probability 0
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


def generator_config_of(path: str) -> BertConfig:
    """The config of an ELECTRA generator directory, with its ``embedding_size``."""
    d = read_json_object(os.path.join(path, checkpoint.CONFIG_NAME), "config.json")
    if d.get("model_type") != "electra" or not isinstance(d.get("embedding_size"), int):
        raise UserError(f"{path} is not an ELECTRA generator directory (config.json model_type 'electra')")
    embedding_size = d.pop("embedding_size")
    d.pop("tie_word_embeddings", None)
    d["model_type"] = "bert"
    config = BertConfig.from_dict(d)
    config.embedding_size = embedding_size  # what ElectraForMaskedLM builds its smaller embeddings with
    return config


def is_generator_dir(path: str) -> bool:
    config = json_object_or_none(os.path.join(path, checkpoint.CONFIG_NAME))
    return config is not None and config.get("model_type") == "electra"


