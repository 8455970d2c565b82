"""Domain adaptation (issue 38): a mini BERT pretrained from scratch on Gutenberg books, then

  (a)   continued on IMDB review text,
  (b)   continued on more books for the same steps and batch size as (a) (equal compute),
  (c)   not continued,
  (a+v) (a) with ``--add-vocab N`` (accuracy only: its masked-LM loss is over another vocabulary),

each fine-tuned on the same 2,000 labelled reviews with three seeds and scored on 5,000 other reviews that no
step has seen, with (a)-(c)'s masked-LM loss on those 5,000 reviews.  Length 128 throughout.

    python benchmarks/domain_adaptation.py --data-dir ../shared/data --out runs/dapt          # the chain
    python benchmarks/domain_adaptation.py --plan                                              # estimated minutes
    python benchmarks/domain_adaptation.py --data-dir ../shared/data --out runs/dapt-dry --dry  # toy sizes

The split, fixed: ``imdb/train.jsonl`` in file order (the file is shuffled as shipped), each exact duplicate
text dropped after its first occurrence; the first 2,000 reviews are the labelled fine-tuning set, the next
5,000 the held-out set, the rest (labels dropped) the continuation text.  The books: ``gutenberg/train-000``
for the model from scratch, ``train-001`` (other books) for (b), ``validation`` for the runs' own evaluation.

Every stage is one bertforge command (run in this process) and leaves a record in OUT/stages/; a stage with a
record is skipped (a record of another command is refused: use another --out), and a training stage killed
midway continues from its checkpoint, so a killed chain, run again, continues where it stopped.  Fine-tuning
keeps its last weights: nothing is chosen on the held-out reviews.  OUT/results.json and OUT/results.md (mean,
min and max over the seeds, the commands) are rewritten after every stage.  Should (a) not win, ``--try``
adds arms: doubled ((a) and (b) at twice the steps), lr-screen ((a) and (b) at 3e-5, 1e-4 and 3e-4),
labelled-text (continued on the 2,000 labelled reviews' text only, against (b)).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shlex
import shutil
import sys
import time
import traceback

SEQ = 128
LR_SCREEN = (3e-4, 1e-4, 3e-5)  # the largest first: the rate likeliest to move a model in few steps
TRIES = ("doubled", "lr-screen", "labelled-text")
LIMIT_MINUTES = 120
# Rates of a mini at length 128 on this machine's two cores, for the plan: training as RESULTS.md's speed tables
# have it for pretraining (fine-tuning, without the masked-LM head, is no slower); the plan rescales both model
# rates by a finished pretraining stage's own tokens/s.
TRAIN_TOKENS_PER_S = 3900.0
INFER_TOKENS_PER_S = 12000.0  # a forward pass only: about a third of a training step's work
TOKENIZE_BYTES_PER_S = 2.0e6  # the pretraining cache's build
VOCAB_BYTES_PER_S = 4.0e6  # training a WordPiece vocabulary
STAGE_OVERHEAD_S = 15.0  # per stage: loading, the final evaluation, saving, plots (a mini's, not a dry run's)


class UserError(Exception):
    """Bad input: one ``error:`` line, exit status 2."""


class StageFailed(Exception):
    """A bertforge command that failed: one ``error:`` line, its exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass
class Sizes:
    """What the chain runs; ``--dry`` replaces these by toy sizes (DRY), flags by their own values."""

    labelled: int = 2000
    heldout: int = 5000
    unlabelled: int = 0  # 0: all the rest
    preset: str = "mini"
    vocab_size: int = 16000
    base_steps: int = 1600
    cont_steps: int = 500
    batch_size: int = 32
    epochs: int = 3
    seeds: tuple = (0, 1, 2)
    add_vocab: int = 2000
    mlm_blocks: int = 4000
    eval_instances: int = 256
    save_every: int = 250
    book_chars: int = 0  # 0: whole books; else the books are sliced to this many characters each (--dry)
    stage_seconds: float = STAGE_OVERHEAD_S  # the plan's fixed cost of a stage


