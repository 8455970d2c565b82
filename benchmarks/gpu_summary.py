"""OUTDIR/summary.json for ``benchmarks/gpu_check.sh`` and ``benchmarks/gpu_seed001.sh``: rewritten after every
change of a stage, so that a run cut short still tells what it did.  Standard library only (``env``, ``matmul``
and ``timed`` aside, which import torch and bertforge).

    gpu_summary.py init OUT [--script NAME] --mode gpu|dry --excerpt DIR --budget S STAGE[=LIMIT]...
                                                                               every stage "pending"; with limits,
                                                                               their sum must fit the budget
    gpu_summary.py env OUT                                                     OUT/env.json: the machine
    gpu_summary.py matmul OUT --dtype bf16|fp32                                a JSON line: the matmul peak
    gpu_summary.py timed OUT STAGE -- BERTFORGE-ARGS...                        bertforge's CLI, with the seconds
                                                                               spent on the CPU and waiting for
                                                                               data in OUT/logs/STAGE.timing.json
    gpu_summary.py start OUT STAGE LIMIT -- COMMAND...                         "running"
    gpu_summary.py finish OUT STAGE --rc N --seconds S                         passed/failed/timeout/skipped + figures
    gpu_summary.py skip OUT STAGE REASON                                       "skipped"
    gpu_summary.py done OUT                                                    "finished", a table; exit 1 on failures

Each stage: status, seconds, limit, command, log (OUT/logs/STAGE.log), reason (skipped), log_tail (failed or
timed out), figures (what the stage measured, read from the files it wrote).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
import xml.etree.ElementTree as ET

TIMEOUT_CODES = (124, 137)  # timeout(1): the limit hit (124), or killed after the grace period (128 + 9)


def _path(out: str) -> str:
    return os.path.join(out, "summary.json")


def load(out: str) -> dict:
    with open(_path(out), encoding="utf-8") as f:
        return json.load(f)


def save(out: str, s: dict) -> None:
    s["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    s["elapsed_seconds"] = round(time.time() - s["started_unix"], 1)
    tmp = _path(out) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(s, f, indent=2)
        f.write("\n")
    os.replace(tmp, _path(out))


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _tail(path: str, n: int = 25) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n")[-400:] for line in f.readlines()[-n:]]
    except OSError:
        return []


def _json_or_none(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def _last_json_line(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


# ------------------------------------------------------------------------------------------------ figures
def tests_figures(out: str) -> tuple[dict, str | None]:
    """pytest's counts, failures and each test's measured figures; and the reason when every test skipped."""
    fig: dict = {}
    reason = None
    try:
        root = ET.parse(os.path.join(out, "tests", "junit.xml")).getroot()
    except (OSError, ET.ParseError):
        root = None
    if root is not None:
        outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
        skip_msgs = set()
        for c in root.iter("testcase"):
            name = c.get("name", "?")
            bad = c.find("failure") if c.find("failure") is not None else c.find("error")
            skipped = c.find("skipped")
            if bad is not None:
                msg = (bad.get("message") or "").strip().splitlines()
                outcome["failed"].append(f"{name}: {msg[0][:300] if msg else ''}")
            elif skipped is not None:
                outcome["skipped"].append(name)
                skip_msgs.add(skipped.get("message", ""))
            else:
                outcome["passed"].append(name)
        fig = {k: len(v) for k, v in outcome.items()}
        fig["failures"] = outcome["failed"]
        if outcome["skipped"] and not outcome["passed"] and not outcome["failed"]:
            reason = f"all {len(outcome['skipped'])} CUDA tests skipped: " + "; ".join(sorted(m for m in skip_msgs if m))
    measured = {}
    try:
        with open(os.path.join(out, "tests", "figures.jsonl"), encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                measured[row.pop("test")] = row
    except (OSError, ValueError):
        pass
    if measured:
        fig["measured"] = measured
    return fig, reason


def _peak(s: dict) -> tuple[float | None, str | None]:
    """The matmul peak a stage of this run measured (the matmul stage's, else the base preset's bench first)."""
    for name in ("matmul", "bench_base", "bench_mini"):
        f = s["stages"].get(name, {}).get("figures") or {}
        if f.get("matmul_peak_gflops"):
            return f["matmul_peak_gflops"] * 1e9, f.get("matmul_peak_dtype")
    return None, None


# Dense (no sparsity: half the data sheets' headline) bf16 tensor-core peaks from NVIDIA's data sheets, FLOP/s,
# by a part of the device name; the first match wins (so "H100 PCIe" before "H100").  A GPU not listed gets no
# such MFU, and says so.
BF16_DENSE_PEAKS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H200 NVL", 835e12), ("H100", 989e12),
                    ("H200", 989e12), ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12))


def dense_peak(device_name: str | None) -> float | None:
    for part, peak in BF16_DENSE_PEAKS:
        if device_name and part in device_name:
            return peak
    return None


def timing(out: str, stage: str) -> dict:
    """What the ``timed`` command measured in a stage (OUT/logs/STAGE.timing.json), its command left out."""
    t = _read_json(os.path.join(out, "logs", f"{stage}.timing.json")) or {}
    return {k: v for k, v in t.items() if k != "command"}


def seed_pretrain_figures(fig: dict, out: str, s: dict) -> dict:
    """The seed run's pretraining: epochs over the text, the time on the CPU, MFU against the data sheet."""
    fig.update(timing(out, "pretrain"))
    if fig.get("tokens_seen") and fig.get("wall_seconds"):
        fig["tokens_per_second_wall"] = fig["tokens_seen"] / fig["wall_seconds"]
    name = (s["stages"].get("env", {}).get("figures") or {}).get("device_name")
    peak = dense_peak(name)
    if fig.get("device", "").startswith("cuda") and peak and fig.get("tokens_per_second"):
        fig["mfu_bf16_dense_peak"] = fig["tokens_per_second"] * fig.get("model_flops_per_token", 0) / peak
        fig["bf16_dense_peak_tflops"] = peak / 1e12
    else:
        fig["mfu_bf16_dense_peak"] = None
        fig["mfu_bf16_dense_peak_reason"] = (f"no data-sheet bf16 peak for {name}" if name else
                                             "no CUDA GPU: MFU only against the matmul measured in this run")
    return fig


