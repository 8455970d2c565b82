"""Reading a user's corpus into documents of sentences.

Accepted inputs (files, directories searched recursively, and glob patterns, mixed freely):

* ``.txt``: by default one file is one document, hard-wrapped prose welcome; with
  ``doc_separator="blank-line"`` it is Google BERT's own format: one sentence per line, a blank line
  between documents; with ``doc_separator="line"`` every non-blank line is one document (one example per
  line).
* ``.jsonl``: one JSON object per line, the text in field ``text`` (another with ``text_field``); one line is
  one document.
* ``.gz`` of either (``.txt.gz``, ``.jsonl.gz``).
* ``.parquet`` (a column ``text_field``), and ``hf:NAME[:CONFIG][@SPLIT]`` for a Hugging Face dataset, both
  when the optional ``datasets`` extra is installed.

Text must be UTF-8: a file with invalid UTF-8 is refused with an error naming the file and the byte
offset (convert it first, e.g. ``iconv -f latin1 -t utf-8``), never silently altered.

Sentence splitting copes with real hard-wrapped books: lines are joined inside a paragraph (blank lines
separate paragraphs), headings stand alone, and a sentence ends at ``.``, ``!`` or ``?`` (with closing
quotes or brackets) followed by a capital letter, digit or opening quote, except after abbreviations such
as "Mr." or "e.g." and single-letter initials.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Iterator

from .errors import UserError, require_file, shown
from .files import json_lines, json_object_or_none, newlines_before, text_lines

from .outputs import MARKER, marker_kind

log = logging.getLogger("bertforge")

TEXT_SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz", ".parquet")

ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "rev", "hon", "gen", "col", "capt", "lt", "sgt",
    "gov", "sen", "rep", "messrs", "mme", "mlle", "esq", "vs", "etc", "e.g", "i.e", "cf", "viz", "no", "vol",
    "ch", "chap", "fig", "p", "pp", "ed", "eds", "co", "inc", "ltd", "jan", "feb", "mar", "apr", "jun", "jul",
    "aug", "sep", "sept", "oct", "nov", "dec", "u.s", "a.m", "p.m", "ave", "approx", "dept", "est",
}

# end punctuation, then optional closing quotes/brackets/underscores, then whitespace
_BOUNDARY = re.compile(r"[.!?]+[\"'\u201d\u2019)\]_]*\s+")
_STARTS_SENTENCE = re.compile(r"[\"'\u201c\u2018(\[_]*[A-Z0-9\u00c0-\u00de]")
_WORD_BEFORE = re.compile(r"([\w.]+)$")
_PARAGRAPHS = re.compile(r"\n[ \t]*\n+")
_SPACES = re.compile(r"\s+")


def split_sentences(text: str) -> list[str]:
    """Split prose (hard-wrapped or not) into sentences; paragraphs never share a sentence."""
    return [s for para in paragraphs(text) for s in split_paragraph(para)]


def paragraphs(text: str) -> list[str]:
    """The paragraphs of prose (blank lines between them), each on one line with its spaces collapsed."""
    out = []
    for para in _PARAGRAPHS.split(text.replace("\r\n", "\n").replace("\r", "\n")):
        para = _SPACES.sub(" ", para).strip()
        if para:
            out.append(para)
    return out


def split_paragraph(p: str) -> list[str]:
    """The sentences of one paragraph of :func:`paragraphs`."""
    sents: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(p):
        end = m.end()
        if not _STARTS_SENTENCE.match(p, end):
            continue
        if p[m.start()] == ".":
            w = _WORD_BEFORE.search(p, start, m.start())
            word = w.group(1).lower().rstrip(".") if w else ""
            # "Mr. Smith", "e.g. This", initials "J. M. Keynes"
            if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                continue
        s = p[start:end].strip()
        if s:
            sents.append(s)
        start = end
    s = p[start:].strip()
    if s:
        sents.append(s)
    return sents


# ------------------------------------------------------------------------------------------------ files
def _walk_texts(top: str) -> list[str]:
    """The text files under directory ``top``, sorted.  Hidden files and folders are passed over, and so is
    any folder below ``top`` that bertforge wrote (it holds the output marker): a run's own files (a tokenizer's
    vocab.txt, a pretraining run's metrics.jsonl, a half-written temporary folder) are never its input; nor is a
    prepared folder copied without its marker (:func:`is_prepared_folder`)."""
    found = []
    for root, dirs, names in os.walk(top):
        if root != top and (MARKER in names or is_prepared_folder(root)):
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in names if f.lower().endswith(TEXT_SUFFIXES) and not f.startswith(".")]
    return sorted(found)


def _in_output(path: str, pattern: str) -> bool:
    """Whether a file a glob ``pattern`` matched lies in a folder bertforge wrote, below the pattern's literal part
    (``runs/*/*.txt`` matching a run's own ``vocab.txt``): never input, as in a directory (:func:`_walk_texts`)."""
    base = pattern
    while any(c in base for c in "*?["):
        base = os.path.dirname(base)
    base, folder = os.path.abspath(base or "."), os.path.dirname(os.path.abspath(path))
    while folder != base and folder.startswith(base + os.sep):
        if os.path.isfile(os.path.join(folder, MARKER)):
            return True
        folder = os.path.dirname(folder)
    return False


def is_prepared_folder(path: str) -> bool:
    """Whether ``path`` is a folder that ``bertforge prepare`` wrote (finished or not): its marker says so, or,
    when a copy lost the marker (``cp -r prep/* dst/``), its manifest and shards."""
    if not os.path.isdir(path):
        return False
    if marker_kind(path) == "prepared":
        return True
    # (a text corpus may hold a file of that name: its manifest says whose it is)
    manifest = json_object_or_none(os.path.join(path, "manifest.json")) or {}
    return manifest.get("kind") == "prepared" and os.path.isdir(os.path.join(path, "shards"))


def expand_paths(paths: list[str]) -> list[str]:
    """Files named by paths, directories (recursively, text suffixes only) and glob patterns, sorted."""
    files: list[str] = []
    for p in paths:
        if p.startswith("hf:"):
            hf_spec(p)
            files.append(p)
        elif os.path.isdir(p):
            if is_prepared_folder(p):
                raise UserError(f"{p} is a prepared corpus (token shards, not text): pretrain --data {p} trains from "
                                "it; give its raw text here")
            found = _walk_texts(p)
            if not found:
                raise UserError(f"no .txt, .jsonl, .gz or .parquet files in directory {p}")
            files.extend(found)
        elif os.path.isfile(p):
            files.append(p)
        elif any(c in p for c in "*?["):
            found = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f) and not _in_output(f, p))
            if not found:
                raise UserError(f"no files match {p}")
            files.extend(found)
        else:
            raise UserError(f"data path not found: {p}")
    seen: set[str] = set()
    kept = []
    for f in files:  # a file named twice (a folder and a file in it, overlapping patterns) is read once
        key = f if f.startswith("hf:") else os.path.realpath(f)
        if key in seen:
            log.warning("%s: named more than once in --data; read once", f)
        else:
            seen.add(key)
            kept.append(f)
    return kept


def parquet_rows(path: str, columns: list[str] | None = None) -> Iterator[dict]:
    """The rows of a .parquet file as dicts (only ``columns``, each checked, when given)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError("reading .parquet needs the datasets extra: pip install 'bertforge[datasets]'") from None
    try:
        pf = pq.ParquetFile(path)
        for c in columns or []:
            if c not in pf.schema_arrow.names:
                raise UserError(f"{path}: no column {c!r} (columns: {', '.join(pf.schema_arrow.names)})")
        for batch in pf.iter_batches(columns=columns):
            yield from batch.to_pylist()
    except UserError:
        raise
    except Exception as e:  # pyarrow's errors
        raise UserError(f"cannot read {path}: {e}") from None


def hf_spec(spec: str) -> tuple[str, str | None, str]:
    """(name, config or None, split) of ``hf:NAME[:CONFIG][@SPLIT]``; a UserError when a part is empty."""
    name, split = spec[len("hf:") :], "train"
    if "@" in name:
        name, split = name.rsplit("@", 1)
    config = None
    if ":" in name:
        name, config = name.split(":", 1)
    if not name.strip() or config is not None and not config.strip() or not split.strip():
        raise UserError(f"data {shown(spec)}: expected hf:NAME[:CONFIG][@SPLIT], each part given (NAME a dataset "
                        "on the hub or a local dataset folder)")
    return name, config, split


def hf_rows(spec: str) -> Iterator[dict]:
    """The rows of ``hf:NAME[:CONFIG][@SPLIT]`` (split ``train`` by default), a Hugging Face dataset: a local
    dataset folder, or from the hub when there is a network; streamed."""
    try:
        import datasets
    except ImportError:
        raise UserError("hf: datasets need the datasets extra: pip install 'bertforge[datasets]'") from None
    name, config, split = hf_spec(spec)
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
        yield from ds
    except Exception as e:  # loading, or reading a row (files whose columns differ, a network error, ...)
        raise UserError(f"cannot load dataset {spec}: {' '.join(str(e).split())[:300]}") from None


def table_rows(path: str) -> Iterator[dict] | None:
    """The rows of ``path`` when it is a .parquet file or an ``hf:`` dataset, else None (a text file)."""
    if path.startswith("hf:"):
        return hf_rows(path)
    if path.lower().endswith(".parquet"):
        require_file(path, "data file")
        return parquet_rows(path)
    return None


def _texts_of(rows: Iterator[dict], field: str, where: str) -> Iterator[str]:
    """The non-empty texts in column ``field`` of table rows; a row without it, or with a value that is not
    text (a number, a list), is an error naming the row."""
    for n, row in enumerate(rows):
        if field not in row:
            raise UserError(f"{where}: row {n}: no field {field!r}")
        value = row[field]
        if value is not None and not isinstance(value, str):
            raise UserError(f"{where}: row {n}: {field!r} must be text, not {type(value).__name__} {shown(value)} "
                            "(--text-field names the column)")
        if value:
            yield value


def _parquet_texts(path: str, field: str) -> Iterator[str]:
    yield from _texts_of(parquet_rows(path, [field]), field, path)


def _hf_texts(spec: str, field: str) -> Iterator[str]:
    yield from _texts_of(hf_rows(spec), field, f"dataset {spec}")


def file_documents(path: str, text_field: str = "text", doc_separator: str = "file") -> Iterator[list[str]]:
    """The documents of one input, each a list of sentences (empty documents skipped), read as ``prepare`` reads
    it (:func:`read_part`, the one reader of every format): memory holds one document, never the whole file."""
    split = sentences_of(doc_separator, path)
    doc: list[str] = []
    for para in read_part(path, text_field=text_field, doc_separator=doc_separator):
        if para is END:
            if doc:
                yield doc
            doc = []
        else:
            doc.extend(split(para))


def iter_documents(paths: list[str], text_field: str = "text", doc_separator: str = "file") -> Iterator[list[str]]:
    """All documents of all inputs, in order."""
    for f in expand_paths(paths):
        yield from file_documents(f, text_field, doc_separator)


class iter_texts:  # noqa: N801 (used as the function it was: iter_texts(paths) gives the sentences)
    """Sentences of the corpus one by one (what a tokenizer is trained on), read again from the files each time
    it is iterated (a tokenizer's training reads them twice)."""

    def __init__(self, paths: list[str], text_field: str = "text", doc_separator: str = "file"):
        self.paths, self.text_field, self.doc_separator = paths, text_field, doc_separator

    def __iter__(self) -> Iterator[str]:
        for doc in iter_documents(self.paths, self.text_field, self.doc_separator):
            yield from doc


def input_signature(paths: list[str]) -> list[tuple[str, int, int, int, int]]:
    """(absolute path, size, mtime_ns, inode, ctime_ns) of each input: what decides whether a cache is still
    valid.  The size and modification time alone miss a file rewritten with both kept (``cp -p``, ``rsync -t``,
    ``tar``, ``touch -r``); the inode (a new file) and the change time (which no one can set back) see it,
    without reading the data."""
    sig = []
    for f in expand_paths(paths):
        if f.startswith("hf:") and os.path.isdir(hf_spec(f)[0]):
            sig.append(_folder_signature(f, hf_spec(f)[0]))
        elif f.startswith("hf:"):  # a dataset on the hub: known by its name alone (no network to ask)
            sig.append((f, 0, 0, 0, 0))
        else:
            st = os.stat(f)
            sig.append((os.path.abspath(f), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    return sig


def _folder_signature(spec: str, folder: str) -> tuple[str, int, int, int, int]:
    """:func:`input_signature` of a local dataset folder: its files' total size, their newest modification and change
    times, and a digest of their names and inodes (a file replaced, added or removed changes it)."""
    import hashlib

    h, size, mtime, ctime = hashlib.sha256(), 0, 0, 0
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for n in sorted(names):
            st = os.stat(os.path.join(root, n))
            h.update(f"{os.path.relpath(os.path.join(root, n), folder)}:{st.st_ino}\n".encode())
            size, mtime, ctime = size + st.st_size, max(mtime, st.st_mtime_ns), max(ctime, st.st_ctime_ns)
    return spec, size, mtime, int(h.hexdigest()[:15], 16), ctime


# ------------------------------------------------------------------------------------------------ streamed reading
# The one reader of every format, for every command: a part of one input (a byte range of a plain file cut at a
# line boundary, or a whole file), streamed in blocks, as a flat sequence of paragraphs with END after each
# document (:func:`file_documents` gathers them into documents); memory holds one block and one paragraph (one
# line of JSONL, one row of a table), however long a document is.
END = None
_SEPARATOR_LINE = re.compile(r"[ \t]*")  # a blank line: between two paragraphs, or documents (blank-line)


def sentences_of(doc_separator: str, path: str):
    """How a paragraph of :func:`read_part` splits into sentences: a line of Google's format is one sentence."""
    if doc_separator == "blank-line" and _is_text_file(path):
        return lambda p: [p]
    return split_paragraph


def _is_text_file(path: str) -> bool:
    low = path.lower()  # (DATA.JSONL is JSON lines as data.jsonl is)
    base = low[:-3] if low.endswith(".gz") else low
    return not (path.startswith("hf:") or low.endswith(".parquet") or base.endswith((".jsonl", ".json")))


def line_based(path: str, doc_separator: str) -> bool:
    """Whether a file can be cut into parts at line boundaries (a document never spans a line break)."""
    if path.startswith("hf:") or path.lower().endswith((".parquet", ".gz")):
        return False
    return not _is_text_file(path) or doc_separator in ("line", "blank-line")


def read_part(path: str, start: int = 0, end: int | None = None, text_field: str = "text",
              doc_separator: str = "file", seen=None) -> Iterator[str | None]:
    """The paragraphs of bytes ``[start, end)`` of ``path`` (the whole input when ``end`` is None), END after
    each document.  ``seen(data)`` is called with every block of bytes read, in order (a checksum, progress)."""
    if path.startswith("hf:") or path.lower().endswith(".parquet"):
        texts = _hf_texts(path, text_field) if path.startswith("hf:") else _parquet_texts(path, text_field)
        yield from _documents_of(texts)
        return
    require_file(path, "data file")
    lines = text_lines(path, start, end, seen)
    if not _is_text_file(path):
        yield from _documents_of(_jsonl_part_texts(lines, path, start, text_field))
    elif doc_separator == "line":
        yield from _documents_of(t for t in (line.rstrip("\r\n") for line in lines) if t.strip())
    elif doc_separator == "blank-line":
        yield from _google_documents(lines)
    elif doc_separator == "file":
        yield from _file_document(lines)
    else:
        raise UserError(f"unknown doc separator {doc_separator!r}; expected file, blank-line or line")


def _documents_of(texts: Iterator[str]) -> Iterator[str | None]:
    for text in texts:
        paras = paragraphs(text)
        if paras:
            yield from paras
            yield END


def _jsonl_part_texts(lines: Iterator[str], path: str, start: int, field: str) -> Iterator[str]:
    def before() -> int:  # (counted only to name a line in an error)
        return newlines_before(path, start) if start else 0

    for n, obj in json_lines(lines, path, before):
        problem = (f"no field {field!r}" if field not in obj else
                   f"field {field!r} is not a string" if not isinstance(obj[field], str) else None)
        if problem:
            raise UserError(f"{path}:{n + before()}: {problem}")
        yield obj[field]


def _google_documents(lines: Iterator[str]) -> Iterator[str | None]:
    """Google BERT's format: one sentence a line, a blank line between documents."""
    open_doc = False
    for n, line in enumerate(lines):
        line = line.replace("\r\n", "\n")
        body = line[:-1] if line.endswith("\n") else line
        if n and _SEPARATOR_LINE.fullmatch(body):
            if open_doc:
                yield END
            open_doc = False
        elif body.strip():
            yield body.strip()
            open_doc = True
    if open_doc:
        yield END


def _file_document(lines: Iterator[str]) -> Iterator[str | None]:
    """A text file as one document of paragraphs (a blank line between them)."""
    para: list[str] = []
    any_para = False
    for line in lines:
        pieces = line.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for piece in pieces[:-1] if line.endswith(("\n", "\r")) else pieces:
            if _SEPARATOR_LINE.fullmatch(piece):
                text = _SPACES.sub(" ", "\n".join(para)).strip()
                para = []
                if text:
                    yield text
                    any_para = True
            else:
                para.append(piece)
    text = _SPACES.sub(" ", "\n".join(para)).strip()
    if text:
        yield text
        any_para = True
    if any_para:
        yield END
