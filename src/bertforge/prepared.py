"""A prepared corpus: the token ids of a pretraining corpus, in shards that every run and every rank reuses.

    bertforge prepare --data PATH... --tokenizer DIR --out DIR [--workers N] [--dedup]

The inputs are cut into parts (a plain JSONL or line-per-document file at line boundaries, into parts of a
64th of the corpus, from ``MIN_PART_BYTES`` to ``PART_BYTES``; any other input whole; consecutive inputs smaller
than a part together, so that a corpus of many small files makes few shards), and worker processes read, split
into sentences and tokenize the parts, each into one shard.  A folder that pretraining reads
(``pretrain --data DIR``) and the implicit cache of raw inputs (a prepared folder under the cache directory)
are the same thing:

    DIR/manifest.json            what was prepared, from what, how; written last (a folder without it is unfinished)
    DIR/tokenizer.json, vocab.txt, ...   the tokenizer
    DIR/shards/NNNNN/record.json the shard's part of its input and its counts and checksums; a shard is finished
                                 when its folder exists (it is written aside and renamed into place)
                     tokens.bin      token ids (uint16 or uint32)
                     sent_ends.bin   int64 sentence ends, in tokens from the shard's start
                     doc_ends.bin    int64 document ends, in sentences from the shard's start
                     doc_hashes.bin, para_hashes.bin   uint64 hashes of each document and paragraph (duplicates)

Read in order, the shards hold exactly the arrays a single pass over the inputs would write (sentences longer
than ``MAX_SENTENCE_TOKENS`` cut into pieces, documents without tokens left out).  A killed ``prepare`` keeps
its finished shards and does only the others when run again; a shard whose input changed (size, modification
time, inode or change time) is prepared again.  ``--dedup`` drops exact duplicates (after spaces are collapsed):
a document met before, then a paragraph met before; the manifest counts them either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass

import numpy as np
from tokenizers import Tokenizer

from . import logs
from .atomic import atomic_write_json, current_umask, fault_point, remove_path, write_failure
from .corpus import END, expand_paths, input_signature, line_based, read_part, sentences_of
from .errors import TrainingError, UserError
from .files import json_object_or_none
from .outputs import MARKER, Output, register_output, write_marker
from .tokenizer import copy_of
from .children import child_pids, stop_children
from .shards import ARRAYS, VERSION, TokenizedCorpus, _arrays_problem, is_prepared, open_prepared, split_documents

log = logging.getLogger("bertforge")

KIND = "prepared"
MAX_SENTENCE_TOKENS = 256
PART_BYTES = 64 << 20
MIN_PART_BYTES = 1 << 20
BATCH_SENTENCES = 8192
HASHES = ("doc_hashes.bin", "para_hashes.bin")
HELD_OUT_RULE = ("documents in the order of numpy.random.default_rng(SeedSequence([0, 7])).permutation(documents) "
                 "until they hold 5% of the tokens (at most 1,000,000), at least one, two left for training")
register_output(KIND, {"manifest.json", "settings.json", "shards", "tokenizer.json", "vocab.txt",
                       "tokenizer_config.json", "special_tokens_map.json"})


@dataclass(frozen=True)
class Reading:
    """How the inputs are read and cut (recorded: a prepared folder is reused only under the same settings)."""

    text_field: str = "text"
    doc_separator: str = "file"
    max_sentence_tokens: int = MAX_SENTENCE_TOKENS
    dedup: bool = False


def tokenizer_fingerprint(tok: Tokenizer) -> str:
    """What decides the token ids (padding and truncation settings aside: the saved copy has none)."""
    return hashlib.sha256(copy_of(tok).to_str().encode()).hexdigest()


# ------------------------------------------------------------------------------------------------ the parts
def plan_parts(files: list[str], reading: Reading, part_bytes: int | None = None) -> list[dict]:
    """The parts the inputs are cut into, in order: ``{"input", "start", "end"}`` byte ranges (``end`` None: the
    whole input).  A line-based plain file is cut after the first line break (for the blank-line format, the
    first blank line) at or beyond every ``part_bytes``: a document never spans two parts.  The plan depends on
    the inputs alone (not on the workers), so that a preparation continued with other settings reuses shards."""
    if part_bytes is None:  # a few dozen parts keep any number of workers busy to the end; at most PART_BYTES
        total = sum(os.path.getsize(f) for f in files if line_based(f, reading.doc_separator))
        part_bytes = min(PART_BYTES, max(MIN_PART_BYTES, total // 64))
    parts = []
    for i, path in enumerate(files):
        if not line_based(path, reading.doc_separator):
            parts.append({"input": i, "start": 0, "end": None})
            continue
        size = os.path.getsize(path)
        if size == 0:  # reading it says it is empty
            parts.append({"input": i, "start": 0, "end": None})
            continue
        cuts = [0]
        with open(path, "rb") as f:
            while cuts[-1] + part_bytes < size:
                cut = _boundary(f, cuts[-1] + part_bytes, reading.doc_separator == "blank-line")
                if cut >= size:
                    break
                cuts.append(cut)
        cuts.append(size)
        parts += [{"input": i, "start": a, "end": b} for a, b in zip(cuts, cuts[1:]) if b > a]
    return _grouped(parts, files, part_bytes)


def _grouped(parts: list[dict], files: list[str], part_bytes: int) -> list[dict]:
    """``parts`` with each run of consecutive whole inputs smaller than ``part_bytes`` joined into parts of up
    to about ``part_bytes``: ``{"input": first, "start": 0, "end": None, "through": last}`` (one input alone
    stays a part of its own)."""
    def whole_size(part: dict) -> int | None:
        path = files[part["input"]]
        if path.startswith("hf:") or part["start"] != 0:
            return None
        size = os.path.getsize(path)
        return size if (part["end"] is None or part["end"] == size) and size < part_bytes else None

    found, run, run_bytes = [], [], 0

    def close() -> None:
        if len(run) > 1:
            found.append({"input": run[0]["input"], "start": 0, "end": None, "through": run[-1]["input"]})
        else:
            found.extend(run)

    for part in parts:
        size = whole_size(part)
        if size is None or (run and run_bytes + size > part_bytes):
            close()
            run, run_bytes = [], 0
        if size is None:
            found.append(part)
            continue
        run.append(part)
        run_bytes += size
    close()
    return found


def segments(part: dict, files: list[str]) -> list[tuple[str, dict]]:
    """(path, byte range) of each input a part reads, in order."""
    if "through" not in part:
        return [(files[part["input"]], part)]
    return [(files[i], {"input": i, "start": 0, "end": None}) for i in range(part["input"], part["through"] + 1)]


_BLANK_LINE = re.compile(rb"\n[ \t]*\r?\n")  # a blank line, as the blank-line format reads one


def _boundary(f, at: int, blank_line: bool) -> int:
    """The first offset at or after ``at`` that follows a line break (a blank line, for ``blank_line``)."""
    f.seek(at - 1)
    base, tail = at - 1, b""
    while True:
        block = f.read(1 << 20)
        if not block:
            return base + len(tail)
        data = tail + block
        m = _BLANK_LINE.search(data) if blank_line else None
        k = (m.end() if m else -1) if blank_line else data.find(b"\n") + 1 or -1
        if k > 0:
            return base + k
        keep = min(len(data), 4096)
        base, tail = base + len(data) - keep, data[-keep:]


# ------------------------------------------------------------------------------------------------ a worker
_TOKENIZER: Tokenizer | None = None


def _init_worker(tok_json: str) -> None:
    """A worker process: its own tokenizer, one thread (the workers are the parallelism), gone with its parent."""
    global _TOKENIZER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt does
    with contextlib.suppress(Exception):  # Linux: a worker ends when the process that started it ends
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    _TOKENIZER = Tokenizer.from_str(tok_json)


class _Summed:
    """A file that keeps the CRC-32 of what is written to it."""

    def __init__(self, f):
        self.f, self.crc = f, 0

    def write(self, data: bytes) -> None:
        self.crc = zlib.crc32(data, self.crc)
        self.f.write(data)


class _ShardWriter:
    """Sentences tokenized in batches and appended to a shard's arrays; a document ends where it is closed."""

    def __init__(self, folder: str, tok: Tokenizer, dtype, max_sentence_tokens: int):
        self.tok, self.dtype, self.max_tokens = tok, dtype, max_sentence_tokens
        self.files = [_Summed(open(os.path.join(folder, name), "wb")) for name in ARRAYS]
        self.pending: list[str] = []
        self.doc_marks: list[int] = []  # positions in pending where a document ends
        self.tokens = self.sentences = self.documents = self.doc_kept = 0

    def add(self, sentences: list[str]) -> None:
        self.pending.extend(sentences)
        if len(self.pending) >= BATCH_SENTENCES:
            self.flush()

    def end_document(self) -> None:
        self.doc_marks.append(len(self.pending))

    def flush(self) -> None:
        # encode_batch_fast (tokenizers >= 0.20) leaves out the character offsets, which nothing here uses
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        encoded = encode(self.pending, add_special_tokens=False) if self.pending else []
        toks, sent_ends, doc_ends, marks = [], [], [], iter(self.doc_marks + [-1])
        mark = next(marks)
        for k in range(len(self.pending) + 1):
            while mark == k:  # the documents that end before sentence k
                if self.doc_kept:
                    self.sentences += self.doc_kept
                    self.documents += 1
                    doc_ends.append(self.sentences)
                self.doc_kept, mark = 0, next(marks)
            if k == len(self.pending):
                break
            ids = encoded[k].ids
            for i in range(0, len(ids), self.max_tokens):
                piece = ids[i : i + self.max_tokens]
                toks.append(np.asarray(piece, dtype=self.dtype))
                self.tokens += len(piece)
                sent_ends.append(self.tokens)
                self.doc_kept += 1
        ft, fs, fd = self.files
        if toks:
            ft.write(np.concatenate(toks).tobytes())
        fs.write(np.asarray(sent_ends, dtype=np.int64).tobytes())
        fd.write(np.asarray(doc_ends, dtype=np.int64).tobytes())
        self.pending, self.doc_marks = [], []

    def close(self) -> dict:
        self.flush()
        for f in self.files:
            f.f.close()
        return {name: f.crc for name, f in zip(ARRAYS, self.files)}


