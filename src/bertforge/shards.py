"""A prepared corpus read (:mod:`bertforge.prepared` writes one): its shards' token, sentence and document arrays
as one corpus, memory-mapped where large, each shard checked against its record; and the held-out split of its
documents that every run of it shares."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zlib
from bisect import bisect_right

import numpy as np
from tokenizers import Tokenizer

from .corpus import is_prepared_folder
from .errors import UserError

VERSION = 1  # of a prepared folder's layout, in its manifest
ARRAYS = ("tokens.bin", "sent_ends.bin", "doc_ends.bin")  # each shard's, in its folder


class ShardedArray:
    """The shards' arrays read as one: shard ``k``'s values plus ``offsets[k]`` (its sentence or token start).
    Indexing by an integer or a slice (step 1) returns what the concatenated array would."""

    def __init__(self, parts: list[np.ndarray], offsets: list[int]):
        self.parts, self.offsets = parts, offsets
        self.starts = np.cumsum([0] + [len(p) for p in parts]).tolist()
        self.dtype = parts[0].dtype

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                raise IndexError("a sharded array is sliced with step 1 only")
            return self._range(start, max(start, stop))
        i = int(key) + (n if int(key) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"index {key} out of range for {n} values")
        k = bisect_right(self.starts, i) - 1
        return self.parts[k][i - self.starts[k]] + self.offsets[k]

    def _range(self, start: int, stop: int) -> np.ndarray:
        k = bisect_right(self.starts, start) - 1
        pieces = []
        while start < stop:
            end = min(stop, self.starts[k + 1])
            piece = self.parts[k][start - self.starts[k] : end - self.starts[k]]
            pieces.append(piece + self.offsets[k] if self.offsets[k] else piece)
            start, k = end, k + 1
        if not pieces:
            return self.parts[0][:0]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __array__(self, dtype=None, copy=None):
        whole = self._range(0, len(self))
        return np.asarray(whole, dtype=dtype) if dtype is not None else np.asarray(whole)


def _joined(parts: list[np.ndarray], offsets: list[int]):
    """One shard's array as it is (no offset), several as a :class:`ShardedArray`."""
    return parts[0] if len(parts) == 1 else ShardedArray(parts, offsets)


class TokenizedCorpus:
    """Token ids of a prepared corpus with sentence and document boundaries, memory-mapped from its shards.

    ``tokens[sent_starts[s]:sent_ends[s]]`` is sentence ``s``; document ``d`` is sentences
    ``doc_starts[d]:doc_ends[d]`` (all indices over the whole corpus, the shards in order).
    """

    def __init__(self, folder: str, manifest: dict | None = None):
        self.folder = folder
        if manifest is None:
            with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
                manifest = json.load(f)
        self.meta = m = manifest
        if m.get("version") != VERSION or m.get("dtype") not in ("uint16", "uint32") or not m.get("shards"):
            raise ValueError(f"manifest.json is not a version {VERSION} prepared corpus's")
        toks, sents, docs = [], [], []
        _allow_open_files(3 * len(m["shards"]))
        for s in m["shards"]:
            where = os.path.join(folder, "shards", s["name"])
            toks.append(_shard_array(os.path.join(where, "tokens.bin"), m["dtype"], s["tokens"]))
            sents.append(_shard_array(os.path.join(where, "sent_ends.bin"), np.int64, s["sentences"]))
            docs.append(_shard_array(os.path.join(where, "doc_ends.bin"), np.int64, s["documents"]))
        token_starts = np.cumsum([0] + [s["tokens"] for s in m["shards"]]).tolist()
        sentence_starts = np.cumsum([0] + [s["sentences"] for s in m["shards"]]).tolist()
        self._parts = (toks, sents, docs)
        self.tokens = _joined(toks, [0] * len(toks))
        self.sent_ends = _joined(sents, token_starts)
        self.doc_ends = _joined(docs, sentence_starts)

    def check(self) -> None:
        """Raise ValueError unless every shard is whole: each array of its size and checksum, its boundaries
        ending where its arrays do (a truncated file, garbage of the right size, a broken manifest)."""
        for s, tok, sent, doc in zip(self.meta["shards"], *self._parts):
            problem = _arrays_problem(os.path.join(self.folder, "shards", s["name"]), s, tok.itemsize)
            if problem:
                raise ValueError(f"shard {s['name']}: {problem}")
            if len(sent) and (sent[-1] != len(tok) or doc[-1] != len(sent)):
                raise ValueError(f"shard {s['name']}: the boundaries do not end with the arrays")
        if not self.n_documents or not self.n_tokens:
            raise ValueError("the prepared corpus holds no tokens")
        held = self.held_out()
        if held is not None and (held.ndim != 1 or not all(0 <= d < self.n_documents for d in held.tolist())):
            raise ValueError("the held-out documents are not documents of the corpus")

    @property
    def n_documents(self) -> int:
        return int(self.meta["documents"])

    @property
    def n_tokens(self) -> int:
        return int(self.meta["tokens"])

    def identity(self) -> dict:
        """What the corpus is, by content (the shards' checksums and counts), whatever its files are called."""
        counts = {"documents": self.n_documents, "tokens": self.n_tokens, "sentences": int(self.meta["sentences"])}
        blob = json.dumps({"crc32": [s["crc32"] for s in self.meta["shards"]], **counts}, sort_keys=True)
        return {"digest": hashlib.sha256(blob.encode()).hexdigest(), **counts}

    def held_out(self) -> np.ndarray | None:
        """The held-out documents the manifest records (None for a corpus of too few documents)."""
        held = self.meta.get("held_out", {}).get("documents")
        return None if held is None else np.asarray(held, dtype=np.int64)

    def doc_range(self, d: int) -> tuple[int, int]:
        """Sentence indices [s0, s1) of document d."""
        return (int(self.doc_ends[d - 1]) if d else 0), int(self.doc_ends[d])

    def sent_start(self, s: int) -> int:
        return int(self.sent_ends[s - 1]) if s else 0

    def doc_tokens(self, d: int) -> int:
        s0, s1 = self.doc_range(d)
        return int(self.sent_ends[s1 - 1]) - self.sent_start(s0)

    def document_text(self, d: int, tok: Tokenizer) -> str:
        s0, s1 = self.doc_range(d)
        return tok.decode(self.tokens[self.sent_start(s0) : int(self.sent_ends[s1 - 1])].tolist())


