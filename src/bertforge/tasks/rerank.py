"""Reranking: a cross-encoder that reads a query and a passage together and scores their relevance (one output
label), trained on each query's positive passages and negatives mined by a first stage, and used to reorder a
first stage's top k.  The saved folder is a transformers sequence-classification folder with one label whose
``config.json`` records its activation as sentence-transformers (v4 and later) does, so that
``sentence_transformers.CrossEncoder(folder)`` loads it and scores as :class:`RerankPipeline` does.

Training files: a SQuAD v1.1 JSON file (each question's own paragraph is its positive, every paragraph of the
file a candidate negative; a mined paragraph that contains one of the question's answers, word for word, is no
negative and is dropped, and counted), JSONL rows of ``{"query", "positive"[, "negative" | "negatives"]}`` or TSV
lines of ``query<TAB>positive[<TAB>negative...]``, or labelled pairs: JSONL rows of ``{"query", "passage",
"label"}`` or a TSV file whose header is ``query<TAB>passage<TAB>label`` (labels 0 or 1; the rows of one query
make one group).

Negatives are mined by a first stage (``--negatives bm25``, an embeddings folder, or ``none`` when the file brings
its own) over the training file's passages: the first stage's ranks from ``--range-min`` to ``--range-max``,
the positives left out, the best ``--num-negatives`` kept (sentence-transformers' ``mine_hard_negatives`` with its
``top`` sampling).

Losses: a listwise softmax over each query's passages (the default): the cross-entropy of its scores' softmax
against its labels scaled to sum to one (with one positive, the localized contrastive estimation loss of Gao et
al., 2021, arXiv:2101.08751; sentence-transformers' ``ListNetLoss`` takes the labels' softmax as its target
instead, which gives the one positive among six passages 0.35, not 1), or pointwise binary cross-entropy over
every pair (sentence-transformers' ``BinaryCrossEntropyLoss``).  The listwise loss ranked better on the held-out
articles (docs/log/rerank.md); its folder records the Identity activation, so scores are logits, where a BCE
folder's are probabilities.  A training example is one query with its passages; ``--batch-size`` counts
queries.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from ..batching import pad_batch
from ..commands import emit, one_line, positive_int
from ..config import FinetuneConfig, setting
from ..errors import UserError, checked, require_type, shown
from ..evaluation import by_length
from ..files import json_lines, json_object_or_none, lines_of, read_text
from ..inference import Pipeline
from ..loading import model_dir
from ..models import BertConfig, BertForSequenceClassification
from ..ops.dropout import DropoutKeys
from ..tokenizer import copy_of, special_ids
from .base import FinetuneTask, given_settings, use_labels, validating
from .retrieval import TOP_K, RetrievalSet, is_squad, metrics, nonempty_text, ranked

log = logging.getLogger("bertforge")

SIGMOID, IDENTITY = "torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity"


@dataclass
class RerankConfig:
    negatives: str = setting("bm25", "where each query's negatives come from: bm25 (mined from the training file's "
                                     "passages), an embeddings model folder (mined by its vectors), or none (the file "
                                     "brings its own)", by_content=True)
    num_negatives: int = setting(5, "mined negatives per query", check="positive")
    range_min: int = setting(0, "mined negatives skip this many of the first stage's best passages (after the "
                                "positives are left out)", check="non-negative")
    range_max: int = setting(30, "mined negatives come from the first stage's best this many passages",
                             check="positive")
    loss: str = setting("listwise", "listwise: the cross-entropy of a softmax over each query's passages (the score "
                                    "is the logit); bce: binary cross-entropy of every pair (the score is the "
                                    "sigmoid of the logit)", choices=("listwise", "bce"))
    pos_weight: float | None = setting(None, "bce: the weight of a positive pair's loss (sentence-transformers' "
                                            "pos_weight); default: --num-negatives (with --negatives none, the file's "
                                            "negatives per positive), so that positives and negatives weigh alike",
                                 check="positive")
    first_stage: str = setting("bm25", "the first stage whose top k the reranker reorders when it is scored: bm25 or "
                                       "an embeddings model folder", by_content=True)
    top_k: int = setting(20, "passages of the first stage the reranker reorders", check="positive")


@dataclass
class Group:
    """One query and its passages with their labels (1 relevant, 0 not)."""

    query: str
    passages: list[str]
    labels: list[int]
    answers: tuple[str, ...] = ()  # a SQuAD question's answers: a passage that holds one is no negative


# ------------------------------------------------------------------------------------------------ reading
def _label(value, where: str) -> int:
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return int(value)
    raise UserError(f"{where}: label {shown(value)} is not 0 or 1")


def read_groups(path: str) -> tuple[list[Group], list[str]]:
    """(each query's group, in the file's order; the passages a first stage searches: a SQuAD file's paragraphs,
    else every distinct passage of the file)."""
    path = os.fspath(path)
    if is_squad(path):
        from .squad import read_examples

        examples, data = read_examples(path)
        groups = [Group(nonempty_text(ex.question, "question", f"{path}: question {ex.id}"), [ex.context], [1],
                        tuple(a["text"] for a in ex.answers if a["text"].strip())) for ex in examples]
        corpus = list(dict.fromkeys(p["context"] for a in data for p in a["paragraphs"]))
    else:
        rows = _rows(path)
        labelled: dict[str, Group] = {}
        groups = []
        for where, r in rows:
            query = nonempty_text(r.get("query"), "query", where)
            if "label" in r or "passage" in r:
                g = labelled.get(query)
                if g is None:
                    g = labelled[query] = Group(query, [], [])
                    groups.append(g)
                g.passages.append(nonempty_text(r.get("passage"), "passage", where))
                g.labels.append(_label(r.get("label"), where))
                continue
            negatives = r.get("negatives", [] if r.get("negative") is None else [r["negative"]])
            if not isinstance(negatives, list):
                raise UserError(f"{where}: 'negatives' must be a list of texts, not {shown(negatives)}")
            passages = [nonempty_text(r.get("positive"), "positive", where)]
            passages += [nonempty_text(n, "negative", where) for n in negatives]
            groups.append(Group(query, passages, [1] + [0] * (len(passages) - 1)))
        corpus = list(dict.fromkeys(p for g in groups for p in g.passages))
    if not groups:
        raise UserError(f"{path} holds no queries")
    return groups, corpus


def _rows(path: str) -> list[tuple[str, dict]]:
    """(where, row) of a JSONL or TSV file of pairs."""
    low, text = path.lower(), read_text(path, "rerank file")
    if low.endswith(".jsonl"):
        return [(f"{path}:{n}", obj) for n, obj in json_lines(io.StringIO(text), path)]
    if not low.endswith(".tsv"):
        raise UserError(f"{path}: unknown format; expected a SQuAD .json file, or .jsonl or .tsv pairs")
    lines = [(n, f) for n, f in enumerate(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE), 1)
             if f and any(x.strip() for x in f)]
    head = [x.strip().lower() for x in lines[0][1]] if lines else []
    if head == ["query", "passage", "label"]:
        expected = "query<TAB>passage<TAB>label"
        return [(f"{path}:{n}", dict(zip(head, f))) if len(f) == 3 else _fields(path, n, f, expected)
                for n, f in lines[1:]]
    if head[:2] == ["query", "positive"]:
        lines = lines[1:]
    elif head[:1] == ["query"]:  # (a header of other columns would be read as a query with its passages)
        raise UserError(f"{path}:{lines[0][0]}: unknown header {shown(chr(9).join(lines[0][1]))}; expected "
                        "query<TAB>passage<TAB>label or query<TAB>positive[<TAB>negative...]")
    elif lines and all(len(f) == 3 and re.fullmatch(r"\s*[-+]?\d+(\.\d*)?\s*", f[2]) for _, f in lines):
        raise UserError(f"{path}: every row's third field is a number, labels read as negative passages without a "
                        "header; a labelled file starts with query<TAB>passage<TAB>label")
    return [(f"{path}:{n}", {"query": f[0], "positive": f[1], "negatives": f[2:]}) if len(f) >= 2
            else _fields(path, n, f, "query<TAB>positive[<TAB>negative...]") for n, f in lines]


def _fields(path: str, n: int, fields: list[str], expected: str):
    raise UserError(f"{path}:{n}: {len(fields)} field(s); expected {expected}")


def retrieval_set(groups: list[Group], corpus: list[str], merge: bool = True) -> RetrievalSet:
    """The groups as queries against ``corpus``, each query's positives relevant.  With ``merge`` (a file of
    pairs) the rows of one query text are one query; without (a SQuAD file) every question is its own, as
    ``evaluate retrieval`` counts them."""
    where = {text: i for i, text in enumerate(corpus)}
    queries: list[tuple[str, dict[int, int]]] = []
    seen: dict[str, dict[int, int]] = {}
    for g in groups:
        relevant = seen.get(g.query) if merge else None
        if relevant is None:
            relevant = {}
            queries.append((g.query, relevant))
            seen[g.query] = relevant
        relevant.update({where[p]: 1 for p, y in zip(g.passages, g.labels) if y})
    keep = [(q, r) for q, r in queries if r]
    if not keep:
        raise UserError("no query has a relevant passage to retrieve")
    return RetrievalSet([q for q, _ in keep], corpus, [r for _, r in keep])


def read_retrieval_data(path: str) -> RetrievalSet:
    """``evaluate rerank``'s data: a BEIR folder, or a file of groups (:func:`read_groups`)."""
    if os.path.isdir(path):
        from .retrieval import read_retrieval_set

        return read_retrieval_set(path)
    return retrieval_set(*read_groups(path), merge=not is_squad(path))