def pretrain_figures(out: str, s: dict) -> dict:
    d = os.path.join(out, "pretrain")
    m = _read_json(os.path.join(d, "metrics.json"))
    if m is None:  # cut short: the last logged training line
        rows = []
        for line in _tail(os.path.join(d, "metrics.jsonl"), 50):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        train = [r for r in rows if r.get("type") == "train"]
        m = {**train[-1], "steps": train[-1].get("step"), "from": "metrics.jsonl (no metrics.json)"} if train else {}
    keep = ("steps", "tokens_per_second", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "nsp_loss", "tokens_seen",
            "wall_seconds", "train_seconds_this_session", "model_flops_per_token", "parameters", "device", "from")
    fig = {k: m[k] for k in keep if k in m}
    peak, dtype = _peak(s)
    if peak and fig.get("tokens_per_second") and fig.get("model_flops_per_token"):
        fig["mfu"] = fig["tokens_per_second"] * fig["model_flops_per_token"] / peak
        by = "matmul" if "matmul" in s["stages"] else "bench"
        fig["mfu_against"] = f"the {dtype} matmul peak measured by the {by} stage"
    return seed_pretrain_figures(fig, out, s) if s.get("script") == "gpu_seed001" else fig


OFFICIAL_DEV_QUESTIONS = 10_570  # SQuAD v1.1's dev set


