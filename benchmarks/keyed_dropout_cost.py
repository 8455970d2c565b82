"""What dropout keyed by sequence costs a CPU pretraining step: the same step (mini, batch 32 x 128, dropout
0.1, the bench's batch) with masks from torch's global generator and keyed by sequence, alternating rounds in
one process, medians compared.  ``--arch modernbert``: a ModernBERT of the preset's size, dropout 0.1 at
every site (its keyed attention dropout runs its own softmax, the unkeyed one SDPA's).

    python benchmarks/keyed_dropout_cost.py [--rounds 9] [--steps 3] [--arch modernbert]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertforge.bench import pretraining_batch
from bertforge.config import ImplConfig, PretrainConfig, PretrainModelConfig, TrainConfig
from bertforge.models import BertConfig
from bertforge.devices import resolve_device, setup_backend
from bertforge.train.engine import Engine
from bertforge.models.initialization import set_dropout
from bertforge.models import BertForPreTraining
from bertforge.models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from bertforge.objectives import MaskedLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--arch", default="bert", choices=["bert", "modernbert"])
    a = ap.parse_args()
    impl = ImplConfig(device="cpu")
    dev = resolve_device(impl)
    setup_backend(dev, impl)
    torch.manual_seed(0)
    if a.arch == "modernbert":
        model = ModernBertForMaskedLM(ModernBertConfig.preset(a.preset)).train()
        set_dropout(model, 0.1)  # as pretraining's --dropout 0.1
    else:
        model = BertForPreTraining(BertConfig.preset(a.preset)).train()  # (its own dropout: 0.1)
    objective = MaskedLM(model, PretrainConfig(model=PretrainModelConfig(arch=a.arch)))
    engine = Engine(objective, TrainConfig(lr=1e-4), impl, dev)
    batch = pretraining_batch(32, 128, 30522)
    batch["sequence_ids"] = torch.arange(32)
    tokens = 32 * 128

    def run(keyed: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            objective.seed = 0 if keyed else None
            engine.step([batch])
        return a.steps * tokens / (time.perf_counter() - t0)

    run(True), run(False)  # warm-up
    rows = []
    for r in range(a.rounds):
        k, g = run(True), run(False)
        rows.append((k, g))
        print(f"round {r + 1}: keyed {k:7.0f} tok/s   global generator {g:7.0f} tok/s   x{k / g:.3f}", flush=True)
    ratio = statistics.median(k / g for k, g in rows)
    print(f"keyed dropout: median {statistics.median(k for k, _ in rows):.0f} tok/s against "
          f"{statistics.median(g for _, g in rows):.0f}; cost {100 * (1 - ratio):.1f}% of the step (median ratio x{ratio:.3f})")


if __name__ == "__main__":
    main()
