"""Arms of the same size at an equal clock on this machine: the classic BERT mini against a ModernBERT of about its
size (the default arms), or BERT pretrained and fine-tuned in fp32 against bf16 (``--arms bert-fp32,bert-bf16``):
the same books, tokenizer and pretraining minutes, then held-out masked-LM accuracy on unseen books (evaluated in
fp32) and SST-2 dev accuracy after the same fine-tuning at several seeds.

    python benchmarks/modern_vs_classic.py --data-dir ../shared/data --out runs/modern-vs-classic
    python benchmarks/modern_vs_classic.py --data-dir ../shared/data --out runs/bf16-s0 --arms bert-fp32,bert-bf16
    python benchmarks/modern_vs_classic.py --data-dir ../shared/data --out runs/dry --dry   # every stage, toy sizes

The stages, each one bertforge command run in this process:

    prepare          the four Gutenberg training shards with bert-base-uncased's vocabulary (all-MiniLM-L6-v2's)
    pretrain-ARM     --preset mini and the arm's flags, the budget recipe, --max-time the minutes, --seed S
    mlm-ARM          evaluate mlm on gutenberg/validation.jsonl (books the pretraining never saw)
    sst2-ARM-K       finetune classify (with the arm's --precision) on the first 20,000 SST-2 training sentences, 1 epoch, batch 32, length
                     64, the default lr for the width, --seed K, scored on sst2/dev.tsv

A stage with a record in OUT/stages/ is skipped (a record of other settings is refused: use another --out); a
training stage killed midway continues from its checkpoint.  OUT/summary.json and OUT/summary.md are rewritten
after every stage.  Run it alone on the machine: the pretraining stages are timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from domain_adaptation import run_command  # noqa: E402
from seed001_cpu import BOOKS, recorded_stage, run_chain, stage_figures, vocabulary  # noqa: E402

# arm -> (its pretraining flags, its fine-tuning flags)
ARMS = {"bert": (["--arch", "bert"], []), "modernbert": (["--arch", "modernbert"], []),
        "bert-fp32": (["--precision", "fp32"], ["--precision", "fp32"]),
        "bert-bf16": (["--precision", "bf16"], ["--precision", "bf16"])}


@dataclasses.dataclass
class Recipe:
    pretrain_minutes: float = 25.0
    preset: str = "mini"
    finetune_seeds: int = 3
    sst2_examples: int = 20_000
    mlm_blocks: int = 2_000  # of 128 tokens, 15% masked: about 38,000 masked tokens
    books: int = 0  # 0: the four training shards; else the first N documents of the first, cut short (--dry)
    pretrain_steps: int = 0  # 0: by the clock (--dry: steps)


DRY = dict(pretrain_minutes=0.2, preset="tiny", finetune_seeds=1, sst2_examples=64, mlm_blocks=8, books=1,
           pretrain_steps=3)
DRY_PRETRAIN = ["--batch-size", "8", "--max-seq-length", "64", "--max-eval-instances", "16"]


@dataclasses.dataclass
class Stage:
    name: str
    argv: list
    out: str | None = None


def stages(out: str, data_dir: str, r: Recipe, seed: int, arms: tuple[str, ...] = ("bert", "modernbert")
           ) -> list[Stage]:
    d = lambda *p: os.path.join(out, *p)  # noqa: E731
    books = [d("books.jsonl")] if r.books else [os.path.join(data_dir, b) for b in BOOKS]
    heldout = d("heldout.jsonl") if r.books else os.path.join(data_dir, "gutenberg", "validation.jsonl")
    clock = ["--max-steps", str(r.pretrain_steps)] if r.pretrain_steps else ["--max-time", f"{r.pretrain_minutes:g}m"]
    clock += DRY_PRETRAIN if r.books else []
    sst2 = os.path.join(data_dir, "sst2")
    found = [Stage("prepare", ["prepare", "--data", *books, "--tokenizer", vocabulary(), "--out", d("prepared"),
                               "--no-progress"], d("prepared"))]
    for arch in arms:
        found.append(Stage(f"pretrain-{arch}", ["pretrain", "--data", d("prepared"), "--out", d(arch), *ARMS[arch][0],
                                                "--preset", r.preset, *clock, "--seed", str(seed), "--no-progress"],
                           d(arch)))
        found.append(Stage(f"mlm-{arch}", ["evaluate", "mlm", "--model", d(arch), "--data", heldout,
                                           "--max-seq-length", "128", "--max-blocks", str(r.mlm_blocks)]))
        for k in range(r.finetune_seeds):
            found.append(Stage(f"sst2-{arch}-{k}", [
                "finetune", "classify", "--model", d(arch), "--train", os.path.join(sst2, "train.tsv"), "--validation",
                os.path.join(sst2, "dev.tsv"), "--out", d(f"sst2-{arch}-{k}"), "--max-train-examples",
                str(r.sst2_examples), "--epochs", "1", "--batch-size", "32", "--max-seq-length", "64", "--seed", str(k),
                *ARMS[arch][1], "--no-progress"], d(f"sst2-{arch}-{k}")))
    return found


def write_books(data_dir: str, out: str, n: int) -> None:
    """(--dry) the first ``n`` documents of the first training shard and of the held-out books, 100 kB each."""
    os.makedirs(out, exist_ok=True)
    for src, name in ((os.path.join(data_dir, BOOKS[0]), "books.jsonl"),
                      (os.path.join(data_dir, "gutenberg", "validation.jsonl"), "heldout.jsonl")):
        with open(src, encoding="utf-8") as f, open(os.path.join(out, name), "w", encoding="utf-8") as g:
            for _, line in zip(range(n), f):
                g.write(json.dumps({"text": json.loads(line)["text"][:100_000]}) + "\n")


def run_stage(st: Stage, out: str) -> dict:
    """Run ``st`` unless its record exists; its record (the stage's figures and minutes)."""
    def work(wanted: list[str]) -> dict:
        stdout = run_command(st.name, wanted, st.out, os.path.join(out, "logs"))
        return stage_figures(st, stdout, st.name.startswith("mlm-"))

    return recorded_stage(out, st.name, st.argv, work)


def summary(records: dict[str, dict], r: Recipe, seed: int, arms_run: tuple[str, ...]) -> dict:
    arms = {}
    for arch in arms_run:
        pre = records.get(f"pretrain-{arch}", {}).get("result", {})
        mlm = records.get(f"mlm-{arch}", {}).get("result", {})
        acc = [records[k]["result"]["accuracy"] for k in sorted(records) if k.startswith(f"sst2-{arch}-")]
        arms[arch] = {"parameters": pre.get("parameters"), "steps": pre.get("steps"),
                      "tokens_seen": pre.get("tokens_seen"), "tokens_per_second": pre.get("tokens_per_second"),
                      "heldout_mlm_accuracy": mlm.get("mlm_accuracy"), "heldout_mlm_loss": mlm.get("mlm_loss"),
                      "sst2_accuracy": acc, "sst2_mean": statistics.mean(acc) if acc else None,
                      "sst2_sd": statistics.stdev(acc) if len(acc) > 1 else None}
    return {"seed": seed, "recipe": dataclasses.asdict(r), "arms": arms, "stages": records}


def markdown(s: dict) -> str:
    lines = ["| arm | parameters | pretraining steps, tokens | held-out MLM accuracy / loss | SST-2 dev accuracy "
             "(seeds) | mean (sd) |", "|---|---|---|---|---|---|"]
    for arch, a in s["arms"].items():
        if a["heldout_mlm_accuracy"] is None:
            continue
        accs = ", ".join(f"{x:.3f}" for x in a["sst2_accuracy"])
        mean = f"{a['sst2_mean']:.3f}" + (f" ({a['sst2_sd']:.3f})" if a["sst2_sd"] is not None else "") \
            if a["sst2_mean"] is not None else ""
        lines.append(f"| {arch} | {a['parameters'] / 1e6:.1f} M | {a['steps']}, {a['tokens_seen']:,} | "
                     f"{a['heldout_mlm_accuracy']:.4f} / {a['heldout_mlm_loss']:.3f} | {accs} | {mean} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0, help="the pretraining runs' seed (fine-tuning: 0, 1, ...)")
    p.add_argument("--dry", action="store_true", help="every stage at toy sizes")
    p.add_argument("--pretrain-minutes", type=float)
    p.add_argument("--preset")
    p.add_argument("--finetune-seeds", type=int)
    p.add_argument("--arms", default="bert,modernbert", help=f"comma-separated, of {', '.join(ARMS)}")
    a = p.parse_args(argv)
    arms = tuple(a.arms.split(","))
    if not arms or not set(arms) <= set(ARMS):
        p.error(f"--arms: each of {', '.join(ARMS)}")
    r = Recipe(**(DRY if a.dry else {}))
    for name in ("pretrain_minutes", "preset", "finetune_seeds"):
        if getattr(a, name) is not None:
            setattr(r, name, getattr(a, name))
    out, data_dir = os.path.abspath(a.out), os.path.abspath(a.data_dir)
    if r.books:
        write_books(data_dir, out, r.books)
    return run_chain(out, stages(out, data_dir, r, a.seed, arms), lambda st: run_stage(st, out),
                     lambda records: summary(records, r, a.seed, arms), markdown)


if __name__ == "__main__":
    sys.exit(main())
