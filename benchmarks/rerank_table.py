"""Retrieve, then rerank, on SQuAD: BM25's top 20 reordered by a cross-encoder fine-tuned by bertforge.

    python benchmarks/rerank_table.py prepare --data-dir ../shared/data --out runs/rerank
    python benchmarks/rerank_table.py train --out runs/rerank --model MODEL --name NAME [--seed 0] [--minutes 30]
    python benchmarks/rerank_table.py score --out runs/rerank --model runs/rerank/NAME [--data dev|hard|heldout]

``prepare`` writes, from ``squad/train-v1.1.json`` and ``squad/dev-v1.1.json``:
- ``train.json``: every paragraph of the training articles (train-v1.1.json without its last five articles, as
  the seed chain sets them aside, and without the *hard* split's articles), with ``--questions`` of their
  questions drawn at random (seed 0); the paragraphs are the corpus the negatives are mined from;
- ``heldout.json``: the five set-aside articles, to choose settings on (the dev articles never are);
- ``hard-1k.json``: the *hard* split of RESULTS.md's retrieval table (the first 40 articles of train-v1.1.json
  outside train-8k: every paragraph) with a fixed sample of 1,000 of its questions, whose ids are
  ``benchmarks/rerank_hard_ids.txt`` (written once, then read);
- ``dev``: ``squad/dev-v1.1.json`` itself (5 articles of the official dev set, 1,032 questions).

``train`` runs ``bertforge finetune rerank`` on train.json by the clock (``--minutes``, whole run), validating on
200 held-out questions; ``score`` runs ``bertforge evaluate rerank`` (BM25's top 20) and appends its JSON line to
OUT/scores.jsonl.  Each command is printed before it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HARD_IDS = os.path.join(HERE, "rerank_hard_ids.txt")
HELD_OUT_ARTICLES, HARD_ARTICLES, HARD_SAMPLE = 5, 40, 1000


def _write(path: str, articles: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": articles}, f)


def _keep(articles: list[dict], ids: set[str]) -> list[dict]:
    """The articles with every paragraph, and only the questions of ``ids``."""
    return [{"title": a["title"], "paragraphs": [{"context": p["context"], "qas": [q for q in p["qas"] if q["id"] in ids]}
                                                 for p in a["paragraphs"]]} for a in articles]


def prepare(a) -> None:
    squad = os.path.join(a.data_dir, "squad")
    with open(os.path.join(squad, "train-v1.1.json"), encoding="utf-8") as f:
        train = json.load(f)["data"]
    with open(os.path.join(squad, "train-8k-v1.1.json"), encoding="utf-8") as f:
        small = {x["title"] for x in json.load(f)["data"]}
    held, rest = train[-HELD_OUT_ARTICLES:], train[:-HELD_OUT_ARTICLES]
    hard = [x for x in train if x["title"] not in small][:HARD_ARTICLES]
    hard_titles = {x["title"] for x in hard}
    assert not hard_titles & {x["title"] for x in held}
    ids = [q["id"] for x in hard for p in x["paragraphs"] for q in p["qas"]]
    if not os.path.isfile(HARD_IDS):
        with open(HARD_IDS, "w", encoding="utf-8") as f:
            f.write("\n".join(sorted(random.Random(0).sample(ids, HARD_SAMPLE))) + "\n")
    sample = set(open(HARD_IDS, encoding="utf-8").read().split())
    assert len(sample) == HARD_SAMPLE and sample <= set(ids), "rerank_hard_ids.txt does not fit the hard split"
    articles = [x for x in rest if x["title"] not in hard_titles]
    questions = [q["id"] for x in articles for p in x["paragraphs"] for q in p["qas"]]
    chosen = set(random.Random(0).sample(questions, min(a.questions, len(questions))))
    os.makedirs(a.out, exist_ok=True)
    _write(os.path.join(a.out, "train.json"), _keep(articles, chosen))
    _write(os.path.join(a.out, "heldout.json"), held)
    _write(os.path.join(a.out, "hard-1k.json"), _keep(hard, sample))
    print(json.dumps({"train_articles": len(articles), "train_questions": len(chosen),
                      "train_paragraphs": sum(len(x["paragraphs"]) for x in articles),
                      "heldout_articles": [x["title"] for x in held], "hard_articles": len(hard),
                      "hard_questions": len(ids), "hard_sample": len(sample)}))


def _run(cmd: list[str]) -> float:
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def train(a) -> None:
    out = os.path.join(a.out, a.name)
    seconds = _run([sys.executable, "-m", "bertforge", "finetune", "rerank", "--model", a.model, "--train",
                    os.path.join(a.out, "train.json"), "--validation", os.path.join(a.out, "heldout.json"),
                    "--max-eval-samples", str(a.eval_samples), "--out", out, "--max-time", f"{a.minutes:g}m", "--seed", str(a.seed),
                    "--lr", str(a.lr), "--batch-size", str(a.batch_size), "--no-progress", "--overwrite", *a.extra])
    print(json.dumps({"model": out, "wall_seconds": round(seconds, 1)}))


def score(a) -> None:
    data = {"dev": os.path.join(a.data_dir, "squad", "dev-v1.1.json"), "hard": os.path.join(a.out, "hard-1k.json"),
            "heldout": os.path.join(a.out, "heldout.json")}
    for name in a.data:
        r = subprocess.run([sys.executable, "-m", "bertforge", "--quiet", "evaluate", "rerank", "--model", a.model,
                            "--data", data[name], "--top-k", "20"], check=True, capture_output=True, text=True)
        row = {"model": a.model, "data": name, **json.loads(r.stdout)}
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "scores.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--questions", type=int, default=20000)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True)
    t.add_argument("--model", required=True)
    t.add_argument("--name", required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--minutes", type=float, default=30)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--eval-samples", type=int, default=100, help="held-out questions validated on")
    t.add_argument("extra", nargs="*", help="more flags of finetune rerank (after --)")
    s = sub.add_parser("score")
    s.add_argument("--out", required=True)
    s.add_argument("--data-dir", default=os.path.join(HERE, "..", "..", "shared", "data"))
    s.add_argument("--model", required=True)
    s.add_argument("--data", nargs="+", default=["dev", "hard"], choices=("dev", "hard", "heldout"))
    a = ap.parse_args()
    {"prepare": prepare, "train": train, "score": score}[a.command](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