DRY = dict(labelled=40, heldout=40, unlabelled=120, preset="tiny", vocab_size=400, base_steps=4, cont_steps=2,
           batch_size=8, epochs=1, add_vocab=20, mlm_blocks=16, eval_instances=16, save_every=2, book_chars=20000,
           stage_seconds=0.5)


@dataclasses.dataclass(frozen=True)
class Arm:
    """A model that is fine-tuned and scored: the base model, or a continuation of it."""

    key: str
    text: str | None = None  # the continuation text: imdb, books or labelled; None: the base model, as it is
    steps: int = 0
    lr: float | None = None  # None: the recipe's
    add_vocab: int = 0

    @property
    def model(self) -> str:
        if self.text is None:
            return "base"
        vocab = f"-vocab{self.add_vocab}" if self.add_vocab else ""
        lr = f"-lr{self.lr:g}" if self.lr is not None else ""
        return f"cont-{self.text}{vocab}-{self.steps}{lr}"

    @property
    def label(self) -> str:
        if self.text is None:
            return "no continuation"
        what = {"imdb": "IMDB reviews", "books": "more Gutenberg books", "labelled": "the labelled reviews' text"}
        extra = (f", lr {self.lr:g}" if self.lr is not None else "") + (
            f", --add-vocab {self.add_vocab}" if self.add_vocab else "")
        return f"continued on {what[self.text]}{extra}"

    @property
    def mlm(self) -> bool:
        """Its held-out masked-LM loss compares with the others' (the same vocabulary)."""
        return not self.add_vocab


@dataclasses.dataclass
class Stage:
    name: str
    kind: str  # split, books, pretrain, mlm, finetune, accuracy
    argv: list  # bertforge's arguments; for split and books, what decides their output
    out: str | None = None  # a training stage's output folder (resumed or replaced when its record is missing)
    work: dict = dataclasses.field(default_factory=dict)  # what the plan estimates from


# ------------------------------------------------------------------------------------------------ recipe
def recipe_lr() -> float:
    """The learning rate of the continued-pretraining recipe, which the continuations run."""
    from bertforge.config import RECIPES

    return RECIPES["continue"]["lr"]


# ------------------------------------------------------------------------------------------------ data
def read_reviews(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise UserError(f"IMDB reviews not found: {path} (--data-dir is the data sets' folder)")
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text, label = row["text"], row["label"]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path}:{n}: not a JSON line with \"text\" and \"label\"") from None
            if not isinstance(text, str) or label not in (0, 1):
                raise UserError(f"{path}:{n}: \"text\" must be a string and \"label\" 0 or 1")
            rows.append({"text": text, "label": label})
    return rows


