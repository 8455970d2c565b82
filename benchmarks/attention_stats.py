"""Where a BERT's attention heads look: per layer and head, the attention entropy (uniform over T tokens is
log T) and the mean weight on the previous and on the next token (uniform: 1/T), over the first blocks of
held-out text.  A masked LM still on the most-frequent-token plateau has every head near uniform; one that
has left it has heads that look at a neighbour.  Reads the model with transformers (eager attention).

    python benchmarks/attention_stats.py MODEL_DIR ../shared/data/gutenberg/validation.jsonl [--blocks 4]
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from transformers import BertModel, BertTokenizerFast
from transformers.utils import logging


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("data", help="JSON lines with a 'text' field")
    ap.add_argument("--blocks", type=int, default=4, help="documents to read one 128-token block from")
    ap.add_argument("--max-seq-length", type=int, default=128)
    args = ap.parse_args()
    logging.set_verbosity_error()
    tok = BertTokenizerFast.from_pretrained(args.model)
    model = BertModel.from_pretrained(args.model, attn_implementation="eager", add_pooling_layer=False).eval()
    ent = prev = nxt = None
    with open(args.data, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(args.blocks), f)]
    for text in texts:
        body = text[len(text) // 10:]  # past the front matter
        enc = tok(body, return_tensors="pt", truncation=True, max_length=args.max_seq_length)
        with torch.no_grad():
            att = model(**enc, output_attentions=True).attentions  # per layer (1, nh, T, T)
        a = torch.stack([x[0] for x in att])  # (L, nh, T, T)
        T = a.shape[-1]
        e = -(a * a.clamp_min(1e-12).log()).sum(-1).mean(-1)  # (L, nh)
        p = a.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)  # (L, nh): query i, key i-1
        n = a.diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)  # query i, key i+1
        ent, prev, nxt = (e, p, n) if ent is None else (ent + e, prev + p, nxt + n)
    k = len(texts)
    print(f"uniform: entropy {math.log(T):.2f} nats, weight {1 / T:.4f}")
    for layer in range(ent.shape[0]):
        fmt = lambda t, d: " ".join(f"{x:.{d}f}" for x in (t[layer] / k).tolist())  # noqa: E731
        print(f"layer {layer}: entropy {fmt(ent, 2)} | previous {fmt(prev, 3)} | next {fmt(nxt, 3)}")


if __name__ == "__main__":
    main()
