"""Retrieval: query/passage pairs and retrieval sets read from files, exact search, and the figures.

Files: a SQuAD v1.1 JSON file (each question with its paragraph; the corpus every paragraph of the file), a
JSONL file of ``{"query", "positive"[, "negative"]}`` rows or a TSV file of ``query<TAB>positive[<TAB>negative]``
lines (the corpus the file's distinct passages, negatives with positives), or, for evaluation, a BEIR folder
(``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``).  Figures as BEIR and pytrec_eval compute them:
MRR@10 (the reciprocal rank of the first relevant passage in the top ten, else 0), recall@k (the share of a
query's relevant passages in its top k), nDCG@10 (gain = the relevance grade, discount log2(rank + 1)), averaged
over the queries that have a relevant passage.  Search is exact: every query against every passage, by cosine
similarity.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import UserError, shown
from ..files import json_lines, read_text

TOP_K = 10


@dataclass
class Pair:
    query: str
    positive: str
    negative: str | None = None


@dataclass
class RetrievalSet:
    queries: list[str]
    corpus: list[str]
    relevant: list[dict[int, int]]  # per query: {passage index: relevance grade > 0}
    itself: list[int] | None = None  # per query: the passage that is the query itself (BEIR leaves it out), or -1


# ------------------------------------------------------------------------------------------------ reading
def is_squad(path: str) -> bool:
    """Whether a file of queries and passages is a SQuAD JSON file (else pairs)."""
    return path.lower().endswith(".json")


def read_pairs(path: str) -> tuple[list[Pair], list[str] | None]:
    """(pairs in the file's order, the corpus when the file defines one: a SQuAD file's paragraphs)."""
    if is_squad(path):
        from .squad import read_examples

        examples, data = read_examples(path)
        corpus = [p["context"] for a in data for p in a["paragraphs"]]
        for ex in examples:
            if not ex.question.strip():
                raise UserError(f"{path}: question {ex.id} is empty")
        return [Pair(ex.question, ex.context) for ex in examples], list(dict.fromkeys(corpus))
    low = path.lower()
    rows: list[tuple[int, list]] = []
    text = read_text(path, "pairs file")
    if low.endswith(".jsonl"):
        for n, obj in json_lines(io.StringIO(text), path):
            for key in ("query", "positive"):
                if key not in obj:
                    raise UserError(f"{path}:{n}: no {key!r} field (a pair is {{\"query\", \"positive\"[, "
                                    "\"negative\"]}})")
            rows.append((n, [obj["query"], obj["positive"], obj.get("negative")]))
    elif low.endswith(".tsv"):
        reader = csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE)
        for n, fields in enumerate(reader, 1):
            if not fields or all(not f.strip() for f in fields):
                continue
            if n == 1 and [f.strip().lower() for f in fields[:2]] == ["query", "positive"]:
                continue  # a header
            if len(fields) not in (2, 3):
                raise UserError(f"{path}:{n}: {len(fields)} fields; a pair is query<TAB>positive[<TAB>negative]")
            rows.append((n, [*fields, None][:3]))
    else:
        raise UserError(f"{path}: unknown format; expected .jsonl or .tsv pairs, or a SQuAD .json file")
    pairs = [Pair(nonempty_text(q, "query", f"{path}:{n}"), nonempty_text(p, "positive", f"{path}:{n}"),
                  None if neg is None else nonempty_text(neg, "negative", f"{path}:{n}")) for n, (q, p, neg) in rows]
    if not pairs:
        raise UserError(f"{path} holds no pairs")
    return pairs, None


def nonempty_text(value, what: str, where: str) -> str:
    """``value``, a text that is not empty; else the error names ``what`` and ``where`` (file:line)."""
    if not isinstance(value, str):
        raise UserError(f"{where}: {what!r} must be text, not {shown(value)}")
    if not value.strip():
        raise UserError(f"{where}: the {what} is empty")
    return value


def pairs_set(pairs: list[Pair], corpus: list[str] | None) -> RetrievalSet:
    """Each pair's query against ``corpus``, its positive relevant.  Without a corpus (a file of pairs) the corpus
    is the file's distinct passages, its negatives with its positives, and a query on several rows is one query
    with each of its positives relevant; with one (a SQuAD file) every question is its own query, as its id makes
    it."""
    grouped = corpus is None
    corpus = corpus if corpus is not None else list(dict.fromkeys(
        text for p in pairs for text in (p.positive, p.negative) if text is not None))
    where = {text: i for i, text in enumerate(corpus)}
    if not grouped:
        return RetrievalSet([p.query for p in pairs], corpus, [{where[p.positive]: 1} for p in pairs])
    relevant: dict[str, dict[int, int]] = {}
    for p in pairs:
        relevant.setdefault(p.query, {})[where[p.positive]] = 1
    return RetrievalSet(list(relevant), corpus, list(relevant.values()))


def _beir(folder: str) -> RetrievalSet:
    def jsonl(name: str, fields: tuple[str, ...]) -> list[dict]:
        path = os.path.join(folder, name)
        rows, seen = [], {}
        for n, obj in json_lines(io.StringIO(read_text(path, "BEIR file")), path):
            for key in fields:
                if not isinstance(obj.get(key), str):
                    raise UserError(f"{path}:{n}: {key!r} must be text, not {shown(obj.get(key))}")
            if obj["_id"] in seen:  # (counted twice, a passage was a hit twice and a query scored twice)
                raise UserError(f"{path}:{n}: _id {shown(obj['_id'])} again (first at line {seen[obj['_id']]}); "
                                "each _id names one passage or query")
            seen[obj["_id"]] = n
            rows.append(obj)
        if not rows:
            raise UserError(f"{path} is empty")
        return rows

    corpus_rows = jsonl("corpus.jsonl", ("_id", "text"))
    query_rows = jsonl("queries.jsonl", ("_id", "text"))
    # BEIR's dense models read a passage as its title, a space, and its text
    corpus = [(f"{r['title']} {r['text']}" if isinstance(r.get("title"), str) and r["title"] else r["text"])
              for r in corpus_rows]
    doc_at = {r["_id"]: i for i, r in enumerate(corpus_rows)}
    qrels_path = os.path.join(folder, "qrels", "test.tsv")
    qrels: dict[str, dict[int, int]] = {}
    for n, fields in enumerate(csv.reader(io.StringIO(read_text(qrels_path, "BEIR qrels")), delimiter="\t"), 1):
        if not fields or (n == 1 and fields[0] == "query-id"):
            continue
        if len(fields) != 3:
            raise UserError(f"{qrels_path}:{n}: {len(fields)} fields; expected query-id, corpus-id, score")
        qid, did, score = fields
        try:
            grade = int(score)
        except ValueError:
            raise UserError(f"{qrels_path}:{n}: score {shown(score)} is no integer") from None
        if did not in doc_at:
            raise UserError(f"{qrels_path}:{n}: corpus-id {shown(did)} is not in corpus.jsonl")
        if grade > 0:
            qrels.setdefault(qid, {})[doc_at[did]] = grade
    queries = [r for r in query_rows if r["_id"] in qrels]  # BEIR scores the queries its qrels judge
    if not queries:
        raise UserError(f"{qrels_path}: no query of queries.jsonl has a relevant passage")
    for r in queries:  # (as a file of pairs refuses one; a passage may be empty, as some BEIR corpora have)
        if not r["text"].strip():
            raise UserError(f"{os.path.join(folder, 'queries.jsonl')}: query {shown(r['_id'])} is empty")
    # as BEIR's evaluation (ignore_identical_ids): a passage with the query's own id is not retrieved for it
    itself = [doc_at.get(r["_id"], -1) for r in queries]
    return RetrievalSet([r["text"] for r in queries], corpus, [qrels[r["_id"]] for r in queries], itself)


def read_retrieval_set(path: str) -> RetrievalSet:
    """A BEIR folder, a SQuAD JSON file, or a file of pairs, as queries, corpus and relevance."""
    if os.path.isdir(path):
        return _beir(path)
    return pairs_set(*read_pairs(path))


# ------------------------------------------------------------------------------------------------ figures
def metrics(ranked: np.ndarray, relevant: list[dict[int, int]]) -> dict[str, float]:
    """MRR@10, recall@1, recall@10 and nDCG@10 of ``ranked`` (Q, k): each query's passage indices, best first."""
    mrr = r1 = r10 = ndcg = 0.0
    for row, rel in zip(ranked, relevant):
        top = [int(i) for i in row[:TOP_K]]
        hits = [rel.get(i, 0) for i in top]
        first = next((k for k, g in enumerate(hits) if g > 0), None)
        mrr += 0.0 if first is None else 1.0 / (first + 1)
        r1 += sum(1 for g in hits[:1] if g > 0) / len(rel)
        r10 += sum(1 for g in hits if g > 0) / len(rel)
        dcg = sum(g / math.log2(k + 2) for k, g in enumerate(hits))
        ideal = sum(g / math.log2(k + 2) for k, g in enumerate(sorted(rel.values(), reverse=True)[:TOP_K]))
        ndcg += dcg / ideal
    n = len(relevant)
    return {"mrr@10": mrr / n, "recall@1": r1 / n, "recall@10": r10 / n, "ndcg@10": ndcg / n}


