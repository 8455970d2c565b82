"""Learning benchmark: pretrain a tiny BERT on ~2 MB of the Gutenberg training books and report held-out
MLM and NSP accuracy beside their baselines.  Not a timed test: run it by hand and put the figures in the README.

    python benchmarks/pretrain_gutenberg.py --data-dir ../shared/data --out runs/gutenberg-tiny [--steps 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertforge.cli import main as bertforge


def slice_books(src: str, dst: str, megabytes: float, max_chars: int | None = None) -> int:
    """Copy books from ``src`` (JSONL) to ``dst`` until ``megabytes`` of text; returns the count.  Books are
    whole, or with ``max_chars`` cut to their first ``max_chars`` characters (at a paragraph break)."""
    n, size = 0, 0
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for line in f:
            if size >= megabytes * 1e6:
                break
            text = json.loads(line)["text"]
            if max_chars and len(text) > max_chars:
                cut = text.rfind("\n\n", 0, max_chars)
                text = text[: cut if cut > 0 else max_chars]
            g.write(json.dumps({"text": text}) + "\n")
            size += len(text.encode("utf-8"))
            n += 1
    return n


def run(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data-dir", default=os.environ.get("BERTFORGE_DATA", "../shared/data"))
    p.add_argument("--out", default="runs/gutenberg-tiny")
    p.add_argument("--megabytes", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--vocab-size", type=int, default=8000)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.out, "books.jsonl")
    books = slice_books(os.path.join(a.data_dir, "gutenberg", "train-000.jsonl"), data, a.megabytes)
    print(f"{books} books, {os.path.getsize(data) / 1e6:.1f} MB of JSONL in {data}", file=sys.stderr)
    rc = bertforge([
        "pretrain", "--data", data, "--eval-data", os.path.join(a.data_dir, "gutenberg", "validation.jsonl"),
        "--out", os.path.join(a.out, "model"), "--preset", a.preset, "--vocab-size", str(a.vocab_size),
        "--max-seq-length", "128", "--batch-size", str(a.batch_size), "--lr", str(a.lr),
        "--max-steps", str(a.steps), "--eval-every", str(max(1, a.steps // 5)), "--save-every", str(a.steps),
    ])
    if rc == 0:
        m = json.load(open(os.path.join(a.out, "model", "metrics.json")))
        print(json.dumps({k: m[k] for k in ("mlm_accuracy", "mlm_baseline_accuracy", "nsp_accuracy", "mlm_loss",
                                            "nsp_loss", "steps", "tokens_per_second", "wall_seconds")}))
    return rc


if __name__ == "__main__":
    raise SystemExit(run())