def _hash8(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def prepare_part(job: dict) -> dict:
    """Read, split and tokenize one part into its shard folder (written aside, renamed into place); return its
    record.  ``job["drop"]``: (documents, paragraphs) of this part to leave out, by their index in the part."""
    tok = _TOKENIZER if _TOKENIZER is not None else Tokenizer.from_str(job["tokenizer"])
    reading = Reading(**job["reading"])
    final = job["folder"]
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.tmp-", dir=os.path.dirname(final))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private: a shared corpus follows the umask
    try:
        record = _fill_shard(tmp, tok, reading, job)
        record["identity"], record["drops"] = job["identity"], _drops_digest(job)
        atomic_write_json(os.path.join(tmp, "record.json"), record, faults=False)
        if os.path.lexists(final):  # a shard of another plan (an input changed)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fault_point("shard", final)
    return record


class _Hashes:
    """The hashes of a part's documents and paragraphs (what duplicates are found by), taken as it is read."""

    def __init__(self):
        self.docs: list[int] = []
        self.paras: list[int] = []
        self._doc = hashlib.blake2b(digest_size=8)

    def read(self, path: str, part: dict, reading: Reading, seen=None) -> Iterator:
        """The part's paragraphs and document ends (``END``), as :func:`corpus.read_part` yields them, each
        hashed before it is yielded."""
        for para in read_part(path, part["start"], part["end"], reading.text_field, reading.doc_separator, seen):
            if para is END:
                self.docs.append(int.from_bytes(self._doc.digest(), "little"))
                self._doc = hashlib.blake2b(digest_size=8)
            else:
                data = para.encode("utf-8")
                self._doc.update(data + b"\n\n")
                self.paras.append(_hash8(data))
            yield para

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.docs, dtype=np.uint64), np.asarray(self.paras, dtype=np.uint64)


