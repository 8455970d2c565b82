"""The pretraining step's fast path: the last encoder layer only at the rows that reach the loss, and the
masked-LM loss fused with its vocabulary projection.

Departure (listed in :mod:`bertforge.models.bert`): in pretraining only [CLS] and the masked tokens reach the loss,
so the last layer computes its queries, attention output, output projection and feed-forward block only
there (every token is still a key and a value), and the masked-LM head runs only at the masked tokens,
through :func:`~bertforge.ops.cross_entropy.linear_cross_entropy_sum`.  Losses and gradients are those of
the models' ``forward`` with labels (tested).

While ``torch.compile`` traces (``--compile``), padding stays in (the padded layout with a key mask) and the
last layer runs at every position: unpadding and the row selection have data-dependent shapes, which would
split the compiled objective into many graphs.  The masked-LM head stays sparse; the values are the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .attention import row_attention
from .cross_entropy import head_buffer, linear_cross_entropy_sum
from .layout import Layout, gather_rows, tracing


def hidden_at(bert, positions, input_ids, attention_mask=None, token_type_ids=None,
              dropout_keys=None) -> torch.Tensor:
    """Final hidden states of the encoder ``bert`` (a :class:`~bertforge.models.bert.BertModel`) at flat positions
    (indices into the B*T tokens, repeats allowed): (M, C), equal to ``forward``'s there."""
    if tracing():  # the whole last layer: selecting its rows needs data-dependent shapes
        layout = bert.layout(input_ids, attention_mask, key_masked=True)  # padding left in
        x = bert.encoder(bert.embed(input_ids, token_type_ids, None, layout), layout)  # (B, T, C)
        return x.reshape(-1, x.shape[-1])[positions]  # (M, C)
    positions, inverse = torch.unique(positions, return_inverse=True)  # the row gathers need unique rows
    layout = bert.layout(input_ids, attention_mask, dropout_keys).flat()
    x = bert.embed(input_ids, token_type_ids, None, layout)  # (N, C) flat rows
    *layers, last = bert.encoder.layer
    for layer in layers:
        x = layer(x, layout)
    return layer_at_rows(last, x, layout.select(layout.rows_of(positions)))[inverse]  # (M, C) as ``positions``


def layer_at_rows(layer, x: torch.Tensor, selection: Layout) -> torch.Tensor:
    """The output (M, C) of ``layer`` (a :class:`~bertforge.models.bert.BertLayer`) at the rows of ``selection``
    (sorted indices among the flat rows ``x`` (N, C)) only: queries, output projection and feed-forward block
    run there; attention still reads every token."""
    att = layer.attention.self
    x_rows = gather_rows(x, selection.rows)  # (M, C)
    p = att.dropout_p if att.training else 0.0
    y = row_attention(x, x_rows, *att.projections(), att.n_head, selection, p)  # (M, C)
    a = layer.attention.output(y, x_rows, selection)
    return layer.output(layer.intermediate(a), a, selection)


def mlm_loss_sum(head, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of the masked-LM ``head`` (:class:`~bertforge.models.bert.BertLMPredictionHead`) at
    hidden states ``h`` (M, C) against ``labels`` (M,), fused with the vocabulary projection."""
    return linear_cross_entropy_sum(head.transform(h), head.decoder.weight, head.bias, labels, head_buffer(head))


def pretraining_losses(model, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None,
                       dropout_keys=None):
    """(summed MLM loss, summed NSP loss or None) of a :class:`~bertforge.models.bert.BertForPreTraining` or
    :class:`~bertforge.models.bert.BertForMaskedLM`: the training step's fast path, no logits kept.  The NSP loss
    needs the model's ``seq_relationship`` head and ``next_sentence_label``."""
    B, T = input_ids.shape
    flat = labels.reshape(-1)
    masked = (flat != -100).nonzero().squeeze(1)  # (N,) flat positions of the masked tokens
    heads = model.cls
    if not hasattr(heads, "seq_relationship"):  # masked LM alone
        h = hidden_at(model.bert, masked, input_ids, attention_mask, token_type_ids, dropout_keys)  # (N, C)
        return mlm_loss_sum(heads.predictions, h, flat[masked]), None
    cls_pos = torch.arange(B, device=input_ids.device) * T  # (B,) the [CLS] tokens
    positions = torch.cat([cls_pos, masked])
    h = hidden_at(model.bert, positions, input_ids, attention_mask, token_type_ids, dropout_keys)  # (B+N, C)
    mlm = mlm_loss_sum(heads.predictions, h[B:], flat[masked])
    nsp = None
    if next_sentence_label is not None:
        pooled = model.bert.pooler.activation(model.bert.pooler.dense(h[:B]))  # (B, C)
        nsp = F.cross_entropy(heads.seq_relationship(pooled), next_sentence_label.reshape(-1), reduction="sum")
    return mlm, nsp
