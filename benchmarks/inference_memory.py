"""What one long inference call holds: a cross-encoder scores N (query, passage) pairs of random lengths in one
``predict`` call (the path of ``evaluate`` and ``predict`` for every task), one thread; the process's resident
memory after it and its peak.  ``--ascending`` runs the batches shortest first, as before the fix.

    python benchmarks/inference_memory.py RERANKER_DIR [--pairs 3840] [--ascending]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import time

import torch

import bertforge.evaluation
from bertforge.tasks.rerank import RerankPipeline


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pairs", type=int, default=3840)
    ap.add_argument("--ascending", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.ascending:
        longest_first = bertforge.evaluation.length_sorted_batches
        bertforge.evaluation.length_sorted_batches = lambda *x: list(reversed(longest_first(*x)))
    pipe = RerankPipeline(a.model, "cpu", 64)
    rng = random.Random(0)
    words = "the of and a to in is was for on that with as by at from his her it an were are which this".split()
    pairs = [(" ".join(rng.choices(words, k=8)), " ".join(rng.choices(words, k=rng.randint(10, 240))))
             for _ in range(a.pairs)]
    start, t = rss_mb(), time.perf_counter()
    pipe.predict(pairs)
    print(json.dumps({"pairs": a.pairs, "order": "ascending" if a.ascending else "longest first",
                      "rss_before_mb": round(start), "rss_after_mb": round(rss_mb()),
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                      "seconds": round(time.perf_counter() - t, 1)}))


if __name__ == "__main__":
    main()