def _fill_shard(folder: str, tok: Tokenizer, reading: Reading, job: dict) -> dict:
    writer = _ShardWriter(folder, tok, np.dtype(job["dtype"]), reading.max_sentence_tokens)
    drop_docs, drop_paras = job.get("drop") or (set(), set())
    hashes, chars, read = _Hashes(), 0, []
    for path, part in job["segments"]:
        split = sentences_of(reading.doc_separator, path)
        digest, n = hashlib.sha256(), [0]

        def seen(block: bytes) -> None:
            digest.update(block)
            n[0] += len(block)

        for para in hashes.read(path, part, reading, seen):
            if para is END:
                writer.end_document()
                continue
            if len(hashes.docs) in drop_docs or len(hashes.paras) - 1 in drop_paras:
                continue
            sentences = split(para)
            chars += sum(len(s) for s in sentences)
            writer.add(sentences)
        read.append({"input": part["input"], "bytes": n[0], "sha256": digest.hexdigest()})
    crc = writer.close()
    for name, array in zip(HASHES, hashes.arrays()):
        array.tofile(os.path.join(folder, name))
    record = {"part": job["part"], "bytes": sum(r["bytes"] for r in read), "sha256": _joined_sha(read),
              "tokens": writer.tokens, "sentences": writer.sentences, "documents": writer.documents, "chars": chars,
              "paragraphs": len(hashes.paras), "documents_read": len(hashes.docs), "crc32": crc,
              "reading": asdict(reading), "dtype": job["dtype"]}
    if len(read) > 1:
        record["inputs"] = read  # (what the manifest says of each input)
    return record


