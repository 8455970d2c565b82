"""Contrastive fine-tuning's objective: in-batch negatives (InfoNCE; sentence-transformers'
MultipleNegativesRankingLoss), as the engine takes an objective.

Each query is scored against every passage of the global batch (its own positive, the others' positives,
and every hard negative) by ``scale`` x cosine similarity, and the loss is the cross-entropy of picking its
own positive, averaged over the batch's queries; with ``symmetric``, plus that of each positive picking its
query among the queries.  A passage whose text equals a query's positive is no negative of that query (in
SQuAD several questions share a paragraph): it leaves the query's softmax, where sentence-transformers'
remedy is a sampler that keeps duplicates out of a batch (``BatchSamplers.NO_DUPLICATES``).

Under torchrun every process gathers the vectors of all the others, so each query meets every passage of the
global batch and N processes compute one process's loss; each process computes that whole loss with its own
vectors carrying their gradients, and the engine's DDP average over processes of ``loss x N`` sums the
processes' parts of the one gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..embeddings import EmbeddingSettings, pool
from ..ops.dropout import DropoutKeys

SIDES = ("", "positive_", "negative_")  # the batch's key prefixes: queries, positives, hard negatives


class InBatchNegatives(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, seed: int | None, settings: EmbeddingSettings, scale: float,
                 symmetric: bool, world: int = 1):
        super().__init__()
        self.model, self.seed, self.settings = model, seed, settings
        self.scale, self.symmetric, self.world = scale, symmetric, world
        if getattr(model, "pooler", None) is not None:  # kept as loaded, unused: no gradient (DDP wants none)
            model.pooler.requires_grad_(False)

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        return {"examples": b["input_ids"].shape[0] * b.get("weight", 1.0)}

    def _vectors(self, b: dict, side: int, step: int) -> torch.Tensor:
        """(B, C) vectors of one side of the batch; dropout keyed by (example, side) on the CPU."""
        p = SIDES[side]
        ids = b["sequence_ids"].tolist() if "sequence_ids" in b else None
        keys = None
        if self.seed is not None and ids is not None and b["input_ids"].device.type == "cpu":
            keys = DropoutKeys(self.seed, step, [3 * i + side for i in ids])
        mask = b[p + "attention_mask"]
        out = self.model(b[p + "input_ids"], mask, torch.zeros_like(mask), dropout_keys=keys)
        return pool(out.last_hidden_state, mask, self.settings)

    def forward(self, b: dict, step: int) -> dict:
        n = b["input_ids"].shape[0]
        real = torch.full((n,), int(b.get("weight", 1.0) > 0), device=b["input_ids"].device)  # (gloo has no bool)
        q, pos = self._vectors(b, 0, step), self._vectors(b, 1, step)
        parts = [q, pos, b["positive_keys"], real]
        if "negative_input_ids" in b:
            parts += [self._vectors(b, 2, step), b["negative_keys"]]
        if self.world > 1:
            parts = _gathered(parts)
        q, pos, pos_keys, real = *parts[:3], parts[3].bool()
        q, pos, pos_keys = q[real], pos[real], pos_keys[real]  # without the stand-ins of processes with no example
        docs, doc_keys = pos, pos_keys
        if len(parts) > 4:
            docs, doc_keys = torch.cat([pos, parts[4][real]]), torch.cat([pos_keys, parts[5][real]])
        loss = _picking(q, docs, pos_keys, doc_keys, self.scale)
        if self.symmetric:
            loss = (loss + _picking(pos, q, pos_keys, pos_keys, self.scale)) / 2
        return {"loss": loss, "n": n * b.get("weight", 1.0)}

    @staticmethod
    def loss(out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        # every process holds the whole batch's loss: its report is that loss times its share of the examples
        return out["loss"], {"loss": out["loss"].detach() * out["n"]}


def _picking(a: torch.Tensor, b: torch.Tensor, a_keys: torch.Tensor, b_keys: torch.Tensor,
             scale: float) -> torch.Tensor:
    """Mean cross-entropy of each row of ``a`` (N, C) picking row i of ``b`` (M >= N, C) by scaled cosine
    similarity, rows of ``b`` with the same key as row i (other than i itself) left out of row i's softmax."""
    scores = scale * F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T  # (N, M)
    N = a.shape[0]
    target = torch.arange(N, device=a.device)
    same = a_keys[:, None] == b_keys[None, :]  # (N, M)
    same[target, target] = False
    scores = scores.masked_fill(same, torch.finfo(scores.dtype).min)
    return F.cross_entropy(scores, target)


def _gathered(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's rows from every process, in rank order, this process's own rows carrying their gradients
    (the others' arrive without). Processes may hold different numbers of rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    n = torch.tensor([parts[0].shape[0]], device=parts[0].device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s) for s in sizes]
    longest = max(sizes)
    out = []
    for t in parts:
        padded = t.detach().new_zeros((longest, *t.shape[1:]))
        padded[: t.shape[0]] = t.detach()
        chunks = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(chunks, padded.contiguous())
        chunks = [c[:s] for c, s in zip(chunks, sizes)]
        chunks[rank] = t
        out.append(torch.cat(chunks))
    return out