def split_reviews(rows: list[dict], labelled: int, heldout: int, unlabelled: int = 0) -> dict[str, list[dict]]:
    """The fixed rule: file order, exact duplicates dropped after their first occurrence, then the first
    ``labelled`` reviews, the next ``heldout``, and the rest (or the next ``unlabelled``) without labels."""
    seen, unique = set(), []
    for row in rows:
        if row["text"] not in seen:
            seen.add(row["text"])
            unique.append(row)
    rest = unique[labelled + heldout:]
    if unlabelled:
        rest = rest[:unlabelled]
    if not rest:
        raise UserError(f"{len(unique)} distinct reviews: too few for {labelled} labelled, {heldout} held out "
                        "and some continuation text")
    return {"labelled": unique[:labelled], "heldout": unique[labelled:labelled + heldout],
            "unlabelled": [{"text": r["text"]} for r in rest]}


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_split(src: str, folder: str, s: Sizes) -> dict:
    """Write the three splits and split.json into ``folder``, whole or not at all; returns the manifest."""
    parts = split_reviews(read_reviews(src), s.labelled, s.heldout, s.unlabelled)
    tmp = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    manifest = {"source": src, "source_sha256": sha256(src), "rule": "file order, exact duplicates dropped after "
                f"their first occurrence; first {s.labelled} labelled, next {s.heldout} held out, the rest "
                "(labels dropped) continuation text", "files": {}}
    for name, part in parts.items():
        path = os.path.join(tmp, f"{name}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
        positive = sum(r["label"] for r in part) if name != "unlabelled" else None
        manifest["files"][name] = {"reviews": len(part), "positive": positive,
                                   "bytes": os.path.getsize(path), "sha256": sha256(path)}
    write_json(os.path.join(tmp, "split.json"), manifest)
    replace_folder(tmp, folder)
    return manifest


def write_book_slices(data_dir: str, folder: str, chars: int) -> dict:
    """--dry: the first books of each Gutenberg file the chain reads, each cut to ``chars`` characters."""
    tmp = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(tmp)
    counts = {}
    for name, books in (("train-000", 6), ("train-001", 6), ("validation", 3)):
        src = os.path.join(data_dir, "gutenberg", f"{name}.jsonl")
        with open(src, encoding="utf-8") as f, open(os.path.join(tmp, f"{name}.jsonl"), "w", encoding="utf-8") as g:
            lines = [line for _, line in zip(range(books), f)]
            g.writelines(json.dumps({"text": json.loads(line)["text"][:chars]}) + "\n" for line in lines)
        counts[name] = len(lines)
    replace_folder(tmp, folder)
    return {"books": counts, "chars_each": chars}


def replace_folder(tmp: str, folder: str) -> None:
    """Put ``tmp`` in the place of ``folder``: one left by a run killed before its stage's record was written."""
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: str, obj) -> None:
    """Write ``obj`` as JSON to ``path`` whole or not at all."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ the stages
def arms(s: Sizes, tries: list[str]) -> list[Arm]:
    """(a), (b), (c), (a+v), then the arms of ``tries``.  A screened learning rate equal to the recipe's is
    the main arm itself (the same model and stages), not a second run of it."""
    n = s.cont_steps
    out = [Arm("a", "imdb", n), Arm("b", "books", n), Arm("c"), Arm("a+v", "imdb", n, add_vocab=s.add_vocab)]
    if "doubled" in tries:
        out += [Arm("a-x2", "imdb", 2 * n), Arm("b-x2", "books", 2 * n)]
    if "lr-screen" in tries:
        default = recipe_lr()
        for lr in LR_SCREEN:
            for key, text in (("a", "imdb"), ("b", "books")):
                out.append(Arm(f"{key}-lr{lr:g}", text, n, None if lr == default else lr))
    if "labelled-text" in tries:
        out.append(Arm("a-labelled", "labelled", n))
    return out


def corpus_paths(out: str, data_dir: str, s: Sizes) -> dict[str, str]:
    books = os.path.join(out, "books") if s.book_chars else os.path.join(data_dir, "gutenberg")
    splits = os.path.join(out, "splits")
    return {"base": os.path.join(books, "train-000.jsonl"), "books": os.path.join(books, "train-001.jsonl"),
            "eval": os.path.join(books, "validation.jsonl"), "imdb": os.path.join(splits, "unlabelled.jsonl"),
            "labelled": os.path.join(splits, "labelled.jsonl"), "heldout": os.path.join(splits, "heldout.jsonl")}


def pretrain_argv(arm: Arm, out: str, c: dict, s: Sizes) -> list[str]:
    common = ["--eval-data", c["eval"], "--max-seq-length", str(SEQ), "--batch-size", str(s.batch_size),
              "--eval-every", "0", "--save-every", str(s.save_every), "--max-eval-instances", str(s.eval_instances),
              "--seed", "0", "--no-progress"]
    if arm.text is None:  # from scratch, the budget recipe, a vocabulary trained on the books
        return ["pretrain", "--recipe", "budget", "--data", c["base"], "--out", os.path.join(out, "base"),
                "--preset", s.preset, "--vocab-size", str(s.vocab_size), "--max-steps", str(s.base_steps), *common]
    argv = ["pretrain", "--init", os.path.join(out, "base"), "--recipe", "continue", "--data", c[arm.text],
            "--out", os.path.join(out, arm.model), "--max-steps", str(arm.steps), *common]
    if arm.lr is not None:
        argv += ["--lr", f"{arm.lr:g}"]
    if arm.add_vocab:
        argv += ["--add-vocab", str(arm.add_vocab)]
    return argv


def build_stages(out: str, data_dir: str, s: Sizes, chosen: list[Arm]) -> list[Stage]:
    """Every stage in the order it runs: (a) and (b) whole first, so that the comparison the chain exists for
    is complete earliest."""
    c = corpus_paths(out, data_dir, s)
    src = os.path.join(data_dir, "imdb", "train.jsonl")
    stages = [Stage("split", "split", ["split", src, s.labelled, s.heldout, s.unlabelled],
                    work={"bytes": size_of(src)})]
    if s.book_chars:
        stages.append(Stage("books", "books", ["books", data_dir, s.book_chars]))
    books = size_of(c["base"])  # the model from scratch trains its vocabulary on them too
    stages.append(Stage("pretrain-base", "pretrain", pretrain_argv(Arm("c"), out, c, s),
                        os.path.join(out, "base"), {"steps": s.base_steps, "bytes": books, "vocab_bytes": books}))
    for arm in chosen:
        model = os.path.join(out, arm.model)
        if arm.text is not None:
            text_bytes = corpus_bytes(arm.text, c, src, s)
            stages.append(Stage(f"pretrain-{arm.model}", "pretrain", pretrain_argv(arm, out, c, s), model,
                                {"steps": arm.steps, "bytes": text_bytes,
                                 "vocab_bytes": text_bytes if arm.add_vocab else 0}))
        if arm.mlm:
            stages.append(Stage(f"mlm-{arm.model}", "mlm", [
                "evaluate", "mlm", "--model", model, "--data", c["heldout"], "--max-seq-length", str(SEQ),
                "--seed", "0", "--max-blocks", str(s.mlm_blocks)], work={"blocks": s.mlm_blocks}))
        for seed in s.seeds:
            ft = os.path.join(out, "finetune", f"{arm.model}-s{seed}")
            stages.append(Stage(f"finetune-{arm.model}-s{seed}", "finetune", [
                "finetune", "classify", "--model", model, "--train", c["labelled"], "--out", ft,
                "--max-seq-length", str(SEQ), "--batch-size", str(s.batch_size), "--epochs", str(s.epochs),
                "--seed", str(seed), "--no-progress"], ft, {"examples": s.labelled * s.epochs}))
            stages.append(Stage(f"accuracy-{arm.model}-s{seed}", "accuracy", [
                "evaluate", "classify", "--model", ft, "--data", c["heldout"], "--max-seq-length", str(SEQ)],
                work={"examples": s.heldout}))
    unique: dict[str, Stage] = {}
    for st in stages:  # an arm that is another's alias shares its stages
        unique.setdefault(st.name, st)
    return list(unique.values())


def size_of(path: str) -> int:
    return os.path.getsize(path) if os.path.isfile(path) else 0


def corpus_bytes(text: str, c: dict, src: str, s: Sizes) -> int:
    """The size of a continuation text; before the split exists, its share of the reviews' file."""
    if os.path.isfile(c[text]):
        return size_of(c[text])
    if text == "books":
        return size_of(c["books"])
    total = size_of(src)
    share = s.labelled / 25000 if text == "labelled" else max(0, 25000 - s.labelled - s.heldout) / 25000
    return int(total * share)