def _joined_sha(read: list[dict]) -> str:
    """One digest of several: that of the one, or the sha256 of their hex digests in order."""
    if len(read) == 1:
        return read[0]["sha256"]
    return hashlib.sha256("".join(r["sha256"] for r in read).encode()).hexdigest()


def hash_part(job: dict) -> dict:
    """The first pass of ``--dedup``: the hashes of one part's documents and paragraphs, nothing tokenized."""
    hashes = _Hashes()
    for path, part in job["segments"]:
        for _ in hashes.read(path, part, Reading(**job["reading"])):
            pass
    docs, paras = hashes.arrays()
    return {"docs": docs, "paras": paras}


# ------------------------------------------------------------------------------------------------ the whole
def prepare_corpus(data: list[str], tok: Tokenizer, out: str, reading: Reading = Reading(), workers: int | None = None,
                   progress: bool = False, overwrite: bool = False, wait_message: str | None = None,
                   flag: str = "--out") -> TokenizedCorpus:
    """Prepare ``data`` into ``out`` (see the module's docstring) and open it; a finished folder of the same
    inputs, tokenizer and settings is opened as it is.  Another process preparing ``out`` is waited for (a
    lock file beside it, which the operating system releases whatever ends that process): no collective."""
    for p in data:
        if is_prepared(p):
            raise UserError(f"{p} is a prepared corpus already: train from it (pretrain --data {p}), or prepare its "
                            "raw text")
    files = expand_paths(data)
    out = os.path.abspath(out)
    who = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
    t0 = time.monotonic()
    output = Output(out, KIND, resume=True, flag=flag,
                    wait=who + (wait_message or "waiting for another process preparing %s"))
    with output:  # (a preparation cut short is continued: the rule as for --resume)
        waited = time.monotonic() - t0
        state = _state(out, files, tok, reading, overwrite)
        if state == "finished":
            log.info("prepared corpus in %s%s", out, f" (waited {waited:.0f} s for the process preparing it)"
                     if waited >= 1 else "")
            return open_prepared(out)
        if state == "replace":
            Output(out, KIND, overwrite=True, flag=flag).check()  # the rule: never files bertforge did not write
            shutil.rmtree(out)
        created = not os.path.lexists(out)
        was_empty = not created and os.path.isdir(out) and not os.listdir(out)  # (a folder the user made for it)
        t0 = time.monotonic()
        try:
            _start_folder(out, tok)
            records, fresh = _run_parts(out, files, tok, reading, workers, progress)
            manifest = _manifest(out, files, tok, reading, records)
            atomic_write_json(os.path.join(out, "manifest.json"), manifest, faults=False)
        except TrainingError:  # a worker died: the finished shards stay, for the same command to continue
            raise
        except KeyboardInterrupt:  # the finished shards stay too
            raise KeyboardInterrupt(f"interrupted; the shards prepared so far are kept in {out}: the same command "
                                    "finishes the preparation") from None
        except Exception as e:  # bad input, a full disk: a folder this call made is removed, none is half-written
            if created:
                shutil.rmtree(out, ignore_errors=True)
            for name in os.listdir(out) if was_empty else []:  # (the user's own folder: emptied, kept as it is)
                remove_path(os.path.join(out, name))
            code = write_failure(e)
            if code is not None and not getattr(e, "filename", None):  # (a worker's write: the folder named)
                raise OSError(code, os.strerror(code), out) from None
            raise
        _remove_others(out, {r["name"] for r in manifest["shards"]})
    mb = sum(r["bytes"] for r in fresh) / 1e6
    took = max(time.monotonic() - t0, 1e-9)
    who = f" (rank {os.environ['RANK']} prepared it)" if "RANK" in os.environ else ""
    log.info("prepared %s documents, %s sentences, %s tokens (%.1f MB in %.0f s, %.1f MB/s) into %s%s",
             f"{manifest['documents']:,}", f"{manifest['sentences']:,}", f"{manifest['tokens']:,}", mb, took,
             mb / took, out, who)
    return open_prepared(out)


