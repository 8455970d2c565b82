"""From a tokenized corpus to BERT pretraining batches, as Google's ``create_pretraining_data.py`` builds them.

Pipeline: documents of sentences (:mod:`bertforge.corpus`) -> a prepared corpus (:mod:`bertforge.prepared`:
token ids with sentence and document boundaries in memory-mapped shards, made by ``bertforge prepare`` or in
the cache) -> instances (segment A, segment B, IsNext) drawn afresh each epoch -> masked batches.

Everything random is a pure function of ``(seed, epoch, index)``: the instances of an epoch, their order,
and each instance's masks.  So a loader restored to any position continues with exactly the batches an
uninterrupted one would have produced, and N ranks together see exactly the batches of one process.

Departures from Google's ``create_pretraining_data.py`` (the model's are listed in :mod:`bertforge.models.bert`):

* The short-sequence target (probability ``short_seq_prob``) is drawn for every instance; Google draws it
  once per document, so that one book in ten yields only short sequences.
* IsNext stays at 50%: when the chunk for segment A holds a single sentence and IsNext was drawn, the
  document's next sentence becomes segment B (Google forces NotNext there, which skews the labels).  Only
  at the very end of a document does a one-sentence chunk fall back to NotNext.
* Masks (and instances) are drawn afresh every epoch (dynamic masking, as RoBERTa), instead of
  ``dupe_factor`` static copies.
* A "random token" replacement is drawn from the non-special tokens (Google draws from the whole
  vocabulary, [CLS] and [PAD] included).
* Sentences longer than 256 tokens are cut into pieces of 256 tokens when the corpus is prepared.
* When no evaluation text is given, the held-out documents are those the prepared corpus records (drawn by a
  fixed rule), the same for every run and seed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from .atomic import path_shown, writing
from .batching import pad_batch
from .config import progress_shown
from .corpus import input_signature
from .devices import Dist
from .errors import UserError
from .prepared import Reading, prepare_corpus, tokenizer_fingerprint
from .shards import VERSION as PREPARED_VERSION
from .shards import TokenizedCorpus, is_prepared, open_prepared, split_documents
from .shards import seed_int as _seed_int
from .tokenizer import SpecialIds, special_ids, vocab_tokens

log = logging.getLogger("bertforge")


def cut_into_documents(corpus: TokenizedCorpus, parts: int) -> TokenizedCorpus:
    """The corpus with its sentences regrouped into about ``parts`` documents of equal sentence counts, the
    original document boundaries kept (for a corpus of a few long texts, e.g. a single .txt file)."""
    n = len(corpus.sent_ends)
    cuts = np.linspace(0, n, parts + 1).round().astype(np.int64)[1:]
    ends = np.union1d(cuts, np.asarray(corpus.doc_ends, dtype=np.int64))
    ends = ends[ends > 0]
    cut = copy.copy(corpus)
    cut.doc_ends, cut.meta = ends, {**corpus.meta, "documents": int(len(ends)), "held_out": {}}
    return cut


def default_cache_dir() -> str:
    return os.environ.get("BERTFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bertforge")


# ------------------------------------------------------------------------------------------------ cache
def cache_key(paths: list[str], tok: Tokenizer, reading: Reading) -> str:
    blob = json.dumps({"version": PREPARED_VERSION, "inputs": input_signature(paths),
                       "tokenizer": tokenizer_fingerprint(tok), "reading": asdict(reading)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def build_corpus(paths: list[str], tok: Tokenizer, cache_dir: str | None = None, text_field: str = "text",
                 doc_separator: str = "file", progress: bool = False, workers: int | None = None) -> TokenizedCorpus:
    """The corpus of ``paths`` as token shards: a folder ``bertforge prepare`` wrote (prepared with ``tok``),
    else prepared once into the cache (:mod:`bertforge.prepared`, keyed by the inputs, the tokenizer and the
    reader settings) and reused.  Any number of processes may ask at once: one prepares, the others wait for
    it on a lock file (no collective, so no process group's timeout), then read what it wrote.  A damaged
    entry of the cache is moved aside and prepared again."""
    if any(is_prepared(p) for p in paths):
        return _given_prepared(paths, tok)
    cache_dir = cache_dir or default_cache_dir()
    reading = Reading(text_field, doc_separator)
    folder = os.path.join(cache_dir, "corpus-" + cache_key(paths, tok, reading))
    corpus = _open_cached(folder)
    if corpus is not None:
        log.info("tokenized corpus from cache %s", folder)
        return corpus
    if os.path.lexists(cache_dir) and not os.path.isdir(cache_dir):
        raise UserError(f"the tokenized-corpus cache {path_shown(cache_dir)} is not a folder; "
                        "choose another with --cache-dir or BERTFORGE_CACHE")
    with _cache_writes(cache_dir):
        return prepare_corpus(paths, tok, folder, reading, workers, progress,
                              wait_message="waiting for another process tokenizing into %s",
                              flag="the tokenized-corpus cache entry")


def _given_prepared(paths: list[str], tok: Tokenizer) -> TokenizedCorpus:
    if len(paths) > 1:
        raise UserError(f"a prepared corpus is given alone: {', '.join(paths)} mixes one with other data; prepare "
                        "them together (bertforge prepare --data ...)")
    corpus = open_prepared(paths[0])
    if corpus.meta["tokenizer"] != tokenizer_fingerprint(tok):
        raise UserError(f"{paths[0]} was prepared with another tokenizer than this run's; leave --tokenizer out "
                        "(a prepared corpus brings its own), or prepare the corpus again with this one")
    log.info("prepared corpus %s", paths[0])
    return corpus


def _open_cached(folder: str) -> TokenizedCorpus | None:
    """The cache entry ``folder`` when it is finished and whole; None when it is missing or unfinished (to be
    prepared, or finished, under its lock); a damaged one is moved aside with a warning, to be prepared again."""
    if not os.path.isfile(os.path.join(folder, "manifest.json")):
        return None
    try:
        corpus = TokenizedCorpus(folder)
        corpus.check()
        return corpus
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # whatever a damaged entry raises
        problem = " ".join(str(e).split())[:200]
    cache_dir, name = os.path.split(folder)
    for entry in os.listdir(cache_dir):  # one damaged copy kept, the newest: each is the corpus's size
        if entry.startswith(f".{name}.damaged-"):
            shutil.rmtree(os.path.join(cache_dir, entry), ignore_errors=True)
    with _cache_writes(cache_dir, creating=True):
        aside = tempfile.mkdtemp(prefix=f".{name}.damaged-", dir=cache_dir)
        os.rmdir(aside)
        with contextlib.suppress(FileNotFoundError):  # (moved aside by another process meanwhile)
            os.rename(folder, aside)
    log.warning("the tokenized corpus in %s is damaged (%s): moved aside to %s, tokenizing again", folder, problem,
                aside)
    return None


CACHE_HINT = "choose another with --cache-dir or BERTFORGE_CACHE"


def _cache_writes(cache_dir: str, creating: bool = False, what: str = "the tokenized-corpus cache"):
    """A cache that cannot be written (a full disk, no permission...) is one error naming it and the way to choose
    another (:func:`~bertforge.atomic.writing`)."""
    return writing(cache_dir, what, CACHE_HINT, creating)


# ------------------------------------------------------------------------------------------------ instances
@dataclass
class MaskingConfig:
    max_seq_length: int = 128
    mask_prob: float = 0.15
    short_seq_prob: float = 0.1
    nsp: bool = True
    whole_word_mask: bool = False


PLAN_CHUNK = 1 << 16  # instances gathered in a list before they join the plan as one int64 block


def instance_chunks(
    corpus: TokenizedCorpus,
    doc_ids: np.ndarray,
    random_pool: np.ndarray,
    cfg: MaskingConfig,
    seed: int,
) -> Iterator[np.ndarray]:
    """Instances of one pass over ``doc_ids``, in blocks of int64 rows ``(a0, a1, b0, b1, is_random_next)``.

    A and B are token ranges ``[a0, a1)`` and ``[b0, b1)`` of ``corpus.tokens`` (B empty without NSP);
    NotNext segments B come from a document of ``random_pool`` other than the instance's own.  One random
    stream, seeded by ``seed``, is drawn from in document order, so the blocks' size does not change them.
    """
    rng = random.Random(seed)
    max_num = cfg.max_seq_length - (3 if cfg.nsp else 2)
    if max_num < 2:
        raise UserError(f"max_seq_length {cfg.max_seq_length} is too short")
    pool = np.asarray(random_pool, dtype=np.int64)
    out: list[tuple[int, int, int, int, int]] = []
    for d in doc_ids:
        _document_instances(corpus, int(d), pool, cfg, max_num, rng, out)
        if len(out) >= PLAN_CHUNK:
            yield np.asarray(out, dtype=np.int64)
            out = []
    if out:
        yield np.asarray(out, dtype=np.int64)


def create_instances(corpus: TokenizedCorpus, doc_ids: np.ndarray, random_pool: np.ndarray, cfg: MaskingConfig,
                     seed: int) -> np.ndarray:
    """The instances of :func:`instance_chunks` as one (N, 5) array in memory."""
    return _stacked(instance_chunks(corpus, doc_ids, random_pool, cfg, seed))


def _stacked(chunks: Iterator[np.ndarray]) -> np.ndarray:
    chunks = list(chunks)
    return np.concatenate(chunks) if chunks else np.zeros((0, 5), dtype=np.int64)


def plan_on_disk(chunks: Iterator[np.ndarray], folder: str, order_seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(instances, order) of an epoch as arrays memory-mapped from two nameless files in ``folder``: the
    instances written block by block as they are drawn, the order shuffled in place on its file, the same
    values as :func:`create_instances` and ``default_rng(order_seed).permutation`` give (None: in order).
    The files have no name from the start, so nothing is left behind, even by a killed run; their disk
    space is freed when the arrays are."""
    with _cache_writes(folder, what="the epoch's instance plan in"):
        with tempfile.TemporaryFile(dir=folder, prefix="plan-") as f:
            n = 0
            for block in chunks:
                f.write(block.tobytes())
                n += len(block)
            f.flush()
            if n == 0:
                return np.zeros((0, 5), dtype=np.int64), np.zeros(0, dtype=np.int64)
            inst = np.memmap(f, dtype=np.int64, mode="r", shape=(n, 5))
        with tempfile.TemporaryFile(dir=folder, prefix="order-") as f:
            for i in range(0, n, PLAN_CHUNK):  # written, not mapped, so that a full disk is an error, not SIGBUS
                f.write(np.arange(i, min(n, i + PLAN_CHUNK), dtype=np.int64).tobytes())
            f.flush()
            order = np.memmap(f, dtype=np.int64, mode="r+", shape=(n,))
    if order_seed is not None:
        np.random.default_rng(order_seed).shuffle(order)  # the very permutation() of the same generator
    return inst, order


def _document_instances(corpus: TokenizedCorpus, d: int, pool: np.ndarray, cfg: MaskingConfig, max_num: int,
                        rng: random.Random, out: list) -> None:
    """Append document ``d``'s instances to ``out``: its sentences gathered into chunks of a target length
    (``max_num`` tokens, or with ``short_seq_prob`` a shorter one), each chunk one instance."""
    s0, s1 = corpus.doc_range(d)
    bounds = [corpus.sent_start(s0)] + [int(x) for x in corpus.sent_ends[s0:s1]]  # token boundaries of the sentences
    nsent = s1 - s0

    def target() -> int:
        return rng.randint(2, max_num) if rng.random() < cfg.short_seq_prob else max_num

    tgt = target()
    chunk_start = 0  # local sentence index where the current chunk starts
    i = 0
    while i < nsent:
        cur_len = bounds[i + 1] - bounds[chunk_start]
        if i == nsent - 1 or cur_len >= tgt:
            nchunk = i - chunk_start + 1
            if not cfg.nsp:
                a0, a1 = bounds[chunk_start], bounds[i + 1]
                out.append((a0, min(a1, a0 + max_num), 0, 0, 0))
            else:
                a_end = 1 if nchunk == 1 else rng.randint(1, nchunk - 1)  # sentences in A
                is_random = rng.random() < 0.5
                if not is_random and nchunk == 1:
                    if i + 1 < nsent:  # keep IsNext: the next sentence becomes B
                        i += 1
                        nchunk = 2
                    else:
                        is_random = True
                a0, a1 = bounds[chunk_start], bounds[chunk_start + a_end]
                if is_random:
                    b0, b1 = _random_segment(corpus, d, pool, max(1, tgt - (a1 - a0)), rng)
                    i -= nchunk - a_end  # the unused sentences start the next chunk
                else:
                    b0, b1 = a1, bounds[i + 1]
                a0, a1, b0, b1 = _truncate_pair(a0, a1, b0, b1, max_num, rng)
                out.append((a0, a1, b0, b1, int(is_random)))
            chunk_start = i + 1
            tgt = target()
        i += 1


def _random_segment(corpus: TokenizedCorpus, d: int, pool: np.ndarray, target_b: int,
                    rng: random.Random) -> tuple[int, int]:
    """Segment B of a NotNext instance of document ``d``: from a random sentence of another document of
    ``pool`` (the only one when the pool holds one), sentences until ``target_b`` tokens or the document's end."""
    rd = d
    if len(pool) > 1:
        while rd == d:
            rd = int(pool[rng.randrange(len(pool))])
    else:
        rd = int(pool[0])
    r0, r1 = corpus.doc_range(rd)
    j = rng.randrange(r0, r1)
    b0 = corpus.sent_start(j)
    b1 = int(corpus.sent_ends[j])
    while b1 - b0 < target_b and j + 1 < r1:
        j += 1
        b1 = int(corpus.sent_ends[j])
    return b0, b1


def _truncate_pair(a0: int, a1: int, b0: int, b1: int, max_num: int,
                   rng: random.Random) -> tuple[int, int, int, int]:
    """Truncate the longer segment, one token at a time from its front or back at random, until both fit."""
    while (a1 - a0) + (b1 - b0) > max_num:
        if a1 - a0 > b1 - b0:
            if rng.random() < 0.5:
                a0 += 1
            else:
                a1 -= 1
        elif rng.random() < 0.5:
            b0 += 1
        else:
            b1 -= 1
    return a0, a1, b0, b1


# ------------------------------------------------------------------------------------------------ masking
def continuation_pieces(vocab: list[str]) -> np.ndarray:
    """Which tokens continue a word (``--whole-word-mask``): WordPiece's ``##`` pieces; in a vocabulary that marks
    word starts instead (byte-level BPE's ``Ġ``, SentencePiece's ``▁``: RoBERTa's and others'), every token
    without the mark.  The marking most of the vocabulary uses decides (a BPE vocabulary holds a few ``##``
    tokens of its own: hashtags, markdown)."""
    starts = ("\u0120", "\u2581")  # Ġ, ▁
    pieces = sum(t.startswith("##") for t in vocab)
    if pieces >= sum(t.startswith(starts) for t in vocab):
        return np.asarray([t.startswith("##") for t in vocab], dtype=bool)  # (none: a word-level vocabulary)
    return np.asarray([bool(t) and not t.startswith(starts) for t in vocab], dtype=bool)


class Masker:
    """Builds ``[CLS] A [SEP] B [SEP]`` and masks it: ``mask_prob`` of the tokens (rounded per sequence, as
    Google), never [CLS] or [SEP]; of those 80% [MASK], 10% a random non-special token, 10% unchanged."""

    def __init__(self, tok: Tokenizer, cfg: MaskingConfig):
        self.cfg = cfg
        self.sp: SpecialIds = special_ids(tok)
        vocab = vocab_tokens(tok)
        self.vocab_size = len(vocab)
        specials = self.sp.as_set()
        self.replace_pool = np.asarray([i for i in range(len(vocab)) if i not in specials], dtype=np.int64)
        self.is_continuation = continuation_pieces(vocab)
        self.max_predictions = max(1, math.ceil(cfg.max_seq_length * cfg.mask_prob))

    def sequence(self, tokens: np.ndarray, inst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input ids, token type ids) of one instance, before masking."""
        a0, a1, b0, b1, _ = (int(x) for x in inst)
        a = np.asarray(tokens[a0:a1], dtype=np.int64)
        if b1 > b0 or self.cfg.nsp:
            b = np.asarray(tokens[b0:b1], dtype=np.int64)
            ids = np.concatenate([[self.sp.cls], a, [self.sp.sep], b, [self.sp.sep]])
            tt = np.zeros(len(ids), dtype=np.int64)
            tt[len(a) + 2 :] = 1
        else:
            ids = np.concatenate([[self.sp.cls], a, [self.sp.sep]])
            tt = np.zeros(len(ids), dtype=np.int64)
        return ids, tt

    def mask(self, ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(masked input ids, labels with -100 where nothing is predicted)."""
        ids = ids.copy()
        labels = np.full(len(ids), -100, dtype=np.int64)
        cand = np.flatnonzero((ids != self.sp.cls) & (ids != self.sp.sep) & (ids != self.sp.pad))
        if len(cand) == 0:
            return ids, labels
        n = min(self.max_predictions, max(1, int(round(len(cand) * self.cfg.mask_prob))))
        if self.cfg.whole_word_mask:
            # a word = a token and the ## continuations that follow it
            starts = ~self.is_continuation[ids[cand]] | (np.diff(cand, prepend=-2) != 1)
            words = np.split(cand, np.flatnonzero(starts)[1:])
            chosen: list[int] = []
            for w in rng.permutation(len(words)):
                if len(chosen) >= n:
                    break
                if len(chosen) + len(words[w]) > n:
                    continue
                chosen.extend(words[w].tolist())
            pos = np.sort(np.asarray(chosen, dtype=np.int64))
        else:
            pos = np.sort(rng.choice(cand, size=n, replace=False))
        labels[pos] = ids[pos]
        r = rng.random(len(pos))
        ids[pos[r < 0.8]] = self.sp.mask
        rand_pos = pos[r >= 0.9]
        ids[rand_pos] = self.replace_pool[rng.integers(0, len(self.replace_pool), size=len(rand_pos))]
        return ids, labels


def collate(seqs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], nsp_labels: np.ndarray | None, pad_id: int) -> dict:
    """Pad (ids, token types, labels) triples to the longest in the batch (:func:`~bertforge.batching.pad_batch`,
    the labels with -100); tensors ready for the model."""
    batch = pad_batch([{"input_ids": x, "token_type_ids": t} for x, t, _ in seqs], pad_id)
    lab = np.full(tuple(batch["input_ids"].shape), -100, dtype=np.int64)
    for i, (x, _, lbl) in enumerate(seqs):
        lab[i, : len(x)] = lbl
    batch["labels"] = torch.from_numpy(lab)
    if nsp_labels is not None:
        batch["next_sentence_label"] = torch.from_numpy(np.asarray(nsp_labels, dtype=np.int64))
    return batch