# ------------------------------------------------------------------------------------------------ running
def call_bertforge(argv: list[str], log_path: str) -> tuple[int, str]:
    """``bertforge ARGV`` in this process (one start of Python and torch for the whole chain), its stdout and
    stderr into ``log_path``; returns its exit status and stdout."""
    from bertforge.cli import main

    captured = io.StringIO()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(["bertforge", *argv]) + "\n")
        log.flush()
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(log):
            try:
                code = main(argv)
            except Exception:  # a bug, not bad input: its traceback goes to the stage's log
                traceback.print_exc()
                code = 1
        log.write(captured.getvalue())
    return code, captured.getvalue()


def run_command(name: str, argv: list[str], output: str | None, logs: str) -> str:
    """Stage ``name``'s bertforge command, its log in ``logs``; its stdout.  A training stage killed midway
    continues from its checkpoint (``output`` holds one), or starts again (killed before its first); a failure
    is one StageFailed that names the log."""
    argv = list(argv)
    if output and os.path.isdir(os.path.join(output, "checkpoints")):
        argv.append("--resume")  # killed midway: continue from its newest checkpoint
    elif output and os.path.exists(output):
        argv.append("--overwrite")  # killed before its first checkpoint (prepare: finishes what it left)
    os.makedirs(logs, exist_ok=True)
    log_path = os.path.join(logs, f"{name}.log")
    code, stdout = call_bertforge(argv, log_path)
    if code == 130:
        raise StageFailed(f"interrupted in stage {name}; the same command continues the chain", code)
    if code:
        said = last_line(log_path).removeprefix("error: ")
        raise StageFailed(f"stage {name} failed (exit status {code}): {said} (log: {log_path})", code)
    return stdout