def _settings(files: list[str], tok: Tokenizer, reading: Reading) -> dict:
    return {"inputs": [os.path.abspath(f) if not f.startswith("hf:") else f for f in files],
            "tokenizer": tokenizer_fingerprint(tok), "reading": asdict(reading)}


def prepared_settings(folder: str) -> dict | None:
    """What a prepared folder was prepared with (its ``settings.json``: inputs, tokenizer, reading); None when it is
    missing or unreadable."""
    return json_object_or_none(os.path.join(folder, "settings.json"))


def _state(out: str, files: list[str], tok: Tokenizer, reading: Reading, overwrite: bool) -> str:
    """new (nothing there yet), continue (an unfinished preparation of the same), finished, or replace."""
    if not os.path.lexists(out) or (os.path.isdir(out) and not os.listdir(out)):
        return "new"
    if not is_prepared(out):
        raise UserError(f"{out} exists and is not a prepared corpus; bertforge never replaces it: choose another "
                        "--out")
    before = prepared_settings(out)
    now = _settings(files, tok, reading)
    if before is None and os.path.isdir(os.path.join(out, "shards")) and os.listdir(os.path.join(out, "shards")):
        if overwrite:  # (shards of unknown settings: another tokenizer's, maybe)
            return "replace"
        raise UserError(f"{out} holds shards but not the settings.json that says what they were prepared with; pass "
                        "--overwrite to prepare it again, or choose another --out")
    if before != now and before is not None:
        if overwrite:
            return "replace"
        names = {"inputs": "inputs", "tokenizer": "a tokenizer",
                 "reading": "reader settings (--text-field, --doc-separator, --dedup)"}
        what = [names[k] for k in now if before.get(k) != now[k]]
        raise UserError(f"{out} holds a corpus prepared with other {' and '.join(what)}; pass --overwrite to "
                        "replace it, or choose another --out")
    manifest = json_object_or_none(os.path.join(out, "manifest.json")) or {}
    try:
        if [i["identity"] for i in manifest["inputs"]] == [list(s) for s in input_signature(files)]:
            TokenizedCorpus(out, manifest).check()  # else: damaged, its whole shards kept, the others again
            return "finished"
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with contextlib.suppress(OSError):  # unfinished again: an input changed, or a preparation was cut short
        os.remove(os.path.join(out, "manifest.json"))
    return "continue"