def random_order_mrr(rs: RetrievalSet) -> float:
    """The MRR@10 that ranking each query's passages in a random order has on average: with r relevant among m
    candidates, the first relevant one is at rank i with probability C(m-i, r-1) / C(m, r)."""
    total = 0.0
    for own, rel in zip(rs.itself or [-1] * len(rs.queries), rs.relevant):
        m, r = len(rs.corpus) - (own >= 0), sum(1 for j, g in rel.items() if g > 0 and j != own)
        if r:
            total += sum(math.comb(m - i, r - 1) / math.comb(m, r) / i for i in range(1, min(TOP_K, m) + 1))
    return total / len(rs.queries)


def search(queries: np.ndarray, corpus: np.ndarray, k: int = TOP_K, chunk: int = 1024,
           itself: list[int] | None = None) -> np.ndarray:
    """(Q, min(k, N)) passage indices of each query, by cosine similarity, best first (exact); ``itself[i]``, a
    passage never to return for query i (-1: none; -1 in the result: no passage there)."""
    q = torch.nn.functional.normalize(torch.from_numpy(queries), dim=-1)
    d = torch.nn.functional.normalize(torch.from_numpy(corpus), dim=-1)
    k = min(k, d.shape[0])
    out = []
    for i in range(0, q.shape[0], chunk):
        sims = q[i : i + chunk] @ d.T  # (chunk, N)
        if itself is not None:
            rows = [(r, j) for r, j in enumerate(itself[i : i + chunk]) if j >= 0]
            if rows:
                sims[[r for r, _ in rows], [j for _, j in rows]] = float("-inf")
        top = torch.topk(sims, k, dim=-1)
        # a query's own passage comes last where the corpus holds no more than k: it is no hit (-1)
        out.append(top.indices.masked_fill(top.values == float("-inf"), -1))
    return torch.cat(out).numpy()