def last_line(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else ""


def stage_result(st: Stage, stdout: str) -> dict:
    """The figures a stage leaves: an evaluation's JSON line, a training run's metrics and settings."""
    if st.kind in ("mlm", "accuracy"):
        return json.loads(stdout.strip().splitlines()[-1])
    metrics = read_json(os.path.join(st.out, "metrics.json"))
    keep = ("steps", "step", "epochs", "train_seconds", "tokens_seen", "tokens_per_second", "wall_seconds",
            "mlm_loss", "mlm_accuracy")
    result = {k: metrics[k] for k in keep if k in metrics}
    if st.kind == "pretrain":
        config = read_json(os.path.join(st.out, "pretrain_config.json"))
        flat = {k: v for section in config.values() if isinstance(section, dict) for k, v in section.items()}
        flat.update({k: v for k, v in config.items() if not isinstance(v, dict)})
        result["settings"] = {k: flat.get(k) for k in ("recipe", "lr", "mask_prob", "dropout", "batch_size",
                                                          "max_steps", "add_vocab")}
        result["vocab_size"] = read_json(os.path.join(st.out, "config.json"))["vocab_size"]
    return result


def run_stage(st: Stage, out: str, data_dir: str) -> tuple[dict, bool]:
    """Run ``st`` unless its record exists; returns its record and whether it ran."""
    record_path = os.path.join(out, "stages", f"{st.name}.json")
    wanted = [str(a) for a in st.argv]
    if os.path.isfile(record_path):
        record = read_json(record_path)
        if record["argv"] != wanted:
            raise UserError(f"{out} holds stage {st.name} run as `{shlex.join(record['argv'])}`, not "
                            f"`{shlex.join(wanted)}`: use another --out for other settings")
        return record, False
    start = time.time()
    if st.kind == "split":
        result, command = write_split(st.argv[1], os.path.join(out, "splits"), sizes_of(st)), None
    elif st.kind == "books":
        result, command = write_book_slices(data_dir, os.path.join(out, "books"), int(st.argv[2])), None
    else:
        stdout = run_command(st.name, wanted, st.out, os.path.join(out, "logs"))
        result, command = stage_result(st, stdout), shlex.join(["bertforge", *wanted])
    record = {"stage": st.name, "argv": wanted, "command": command, "seconds": round(time.time() - start, 1),
              "result": result}
    write_json(record_path, record)
    return record, True


def sizes_of(st: Stage) -> Sizes:
    _, _, labelled, heldout, unlabelled = st.argv
    return Sizes(labelled=int(labelled), heldout=int(heldout), unlabelled=int(unlabelled))


def read_records(out: str, names: list[str] | None = None) -> dict[str, dict]:
    """The records of stages ``names`` (all of them: None) that are done in ``out``."""
    folder = os.path.join(out, "stages")
    if names is None:
        names = sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".json")) if os.path.isdir(folder) else []
    records = {}
    for name in names:
        path = os.path.join(folder, f"{name}.json")
        if os.path.isfile(path):
            records[name] = read_json(path)
    return records


# ------------------------------------------------------------------------------------------------ results
def spread(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "n": len(values)}