def squad_figures(out: str, s: dict | None = None) -> dict:
    d = os.path.join(out, "squad")
    m = _read_json(os.path.join(d, "metrics.json"))
    if m is None:  # cut short: the last evaluation (after an epoch) that metrics.jsonl holds
        evals = [r for r in map(_json_or_none, _tail(os.path.join(d, "metrics.jsonl"), 50))
                 if r and r.get("type") == "eval"]
        m = {**evals[-1], "from": "metrics.jsonl (no metrics.json)"} if evals else {}
    keep = ("f1", "exact_match", "train_seconds", "train_questions", "train_windows", "epoch", "from")
    fig = {k: m[k] for k in keep if k in m}
    ft = (_read_json(os.path.join(d, "finetune_config.json")) or {}).get("finetune", {})
    train = ft.get("train", {})
    if "train_windows" in fig and train.get("batch_size"):
        fig["steps"] = math.ceil(fig["train_windows"] / train["batch_size"]) * (train.get("epochs") or 1)
    if s and s.get("script") == "gpu_seed001":
        fig.update(timing(out, "squad"))
    return fig


def dev_figures(out: str) -> dict:
    """``evaluate squad``'s JSON line, and how much of the official dev set it scored."""
    fig = _last_json_line(os.path.join(out, "logs", "squad_dev.log")) or {}
    n = fig.get("questions")
    if isinstance(n, int) and n:
        fig["dev_note"] = (f"{n:,} of the official dev set's {OFFICIAL_DEV_QUESTIONS:,} questions"
                           if n < OFFICIAL_DEV_QUESTIONS else "the official dev set")
    return fig


def figures(out: str, stage: str, s: dict) -> tuple[dict, str | None]:
    """(figures, reason-for-skipped) of a finished stage, from the files it wrote."""
    if stage == "env":
        return _read_json(os.path.join(out, "env.json")) or {}, None
    if stage == "tests":
        return tests_figures(out)
    if stage == "squad_dev":
        return dev_figures(out), None
    if stage.startswith("bench") or stage in ("matmul", "mlm"):  # a JSON line at the end of the log
        return _last_json_line(os.path.join(out, "logs", f"{stage}.log")) or {}, None
    if stage == "pretrain":
        return pretrain_figures(out, s), None
    if stage == "squad":
        return squad_figures(out, s), None
    return {}, None


# ------------------------------------------------------------------------------------------------ commands
def plan(stages: list[str]) -> dict[str, float]:
    """The stage limits of ``NAME=LIMIT`` arguments (stages given by name alone have none)."""
    limits = {}
    for arg in stages:
        name, sep, limit = arg.partition("=")
        if sep:
            limits[name] = float(limit)
    return limits


def cmd_init(out: str, script: str, mode: str, excerpt: str, budget: float, stages: list[str]) -> int:
    limits = plan(stages)
    if sum(limits.values()) > budget:
        print(f"error: the stages' limits add up to {sum(limits.values()):.0f} s, over the budget of {budget:.0f} s",
              file=sys.stderr)
        return 2
    s = {"script": script, "mode": mode, "finished": False, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
         "started_unix": time.time(), "budget_seconds": budget, "excerpt": excerpt, "outdir": out,
         "stages": {arg.partition("=")[0]: {"status": "pending"} for arg in stages}}
    if limits:
        s.update(plan_seconds=limits, planned_seconds=sum(limits.values()))
    save(out, s)
    return 0


