"""Contrastive fine-tuning's objective: in-batch negatives (InfoNCE; sentence-transformers'
MultipleNegativesRankingLoss), as the engine takes an objective.

Each query is scored against every passage of the global batch (its own positive, the others' positives,
and every hard negative) by ``scale`` x cosine similarity, and the loss is the cross-entropy of picking its
own positive, averaged over the batch's queries; with ``symmetric``, the mean of that and of each positive
picking its query among the queries.  A passage whose text equals a query's positive, and the positive of
another row with the same query text, are no negatives of that query (in SQuAD several questions share a
paragraph): they leave the query's softmax (and likewise, in the symmetric part, the queries of rows with the
same positive or query text), where sentence-transformers' remedy is a sampler that keeps repeated texts out
of a batch (``BatchSamplers.NO_DUPLICATES``).

Under torchrun every process gathers the vectors of all the others, so each query meets every passage of the
global batch and N processes compute one process's loss; each process computes that whole loss with its own
vectors carrying their gradients, and the engine's DDP average over processes of ``loss x N`` sums the
processes' parts of the one gradient.

With gradient accumulation the micro-batches would not see each other's passages, so the step runs as GradCache
(Gao et al., 2021): :meth:`InBatchNegatives.prepare` computes every micro-batch's vectors without a graph, the
whole batch's loss and its gradient with respect to those vectors; each micro-batch's forward then computes its
vectors again (the same dropout masks: keyed by example on the CPU, the random state replayed elsewhere) and
back-propagates their cached gradient.  The update is the whole batch's, in the memory of one micro-batch.
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

        self.cache: dict | None = None

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        return {"examples": b["input_ids"].shape[0] * b.get("weight", 1.0)}

    def _sides(self, b: dict, step: int) -> list[torch.Tensor]:
        """The vectors of the queries, the positives and (when the batch has them) the hard negatives."""
        return [self._vectors(b, side, step) for side in range(2 + ("negative_input_ids" in b))]

    @staticmethod
    def _parts(b: dict, vecs: list[torch.Tensor]) -> list[torch.Tensor]:
        real = torch.full((b["input_ids"].shape[0],), int(b.get("weight", 1.0) > 0),
                          device=b["input_ids"].device)  # (an int: gloo gathers no bool)
        parts = [vecs[0], vecs[1], b["query_keys"], b["positive_keys"], real]
        return parts + ([vecs[2], b["negative_keys"]] if len(vecs) > 2 else [])

    def prepare(self, batches: list[dict], step: int) -> None:
        """Before a step of several micro-batches: the whole batch's loss and its gradient with respect to each
        micro-batch's vectors (GradCache), computed without the encoder's graph."""
        if len(batches) == 1:
            self.cache = None
            return
        states, leaves = [], []
        with torch.no_grad():
            for b in batches:
                states.append(_random_state(b["input_ids"].device))
                leaves.append([v.detach().requires_grad_() for v in self._sides(b, step)])
        per_batch = [self._parts(b, vecs) for b, vecs in zip(batches, leaves)]
        with torch.enable_grad():
            loss = self._loss([torch.cat(column) for column in zip(*per_batch)])
            grads = torch.autograd.grad(loss, [v for vecs in leaves for v in vecs])
        sizes = [len(vecs) for vecs in leaves]
        cut = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.cache = {"loss": loss.detach(), "states": states, "next": 0,
                      "grads": [grads[cut[i] : cut[i + 1]] for i in range(len(sizes))]}

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
        n = b["input_ids"].shape[0] * b.get("weight", 1.0)
        if self.cache is None:
            return {"loss": self._loss(self._parts(b, self._sides(b, step))), "n": n}
        c = self.cache  # a micro-batch of a cached step: its vectors again, back-propagating their cached gradient
        k = c["next"]
        c["next"] += 1
        _restore_random_state(c["states"][k], b["input_ids"].device)
        surrogate = sum((v * g).sum() for v, g in zip(self._sides(b, step), c["grads"][k]))
        return {"loss": surrogate, "n": n, "value": c["loss"]}

    def _loss(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The whole batch's loss from its rows (gathered from every process under torchrun)."""
        if self.world > 1:
            parts = _gathered(parts)
        real = parts[4].bool()  # without the stand-ins of processes with no example
        q, pos, q_keys, pos_keys = (x[real] for x in parts[:4])
        N = q.shape[0]
        # what is no negative of row i: the passages equal to its positive, the positives of its query's twins
        taken = _same(pos_keys, pos_keys) | _same(q_keys, q_keys)  # (N, N)
        docs = pos
        if len(parts) > 5:
            docs = torch.cat([pos, parts[5][real]])
            taken = torch.cat([taken, _same(pos_keys, parts[6][real])], dim=1)  # (N, 2N)
        loss = _picking(q, docs, taken, self.scale)
        if self.symmetric:  # each positive picks its query; the rows of its text or its query's are no negatives
            loss = (loss + _picking(pos, q, taken[:, :N], self.scale)) / 2
        return loss

    @staticmethod
    def loss(out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        # every process holds the whole batch's loss: its report is that loss times its share of the examples
        value = out.get("value", out["loss"])
        return out["loss"], {"loss": value.detach() * out["n"]}


def _same(a_keys: torch.Tensor, b_keys: torch.Tensor) -> torch.Tensor:
    """(N, M): whether row i's key equals column j's."""
    return a_keys[:, None] == b_keys[None, :]


def _picking(a: torch.Tensor, b: torch.Tensor, taken: torch.Tensor, scale: float) -> torch.Tensor:
    """Mean cross-entropy of each row i of ``a`` (N, C) picking row i of ``b`` (M >= N, C) by scaled cosine
    similarity, the columns ``taken`` marks in row i (other than i itself) left out of its softmax."""
    scores = scale * F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T  # (N, M)
    N = a.shape[0]
    target = torch.arange(N, device=a.device)
    taken = taken.clone()
    taken[target, target] = False
    scores = scores.masked_fill(taken, torch.finfo(scores.dtype).min)
    return F.cross_entropy(scores, target)


def _random_state(device: torch.device) -> tuple:
    """The random state that dropout draws from (on the CPU in training it is keyed instead, and unused)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _restore_random_state(state: tuple, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


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