# ------------------------------------------------------------------------------------------------ the first stage
def check_first_stage(stage: str, flag: str) -> None:
    """Refuse a first stage that is neither ``bm25`` nor an embeddings model folder."""
    if stage == "bm25":
        return
    config = json_object_or_none(os.path.join(stage, "config.json")) if os.path.isdir(stage) else None
    if config is None:
        raise UserError(f"{flag} {stage}: not bm25 and not a model folder (no config.json)")
    named = config.get("architectures") or []
    if not isinstance(named, list):
        raise UserError(f"{flag} {stage}: its config.json's architectures is {shown(named)}, not a list")
    named = [str(a) for a in named]
    if any(a.endswith(("ForSequenceClassification", "ForQuestionAnswering", "ForTokenClassification"))
           for a in named):
        raise UserError(f"{flag} {stage} holds a {named[0]} (its config.json says), not an embeddings model")


def first_stage_depth(top_k: int) -> int:
    """How many passages the first stage ranks for a reranker that reorders its ``top_k``: at least the 10 that its
    figures (and :func:`rerank_figures`' of the first stage alone) read, whatever ``--top-k``."""
    return max(top_k, TOP_K)


def first_stage_ranked(rs: RetrievalSet, stage: str, k: int, flag: str, device: str = "auto",
                       batch_size: int = 64) -> np.ndarray:
    """(Q, k) passage indices of each query by ``stage`` (bm25, or an embeddings folder), best first; -1: none."""
    check_first_stage(stage, flag)
    if stage == "bm25":
        return ranked(rs, stage, k)
    from .embed import EmbedPipeline

    return ranked(rs, EmbedPipeline(stage, device, batch_size), k)