def arm_results(arm: Arm, s: Sizes, records: dict) -> dict:
    entry = {"key": arm.key, "label": arm.label, "model": arm.model, "continued_on": arm.text,
             "steps": arm.steps or None, "batch_size": s.batch_size if arm.text else None, "lr": arm.lr,
             "add_vocab": arm.add_vocab or None}
    pre = records.get(f"pretrain-{arm.model}")
    entry["pretraining"] = pre["result"] if pre else None
    per_seed = {str(seed): records[f"accuracy-{arm.model}-s{seed}"]["result"]["accuracy"] for seed in s.seeds
                if f"accuracy-{arm.model}-s{seed}" in records}
    entry["accuracy"] = {"per_seed": per_seed, **spread(list(per_seed.values()))}
    mlm = records.get(f"mlm-{arm.model}")
    entry["heldout_mlm"] = ({"loss": mlm["result"].get("mlm_loss"), "accuracy": mlm["result"].get("mlm_accuracy")}
                            if mlm and arm.mlm else None)
    return entry


def checks(by_key: dict, seeds: int) -> dict:
    """What the issue asks the figures to show: (a)'s lowest seed above (b)'s highest, (a)'s loss below (b)'s;
    None until both are measured."""
    a, b = by_key["a"], by_key["b"]
    whole = a["accuracy"]["n"] == b["accuracy"]["n"] == seeds
    acc = a["accuracy"]["min"] > b["accuracy"]["max"] if whole else None
    loss = a["heldout_mlm"]["loss"] < b["heldout_mlm"]["loss"] if a["heldout_mlm"] and b["heldout_mlm"] else None
    return {"a_lowest_seed_above_b_highest": acc, "a_heldout_loss_below_b": loss}


def collect(out: str, s: Sizes, chosen: list[Arm], stages: list[Stage], dry: bool) -> dict:
    records = read_records(out)
    models = {arm.model for arm in chosen}  # and the arms of an earlier --try, done in this folder:
    shown = chosen + [arm for arm in arms(s, list(TRIES)) if arm.model not in models and any(
        name.startswith(f"accuracy-{arm.model}-s") for name in records)]
    by_key = {arm.key: arm_results(arm, s, records) for arm in shown}
    commands = [records[st.name]["command"] if st.name in records else shlex.join(["bertforge", *map(str, st.argv)])
                for st in stages if st.kind not in ("split", "books")]
    return {"benchmark": "domain_adaptation", "mode": "dry" if dry else "full",
            "complete": all(st.name in records for st in stages), "sizes": dataclasses.asdict(s),
            "max_seq_length": SEQ,
            "split": records["split"]["result"] if "split" in records else None,
            "arms": list(by_key.values()), "checks": checks(by_key, len(s.seeds)),
            "stages": {st.name: records[st.name]["seconds"] if st.name in records else None for st in stages},
            "commands": commands}


def pct(x) -> str:
    return "" if x is None else f"{100 * x:.2f}"


def markdown(r: dict) -> str:
    s = r["sizes"]
    seeds = ", ".join(map(str, s["seeds"]))
    lines = ["# Domain adaptation: continued pretraining on reviews against more books", "",
             f"Mode: {r['mode']}{'' if r['complete'] else ' (incomplete: stages still to run)'}. "
             f"Length {r['max_seq_length']}; fine-tuning {s['epochs']} epochs on {s['labelled']} labelled reviews, "
             f"seeds {seeds}, last weights; accuracy (%) on {s['heldout']} held-out reviews; masked-LM loss on "
             f"the first {s['mlm_blocks']} blocks of the held-out reviews (`evaluate mlm`, seed 0).", ""]
    if r["split"]:
        files = r["split"]["files"]
        lines += [f"Split: {r['split']['rule']}: " + ", ".join(
            f"{k} {v['reviews']:,} ({v['positive']:,} positive)" if k != "unlabelled" else f"{k} {v['reviews']:,}"
            for k, v in files.items()) + ".", ""]
    lines += ["| arm | model | steps x batch | accuracy mean | min | max | seeds | held-out MLM loss | "
              "MLM accuracy |", "|---|---|---|---|---|---|---|---|---|"]
    for a in r["arms"]:
        acc, mlm = a["accuracy"], a["heldout_mlm"] or {}
        size = f"{a['steps']} x {a['batch_size']}" if a["steps"] else ""
        loss = "" if mlm.get("loss") is None else f"{mlm['loss']:.4f}"
        lines.append(f"| ({a['key']}) {a['label']} | `{a['model']}` | {size} | {pct(acc['mean'])} | "
                     f"{pct(acc['min'])} | {pct(acc['max'])} | {acc['n']} | {loss} | {pct(mlm.get('accuracy'))} |")
    c = r["checks"]
    lines += ["", f"(a)'s lowest seed above (b)'s highest: {c['a_lowest_seed_above_b_highest']}; "
                  f"(a)'s held-out masked-LM loss below (b)'s: {c['a_heldout_loss_below_b']}.", "",
              "## Commands", "", "```bash", *r["commands"], "```", ""]
    return "\n".join(lines)


