"""The unlabelled text of a SQuAD file as a pretraining corpus: one JSON line per article, {"title", "text"},
its paragraphs (the contexts) separated by blank lines. Questions and answers are left out.

    python benchmarks/squad_contexts.py ../shared/data/squad/train-v1.1.json runs/squad-train-contexts.jsonl

Task-adaptive pretraining (Gururangan et al. 2020, "Don't Stop Pretraining") continues a model's
pretraining on the task's own unlabelled text; `bertforge pretrain --init MODEL --data OUT.jsonl` does it.
Only a training file's contexts belong here: the dev set's articles are disjoint from the training set's.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("squad", help="a SQuAD v1.1 JSON file (a training file)")
    ap.add_argument("out", help="the JSON-lines corpus to write")
    a = ap.parse_args()
    with open(a.squad, encoding="utf-8") as f:
        data = json.load(f)["data"]
    words = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for article in data:
            text = "\n\n".join(p["context"].strip() for p in article["paragraphs"])
            words += len(text.split())
            f.write(json.dumps({"title": article.get("title", ""), "text": text}) + "\n")
    print(f"{len(data)} articles, {words:,} words -> {a.out}")


if __name__ == "__main__":
    main()