def _words(text: str) -> str:
    """``text`` lowercased as its words, each between spaces: an answer is in a passage when its words are a run
    of the passage's (" 2 " is not in " in 2012 ", as "2" is in "in 2012")."""
    return " " + " ".join(re.findall(r"\w+", text.lower())) + " "


def mine(groups: list[Group], corpus: list[str], s: RerankConfig, device: str = "auto") -> dict:
    """Add ``s.num_negatives`` mined negatives to each group (in place); what was mined, for metrics.json.  No
    passage a query already has is mined for it, whichever of its rows (a file of pairs) brings it."""
    rs = RetrievalSet([g.query for g in groups], corpus, [{} for _ in groups])
    rows = first_stage_ranked(rs, s.negatives, s.range_max, "--negatives", device)
    known: dict[str, set[str]] = {}
    for g in groups:
        known.setdefault(g.query, set()).update(g.passages)
    words: dict[int, str] = {}  # (each passage's words, made once: passages recur across queries)

    def has_answer(i: int, answers: list[str]) -> bool:
        if i not in words:
            words[i] = _words(corpus[i])
        return any(a in words[i] for a in answers)

    found = dropped = short = 0
    for g, row in zip(groups, rows):
        answers = [w for w in map(_words, g.answers) if w.strip()]
        candidates = [int(i) for i in row if i >= 0 and corpus[i] not in known[g.query]][s.range_min :]
        taken = []
        for i in candidates:
            if len(taken) == s.num_negatives:
                break
            if answers and has_answer(i, answers):
                dropped += 1  # a passage that answers the question is no negative (a false negative)
                continue
            taken.append(corpus[i])
        g.passages += taken
        g.labels += [0] * len(taken)
        found, short = found + len(taken), short + (len(taken) < s.num_negatives)
    share = dropped / max(1, dropped + found)
    log.info("mined %d negatives by %s (ranks %d-%d); dropped %d that hold an answer (%.1f%% of those looked at); "
             "%d queries got fewer than %d", found, s.negatives, s.range_min, s.range_max, dropped, 100 * share, short,
             s.num_negatives)
    return {"mined_negatives": found, "false_negatives_dropped": dropped, "false_negative_share": round(share, 4),
            "queries_short_of_negatives": short}