# ------------------------------------------------------------------------------------------------ loader
class PretrainingLoader:
    """Global batches of ``batch_size`` instances, epoch after epoch, reproducible and resumable.

    ``position`` = (epoch, step) is the whole state.  With ``world`` ranks, rank r builds rows
    ``[r*B/world, (r+1)*B/world)`` of each global batch, so the ranks together see exactly the batches of
    one process.  A partial last batch of an epoch is dropped.
    """

    def __init__(self, corpus: TokenizedCorpus, doc_ids: np.ndarray, masker: Masker, batch_size: int, seed: int,
                 rank: int = 0, world: int = 1, random_pool: np.ndarray | None = None, shuffle: bool = True,
                 plan_dir: str | None = None):
        if batch_size % world:
            raise UserError(f"batch size {batch_size} is not divisible by the number of processes {world}")
        self.corpus, self.doc_ids, self.masker = corpus, np.asarray(doc_ids), masker
        self.random_pool = self.doc_ids if random_pool is None else np.asarray(random_pool)
        self.batch_size, self.seed, self.rank, self.world, self.shuffle = batch_size, seed, rank, world, shuffle
        self.plan_dir = plan_dir  # None: each epoch's plan in memory (a small corpus, the evaluation set)
        self.epoch, self.step = 0, 0
        self._cached: tuple[int, np.ndarray, np.ndarray] | None = None

    # -- one epoch
    def _chunks(self, epoch: int) -> Iterator[np.ndarray]:
        return instance_chunks(self.corpus, self.doc_ids, self.random_pool, self.masker.cfg,
                               _seed_int(self.seed, 1, epoch))

    def instances(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(instances, order) of an epoch; computed once per epoch, held on disk with ``plan_dir``, so that
        the memory it takes does not grow with the corpus."""
        if self._cached is None or self._cached[0] != epoch:
            self._cached = None  # the last epoch's plan freed before the next is drawn
            order_seed = _seed_int(self.seed, 2, epoch) if self.shuffle else None
            if self.plan_dir is not None:
                inst, order = plan_on_disk(self._chunks(epoch), self.plan_dir, order_seed)
            else:
                inst = _stacked(self._chunks(epoch))
                order = (np.random.default_rng(order_seed).permutation(len(inst)) if order_seed is not None
                         else np.arange(len(inst)))
            self._cached = (epoch, inst, order)
        return self._cached[1], self._cached[2]

    def steps_in_epoch(self, epoch: int) -> int:
        return len(self.instances(epoch)[0]) // self.batch_size

    def steps_in_epochs(self, epochs: int) -> int:
        """The global batches of the first ``epochs`` epochs (``--epochs``): each epoch draws its instances
        afresh, so their number varies a little; the epochs after the first are drawn to be counted only."""
        later = (sum(len(c) for c in self._chunks(e)) // self.batch_size for e in range(1, epochs))
        return self.steps_in_epoch(0) + sum(later)

    def build(self, epoch: int, indices: np.ndarray) -> dict:
        """The masked batch of the given instance indices of an epoch."""
        inst, _ = self.instances(epoch)
        seqs = []
        for k in indices:
            ids, tt = self.masker.sequence(self.corpus.tokens, inst[k])
            masked, labels = self.masker.mask(ids, np.random.default_rng([self.seed & 0xFFFFFFFF, 3, epoch, int(k)]))
            seqs.append((masked, tt, labels))
        nsp = inst[indices, 4] if self.masker.cfg.nsp else None
        batch = collate(seqs, nsp, self.masker.sp.pad)
        batch["sequence_ids"] = torch.as_tensor(np.asarray(indices, dtype=np.int64))  # keys of keyed dropout
        return batch

    def global_rows(self, epoch: int, step: int) -> np.ndarray:
        _, order = self.instances(epoch)
        return order[step * self.batch_size : (step + 1) * self.batch_size]

    def rank_rows(self, epoch: int, step: int) -> np.ndarray:
        rows = self.global_rows(epoch, step)
        per = self.batch_size // self.world
        return rows[self.rank * per : (self.rank + 1) * per]

    # -- iteration with state
    def next_rows(self) -> tuple[int, np.ndarray]:
        """(epoch, this rank's instance indices) of the next global batch; advances the position."""
        if self.steps_in_epoch(self.epoch) == 0:
            raise UserError(
                f"the training data yields {len(self.instances(self.epoch)[0])} instances per epoch, "
                f"fewer than one batch of {self.batch_size}; lower --batch-size or add data"
            )
        if self.step >= self.steps_in_epoch(self.epoch):
            self.epoch, self.step = self.epoch + 1, 0
        rows = self.rank_rows(self.epoch, self.step)
        epoch = self.epoch
        self.step += 1
        return epoch, rows

    def next_batch(self) -> dict:
        epoch, rows = self.next_rows()
        return self.build(epoch, rows)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed or state.get("batch_size", self.batch_size) != self.batch_size:
            raise UserError("the checkpoint's data seed or batch size differs from this run's; "
                            "resume with the same settings")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])