def write_results(out: str, results: dict) -> None:
    write_json(os.path.join(out, "results.json"), results)
    write_text(os.path.join(out, "results.md"), markdown(results))


# ------------------------------------------------------------------------------------------------ the plan
def rates(records: dict) -> tuple[float, float]:
    """Training and inference tokens/s: the assumed ones, rescaled by a finished pretraining's own figure."""
    measured = records.get("pretrain-base", {}).get("result", {}).get("tokens_per_second")
    scale = measured / TRAIN_TOKENS_PER_S if measured else 1.0
    return TRAIN_TOKENS_PER_S * scale, INFER_TOKENS_PER_S * scale


def estimate_seconds(st: Stage, s: Sizes, train: float, infer: float) -> float:
    w = st.work
    if st.kind in ("split", "books"):
        return 1 + w.get("bytes", 0) / 50e6
    if st.kind == "pretrain":
        return (s.stage_seconds + w["bytes"] / TOKENIZE_BYTES_PER_S + w["vocab_bytes"] / VOCAB_BYTES_PER_S
                + w["steps"] * s.batch_size * SEQ / train)
    if st.kind == "mlm":
        return s.stage_seconds + w["blocks"] * SEQ / infer
    if st.kind == "finetune":
        return s.stage_seconds + w["examples"] * SEQ / train
    return s.stage_seconds + w["examples"] * SEQ / infer  # accuracy


def plan(out: str, s: Sizes, stages: list[Stage]) -> dict:
    """Estimated minutes per stage (every review and sequence counted at the full 128 tokens: an upper bound),
    with the measured minutes of the stages already done in ``out``."""
    records = read_records(out, [st.name for st in stages])
    train, infer = rates(records)
    rows = [{"stage": st.name, "estimated_minutes": round(estimate_seconds(st, s, train, infer) / 60, 2),
             "done_minutes": round(records[st.name]["seconds"] / 60, 2) if st.name in records else None}
            for st in stages]
    total = sum(r["estimated_minutes"] for r in rows)
    return {"stages": rows, "total_minutes": round(total, 1), "limit_minutes": LIMIT_MINUTES,
            "train_tokens_per_second": round(train), "infer_tokens_per_second": round(infer),
            "remaining_minutes": round(sum(r["estimated_minutes"] for r in rows if r["done_minutes"] is None), 1)}


def print_plan(p: dict) -> None:
    print(f"{'stage':44} {'est. min':>9} {'done min':>9}")
    for r in p["stages"]:
        done = "" if r["done_minutes"] is None else f"{r['done_minutes']:.1f}"
        print(f"{r['stage']:44} {r['estimated_minutes']:9.1f} {done:>9}")
    print(f"total: {p['total_minutes']:.1f} min estimated (the main chain's limit: {p['limit_minutes']}), "
          f"{p['remaining_minutes']:.1f} to go; at {p['train_tokens_per_second']} training and "
          f"{p['infer_tokens_per_second']} inference tokens/s")


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("BERTFORGE_DATA") or "../shared/data",
                   help="the data sets' folder: imdb/train.jsonl, gutenberg/ (default: $BERTFORGE_DATA or "
                        "../shared/data)")
    p.add_argument("--out", default="runs/domain-adaptation", help="the run folder (default: %(default)s)")
    p.add_argument("--dry", action="store_true", help="every stage at toy sizes (tiny model, few steps), in seconds")
    p.add_argument("--plan", action="store_true", help="print the stages with estimated minutes; run nothing")
    p.add_argument("--json", action="store_true", help="--plan as JSON")
    p.add_argument("--try", dest="tries", nargs="+", choices=TRIES, default=[],
                   help="more arms, should (a) not win: doubled, lr-screen, labelled-text")
    defaults = Sizes()
    for name in ("base_steps", "cont_steps", "batch_size", "epochs", "add_vocab", "vocab_size", "mlm_blocks"):
        p.add_argument("--" + name.replace("_", "-"), type=int,
                       help=f"(default: {getattr(defaults, name)}; --dry: {DRY.get(name, getattr(defaults, name))})")
    p.add_argument("--seeds", type=int, nargs="+", help="fine-tuning seeds (default: 0 1 2)")
    return p.parse_args(argv)