def cmd_env(out: str) -> None:
    """The machine, as the stages will see it: written to OUT/env.json and printed."""
    import importlib.metadata as md
    import platform
    import shutil
    import subprocess

    import torch

    import bertforge

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
           "torch_cuda": torch.version.cuda, "cpu_count": os.cpu_count(), "bertforge_file": bertforge.__file__}
    for pkg in ("transformers", "tokenizers", "safetensors", "numpy"):
        try:
            env[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            env[pkg] = None
    if env["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        env.update(device_name=p.name, device_count=torch.cuda.device_count(), capability=f"{p.major}.{p.minor}",
                   memory_gib=round(p.total_memory / 2**30, 1), bf16_supported=torch.cuda.is_bf16_supported(),
                   flash_sdp_enabled=torch.backends.cuda.flash_sdp_enabled(),
                   mem_efficient_sdp_enabled=torch.backends.cuda.mem_efficient_sdp_enabled(),
                   nccl_available=torch.distributed.is_nccl_available())
    if shutil.which("nvidia-smi"):
        try:
            env["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"failed: {e}"
    with open(os.path.join(out, "env.json"), "w", encoding="utf-8") as f:
        json.dump(env, f, indent=2)
    print(json.dumps(env, indent=2))


def say(s: dict, text: str) -> None:
    print(f"[{s.get('script', 'gpu_check')}] {text}", flush=True)


def cmd_matmul(dtype: str, seconds: float) -> None:
    """The matmul peak (square matmuls, the best of a few sizes) in ``dtype`` on this run's device, printed as a
    JSON line: what MFU is measured against besides the data sheet."""
    import torch

    from bertforge.bench import matmul_peak

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    peak = matmul_peak(dev, seconds, dtype=dt, sizes=(256, 512))  # sizes for the CPU; a GPU's are matmul_peak's
    print(json.dumps({"matmul_peak_gflops": peak / 1e9, "matmul_peak_dtype": dtype, "device": str(dev)}))


# (module, class, method, figure): what ``timed`` adds up in a bertforge run.  Tokenizing (the corpus cache, and
# the first epoch's instances) and SQuAD's features run on the CPU before training; the training loop builds
# each batch while the accelerator waits for it.
TIMERS = (("bertforge.data", "PretrainingData", "__init__", "tokenize_seconds"),
          ("bertforge.train.pretrain", "Pretraining", "next_batches", "data_seconds"),
          ("bertforge.tasks.squad", "SquadTask", "read", "read_seconds"),
          ("bertforge.tasks.squad", "SquadTask", "encode", "features_seconds"),
          ("bertforge.train.finetune", "FineTuning", "next_batches", "data_seconds"))


def _epochs(data) -> dict:
    """How far the pretraining loader went: epochs over the training text (fractional), and its tokens."""
    loader = data.loader
    per_epoch = loader.steps_in_epoch(loader.epoch)
    return {"corpus_tokens": int(data.corpus.n_tokens),
            "epochs": loader.epoch + (loader.step / per_epoch if per_epoch else 0.0)}


def cmd_timed(out: str, stage: str, argv: list[str]) -> int:
    """``bertforge ARGV`` in this process, with TIMERS' methods timed; OUT/logs/STAGE.timing.json at the end."""
    import functools
    import importlib

    figures: dict = {"command": shlex.join(["bertforge", *argv])}
    seen: dict = {}

    def timed(cls, name: str, key: str):
        fn = getattr(cls, name)

        @functools.wraps(fn)
        def wrapper(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return fn(self, *a, **k)
            finally:
                figures[key] = figures.get(key, 0.0) + time.perf_counter() - t0
                seen[cls.__name__] = self

        setattr(cls, name, wrapper)

    for module, cls, name, key in TIMERS:
        timed(getattr(importlib.import_module(module), cls), name, key)
    from bertforge.cli import main as bertforge

    try:
        return bertforge(argv)
    finally:
        if "PretrainingData" in seen and hasattr(seen["PretrainingData"], "loader"):
            figures.update(_epochs(seen["PretrainingData"]))
        path = os.path.join(out, "logs", f"{stage}.timing.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2)
        os.replace(path + ".tmp", path)


def cmd_start(out: str, stage: str, limit: float, command: list[str]) -> None:
    s = load(out)
    s["stages"][stage] = {"status": "running", "limit_seconds": limit, "command": shlex.join(command),
                          "log": os.path.join(out, "logs", f"{stage}.log")}
    save(out, s)
    say(s, f"{stage}: started (limit {limit:.0f} s)")


def cmd_finish(out: str, stage: str, rc: int, seconds: float) -> None:
    s = load(out)
    st = s["stages"][stage]
    st.update(rc=rc, seconds=round(seconds, 1))
    fig, skipped_reason = figures(out, stage, s)
    if rc == 0:
        st["status"] = "skipped" if skipped_reason else "passed"
        if skipped_reason:
            st["reason"] = skipped_reason
    else:
        st["status"] = "timeout" if rc in TIMEOUT_CODES else "failed"
        st["log_tail"] = _tail(st["log"])
    st["figures"] = fig
    save(out, s)
    brief = {k: v for k, v in fig.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    say(s, f"{stage}: {st['status']} in {seconds:.1f} s (rc {rc}) {json.dumps(brief)[:600]}")
    if st["status"] in ("failed", "timeout"):
        print("\n".join(f"    {line}" for line in st["log_tail"][-12:]), flush=True)


def cmd_skip(out: str, stage: str, reason: str) -> None:
    s = load(out)
    s["stages"][stage] = {"status": "skipped", "reason": reason}
    save(out, s)
    say(s, f"{stage}: skipped: {reason}")


def cmd_done(out: str) -> int:
    s = load(out)
    s["finished"] = True
    counts: dict[str, int] = {}
    for st in s["stages"].values():
        counts[st["status"]] = counts.get(st["status"], 0) + 1
    s["counts"] = counts
    save(out, s)
    say(s, f"done in {s['elapsed_seconds']:.0f} s: {json.dumps(counts)}; summary in {_path(out)}")
    for name, st in s["stages"].items():
        print(f"    {name:16s} {st['status']:8s} {st.get('seconds', 0):7.1f} s  {st.get('reason', '')}", flush=True)
    return 1 if counts.get("failed") or counts.get("timeout") else 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("init")
    c.add_argument("out")
    c.add_argument("--script", default="gpu_check", choices=["gpu_check", "gpu_seed001"])
    c.add_argument("--mode", required=True, choices=["gpu", "dry"])
    c.add_argument("--excerpt", required=True)
    c.add_argument("--budget", required=True, type=float)
    c.add_argument("stages", nargs="+")
    sub.add_parser("env").add_argument("out")
    c = sub.add_parser("matmul")
    c.add_argument("out")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    c.add_argument("--seconds", default=0.5, type=float, help="per matrix size")
    c = sub.add_parser("timed")
    c.add_argument("out")
    c.add_argument("stage")
    c.add_argument("command", nargs=argparse.REMAINDER)
    c = sub.add_parser("start")
    c.add_argument("out")
    c.add_argument("stage")
    c.add_argument("limit", type=float)
    c.add_argument("command", nargs=argparse.REMAINDER)
    c = sub.add_parser("finish")
    c.add_argument("out")
    c.add_argument("stage")
    c.add_argument("--rc", required=True, type=int)
    c.add_argument("--seconds", required=True, type=float)
    c = sub.add_parser("skip")
    c.add_argument("out")
    c.add_argument("stage")
    c.add_argument("reason")
    sub.add_parser("done").add_argument("out")
    a = p.parse_args(argv)
    if a.cmd == "init":
        return cmd_init(a.out, a.script, a.mode, a.excerpt, a.budget, a.stages)
    elif a.cmd == "env":
        cmd_env(a.out)
    elif a.cmd == "matmul":
        cmd_matmul(a.dtype, a.seconds)
    elif a.cmd == "timed":
        return cmd_timed(a.out, a.stage, a.command[1:] if a.command[:1] == ["--"] else a.command)
    elif a.cmd == "start":
        cmd_start(a.out, a.stage, a.limit, a.command[1:] if a.command[:1] == ["--"] else a.command)
    elif a.cmd == "finish":
        cmd_finish(a.out, a.stage, a.rc, a.seconds)
    elif a.cmd == "skip":
        cmd_skip(a.out, a.stage, a.reason)
    else:
        return cmd_done(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