def eval_batches(corpus: TokenizedCorpus, doc_ids: np.ndarray, masker: Masker, batch_size: int, seed: int,
                 max_instances: int = 2048) -> list[dict]:
    """A fixed evaluation set: instances and masks from the held-out documents, the same every time.  Every
    segment is held-out text, NotNext's too: with one document held out, a random sentence of its own."""
    loader = PretrainingLoader(corpus, doc_ids, masker, 1, seed + 1_000_003)
    inst, order = loader.instances(0)
    idx = order[:max_instances]
    return [loader.build(0, idx[i : i + batch_size]) for i in range(0, len(idx), batch_size)]


# ------------------------------------------------------------------------------------------------ a run's data
CUT_PARTS = 20  # the documents a corpus of too few is cut into


class PretrainingData:
    """The tokenized corpus, its held-out documents, the masker and the training batches of this process."""

    def __init__(self, cfg, tok, d: Dist, resume: bool):
        dc, t, self.cfg, self.d = cfg.data, cfg.train, cfg, d
        self.masker = Masker(tok, MaskingConfig(dc.max_seq_length, dc.mask_prob, dc.short_seq_prob, dc.nsp,
                                                dc.whole_word_mask))
        self.corpus = self._corpus(dc.data, tok)
        need = (2 if dc.nsp else 1) + (0 if dc.eval_data else 1)  # training documents, and one to hold out
        # too few documents to train on, or to hold out about 5% of the text by whole documents (a folder of three
        # books held out one whole book, the manifest's rule): cut into parts, as a single file is
        if self.corpus.n_documents < need or (not dc.eval_data and self._few_documents()):
            self.corpus = self._cut(self.corpus, need)
        if dc.eval_data:
            self.eval_corpus = self._corpus(dc.eval_data, tok)
            n_sent = len(self.eval_corpus.sent_ends)
            if dc.nsp and self.eval_corpus.n_documents < 2 and n_sent >= 2:
                # a single held-out text is cut into parts as training's is: NotNext segments from other text
                self.eval_corpus = cut_into_documents(self.eval_corpus, min(CUT_PARTS, n_sent))
            self.train_docs = np.arange(self.corpus.n_documents)
            self.eval_docs = np.arange(self.eval_corpus.n_documents)
        else:  # the manifest's held-out documents, the same for every run of the corpus; a cut corpus its own
            self.eval_corpus = self.corpus
            held = self.corpus.held_out()
            if held is None:
                self.train_docs, self.eval_docs = split_documents(self.corpus, t.seed, need_train=2 if dc.nsp else 1)
            else:
                self.train_docs = np.setdiff1d(np.arange(self.corpus.n_documents, dtype=np.int64), held)
                self.eval_docs = held
        plan_dir = dc.cache_dir or default_cache_dir()  # each epoch's instance plan, off the heap
        with _cache_writes(plan_dir, creating=True, what="the epoch's instance plan in"):
            os.makedirs(plan_dir, exist_ok=True)
        self.loader = PretrainingLoader(self.corpus, self.train_docs, self.masker, t.batch_size, t.seed, d.rank,
                                        d.world, plan_dir=plan_dir)
        self.micro = t.batch_size // d.world // t.grad_accum
        if self.micro < 1:
            raise UserError(f"--batch-size {t.batch_size} is smaller than processes x --grad-accum")
        n_instances = len(self.loader.instances(0)[0]) if not resume else t.batch_size
        if n_instances < t.batch_size:  # before anything is written
            raise UserError(f"the training data yields {n_instances} instances per epoch, fewer than one batch of "
                            f"{t.batch_size}; lower --batch-size or add data")

    def _few_documents(self) -> bool:
        """Whether the held-out documents would hold far more than 5% of the text: fewer than ``CUT_PARTS``
        documents, and the manifest's held-out ones over twice that share (or none recorded)."""
        c = self.corpus
        if c.n_documents >= CUT_PARTS:
            return False
        held = c.held_out()
        return held is None or sum(c.doc_tokens(int(d)) for d in held) > 0.1 * c.n_tokens

    def _corpus(self, paths: list[str], tok) -> TokenizedCorpus:
        """Every rank asks; one process per shared cache prepares, the others wait (:func:`build_corpus`)."""
        dc = self.cfg.data
        return build_corpus(paths, tok, dc.cache_dir, dc.text_field, dc.doc_separator,
                            progress=self.d.is_main and progress_shown(self.cfg.impl.progress))

    def _cut(self, corpus: TokenizedCorpus, need: int) -> TokenizedCorpus:
        """A corpus of fewer documents than the run needs (a single text file): cut at sentence boundaries."""
        dc, n_sent = self.cfg.data, len(corpus.sent_ends)
        parts = min(CUT_PARTS, n_sent)
        if parts < need:
            raise UserError(
                f"the corpus holds {corpus.n_documents} document(s) of {n_sent} sentence(s) in all; this run needs at "
                f"least {need} documents or sentences ({'2 for next sentence prediction' if dc.nsp else '1'} "
                f"to train on{', 1 to hold out for evaluation' if not dc.eval_data else ''}): add text, "
                "give --eval-data, or pass --no-nsp")
        cut = cut_into_documents(corpus, parts)
        log.warning("the corpus holds %d document(s): cut into %d parts of about %d sentences at sentence boundaries "
                    "(NotNext segments come from other parts of the same text)%s", corpus.n_documents,
                    cut.n_documents, n_sent // cut.n_documents,
                    "" if dc.eval_data else "; the held-out evaluation text is drawn from these parts")
        return cut

    def eval_set(self) -> list[dict]:
        dc, t = self.cfg.data, self.cfg.train
        return eval_batches(self.eval_corpus, self.eval_docs, self.masker, max(self.micro, 32), t.seed,
                            dc.max_eval_instances)

    def most_frequent_token(self, sample: int = 20_000_000) -> int:
        """The accuracy of always predicting it is the baseline that evaluation reports."""
        counts = np.bincount(np.asarray(self.corpus.tokens[:sample], dtype=np.int64))
        for t in self.masker.sp.as_set():
            if t < len(counts):
                counts[t] = 0
        return int(counts.argmax())
