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
import os
import re
from collections.abc import Iterator

from .errors import UserError, require_file, shown
from .files import json_lines, read_text
from .outputs import MARKER

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
    out: list[str] = []
    for para in _PARAGRAPHS.split(text.replace("\r\n", "\n").replace("\r", "\n")):
        para = _SPACES.sub(" ", para).strip()
        if para:
            out.extend(_split_paragraph(para))
    return out


def _split_paragraph(p: str) -> list[str]:
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
    vocab.txt, a pretraining run's metrics.jsonl, a half-written temporary folder) are never its input."""
    found = []
    for root, dirs, names in os.walk(top):
        if root != top and MARKER in names:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, f) for f in names if f.endswith(TEXT_SUFFIXES) and not f.startswith(".")]
    return sorted(found)


def expand_paths(paths: list[str]) -> list[str]:
    """Files named by paths, directories (recursively, text suffixes only) and glob patterns, sorted."""
    files: list[str] = []
    for p in paths:
        if p.startswith("hf:"):
            hf_spec(p)
            files.append(p)
        elif os.path.isdir(p):
            found = _walk_texts(p)
            if not found:
                raise UserError(f"no .txt, .jsonl, .gz or .parquet files in directory {p}")
            files.extend(found)
        elif os.path.isfile(p):
            files.append(p)
        elif any(c in p for c in "*?["):
            found = sorted(f for f in glob.glob(p, recursive=True) if os.path.isfile(f))
            if not found:
                raise UserError(f"no files match {p}")
            files.extend(found)
        else:
            raise UserError(f"data path not found: {p}")
    return files


def _jsonl_texts(path: str, text: str, field: str) -> Iterator[str]:
    for lineno, obj in json_lines(text, path):
        if field not in obj:
            raise UserError(f"{path}:{lineno}: no field {field!r}")
        value = obj[field]
        if not isinstance(value, str):
            raise UserError(f"{path}:{lineno}: field {field!r} is not a string")
        yield value


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
    """The documents of one input, each a list of sentences (empty documents skipped)."""
    if path.startswith("hf:"):
        texts: Iterator[str] = _hf_texts(path, text_field)
    elif path.endswith(".parquet"):
        texts = _parquet_texts(path, text_field)
    else:
        text = read_text(path, "data file")
        base = path[:-3] if path.endswith(".gz") else path
        if base.endswith(".jsonl") or base.endswith(".json"):
            texts = _jsonl_texts(path, text, text_field)
        elif doc_separator == "blank-line":
            for block in _PARAGRAPHS.split(text.replace("\r\n", "\n")):
                sents = [s.strip() for s in block.split("\n") if s.strip()]
                if sents:
                    yield sents
            return
        elif doc_separator == "file":
            texts = iter([text])
        elif doc_separator == "line":  # one example per line, as transformers' run_mlm.py --line_by_line
            texts = (line for line in text.splitlines() if line.strip())
        else:
            raise UserError(f"unknown doc separator {doc_separator!r}; expected file, blank-line or line")
    for t in texts:
        sents = split_sentences(t)
        if sents:
            yield sents


def iter_documents(paths: list[str], text_field: str = "text", doc_separator: str = "file") -> Iterator[list[str]]:
    """All documents of all inputs, in order."""
    for f in expand_paths(paths):
        yield from file_documents(f, text_field, doc_separator)


def iter_texts(paths: list[str], text_field: str = "text", doc_separator: str = "file") -> Iterator[str]:
    """Sentences of the corpus one by one (what a tokenizer is trained on)."""
    for doc in iter_documents(paths, text_field, doc_separator):
        yield from doc


def input_signature(paths: list[str]) -> list[tuple[str, int, int, int, int]]:
    """(absolute path, size, mtime_ns, inode, ctime_ns) of each input: what decides whether a cache is still
    valid.  The size and modification time alone miss a file rewritten with both kept (``cp -p``, ``rsync -t``,
    ``tar``, ``touch -r``); the inode (a new file) and the change time (which no one can set back) see it,
    without reading the data."""
    sig = []
    for f in expand_paths(paths):
        if f.startswith("hf:"):
            sig.append((f, 0, 0, 0, 0))
        else:
            st = os.stat(f)
            sig.append((os.path.abspath(f), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns))
    return sig