# ------------------------------------------------------------------------------------------------ the loss
class RerankLoss(torch.nn.Module):
    """The cross-encoder's loss as the engine takes an objective: binary cross-entropy averaged over every pair of
    the global batch, or the listwise softmax cross-entropy averaged over its queries; a process without examples
    takes part with one of ``weight`` 0.  Dropout masks are keyed by (query, passage) on the CPU."""

    def __init__(self, model: torch.nn.Module, seed: int | None, loss: str, pos_weight: float = 1.0):
        super().__init__()
        self.model, self.seed, self.listwise, self.pos_weight = model, seed, loss == "listwise", pos_weight

    @staticmethod
    def counts(b: dict) -> dict[str, float]:
        w = b.get("weight", 1.0)
        return {"examples": float(b["slot"].eq(0).sum()) * w, "pairs": b["input_ids"].shape[0] * w}

    def forward(self, b: dict, step: int) -> dict:
        keys = None
        if self.seed is not None and "sequence_ids" in b and b["input_ids"].device.type == "cpu":
            keys = DropoutKeys(self.seed, step, (b["sequence_ids"][b["group"]] * 4096 + b["slot"]).tolist())
        logits = self.model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                            dropout_keys=keys).logits.squeeze(-1)  # (N,)
        labels = b["labels"].to(logits.dtype)
        if not self.listwise:
            weight = torch.tensor(self.pos_weight, device=logits.device)
            total = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="sum",
                                                       pos_weight=weight)
        else:
            total = listwise_sum(logits, labels, b["group"], b["slot"])
        w = b.get("weight", 1.0)
        return {"loss": total * w}

    def loss(self, out: dict, totals: dict[str, float]) -> tuple[torch.Tensor, dict]:
        # reported per example (query) by the runner: scaled so that the log shows the mean of the loss's own unit
        unit = totals["examples"] if self.listwise else totals["pairs"]
        return out["loss"] / max(1.0, unit), {"loss": out["loss"].detach() * (totals["examples"] / max(1.0, unit))}