def _start_folder(out: str, tok: Tokenizer) -> None:
    from .tokenizer import save_tokenizer

    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    if not os.path.isfile(os.path.join(out, MARKER)):
        write_marker(out, KIND)
    if not os.path.isfile(os.path.join(out, "tokenizer.json")):
        save_tokenizer(tok, out)
    for name in os.listdir(os.path.join(out, "shards")):  # what a killed preparation was writing
        if name.startswith("."):
            shutil.rmtree(os.path.join(out, "shards", name), ignore_errors=True)


def _run_parts(out: str, files: list[str], tok: Tokenizer, reading: Reading, workers: int | None,
               progress: bool) -> tuple[list[dict], list[dict]]:
    """Every part's shard record, in order (the finished shards' as they are, the others prepared), and the
    records of those prepared now."""
    atomic_write_json(os.path.join(out, "settings.json"), _settings(files, tok, reading), faults=False)
    parts = plan_parts(files, reading)
    signature = input_signature(files)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = "uint16" if vocab <= 65536 else "uint32"
    records: list[dict | None] = []
    jobs, every = [], []
    for k, part in enumerate(parts):
        name, read = f"{k:05d}", segments(part, files)
        identity = [list(signature[p["input"]]) for _, p in read]
        job = {"part": part, "segments": read, "identity": identity[0] if len(identity) == 1 else identity,
               "reading": asdict(reading), "dtype": dtype, "folder": os.path.join(out, "shards", name), "name": name}
        done = _finished_record(job["folder"], job)
        records.append(done)
        every.append(job)
        if done is None:
            jobs.append(job)
    if len(jobs) < len(parts):
        log.info("%d of %d shards already prepared in %s: preparing the others", len(parts) - len(jobs), len(parts),
                 out)
    if jobs and reading.dedup:  # a part's drops depend on the parts before it: a finished shard may need redoing
        _assign_drops(out, parts, records, every, tok, workers)
        for k, job in enumerate(every):
            if records[k] is not None and records[k].get("drops") != _drops_digest(job):
                records[k] = None
                jobs.append(job)
        jobs.sort(key=lambda j: j["name"])
    sizes = {id(j): _part_size(j) for j in jobs}
    if jobs:  # (the phase's first line: a large corpus takes minutes before the run's next)
        log.info("tokenizing %.1f MB of text in %d shard(s) into %s", sum(sizes.values()) / 1e6, len(jobs), out)
    total = sum(sizes.values())

    def said(done: int, seconds: float) -> None:
        log.info("prepared %.0f of %.0f MB (%.1f MB/s)", done / 1e6, total / 1e6, done / 1e6 / max(seconds, 1e-9))

    with logs.progress(total, "preparing", progress, said, 30, unit="B", unit_scale=True) as advance:
        for job, record in _map(prepare_part, jobs, tok, workers):
            records[int(job["name"])] = record
            advance(sizes[id(job)])
    for k, r in enumerate(records):
        r["name"] = f"{k:05d}"
    return records, [records[int(j["name"])] for j in jobs]


def _drops_digest(job: dict) -> str | None:
    """What ``--dedup`` leaves out of a part, which the parts before it decide (None without --dedup)."""
    if job.get("drop") is None:
        return None
    return hashlib.sha256(json.dumps([sorted(d) for d in job["drop"]]).encode()).hexdigest()


def _finished_record(folder: str, job: dict) -> dict | None:
    r = json_object_or_none(os.path.join(folder, "record.json"))
    if r is None:
        return None
    same = (r.get("part"), r.get("identity"), r.get("reading"), r.get("dtype")) == (
        job["part"], job["identity"], job["reading"], job["dtype"])
    try:  # a damaged shard (an array not of the size and checksum its record says) is redone
        return r if same and _arrays_problem(folder, r, np.dtype(r["dtype"]).itemsize) is None else None
    except (OSError, KeyError, TypeError):
        return None