def sizes(a: argparse.Namespace) -> Sizes:
    s = Sizes(**DRY) if a.dry else Sizes()
    for name in ("base_steps", "cont_steps", "batch_size", "epochs", "add_vocab", "vocab_size", "mlm_blocks"):
        value = getattr(a, name)
        if value is not None:
            if value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
            setattr(s, name, value)
    if a.seeds:
        if len(set(a.seeds)) != len(a.seeds) or min(a.seeds) < 0:
            raise UserError(f"--seeds must be distinct and not negative, not {' '.join(map(str, a.seeds))}")
        s.seeds = tuple(a.seeds)
    return s


def check_inputs(a: argparse.Namespace, s: Sizes) -> None:
    """Before anything is written: the data (the reviews split, unless that is done) and the run folder."""
    needed = [os.path.join("imdb", "train.jsonl")] + [os.path.join("gutenberg", f"{n}.jsonl")
                                                      for n in ("train-000", "train-001", "validation")]
    for rel in needed:
        if not os.path.isfile(os.path.join(a.data_dir, rel)):
            raise UserError(f"{os.path.join(a.data_dir, rel)} not found (--data-dir is the data sets' folder)")
    if os.path.isdir(a.out) and os.listdir(a.out) and not os.path.isdir(os.path.join(a.out, "stages")):
        raise UserError(f"{a.out} exists and is not this benchmark's run folder: use another --out")
    if not os.path.isfile(os.path.join(a.out, "stages", "split.json")):
        split_reviews(read_reviews(os.path.join(a.data_dir, "imdb", "train.jsonl")), s.labelled, s.heldout,
                      s.unlabelled)


def run(argv=None) -> int:
    a = parse_args(argv)
    s = sizes(a)
    a.data_dir, a.out = os.path.abspath(a.data_dir), os.path.abspath(a.out)
    chosen = arms(s, a.tries)
    stages = build_stages(a.out, a.data_dir, s, chosen)
    if a.plan:
        p = plan(a.out, s, stages)
        print(json.dumps(p, indent=1)) if a.json else print_plan(p)
        return 0
    check_inputs(a, s)
    if a.dry:  # toy sizes gain nothing from more threads, and lose much to contention on a shared host
        os.environ.setdefault("BERTFORGE_THREADS", "1")
    for sub in ("stages", "logs"):
        os.makedirs(os.path.join(a.out, sub), exist_ok=True)
    p = plan(a.out, s, stages)
    print(f"{len(stages)} stages in {a.out}: about {p['remaining_minutes']:.0f} of {p['total_minutes']:.0f} "
          "estimated minutes to go (--plan: each stage)", flush=True)
    for i, st in enumerate(stages, 1):
        record, ran = run_stage(st, a.out, a.data_dir)
        state = f"done in {record['seconds']:.0f} s" if ran else "already done: skipped"
        print(f"[{i}/{len(stages)}] {st.name}: {state}", flush=True)
        write_results(a.out, collect(a.out, s, chosen, stages, a.dry))
    print(f"results: {os.path.join(a.out, 'results.md')}, {os.path.join(a.out, 'results.json')}")
    return 0


def main(argv=None) -> int:
    try:
        return run(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except StageFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 130 if e.code == 130 else 1
    except KeyboardInterrupt:
        print("error: interrupted; the same command continues the chain", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