def bm25_ranked(rs: RetrievalSet, k: int = TOP_K) -> np.ndarray:
    """(Q, k) passage indices by BM25 (:data:`BM25_SETTINGS`, through the ``bm25s`` library)."""
    try:
        import bm25s
    except ImportError:
        raise UserError("--model bm25 needs the bm25s library: pip install 'bertforge[retrieval]'") from None
    index = bm25s.BM25(k1=BM25_SETTINGS["k1"], b=BM25_SETTINGS["b"], method=BM25_SETTINGS["method"])
    stop = BM25_SETTINGS["stopwords"]
    try:
        index.index(bm25s.tokenize(rs.corpus, stopwords=stop, show_progress=False), show_progress=False)
    except ValueError as e:  # (passages of stop words alone leave nothing to index)
        raise UserError(f"BM25 has nothing to index: the passages hold no word but stop words ({e})") from None
    depth = min(k + (rs.itself is not None), len(rs.corpus))  # (one more, for the query's own passage)
    docs, scores = index.retrieve(bm25s.tokenize(rs.queries, stopwords=stop, show_progress=False), k=depth,
                                  show_progress=False)
    # a passage that shares no word with the query scores 0: it was not retrieved, whatever its place (-1: no hit)
    docs = np.where(np.asarray(scores) > 0, np.asarray(docs), -1)
    if rs.itself is None:
        return np.asarray(docs)
    # (a query that is no passage has no own passage to leave out: -1 there marks a slot without a hit)
    rows = [[d for d in row if own < 0 or d != own] for row, own in zip(np.asarray(docs), rs.itself)]
    width = min(k, depth)  # (a row without its own passage among its hits keeps them all; -1 pads the others)
    return np.asarray([(row + [-1] * width)[:width] for row in rows])


BM25_SETTINGS = {"k1": 1.5, "b": 0.75, "method": "lucene", "stopwords": "en"}


def ranked(rs: RetrievalSet, embed, k: int = TOP_K) -> np.ndarray:
    """(Q, k) passage indices of each query, best first (-1: none), by ``embed``'s vectors (texts -> (N, C)), or by
    BM25 for the string ``"bm25"``."""
    if embed == "bm25":
        return bm25_ranked(rs, k)
    return search(embed(rs.queries), embed(rs.corpus), k=k, itself=rs.itself)


def evaluate(rs: RetrievalSet, embed) -> dict:
    """The figures of ``embed`` (texts -> (N, C) vectors; the string ``"bm25"`` for BM25) on ``rs``."""
    t0 = time.perf_counter()
    return {**figures(rs, ranked(rs, embed)), "seconds": round(time.perf_counter() - t0, 3)}


def figures(rs: RetrievalSet, found: np.ndarray) -> dict:
    """The figures of the ranking ``found`` (:func:`ranked`'s) on ``rs``, with its numbers of queries and passages."""
    return {**metrics(found, rs.relevant), "queries": len(rs.queries), "corpus": len(rs.corpus)}