def _part_size(job: dict) -> int:
    size = 0
    for path, part in job["segments"]:
        if part["end"] is not None:
            size += part["end"] - part["start"]
        elif not path.startswith("hf:"):
            size += os.path.getsize(path)
    return size


def _map(fn, jobs: list[dict], tok: Tokenizer, workers: int | None) -> Iterator[tuple[dict, dict]]:
    """(job, fn(job)) as the jobs finish: in worker processes, or here when one is enough."""
    from .devices import available_cores

    n = min(workers or available_cores(), len(jobs))
    if n <= 1:
        for job in jobs:
            yield job, fn({**job, "tokenizer": tok.to_str()})
        return
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    # each worker one thread, and no warning about the fork: set while the pool lives, since the executor
    # forks its workers at the first submit, not when it is made
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    others = set(multiprocessing.active_children())  # children of this process that are not the pool's
    before_pids = child_pids()
    try:
        with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(tok.to_str(),)) as pool:
            try:  # not pool.map: it cancels its futures on an interrupt, and the pool's thread then fails on them
                futures = [pool.submit(fn, job) for job in jobs]
                for job, future in zip(jobs, futures):
                    yield job, future.result()
            except BrokenProcessPool:
                raise TrainingError("a worker process of bertforge prepare died (out of memory?); the shards finished "
                                "so far are kept: run the same command again, with fewer --workers") from None
            except BaseException:  # an interrupt: the workers stop now, and no queued job starts (a worker
                # started while the interrupt came would otherwise go on through all of them)
                pool.shutdown(wait=False, cancel_futures=True)
                stop_children(others, before_pids)
                raise
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _assign_drops(out: str, parts: list[dict], records: list, jobs: list[dict], tok: Tokenizer,
                  workers: int | None) -> None:
    """``--dedup``: every part's document and paragraph hashes (a finished shard's from its files, the others
    by a first pass), then, for each job, the documents and paragraphs met before it in corpus order."""
    hashes: list = [None] * len(parts)
    for k, r in enumerate(records):
        if r is not None:
            folder = os.path.join(out, "shards", f"{k:05d}")
            hashes[k] = {"docs": np.fromfile(os.path.join(folder, HASHES[0]), dtype=np.uint64),
                         "paras": np.fromfile(os.path.join(folder, HASHES[1]), dtype=np.uint64)}
    todo = [{**p, "index": k} for k, p in enumerate(parts) if hashes[k] is None]
    lookup = {j["name"]: j for j in jobs}
    for job, found in _map(hash_part, [lookup[f"{t['index']:05d}"] for t in todo], tok, workers):
        hashes[int(job["name"])] = found
    for key in ("docs", "paras"):
        every = np.concatenate([h[key] for h in hashes])
        _, first = np.unique(every, return_index=True)
        repeated = np.ones(len(every), dtype=bool)
        repeated[first] = False
        starts = np.cumsum([0] + [len(h[key]) for h in hashes])
        for job in jobs:
            k = int(job["name"])
            local = np.flatnonzero(repeated[starts[k] : starts[k + 1]])
            drop = job.setdefault("drop", [set(), set()])
            drop[0 if key == "docs" else 1] = set(local.tolist())