def listwise_sum(logits: torch.Tensor, labels: torch.Tensor, group: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The listwise loss summed over the queries of a flattened batch, whose pair i is passage ``slot[i]`` of query
    ``group[i]``: the cross-entropy of each query's softmax of scores against its labels scaled to sum to one."""
    G, S = int(group.max()) + 1, int(slot.max()) + 1
    scores = logits.new_full((G, S), float("-inf")).index_put((group, slot), logits)  # (G, S)
    target = labels.new_zeros((G, S)).index_put((group, slot), labels)
    mass = target.sum(-1, keepdim=True)
    has = mass.squeeze(-1) > 0  # (a query without a relevant passage adds nothing)
    logp = F.log_softmax(scores.float(), -1).masked_fill(target == 0, 0.0)
    return -((target / mass.clamp_min(1)) * logp).sum(-1)[has].sum()


# ------------------------------------------------------------------------------------------------ the task
def encode_pairs(tok: Tokenizer, queries: list[str], passages: list[str]) -> list[dict]:
    """Token ids of (query, passage) pairs: [CLS] query [SEP] passage [SEP], segments 0 and 1."""
    return [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in tok.encode_batch(list(zip(queries, passages)))]


def pair_logits(model, tok: Tokenizer, pad: int, device, batch_size: int, queries: list[str], passages: list[str],
                desc: str | None = None) -> np.ndarray:
    """(N,) relevance logits of (query, passage) pairs, in length-sorted batches (``tok`` truncates)."""
    out = by_length(model, encode_pairs(tok, queries, passages), pad, device, batch_size,
                    lambda o, b: o.logits.float().squeeze(-1).tolist(), desc)
    return np.asarray(out, dtype=np.float32)


def rerank_figures(rs: RetrievalSet, ranked: np.ndarray, score_pairs, top_k: int) -> tuple[dict, dict]:
    """(the first stage's figures, the reranked ones) of the first stage's ``ranked`` passages on ``rs``, its top
    ``top_k`` of each query reordered by ``score_pairs(queries, passages) -> scores`` and the rest left in its
    order (``ranked`` holds at least the figures' 10 a query: :func:`first_stage_depth`)."""
    cand = [[int(i) for i in row[:top_k] if i >= 0] for row in ranked]
    pairs = [(rs.queries[q], rs.corpus[i]) for q, row in enumerate(cand) for i in row]
    # each distinct pair scored once: passages of the same text tie exactly, and keep the first stage's order
    # (scored apart, in other batches, they would differ in the last bits and be ordered by rounding)
    once = list(dict.fromkeys(pairs))
    score_of = dict(zip(once, score_pairs([q for q, _ in once], [p for _, p in once]))) if once else {}
    scores = np.asarray([score_of[pair] for pair in pairs])
    reranked, at = [], 0
    for row, first in zip(cand, ranked):
        s = scores[at : at + len(row)]
        at += len(row)
        reranked.append([row[i] for i in np.argsort(-np.asarray(s), kind="stable")] + [int(i) for i in first[top_k:]])
    return metrics([list(r) for r in ranked], rs.relevant), metrics(reranked, rs.relevant)


class RerankTask(FinetuneTask):
    """A cross-encoder over (query, passage) pairs; MRR@10 of the first stage's top k reranked picks the best
    epoch."""

    name = "rerank"
    model_class = BertForSequenceClassification
    settings_class = RerankConfig
    select = "mrr@10"
    plotted = [("mrr@10", "MRR@10 reranked"), ("recall@1", "recall@1 reranked")]
    pipeline_tag = "text-ranking"
    bench_files = ("squad/train-8k-v1.1.json", "squad/dev-v1.1.json")
    # not the width rule's rate: at it, and without a positive weight, a small model stayed at the base rate's loss
    # (docs/log/rerank.md has the runs)
    defaults = {"max_seq_length": 256, "batch_size": 8, "lr": 1e-4}
    evaluate_length = Pipeline.default_length  # a pair as predict and CrossEncoder read it (the pipeline's)
    flag_notes = {"batch_size": "for rerank, in queries: each with its passages"}

    help = ("a cross-encoder reranker from queries and their passages (SQuAD JSON, JSONL, TSV), negatives mined by "
            "BM25 or an embeddings model; the output is also a sentence-transformers CrossEncoder folder")
    printed = ("mrr@10", "recall@1", "recall@10", "ndcg@10")
    evaluate_name = "rerank"
    evaluate_help = "MRR@10, recall@1/10 and nDCG@10 of a first stage alone and reranked by a cross-encoder"
    evaluate_settings = RerankConfig
    evaluate_flags = ("first_stage", "top_k")
    evaluate_data_help = ("a SQuAD JSON file (each question against every paragraph), a BEIR folder, or a JSONL/TSV "
                          "file of pairs")

    predict_name = "rerank"
    predict_help = "scores of passages for a query, best first (as CrossEncoder.rank gives them)"
    aliases = ("text-ranking",)

    @classmethod
    def evaluation(cls):
        return evaluate_rerank

    @classmethod
    def holds(cls, config) -> bool:
        return config.num_labels == 1  # one relevance score (a classifier has at least two classes)

    @classmethod
    def pipeline_class(cls) -> type:
        return RerankPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        p.add_argument("--query", required=True)
        p.add_argument("--input", help="a text file of passages, one per line")
        p.add_argument("--max-seq-length", type=positive_int, help="tokens read of a pair (default: 512, or the "
                                                                   "model's positions if fewer)")
        p.add_argument("passage", nargs="*")

    @classmethod
    def predict(cls, a) -> None:
        if a.input and a.passage:
            raise UserError("give passages or --input, not both")
        passages = lines_of(read_text(a.input, "input file")) if a.input else a.passage  # (corpus_id: the line's)
        if not any(p.strip() for p in passages):  # (blank lines among passages stay: corpus_id is the line's)
            raise UserError(f"{a.input} holds no passage" if a.input else "give passages (or --input FILE)")
        ranked = RerankPipeline(a.model, a.device, a.batch_size, max_seq_length=a.max_seq_length)(a.query, passages)
        emit(a, ranked, lambda rows: (f"{r['score']:8.4f}  {one_line(r['text'])}" for r in rows))

    # ---- fine-tuning
    def read(self, cfg: FinetuneConfig) -> None:
        s, dc = self.settings, cfg.data
        if s.range_min >= s.range_max:
            raise UserError(f"--range-min {s.range_min} must be below --range-max {s.range_max}")
        if s.negatives != "none":  # (refused before any file is read)
            check_first_stage(s.negatives, "--negatives")
        check_first_stage(s.first_stage, "--first-stage")
        groups, corpus = read_groups(dc.train_file)
        val: list[RetrievalSet] = []

        def read_validation(path: str) -> list:
            val.append(read_retrieval_data(path))
            return val[0].queries

        groups, held = self.split_validation(groups, cfg, read_validation, key=lambda g: g.query)
        if held and not val:  # (a part of the training file held out: against the training file's passages)
            val.append(retrieval_set(held, corpus, merge=not is_squad(dc.train_file)))
        if dc.max_train_examples:
            groups = groups[: dc.max_train_examples]
        self.mined = mine(groups, corpus, s, cfg.impl.device) if s.negatives != "none" else {}
        if not any(0 in g.labels for g in groups):
            raise UserError(f"{dc.train_file}: no query has a negative passage; give negatives in the file or mine "
                            "them (--negatives bm25, or an embeddings folder)")
        if s.loss == "listwise" and not all(1 in g.labels for g in groups):
            log.warning("%d queries without a relevant passage add nothing to the listwise loss",
                        sum(1 not in g.labels for g in groups))
        self.groups = groups
        self.val = val[0] if val else None
        if self.val is not None and dc.max_eval_examples:
            v = self.val
            self.val = RetrievalSet(v.queries[: dc.max_eval_examples], v.corpus, v.relevant[: dc.max_eval_examples],
                                    v.itself[: dc.max_eval_examples] if v.itself else None)
        self.ranked = (first_stage_ranked(self.val, s.first_stage, first_stage_depth(s.top_k), "--first-stage",
                                          cfg.impl.device)
                       if self.val is not None else None)

    def texts(self) -> list[str]:
        return [g.query + " " + p for g in self.groups for p in g.passages]

    def configure(self, config: BertConfig) -> bool:
        new = use_labels(config, ["LABEL_0"])
        config.extra["sentence_transformers"] = {
            "activation_fn": IDENTITY if self.settings.loss == "listwise" else SIGMOID}
        return new

    def objective(self, model, seed: int | None, world: int):
        if self.settings.loss == "listwise":
            # a shift of every score leaves the listwise loss as it is: the bias would get a gradient of rounding
            # only, which Adam turns into steps of their own (runs of 1 and 2 processes part on it): it stays put
            model.classifier.bias.requires_grad_(False)
        return RerankLoss(model, seed, self.settings.loss, self.pos_weight)

    @property
    def pos_weight(self) -> float:
        s = self.settings
        if s.pos_weight is not None:
            return s.pos_weight
        if s.negatives != "none":
            return float(s.num_negatives)
        labels = [label for g in self.groups for label in g.labels]  # (the file's own: none are mined)
        return labels.count(0) / max(labels.count(1), 1)

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig):
        self.tok = copy_of(tok, cfg.data.max_seq_length)
        self.pad, self.eval_batch_size = special_ids(tok).pad, cfg.data.eval_batch_size
        features = []
        for g in self.groups:
            rows = encode_pairs(self.tok, [g.query] * len(g.passages), g.passages)
            longest = max(rows, key=lambda r: len(r["input_ids"]))
            # input_ids: the group's longest pair (its length stands for the group's where lengths are compared)
            features.append({"rows": rows, "labels": g.labels, "input_ids": longest["input_ids"]})
        n = sum(len(g.passages) for g in self.groups)
        log.info("fine-tuning %s for reranking on %d queries (%d pairs, %s loss)%s", cfg.model, len(features), n,
                 self.settings.loss, validating(len(self.val.queries) if self.val else 0, "queries"))
        return features, self._collate

    def _collate(self, fs: list[dict]) -> dict:
        rows = [r for f in fs for r in f["rows"]]
        b = pad_batch(rows, self.pad)
        b["labels"] = torch.tensor([y for f in fs for y in f["labels"]], dtype=torch.float32)
        b["group"] = torch.tensor([g for g, f in enumerate(fs) for _ in f["rows"]], dtype=torch.long)
        b["slot"] = torch.tensor([j for f in fs for j in range(len(f["rows"]))], dtype=torch.long)
        return b

    def evaluate(self, model, device):
        first, reranked = rerank_figures(
            self.val, self.ranked, lambda q, p: pair_logits(model, self.tok, self.pad, device, self.eval_batch_size,
                                                            q, p), self.settings.top_k)
        return {**reranked, **{f"first_stage_{k}": v for k, v in first.items()}}, None

    def unlearnt(self, metrics, artifacts) -> str | None:
        if self.settings.top_k < 2:  # one passage a query: nothing to reorder, every order is the first stage's
            return None
        if getattr(self, "chance", None) is None:  # the same candidates in an order drawn at random, once
            rng = np.random.default_rng(0)
            self.chance = rerank_figures(self.val, self.ranked, lambda q, p: rng.random(len(q)),
                                         self.settings.top_k)[1][self.select]
        ours, first = metrics[self.select], metrics[f"first_stage_{self.select}"]
        if ours <= self.chance:
            return (f"its MRR@10 on the {len(self.val.queries)} validation queries, {ours:.3f}, is no better than "
                    f"the {self.chance:.3f} of the first stage's top {self.settings.top_k} in a random order (the "
                    f"first stage's own order: {first:.3f})")
        return None

    def eval_size(self) -> int:
        """The pairs an evaluation scores, counted in training examples (a query with its passages), the unit the
        run's clock estimates an evaluation by."""
        if not self.val:
            return 0
        pairs = sum(int((row[: self.settings.top_k] >= 0).sum()) for row in self.ranked)
        return round(pairs * len(self.groups) / max(1, sum(len(g.passages) for g in self.groups)))

    def describe(self) -> str:
        s = self.settings
        mined = (f"{s.num_negatives} negatives per query mined by {s.negatives} (ranks {s.range_min}-{s.range_max})"
                 if s.negatives != "none" else "the training file's own negatives")
        loss = (f"binary cross-entropy (positives weighted {self.pos_weight:g})" if s.loss == "bce"
                else "a listwise softmax")
        return (f"A cross-encoder reranker: one relevance score of a (query, passage) pair, trained with {loss} on "
                f"{mined}. Loads as `sentence_transformers.CrossEncoder(folder)`.")

    def train_figures(self) -> dict:
        return {"train_queries": len(self.groups), "train_pairs": sum(len(g.passages) for g in self.groups),
                **self.mined}

    # ---- `bench --task rerank`: our step against sentence-transformers' CrossEncoder model with the same loss
    def bench_reference(self, folder: str, model_class: type, transformers, device):
        from sentence_transformers import CrossEncoder

        return CrossEncoder(folder, device=str(device)).model.train()

    def bench_step(self, theirs):
        return _ReferenceStep(theirs, self.settings.loss, self.pos_weight)


