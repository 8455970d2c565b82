"""Sentence embeddings: contrastive fine-tuning on query/passage pairs with in-batch negatives
(:mod:`bertforge.tasks.contrastive`), validated by retrieval (MRR@10), saved as a BERT directory that
is also a sentence-transformers folder (:mod:`bertforge.embeddings`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from ..batching import pad_batch
from ..commands import emit, one_line, positive_int, text_input_flags
from ..config import FinetuneConfig, FinetuneDataConfig, setting
from ..embeddings import POOLINGS, EmbeddingSettings, encode, read_settings, settings_of, tokenize, write_settings
from ..errors import UserError, checked, require_type
from ..inference import Pipeline
from ..loading import model_dir
from ..models import BertConfig, BertModel
from .retrieval import (Pair, RetrievalSet, evaluate, figures, pairs_set, random_order_mrr, ranked,
                        read_pairs)
from ..tokenizer import special_ids
from .base import FinetuneTask, validating
from .classify import input_texts

log = logging.getLogger("bertforge")


def embedding_flags(p) -> None:
    """The flags of a command that embeds texts with a model folder (``evaluate retrieval``, ``predict embed``)."""
    p.add_argument("--pooling", choices=POOLINGS, help="default: the folder's sentence-transformers pooling, else mean")
    p.add_argument("--max-seq-length", type=positive_int, help="tokens read of a text (default: the folder's "
                                                                "max_seq_length, else 512)")


@dataclass
class EmbedConfig:
    pooling: str = setting("auto", "how a text's vector is made: mean (of the last layer over its tokens) or cls (the "
                                   "[CLS] state); auto: the model folder's sentence-transformers pooling, else mean",
                           choices=("auto", "mean", "cls"))
    scale: float = setting(20.0, "similarities are multiplied by this before the softmax over the batch (1/temperature;"
                                 " 20 as sentence-transformers' MultipleNegativesRankingLoss)", check="positive")
    symmetric: bool = setting(False, "add the loss of each positive picking its query among the batch's queries")



class EmbedTask(FinetuneTask):
    """Query/passage pairs (JSONL, TSV or a SQuAD file); MRR@10 on the validation pairs picks the best epoch."""

    name = "embed"
    model_class = BertModel
    settings_class = EmbedConfig
    select = "mrr@10"
    plotted = [("mrr@10", "MRR@10"), ("recall@10", "recall@10")]
    pipeline_tag = "sentence-similarity"
    bench_files = ("squad/train-8k-v1.1.json", "squad/dev-v1.1.json")
    # the batch not by the data: a larger batch holds more in-batch negatives; the length by the base folder
    defaults = {"batch_size": 32, "max_seq_length": None}
    length_rule = ("the base folder's sentence-transformers max_seq_length (what sentence-transformers trains it "
                   f"with), else {FinetuneDataConfig().max_seq_length}; at most the model's positions")

    @classmethod
    def default_length(cls, base: str) -> int:
        found = read_settings(base)
        return found.max_seq_length if found is not None and found.max_seq_length else super().default_length(base)

    help = ("sentence embeddings from query/passage pairs (JSONL, TSV or SQuAD JSON), in-batch negatives; the output "
            "is also a sentence-transformers folder")
    printed = ("mrr@10", "recall@1", "recall@10", "ndcg@10")
    evaluate_name = "retrieval"
    evaluate_help = "MRR@10, recall@1/10 and nDCG@10 of a model's embeddings (or BM25)"

    @classmethod
    def evaluation(cls):
        return evaluate_retrieval

    @classmethod
    def evaluate_arguments(cls, p) -> None:
        p.add_argument("--model", required=True, help="a BERT or sentence-transformers directory, or bm25 (BM25 "
                                                      "through the bm25s library: k1 1.5, b 0.75, Lucene's idf, "
                                                      "English stop words)")
        p.add_argument("--data", required=True, help="a SQuAD JSON file (each question against every paragraph), a "
                                                     "BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv) or a "
                                                     "JSONL file of {query, positive[, negative]} (against "
                                                     "the file's distinct passages)")
        p.add_argument("--batch-size", type=positive_int, default=64)
        embedding_flags(p)
        p.add_argument("--device", default="auto")

    predict_name = "embed"
    predict_help = "sentence vectors (as SentenceTransformer.encode gives them; --json: each with its text)"
    aliases = ("feature-extraction", "sentence-similarity")

    @classmethod
    def pipeline_class(cls) -> type:
        return EmbedPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        text_input_flags(p)
        embedding_flags(p)
        p.add_argument("text", nargs="*")

    @classmethod
    def predict(cls, a) -> None:
        texts = input_texts(a)
        vecs = EmbedPipeline(a.model, a.device, a.batch_size, max_seq_length=a.max_seq_length,
                             pooling=a.pooling)(texts)

        def table(rows):
            for t, v in zip(texts, rows):
                head = " ".join(f"{x:+.3f}" for x in v[:4])
                yield f"[{head} ...] ({len(v)} values, norm {float((v ** 2).sum()) ** 0.5:.3f})  {one_line(t, 60)}"

        emit(a, [{"text": t, "embedding": v} for t, v in zip(texts, vecs.tolist())] if a.json else vecs, table)

    def read(self, cfg: FinetuneConfig) -> None:
        dc = cfg.data
        if dc.max_seq_length < 3:
            raise UserError(f"--max-seq-length {dc.max_seq_length}: a text needs [CLS], a token and [SEP]")
        corpus: list[list[str] | None] = [None]  # a validation file's own corpus (a SQuAD file's paragraphs)

        def read_validation(path: str) -> list:
            found, corpus[0] = read_pairs(path)
            return found

        pairs, val_pairs = self.split_validation(read_pairs(dc.train_file)[0], cfg, read_validation,
                                                 key=lambda p: p.positive)
        val: RetrievalSet | None = pairs_set(val_pairs, corpus[0]) if val_pairs else None
        if dc.max_train_examples:
            pairs = pairs[: dc.max_train_examples]
        negatives = sum(p.negative is not None for p in pairs)
        if negatives not in (0, len(pairs)):
            raise UserError(f"{dc.train_file}: {negatives} of {len(pairs)} pairs have a negative; give one to every "
                            "pair or to none")
        self.pairs, self.val = pairs, val
        pooling = self.settings.pooling
        self.embedding: EmbeddingSettings = settings_of(cfg.model, None if pooling == "auto" else pooling)
        self.embedding.max_seq_length = dc.max_seq_length

    def texts(self) -> list[str]:
        return [p.query + " " + p.positive for p in self.pairs]

    def objective(self, model, seed: int | None, world: int):
        from .contrastive import InBatchNegatives

        return InBatchNegatives(model, seed, self.embedding, self.settings.scale, self.settings.symmetric, world)

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig):
        n = cfg.data.max_seq_length
        self.tok, self.max_length, self.eval_batch_size = tok, n, cfg.data.eval_batch_size
        self.pad = special_ids(tok).pad
        # each distinct text's number: equal passages (or the passages of equal queries) are no negatives
        texts: dict[str, int] = {}
        queries: dict[str, int] = {}
        sides = {"input_ids": [p.query for p in self.pairs], "positive": [p.positive for p in self.pairs]}
        if self.pairs[0].negative is not None:
            sides["negative"] = [p.negative for p in self.pairs]
        features: list[dict] = [{} for _ in self.pairs]
        for side, side_texts in sides.items():
            for f, ids, text in zip(features, tokenize(tok, side_texts, self.embedding, n), side_texts):
                f[side] = ids["input_ids"]
                if side != "input_ids":
                    f[side + "_key"] = texts.setdefault(text, len(texts))
                else:
                    f["token_type_ids"], f["query_key"] = ids["token_type_ids"], queries.setdefault(text, len(queries))
        if "negative" not in sides and (cfg.train.batch_size < 2 or len(texts) < 2):
            why = (f"--batch-size {cfg.train.batch_size} puts one pair in a batch" if cfg.train.batch_size < 2 else
                   f"every pair of {cfg.data.train_file} has the same passage")
            raise UserError(f"{why}: no passage is another query's negative, so nothing is learnt (the loss is 0); "
                            "give a larger --batch-size, pairs with other passages, or a negative to every pair")
        log.info("fine-tuning %s for embeddings on %d pairs%s (%d distinct passages), %s pooling%s", cfg.model,
                 len(features), " with hard negatives" if "negative" in sides else "", len(texts),
                 self.embedding.pooling, validating(len(self.val.queries) if self.val else 0, "queries"))
        return features, self._collate

    def _collate(self, fs: list[dict]) -> dict:
        b = pad_batch(fs, self.pad, ("query_key",))  # the queries
        b["query_keys"] = b.pop("query_key")
        for side in ("positive", "negative"):
            if side in fs[0]:
                s = pad_batch([{"input_ids": f[side], "token_type_ids": [0] * len(f[side])} for f in fs], self.pad)
                b[side + "_input_ids"], b[side + "_attention_mask"] = s["input_ids"], s["attention_mask"]
                b[side + "_keys"] = torch.tensor([f[side + "_key"] for f in fs], dtype=torch.long)
        return b

    def vectors(self, model, device, texts: list[str]):
        feats = tokenize(self.tok, texts, self.embedding, self.max_length)
        return encode(model, feats, self.pad, device, self.embedding, self.eval_batch_size)

    def evaluate(self, model, device):
        found = ranked(self.val, lambda texts: self.vectors(model, device, texts))  # (Q, min(10, N)), best first
        return figures(self.val, found), found  # (no seconds: a run's figures do not depend on the machine's speed)

    def unlearnt(self, metrics, found) -> str | None:
        q, n, k = len(self.val.queries), len(self.val.corpus), found.shape[1]
        if q < 10 or n <= k:  # (too few to tell)
            return None
        if (found == found[0]).all():  # (vectors that no longer tell texts apart)
            return f"it ranks the same {k} passages first for every one of the {q} validation queries"
        if getattr(self, "chance", None) is None:
            self.chance = random_order_mrr(self.val)
        if metrics["mrr@10"] <= self.chance < 1:
            return (f"its MRR@10 on the {q} validation queries, {metrics['mrr@10']:.3f}, is no better than the "
                    f"{self.chance:.3f} of the {n} passages in a random order")
        return None

    def eval_size(self) -> int:
        return len(self.val.queries) + len(self.val.corpus) if self.val else 0

    def write_model(self, folder: str, config: BertConfig) -> None:
        write_settings(folder, self.embedding, config.hidden_size)

    def describe(self) -> str:
        e, s = self.embedding, self.settings
        return (f"Sentence embeddings: {e.pooling} pooling{', L2-normalised' if e.normalize else ''}, at most "
                f"{e.max_seq_length} tokens a text; trained with in-batch negatives (MultipleNegativesRankingLoss), "
                f"scale {s.scale:g}{', symmetric' if s.symmetric else ''}. Loads as `SentenceTransformer(folder)`.")

    def bench_reference(self, folder: str, model_class: type, transformers, device):
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(folder, device=str(device)).train()

    def bench_step(self, theirs):
        return _RankingLossStep(theirs, self.settings.scale)

    def reference_difference(self, ours, theirs, batch: dict) -> float:
        from ..embeddings import pool

        o = pool(ours(**batch).last_hidden_state, batch["attention_mask"], self.embedding)
        return float((o - theirs(dict(batch))["sentence_embedding"]).abs().max())

    def train_figures(self) -> dict:
        return {"train_pairs": len(self.pairs)}


__all__ = ["EmbedTask", "Pair"]


@checked(batch_size=1)
def evaluate_retrieval(model: str | os.PathLike, data: str | os.PathLike, batch_size: int = 64, device: str = "auto",
                       pooling: str | None = None, max_seq_length: int | None = None) -> dict:
    """``bertforge evaluate retrieval``: MRR@10, recall@1, recall@10 and nDCG@10 (fractions) of ``model``'s
    embeddings on ``data`` (a SQuAD JSON file: every question against every paragraph; a BEIR folder; a JSONL
    file of ``{"query", "positive"[, "negative"]}`` pairs against its distinct passages), by exact search;
    ``model="bm25"`` scores BM25 instead (:data:`bertforge.tasks.retrieval.BM25_SETTINGS`)."""
    from .retrieval import read_retrieval_set

    data = os.fspath(data)
    embed_texts = "bm25"
    if os.fspath(model) != "bm25":
        embed_texts = EmbedPipeline(model, device, batch_size, max_seq_length=max_seq_length, pooling=pooling)
    elif pooling is not None or max_seq_length is not None:
        raise UserError("--pooling and --max-seq-length are settings of an embedding model, not of bm25")
    return evaluate(read_retrieval_set(data), embed_texts)


# ------------------------------------------------------------------------------------------------ pipeline
class EmbedPipeline(Pipeline):
    task = "embed"
    model_class = BertModel
    head = ("encoder weights", "give a BERT directory")

    def __init__(self, model: str | os.PathLike, device: str = "auto", batch_size: int = 32, progress: bool = False,
                 max_seq_length: int | None = None, pooling: str | None = None, backend: str | None = None):
        self.settings = settings_of(model_dir(model), pooling)
        self.default_length = self.settings.max_seq_length or Pipeline.default_length  # the folder's, as ST reads it
        super().__init__(model, device, batch_size, progress, max_seq_length, backend)

    @checked
    def __call__(self, texts: str | list[str]) -> np.ndarray:
        """(C,) float32 vector of a text, or (N, C) of a list, cut at the folder's ``max_seq_length`` tokens."""
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        for i, t in enumerate(texts):
            require_type(t, str, f"texts[{i}]")
        vecs = encode(self.model, tokenize(self.tok, texts, self.settings, self.max_length), self.sp.pad, self.device,
                      self.settings, self.batch_size, self.task if self.progress else None)
        return vecs[0] if single else vecs


class _RankingLossStep(torch.nn.Module):
    """sentence-transformers' MultipleNegativesRankingLoss (cosine, ``scale``) over a batch's queries and
    positives, as a model whose output has the loss: what the bench's reference trains."""

    def __init__(self, st, scale: float):
        super().__init__()
        try:  # (sentence-transformers 6 moved its losses; the floor, 4, has them here only)
            from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        except ImportError:
            from sentence_transformers.losses import MultipleNegativesRankingLoss

        self.mnrl = MultipleNegativesRankingLoss(st, scale=scale)  # (holds the model: its parameters are ours here)

    def forward(self, **b):
        import types

        sides = [{"input_ids": b[p + "input_ids"], "attention_mask": b[p + "attention_mask"],
                  "token_type_ids": torch.zeros_like(b[p + "input_ids"])} for p in ("", "positive_")]
        return types.SimpleNamespace(loss=self.mnrl(sides, None))
