"""bf16 inference against fp32 on a CPU: the same fine-tuned folders through ``--backend torch`` and
``--backend torch-bf16`` (bf16 autocast), every dev example of the task, alternating passes: the share of
examples whose prediction is the fp32 one, each backend's score, and the speed-up (the median of the passes).

    python benchmarks/bf16_inference.py --data-dir ../shared/data qa=runs/onnx/squad classify=runs/onnx/sst2

``qa``: SQuAD dev (the answer text compared, F1 by the official script); ``classify``: SST-2 dev (the label).
One JSON line per folder on stdout.  Run it alone on the machine: the passes are timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from bertforge import pipeline
from bertforge.evaluation import squad_evaluate
from bertforge.tasks.squad import read_examples

BACKENDS = ("torch", "torch-bf16")


def _passes(run, rounds: int) -> tuple[dict, dict]:
    """(backend -> its outputs, backend -> its pass seconds), ``rounds`` passes of each, alternating."""
    outputs, seconds = {}, {b: [] for b in BACKENDS}
    for _ in range(rounds):
        for b in BACKENDS:
            t0 = time.perf_counter()
            outputs[b] = run(b)
            seconds[b].append(time.perf_counter() - t0)
    return outputs, seconds


def qa(folder: str, data_dir: str, rounds: int) -> dict:
    path = os.path.join(data_dir, "squad", "dev-v1.1.json")
    examples, dataset = read_examples(path)
    pipes = {b: pipeline("qa", model=folder, backend=b) for b in BACKENDS}
    outputs, seconds = _passes(lambda b: pipes[b](examples=examples), rounds)
    same = sum(outputs["torch"][k] == outputs["torch-bf16"][k] for k in outputs["torch"])
    return {"examples": len(examples), "same_answer": same / len(examples),
            **{f"{b}_f1": squad_evaluate(dataset, outputs[b])["f1"] for b in BACKENDS}, **_speed(seconds)}


def classify(folder: str, data_dir: str, rounds: int) -> dict:
    with open(os.path.join(data_dir, "sst2", "dev.tsv"), encoding="utf-8") as f:
        rows = [line.split("\t") for line in f.read().splitlines()[1:]]
    texts, gold = [r[0] for r in rows], [r[1] for r in rows]
    pipes = {b: pipeline("classify", model=folder, backend=b) for b in BACKENDS}
    outputs, seconds = _passes(lambda b: [o["label"] for o in pipes[b](texts)], rounds)
    label = pipes["torch"].config.id2label
    wanted = [label.get(int(g), g) if g.isdigit() else g for g in gold]
    return {"examples": len(texts), "same_answer": sum(a == b for a, b in zip(*outputs.values())) / len(texts),
            **{f"{b}_accuracy": sum(p == g for p, g in zip(outputs[b], wanted)) / len(texts) for b in BACKENDS},
            **_speed(seconds)}


def _speed(seconds: dict) -> dict:
    med = {b: statistics.median(v) for b, v in seconds.items()}
    return {**{f"{b}_seconds": round(v, 2) for b, v in med.items()},
            "bf16_speedup": round(med["torch"] / med["torch-bf16"], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", metavar="TASK=FOLDER", help="qa=FOLDER or classify=FOLDER")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for item in a.folders:
        task, folder = item.split("=", 1)
        res = {"qa": qa, "classify": classify}[task](folder, a.data_dir, a.rounds)
        print(json.dumps({"task": task, "folder": folder, "threads": torch.get_num_threads(), **res}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
