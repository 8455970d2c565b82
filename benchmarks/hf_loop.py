"""The training loop of the transformers side of the parity runs (``parity_sst2.py``, ``parity_squad.py``):
transformers' example recipe (``run_glue_no_trainer.py``, ``run_qa_no_trainer.py``) in a plain loop, as its
Trainer needs ``accelerate`` (not installed here): AdamW with weight decay 0.01 (none on biases and LayerNorm
weights), a linear schedule with 10% warmup, clipping at 1.0, the examples in a seeded random order, one epoch.
"""

import math
import time

import torch
from transformers import get_linear_schedule_with_warmup


def train_one_epoch(model, features: list, collate, lr: float, batch_size: int, seed: int, log_every: int = 50,
                    epochs: int = 1, after_epoch=None):
    """Train ``model`` for ``epochs`` passes over ``features`` (``collate(list) -> batch dict`` with the labels),
    each in its own seeded order, ``after_epoch(epoch)`` called after each; return (training seconds, optimizer
    steps)."""
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    steps = math.ceil(len(features) / batch_size) * epochs
    sched = get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
    generator = torch.Generator().manual_seed(seed)
    t0, seconds, step = time.perf_counter(), 0.0, 0
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(features), generator=generator).tolist()
        model.train()
        t0 = time.perf_counter()
        for i in range(0, len(order), batch_size):
            loss = model(**collate([features[j] for j in order[i : i + batch_size]])).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if log_every and step % log_every == 0:
                print(f"step {step}/{steps} loss {loss.item():.4f} {time.perf_counter() - t0:.0f} s", flush=True)
            step += 1
        seconds += time.perf_counter() - t0
        if after_epoch is not None:
            after_epoch(epoch)
    return seconds, steps
