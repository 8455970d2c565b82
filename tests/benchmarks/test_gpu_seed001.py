"""benchmarks/gpu_seed001.sh: its stage limits fit the budget of an unattended GPU run, the excerpt that
benchmarks/gpu_prepare.py makes keeps within its size limit, and --dry runs every stage end to end on the CPU,
on data built here, so that the one-shot GPU run cannot fail for a reason the CPU would have shown."""

from __future__ import annotations

import gzip
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from .test_gpu_check import _shared_data, _tree

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "gpu_seed001.sh")
STAGES = ["env", "matmul", "pretrain", "mlm", "squad", "squad_dev"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="gpu_seed001.sh needs bash and timeout")


def _prepare(shared: pathlib.Path, excerpt: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_prepare.py"), str(shared), str(excerpt),
                           "--small", "--tokenizer", "train", *extra], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_gpu_run_stage_limits_fit_its_budget():
    r = subprocess.run(["bash", SCRIPT, "--budgets"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert list(plan["stages"]) == STAGES
    assert sum(plan["stages"].values()) <= plan["budget"] <= plan["max_budget"] == 540
    # pretraining's training clock is a fixed share that leaves its stage room to tokenize, evaluate and save
    assert 0.2 <= plan["pretrain_seconds"] / plan["budget"] <= 0.4
    assert plan["stages"]["pretrain"] >= plan["pretrain_seconds"] + 60


@pytest.mark.slow
def test_excerpt_fills_its_size_limit_with_whole_books(tmp_path):
    shared = _shared_data(tmp_path / "shared")
    r = _prepare(shared, tmp_path / "whole")
    assert r.returncode == 0, r.stderr
    whole = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    assert whole["seed_books"] == 400 and whole["seed_books_left_out"] == 0  # both train-*.jsonl files
    limit = (whole["bytes"] - whole["seed_book_text_bytes"] / 4) / 2**20  # room for a part of the books only
    r = _prepare(shared, tmp_path / "cut", "--max-mib", f"{limit:.4f}")
    assert r.returncode == 0, r.stderr
    cut = json.loads((tmp_path / "cut" / "manifest.json").read_text())
    assert cut["bytes"] <= limit * 2**20 and cut["mib"] <= limit + 0.01
    assert 0 < cut["seed_books"] < 400 and cut["seed_books"] + cut["seed_books_left_out"] == 400
    with gzip.open(tmp_path / "cut" / "gutenberg" / "books.jsonl.gz", "rt", encoding="utf-8") as f:
        books = [json.loads(line) for line in f]
    first = [json.loads(line) for line in (shared / "gutenberg" / "train-000.jsonl").read_text().splitlines()]
    assert books == first[: len(books)]  # whole books, in order
    with gzip.open(tmp_path / "cut" / "squad" / "train-v1.1.json.gz", "rt", encoding="utf-8") as f:
        assert sum(len(p["qas"]) for a in json.load(f)["data"] for p in a["paragraphs"]) == 64
    r = _prepare(shared, tmp_path / "none", "--max-mib", "0.05")  # not even the other files fit
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_gpu_seed001_dry_run_end_to_end(tmp_path):
    shared = _shared_data(tmp_path / "shared")
    excerpt, out = tmp_path / "excerpt", tmp_path / "out"
    before = _tree(ROOT)
    assert _prepare(shared, excerpt).returncode == 0
    env = {**os.environ, "PYTHON": sys.executable}
    dev = shared / "squad" / "dev-v1.1.json"  # larger than the excerpt's slice of it
    run = subprocess.run(["bash", SCRIPT, str(excerpt), str(out), "--dry", "--dev", str(dev)], capture_output=True,
                         text=True, env=env, timeout=200)
    assert run.returncode == 0, run.stdout + run.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["script"] == "gpu_seed001" and s["mode"] == "dry" and s["finished"] and list(s["stages"]) == STAGES
    assert s["planned_seconds"] <= s["budget_seconds"]
    st = s["stages"]
    assert {k: v["status"] for k, v in st.items()} == dict.fromkeys(STAGES, "passed"), run.stdout
    assert st["matmul"]["figures"]["matmul_peak_gflops"] > 0
    pre = st["pretrain"]["figures"]
    assert pre["device"] == "cpu" and pre["steps"] >= 1 and math.isfinite(pre["mlm_loss"])
    assert pre["tokens_seen"] > 0 and pre["tokens_per_second"] > 0 and pre["mfu"] > 0
    assert pre["mfu_bf16_dense_peak"] is None and "no CUDA GPU" in pre["mfu_bf16_dense_peak_reason"]
    assert pre["tokenize_seconds"] > 0 and pre["data_seconds"] > 0
    assert pre["corpus_tokens"] > 0 and pre["epochs"] > 0
    assert 0 <= st["mlm"]["figures"]["mlm_accuracy"] <= 1 and st["mlm"]["figures"]["masked_tokens"] > 0
    squad = st["squad"]["figures"]
    assert "f1" not in squad and squad["train_questions"] == 32 and squad["steps"] == 2 * 4  # no dev in training
    assert squad["features_seconds"] > 0 and squad["data_seconds"] > 0
    dev = st["squad_dev"]["figures"]
    assert dev["questions"] == 40 and 0 <= dev["f1"] <= 100 and "of the official dev set's 10,570" in dev["dev_note"]
    assert "--max-answer-length 8" in st["squad_dev"]["command"]
    assert _tree(ROOT) == before  # nothing written into the source tree
    for bulky in ("cache", "tmp", "pretrain/checkpoints", "squad/checkpoints"):  # pruned
        assert not (out / bulky).exists(), bulky


@pytest.mark.slow
def test_gpu_seed001_refuses_bad_arguments(tmp_path):
    r = subprocess.run(["bash", SCRIPT, str(tmp_path / "none"), str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "gpu_prepare.py" in r.stderr
    assert not (tmp_path / "out").exists()
    r = subprocess.run(["bash", SCRIPT, "a", "b", "--fast"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == "error: unknown option --fast (expected --dry or --dev FILE)"
    r = subprocess.run(["bash", SCRIPT, "a", "b", "--dev", str(tmp_path / "dev.json")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --dev ")


def test_summary_of_a_gpu_run(tmp_path, capsys):
    """What the summary makes of a GPU run's files (no GPU needed): MFU against the data sheet's bf16 dense peak
    and against the matmul stage, epochs and the seconds on the CPU from the timing file; a plan over its
    budget refused."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_summary as G
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = str(tmp_path)
    (tmp_path / "logs").mkdir()
    assert G.main(["init", out, "--script", "gpu_seed001", "--mode", "gpu", "--excerpt", "x", "--budget", "100",
                   "env=60", "pretrain=50"]) == 2
    assert capsys.readouterr().err.startswith("error: the stages' limits add up to 110 s, over the budget of 100 s")
    assert G.main(["init", out, "--script", "gpu_seed001", "--mode", "gpu", "--excerpt", "x", "--budget", "100",
                   "env=20", "matmul=20", "pretrain=50", "squad=10"]) == 0
    (tmp_path / "env.json").write_text(json.dumps({"cuda_available": True, "device_name": "NVIDIA H200"}))
    (tmp_path / "logs" / "matmul.log").write_text('{"matmul_peak_gflops": 500000.0, "matmul_peak_dtype": "bf16"}\n')
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain" / "metrics.json").write_text(json.dumps(
        {"steps": 100, "tokens_seen": 3_000_000, "tokens_per_second": 1e6, "wall_seconds": 4.0,
         "model_flops_per_token": 1e8, "device": "cuda:0"}))
    (tmp_path / "logs" / "pretrain.timing.json").write_text(json.dumps(
        {"command": "bertforge pretrain", "tokenize_seconds": 12.5, "data_seconds": 3.0, "corpus_tokens": 1_000_000,
         "epochs": 2.5}))
    for stage in ("env", "matmul", "pretrain"):
        G.main(["finish", out, stage, "--rc", "0", "--seconds", "1"])
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["plan_seconds"] == {"env": 20, "matmul": 20, "pretrain": 50, "squad": 10} and s["planned_seconds"] == 100
    pre = s["stages"]["pretrain"]["figures"]
    assert pre["mfu"] == pytest.approx(1e14 / 5e14) and "matmul stage" in pre["mfu_against"]
    assert pre["mfu_bf16_dense_peak"] == pytest.approx(1e14 / 989e12) and pre["bf16_dense_peak_tflops"] == 989
    assert pre["epochs"] == 2.5 and pre["tokenize_seconds"] == 12.5 and pre["data_seconds"] == 3.0
    assert pre["tokens_per_second_wall"] == 750_000 and "command" not in pre
    assert G.dense_peak("NVIDIA H100 PCIe") == 756e12 and G.dense_peak("Tesla T4") is None
    # fine-tuning cut short in its second epoch: the first epoch's evaluation still reported
    (tmp_path / "squad").mkdir()
    (tmp_path / "squad" / "metrics.jsonl").write_text(
        '{"type": "eval", "step": 9, "epoch": 1, "exact_match": 10.5, "f1": 18.25}\n{"type": "train", "step": 10}\n')
    G.main(["start", out, "squad", "210", "--", "bertforge", "finetune", "squad"])
    G.main(["finish", out, "squad", "--rc", "124", "--seconds", "210"])
    squad = json.loads((tmp_path / "summary.json").read_text())["stages"]["squad"]
    assert squad["status"] == "timeout" and squad["figures"]["f1"] == 18.25 and squad["figures"]["epoch"] == 1