class _ReferenceStep(torch.nn.Module):
    """The run's loss around sentence-transformers' CrossEncoder's transformers model, as a model whose output has
    the loss: what the bench's reference trains.  BCE is its ``BinaryCrossEntropyLoss`` (the mean over the batch's
    pairs); the listwise loss, which it has not, is :func:`listwise_sum` over the batch's queries."""

    def __init__(self, model, loss: str, pos_weight: float):
        super().__init__()
        self.model, self.listwise, self.pos_weight = model, loss == "listwise", pos_weight

    def forward(self, **b):
        import types

        logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                            token_type_ids=b["token_type_ids"]).logits.view(-1)
        if self.listwise:
            queries = RerankLoss.counts(b)["examples"]
            loss = listwise_sum(logits, b["labels"].to(logits.dtype), b["group"], b["slot"]) / queries
        else:
            weight = logits.new_tensor(self.pos_weight)
            loss = F.binary_cross_entropy_with_logits(logits, b["labels"], pos_weight=weight)
        return types.SimpleNamespace(loss=loss)


# ------------------------------------------------------------------------------------------------ use
class RerankPipeline(Pipeline):
    task = "rerank"
    model_class = BertForSequenceClassification
    head = ("reranking head (classifier)", "fine-tune it with bertforge finetune rerank")

    def _check(self, config: BertConfig) -> None:
        if config.num_labels != 1:
            raise UserError(f"{self.dir} scores {config.num_labels} labels, not one relevance score: not a reranker")
        st = config.extra.get("sentence_transformers") or {}
        if not isinstance(st, dict):
            raise UserError(f"{self.dir}: config.json's sentence_transformers is {shown(st)}, not an object")
        # (as CrossEncoder reads it: before sentence-transformers v4 a folder named it at config.json's top level)
        fn = st.get("activation_fn") or config.extra.get("sbert_ce_default_activation_function") or SIGMOID
        if fn not in (SIGMOID, IDENTITY):
            raise UserError(f"{self.dir}: activation {shown(fn)} is neither {SIGMOID} nor {IDENTITY}")
        self.sigmoid = fn == SIGMOID  # (as CrossEncoder: a one-label model without one is read through a sigmoid)

    @checked(batch_size=1)
    def predict(self, pairs: list[tuple[str, str]] | list[list[str]]) -> np.ndarray:
        """(N,) scores of (query, passage) pairs, as ``CrossEncoder.predict`` gives them."""
        for i, p in enumerate(pairs):
            if not (isinstance(p, (tuple, list)) and len(p) == 2):
                raise UserError(f"pairs[{i}] must be a (query, passage) pair, not {shown(p)}")
            require_type(p[0], str, f"pairs[{i}][0]"), require_type(p[1], str, f"pairs[{i}][1]")
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        logits = pair_logits(self.model, self._truncating, self.sp.pad, self.device, self.batch_size,
                             [p[0] for p in pairs], [p[1] for p in pairs], self.task if self.progress else None)
        return torch.sigmoid(torch.from_numpy(logits)).numpy() if self.sigmoid else logits

    def __call__(self, query: str, passages: list[str], top_k: int | None = None) -> list[dict]:
        """``[{"corpus_id", "score", "text"}]`` of ``passages`` for ``query``, best first (``CrossEncoder.rank``)."""
        require_type(query, str, "query")
        if not query.strip():
            raise UserError("the query is empty")
        passages = [passages] if isinstance(passages, str) else list(passages)
        scores = self.predict([(query, p) for p in passages])
        order = np.argsort(-scores, kind="stable")[:top_k]
        return [{"corpus_id": int(i), "score": float(scores[i]), "text": passages[i]} for i in order]