MAPPED_BYTES = 1 << 20  # a shard's array at least this large is memory-mapped; a smaller one is read


def _shard_array(path: str, dtype, n: int) -> np.ndarray:
    """One array of a shard: memory-mapped when large, read when small or empty (a map keeps a file descriptor open,
    so that a corpus of many small inputs would exceed the open-file limit; and an empty file cannot be mapped)."""
    if n * np.dtype(dtype).itemsize < MAPPED_BYTES:
        return np.fromfile(path, dtype=dtype, count=n)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def _allow_open_files(n: int) -> None:
    """Raise this process's soft limit of open files towards its hard one when ``n`` maps may need it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and n + 256 > soft:
        with contextlib.suppress(ValueError, OSError):
            want = n + 256 if hard == resource.RLIM_INFINITY else min(hard, n + 256)
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _crc32(path: str, chunk: int = 1 << 24) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _arrays_problem(folder: str, record: dict, width: int) -> str | None:
    """The first array of a shard whose size or checksum is not its record's, and how; None when all are whole."""
    sizes = (record["tokens"] * width, record["sentences"] * 8, record["documents"] * 8)  # the boundaries: int64
    for name, size in zip(ARRAYS, sizes):
        path = os.path.join(folder, name)
        if os.path.getsize(path) != size:
            return f"{name} holds {os.path.getsize(path)} bytes, not {size}"
        if _crc32(path) != record["crc32"][name]:
            return f"{name} does not match its checksum"
    return None



is_prepared = is_prepared_folder  # (one recognition, for every command that takes a corpus)


def open_prepared(folder: str) -> TokenizedCorpus:
    """A finished prepared folder, checked; a UserError saying what is wrong otherwise."""
    if not os.path.isfile(os.path.join(folder, "manifest.json")):
        raise UserError(f"{folder} is a prepared corpus that was not finished: run the same bertforge prepare "
                        "command again to finish it")
    try:
        corpus = TokenizedCorpus(folder)
        corpus.check()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # (a manifest of other shapes)
        raise UserError(f"the prepared corpus {folder} is damaged ({' '.join(str(e).split())[:200]}); prepare it "
                        "again") from None
    return corpus


def seed_int(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0])


def split_documents(corpus: TokenizedCorpus, seed: int, eval_fraction: float = 0.05,
                    max_eval_tokens: int = 1_000_000, need_train: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(train document ids, held-out document ids): documents drawn at random until the held-out part
    holds ``eval_fraction`` of the tokens (at most ``max_eval_tokens``), at least one document, and at
    least ``need_train`` documents stay for training."""
    n = corpus.n_documents
    if n < need_train + 1:
        raise UserError(
            f"the corpus has {n} document(s): holding some out for evaluation needs at least {need_train + 1}; "
            "give --eval-data, or split the text into documents (one file or JSONL line per document, "
            "or --doc-separator blank-line)"
        )
    order = np.random.default_rng(seed_int(seed, 7)).permutation(n)
    budget = min(eval_fraction * corpus.n_tokens, max_eval_tokens)
    held: list[int] = []
    tokens = 0
    for d in order[: n - need_train]:
        if held and tokens >= budget:
            break
        held.append(int(d))
        tokens += corpus.doc_tokens(int(d))
    held_arr = np.sort(np.asarray(held, dtype=np.int64))
    train = np.setdiff1d(np.arange(n, dtype=np.int64), held_arr)
    return train, held_arr
