"""The transformers side of the SST-2 parity run (issue 16): the same recipe as

    bertforge finetune classify --model M --train sst2/train.tsv --validation sst2/dev.tsv --out OUT \
        --max-train-examples 20000 --epochs 1 --batch-size 32 --lr 5e-5 --max-seq-length 64 --seed S

in transformers' own classes, as its ``run_glue_no_trainer.py`` example trains (its Trainer needs ``accelerate``,
not installed here): ``BertForSequenceClassification`` from M, the first 20,000 training sentences in random
order (seeded), each batch padded to its longest sentence (``DataCollatorWithPadding``), AdamW (weight decay
0.01, none on biases and LayerNorm weights), linear schedule with 10% warmup, clipping at 1.0; then accuracy on
``sst2/dev.tsv``.  Prints one JSON line.

    python benchmarks/parity_sst2.py MODEL_DIR DATA_DIR [--seed S]
"""

import argparse
import json
import os

import torch
from hf_loop import train_one_epoch
from transformers import AutoTokenizer, BertForSequenceClassification, DataCollatorWithPadding


def read_tsv(path, limit=None):
    rows = [line.split("\t") for line in open(path, encoding="utf-8").read().splitlines()[1:]]
    return [(s, int(y)) for s, y in rows[:limit]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=20000)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = BertForSequenceClassification.from_pretrained(a.model, num_labels=2, attn_implementation="sdpa")
    train = read_tsv(os.path.join(a.data, "sst2", "train.tsv"), a.examples)
    dev = read_tsv(os.path.join(a.data, "sst2", "dev.tsv"))
    enc = lambda rows: [{**tok(s, truncation=True, max_length=a.max_length), "labels": y} for s, y in rows]  # noqa: E731
    f_train, f_dev = enc(train), enc(dev)
    collate = DataCollatorWithPadding(tok)
    train_seconds, steps = train_one_epoch(model, f_train, collate, a.lr, a.batch_size, a.seed, log_every=0)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(f_dev), 64):
            batch = collate(f_dev[i : i + 64])
            correct += int((model(**batch).logits.argmax(-1) == batch["labels"]).sum())
    print(json.dumps({"tool": "transformers", "seed": a.seed, "accuracy": correct / len(f_dev), "train_seconds": train_seconds,
                      "steps": steps}))


if __name__ == "__main__":
    main()
