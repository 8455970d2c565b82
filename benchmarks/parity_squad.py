"""The transformers side of the SQuAD parity run (issue 16): the same recipe as

    bertforge finetune squad --model M --train squad/train-8k-v1.1.json --validation squad/dev-v1.1.json \
        --out OUT --epochs 1 --batch-size 16 --lr 1e-4 --max-seq-length 384 --doc-stride 128 --seed S

in transformers' own classes, as its ``run_qa.py`` / ``run_qa_no_trainer.py`` examples train (the Trainer needs
``accelerate``, not installed here): ``BertForQuestionAnswering`` from M; each question and its context cut into
windows of 384 tokens with 128 tokens of overlap (``truncation="only_second"``, ``return_overflowing_tokens``),
padded to 384 as ``run_qa.py`` does by default (``--pad-to-longest`` pads each batch to its longest window
instead); a window whose context does not hold the answer points at [CLS]; the windows in random order (seeded);
AdamW (weight decay 0.01, none on biases and LayerNorm weights), linear schedule with 10% warmup, clipping at
1.0, one epoch (``hf_loop.py``). Then the dev predictions with ``run_qa.py``'s post-processing (the 20 best starts and ends of
every window, spans inside the context of at most 30 tokens, the best start + end logit over the windows of a
question), scored with the official SQuAD v1.1 exact match and F1. Prints one JSON line.

    python benchmarks/parity_squad.py MODEL_DIR DATA_DIR [--seed S] [--predictions FILE]
"""

import argparse
import json
import os

import numpy as np
import torch
from hf_loop import train_one_epoch
from transformers import AutoTokenizer, BertForQuestionAnswering


def read_squad(path, limit=None):
    examples, articles = [], json.load(open(path, encoding="utf-8"))["data"]
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                examples.append({"id": qa["id"], "question": qa["question"].lstrip(), "context": paragraph["context"],
                                 "answers": qa["answers"]})
    return examples[:limit], articles


def windows(tok, examples, a, train):
    enc = tok([e["question"] for e in examples], [e["context"] for e in examples], truncation="only_second",
              max_length=a.max_length, stride=a.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True)
    feats = []
    for i in range(len(enc["input_ids"])):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        offsets = [o if s == 1 else None for o, s in zip(enc["offset_mapping"][i], seq)]
        f = {"input_ids": enc["input_ids"][i], "token_type_ids": enc["token_type_ids"][i],
             "attention_mask": enc["attention_mask"][i], "example": ex, "offsets": offsets}
        if train:
            answer = ex["answers"][0]
            start_char, end_char = answer["answer_start"], answer["answer_start"] + len(answer["text"])
            ctx = [k for k, s in enumerate(seq) if s == 1]
            f["start_positions"] = f["end_positions"] = 0  # [CLS]: the answer is not in this window
            if offsets[ctx[0]][0] <= start_char and offsets[ctx[-1]][1] >= end_char:
                f["start_positions"] = max(k for k in ctx if offsets[k][0] <= start_char)
                f["end_positions"] = min(k for k in ctx if offsets[k][1] >= end_char)
        feats.append(f)
    return feats


def collate(feats, keys, length):
    """Pad every window to ``length`` (run_qa.py's default: --max-length), or to the batch's longest (None)."""
    n = length or max(len(f["input_ids"]) for f in feats)
    pad = lambda v: v + [0] * (n - len(v)) if isinstance(v, list) else v  # noqa: E731  ([PAD] is id 0)
    return {k: torch.tensor([pad(f[k]) for f in feats]) for k in keys}


def postprocess(feats, starts, ends, n_best=20, max_answer=30):
    best = {}
    for f, s_logits, e_logits in zip(feats, starts, ends):
        offsets, qid = f["offsets"], f["example"]["id"]
        for s in np.argsort(s_logits)[-1 : -n_best - 1 : -1]:
            for e in np.argsort(e_logits)[-1 : -n_best - 1 : -1]:
                if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                    continue
                if e < s or e - s + 1 > max_answer:
                    continue
                score = s_logits[s] + e_logits[e]
                if qid not in best or score > best[qid][0]:
                    best[qid] = (score, f["example"]["context"][offsets[s][0] : offsets[e][1]])
    return {f["example"]["id"]: best.get(f["example"]["id"], (0, ""))[1] for f in feats}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train", default="squad/train-8k-v1.1.json")
    ap.add_argument("--validation", default="squad/dev-v1.1.json")
    ap.add_argument("--examples", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=384)
    ap.add_argument("--doc-stride", type=int, default=128)
    ap.add_argument("--pad-to-longest", action="store_true")
    ap.add_argument("--predictions", help="write the dev predictions (JSON) here")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = BertForQuestionAnswering.from_pretrained(a.model, attn_implementation="sdpa")
    train, _ = read_squad(os.path.join(a.data, a.train), a.examples)
    dev, dev_articles = read_squad(os.path.join(a.data, a.validation))
    f_train, f_dev = windows(tok, train, a, True), windows(tok, dev, a, False)
    keys = ("input_ids", "token_type_ids", "attention_mask")
    length = None if a.pad_to_longest else a.max_length
    labelled = keys + ("start_positions", "end_positions")
    train_seconds, steps = train_one_epoch(model, f_train, lambda fs: collate(fs, labelled, length), a.lr, a.batch_size,
                                           a.seed)
    model.eval()
    starts, ends = [], []
    with torch.no_grad():
        for i in range(0, len(f_dev), 64):
            out = model(**collate(f_dev[i : i + 64], keys, length))
            starts += list(out.start_logits.numpy())
            ends += list(out.end_logits.numpy())
    predictions = postprocess(f_dev, starts, ends)
    if a.predictions:
        json.dump(predictions, open(a.predictions, "w"))
    from bertforge.evaluation import squad_evaluate  # the official v1.1 exact match and F1

    scores = squad_evaluate(dev_articles, predictions)
    print(json.dumps({"tool": "transformers", "seed": a.seed, **scores, "train_seconds": train_seconds, "steps": steps,
                      "windows": len(f_train)}))


if __name__ == "__main__":
    main()