def _manifest(out: str, files: list[str], tok: Tokenizer, reading: Reading, records: list[dict]) -> dict:
    read: dict[int, list[dict]] = {}  # each input's parts, as read
    for r in records:
        for one in r.get("inputs") or [{"input": r["part"]["input"], "bytes": r["bytes"], "sha256": r["sha256"]}]:
            read.setdefault(one["input"], []).append(one)
    inputs = []
    for i, identity in enumerate(input_signature(files)):
        mine = read.get(i, [])
        inputs.append({"path": identity[0], "identity": list(identity), "bytes": sum(r["bytes"] for r in mine),
                       "sha256": _joined_sha(mine), "parts": len(mine)})
    shards = [{k: r[k] for k in ("name", "part", "tokens", "sentences", "documents", "paragraphs", "chars", "bytes",
                                 "sha256", "crc32")} for r in records]
    totals = {k: sum(r[k] for r in records) for k in ("tokens", "sentences", "documents", "chars")}
    if not totals["documents"] or not totals["tokens"]:
        raise UserError(f"the corpus is empty: no text in {', '.join(files)}")
    manifest = {
        "version": VERSION, "kind": KIND, "dtype": records[0]["dtype"],
        "vocab_size": tok.get_vocab_size(with_added_tokens=True), "tokenizer": tokenizer_fingerprint(tok),
        "reading": asdict(reading),
        "input_sha256": "sha256 of the text read (decompressed); for an input cut into parts, the sha256 of its "
                        "parts' hex digests in order",
        "inputs": inputs, "shards": shards, **totals, "duplicates": _duplicates(out, records, reading),
    }
    manifest["held_out"] = _held_out(out, manifest)
    return manifest


def _duplicates(out: str, records: list[dict], reading: Reading, buckets: int = 256,
                in_memory: int = 1 << 24) -> dict:
    """Exact duplicates beyond each first occurrence (spaces collapsed), over the whole corpus: up to
    ``in_memory`` hashes (128 MB, and as much again to sort them) counted at once; more are spread into
    ``buckets`` files by their top byte and each bucket is counted alone, so the memory this takes is a bucket's,
    not the corpus's."""
    found = {"dropped": reading.dedup}
    for key, name in (("documents", HASHES[0]), ("paragraphs", HASHES[1])):
        paths = [os.path.join(out, "shards", r["name"], name) for r in records]
        total = sum(os.path.getsize(p) for p in paths) // 8
        if total <= in_memory:  # (a temporary file per bucket costs more than the counting of a small corpus)
            hashes, at = np.empty(total, dtype=np.uint64), 0
            for p in paths:
                h = np.fromfile(p, dtype=np.uint64)
                hashes[at : at + len(h)], at = h, at + len(h)
            hashes.sort()
            distinct = int(np.count_nonzero(np.diff(hashes))) + 1 if total else 0
        else:
            distinct = _distinct_by_bucket(out, paths, buckets)
        found[key], found[f"{key}_read"] = total - distinct, total
    return found


def _distinct_by_bucket(out: str, paths: list[str], buckets: int) -> int:
    """The distinct hashes of ``paths``, counted bucket by bucket in temporary files under ``out``."""
    with tempfile.TemporaryDirectory(prefix=".duplicates-", dir=out) as tmp:
        files = [open(os.path.join(tmp, str(b)), "wb") for b in range(buckets)]
        for path in paths:
            h = np.fromfile(path, dtype=np.uint64)
            top = (h >> np.uint64(56)).astype(np.int64) * buckets // 256
            order = np.argsort(top, kind="stable")
            bounds = np.searchsorted(top[order], np.arange(buckets + 1))
            for b in np.flatnonzero(np.diff(bounds)):
                h[order[bounds[b] : bounds[b + 1]]].tofile(files[b])
        for f in files:
            f.close()
        return sum(len(np.unique(np.fromfile(os.path.join(tmp, str(b)), dtype=np.uint64))) for b in range(buckets))


def _held_out(out: str, manifest: dict) -> dict:
    """The documents that evaluation holds out when no other evaluation text is given (HELD_OUT_RULE)."""
    rule = {"rule": HELD_OUT_RULE, "documents": None}
    if manifest["documents"] < 3:
        return rule
    _, held = split_documents(TokenizedCorpus(out, manifest), seed=0, need_train=2)
    rule["documents"] = held.tolist()
    return rule


def _remove_others(out: str, keep: set[str]) -> None:
    """Shards of an earlier plan that this one does not use (an input that changed size)."""
    shards = os.path.join(out, "shards")
    for name in os.listdir(shards):
        if name not in keep:
            shutil.rmtree(os.path.join(shards, name), ignore_errors=True)
