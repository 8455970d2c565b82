"""Start values beyond BERT's random ones, and the dropout a run trains with.

BERT starts every weight at random (:meth:`bertforge.models.bert.BertPreTrainedModel.init_weights`).  The budget
recipe starts a new model's position embeddings from the Transformer's sines and cosines
(:func:`sinusoidal_positions_`) and the first layer's heads 0 and 1 looking at the previous and the next
token (:func:`local_attention_heads_`).  The architecture stays BERT's: only starting values differ, and
every value stays a learned parameter.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from .bert import BertEmbeddings, BertSelfAttention
from .modernbert import ModernBertAttention


def set_dropout(model: nn.Module, p: float) -> None:
    """Use dropout ``p`` (hidden and attention) in ``model`` from now on, leaving its ``config`` (what is
    saved) as it is: pretraining without dropout still saves the model's own dropout for fine-tuning."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):  # bertforge's Dropout and torch's (a ModernBERT's)
            m.p = p
        if isinstance(m, (BertSelfAttention, ModernBertAttention)):
            m.dropout_p = p


def sinusoid_frequencies(C: int) -> torch.Tensor:
    """The Transformer's frequencies, 10000^(-2f/C) radian per position, of columns 2f (sin) and 2f+1 (cos):
    (C/2,)."""
    return torch.exp(torch.arange(0, C, 2, dtype=torch.float64) * (-math.log(10000.0) / C))


def sinusoidal_positions_(model: nn.Module) -> None:
    """Start every position-embedding table of ``model`` from the Transformer's sines and cosines (Vaswani et
    al., 2017) at the standard deviation of the model's other initial weights.  They stay learned parameters:
    only their starting point differs from BERT's random one.  With random positions, each of the T positions
    must learn on its own how it relates to its neighbours, and attention stays near uniform for a long time,
    no head looking at the next or the previous token; with sinusoids, an offset is one linear map shared by
    all positions."""
    for m in model.modules():
        if isinstance(m, BertEmbeddings):
            w = m.position_embeddings.weight  # (P, C)
            P, C = w.shape
            pos = torch.arange(P, dtype=torch.float64).unsqueeze(1)  # (P, 1)
            freq = sinusoid_frequencies(C)  # (C/2,)
            table = torch.zeros(P, C, dtype=torch.float64)
            table[:, 0::2] = torch.sin(pos * freq)
            table[:, 1::2] = torch.cos(pos * freq)[:, : C // 2]
            with torch.no_grad():
                w.copy_(table / table.std() * model.config.initializer_range)


def local_attention_heads_(model: nn.Module, offsets: tuple[int, ...] = (-1, 1), pairs: int = 16,
                           scale: float = 3.0) -> list[int]:
    """Start the first layer's heads 0, 1, ... of every encoder in ``model`` as heads that look at the token at
    each of ``offsets`` (by default the previous and the next one), read from sinusoidal position embeddings
    (call :func:`sinusoidal_positions_` first).  Returns the embedding columns the heads read.

    Why: with BERT's random start, every head attends uniformly for thousands of steps and the masked LM
    predicts from a bag of the sequence's words (the "unigram plateau"; it leaves it when heads that look at
    a neighbour appear).  Gopalani & Hu (2025,
    "What happens during the loss plateau?") show that the plateau is the time it takes to learn the
    attention map and that starting attention at the right map removes it.  Here the map is the simplest
    one a language has: the neighbours.

    How: ``pairs`` (sin, cos) columns of the position table, at frequencies spread from 1 to 0.1 radian per
    position, are given to positions alone (token and segment embeddings start at zero there).  Head h's key
    reads those columns; its query reads them rotated by ``offsets[h]`` positions, so that q_i . k_j is
    ``scale``^2 times a sum of cos(w (i + offset - j)), largest at j = i + offset (with the defaults, most of
    the head's attention starts there, the rest mostly on the tokens beside it).  A one-head
    encoder gets the first offset only.  An encoder that projects its embeddings to another width (ELECTRA's
    generator) has its projection start by copying those columns into its first hidden units (at most
    half of its units; the others keep the tokens).  Everything stays a learned parameter of the same
    BERT: only the starting values differ; values and outputs keep their random start."""
    emb = next(m for m in model.modules() if isinstance(m, BertEmbeddings))  # ELECTRA: shared by both encoders
    E = emb.position_embeddings.weight.shape[1]
    pairs = max(1, min(pairs, E // 8))
    # the pairs whose frequency 10000^(-2f/E) lies in [0.1, 1], evenly spread (f = E/8 is 0.1 rad/position)
    fs = [round(k * (E // 8) / pairs) for k in range(pairs)]
    freq = sinusoid_frequencies(E)[fs].tolist()  # those of sinusoidal_positions_' columns
    cols = [c for f in fs for c in (2 * f, 2 * f + 1)]  # sin, cos columns of sinusoidal_positions_' table
    with torch.no_grad():
        emb.word_embeddings.weight[:, cols] = 0
        emb.token_type_embeddings.weight[:, cols] = 0
        for enc in [m for m in model.modules() if hasattr(m, "encoder") and hasattr(m, "embeddings")]:
            att = enc.encoder.layer[0].attention.self
            C, nh = att.query.weight.shape[1], att.n_head
            hs = C // nh
            proj = getattr(enc, "embeddings_project", None)
            n = max(1, min(pairs, hs // 2, C // 4 if proj is not None else pairs))  # pairs this encoder's heads read
            rs = [round(k * pairs / n) for k in range(n)]  # evenly spread over the frequencies
            read = [c for r in rs for c in (cols[2 * r], cols[2 * r + 1])]
            if proj is not None:  # (C, E): hidden unit k starts as column read[k] (at most half the units)
                units = list(range(len(read)))
                proj.weight[units] = 0
                proj.weight[units, read] = 1
                proj.bias[units] = 0
                read = units
            for h, off in enumerate(offsets[:nh]):
                wq = torch.zeros(hs, C, dtype=torch.float64)
                wk = torch.zeros(hs, C, dtype=torch.float64)
                for i, r in enumerate(rs):
                    s, c = read[2 * i], read[2 * i + 1]
                    a = off * freq[r]  # rotating (sin wi, cos wi) by a gives (sin w(i+off), cos w(i+off))
                    wk[2 * i, s] = wk[2 * i + 1, c] = 1.0
                    wq[2 * i, s], wq[2 * i, c] = math.cos(a), math.sin(a)
                    wq[2 * i + 1, c], wq[2 * i + 1, s] = math.cos(a), -math.sin(a)
                rows = slice(h * hs, (h + 1) * hs)
                att.query.weight[rows] = (scale * wq).to(att.query.weight.dtype)
                att.key.weight[rows] = (scale * wk).to(att.key.weight.dtype)
                att.query.bias[rows] = 0
                att.key.bias[rows] = 0
    return cols