@checked(batch_size=1, top_k=1)
def evaluate_rerank(model: str | os.PathLike, data: str | os.PathLike, first_stage: str = "bm25", top_k: int = 20,
                    batch_size: int = 64, device: str = "auto", max_seq_length: int | None = None) -> dict:
    """``bertforge evaluate rerank``: MRR@10, recall@1, recall@10 and nDCG@10 of ``first_stage``'s top ``top_k``
    reordered by the cross-encoder ``model``, and the first stage's own (``first_stage``), on ``data`` (a SQuAD
    JSON file, a BEIR folder, or a file of pairs)."""
    import time

    settings = given_settings(RerankConfig(), {"first_stage": os.fspath(first_stage), "top_k": top_k},
                              "evaluate_rerank's settings")
    t0 = time.perf_counter()
    pipe = RerankPipeline(model_dir(model), device, batch_size, max_seq_length=max_seq_length)
    rs = read_retrieval_data(os.fspath(data))
    ranked = first_stage_ranked(rs, settings.first_stage, first_stage_depth(settings.top_k), "--first-stage", device,
                                batch_size)
    first, reranked = rerank_figures(rs, ranked, lambda q, p: pipe.predict(list(zip(q, p))), settings.top_k)
    return {**reranked, "queries": len(rs.queries), "corpus": len(rs.corpus), "top_k": settings.top_k,
            "first_stage": {"model": settings.first_stage, **first}, "seconds": round(time.perf_counter() - t0, 3)}


__all__ = ["RerankConfig", "RerankPipeline", "RerankTask", "evaluate_rerank", "read_groups"]
