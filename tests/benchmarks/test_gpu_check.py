"""benchmarks/gpu_prepare.py and benchmarks/gpu_check.sh --dry end to end, on data built here (stories in the
shared data's layout), so that the one-shot GPU run cannot fail for a reason the CPU would have shown."""

from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from bertforge.cli import main
from bertforge.demo.corpus import generate_stories, sentiment_split, write_story_corpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGES = ["env", "tests", "bench_mini", "bench_base", "bench_modern_1k", "bench_modern_8k", "pretrain", "squad"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="gpu_check.sh needs bash and timeout")


def _squad(path: pathlib.Path, n: int, seed: int) -> None:
    """SQuAD v1.1 JSON: each story a paragraph, asked where its first sentence happens (a span of it)."""
    paragraphs = []
    for i, story in enumerate(generate_stories(n, seed)):
        context = " ".join(story)
        words = story[0].rstrip(".").split()
        answer = " ".join(words[-2:])
        paragraphs.append({"context": context, "qas": [{"id": f"q{seed}-{i}", "question": f"Where did {words[0]} go?",
                                                         "answers": [{"text": answer, "answer_start": context.index(answer)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "stories", "paragraphs": paragraphs}]}))


def _shared_data(root: pathlib.Path) -> pathlib.Path:
    """A stand-in for ../shared/data with the files gpu_prepare.py reads."""
    for sub in ("gutenberg", "sst2", "squad"):
        (root / sub).mkdir(parents=True)
    write_story_corpus(root / "gutenberg" / "train-000.jsonl", n_docs=300, seed=1)
    write_story_corpus(root / "gutenberg" / "validation.jsonl", n_docs=60, seed=2)
    for name, n in (("train", 240), ("dev", 60)):
        rows = sentiment_split(n, seen=True, seed=len(name))
        (root / "sst2" / f"{name}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{int(lbl == 'positive')}\n" for t, lbl in rows))
    _squad(root / "squad" / "train-8k-v1.1.json", 80, seed=3)
    _squad(root / "squad" / "train-v1.1.json", 100, seed=5)  # gpu_seed001.sh's
    _squad(root / "squad" / "dev-v1.1.json", 40, seed=4)
    write_story_corpus(root / "gutenberg" / "train-001.jsonl", n_docs=100, seed=6)  # books beyond the first file
    return root


def _tree(root: pathlib.Path) -> set[str]:
    skip = {".git", "__pycache__", ".pytest_cache", ".venv"}
    return {str(p.relative_to(root)) for p in root.rglob("*") if not skip & set(p.relative_to(root).parts)}


@pytest.mark.slow
def test_gpu_check_dry_run_end_to_end(tmp_path):
    shared = _shared_data(tmp_path / "shared")
    excerpt, out = tmp_path / "excerpt", tmp_path / "out"
    before = _tree(ROOT)
    env = {**os.environ, "PYTHON": sys.executable}
    prep = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_prepare.py"), str(shared), str(excerpt), "--small",
                           "--tokenizer", "train"], capture_output=True, text=True, env=env, timeout=120)
    assert prep.returncode == 0, prep.stderr
    manifest = json.loads((excerpt / "manifest.json").read_text())
    assert manifest["small"] and manifest["squad_train_questions"] == 48 and manifest["sst2_dev_rows"] == 60
    assert manifest["gutenberg_train_books"] >= 2 and manifest["gutenberg_validation_books"] >= 2

    # a budget for a loaded CI host (the dry run's own, 120 s, is for a quiet machine)
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(excerpt), str(out), "--dry"],
                         capture_output=True, text=True, env={**env, "GPU_CHECK_BUDGET": "300"}, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "dry" and s["finished"] and list(s["stages"]) == STAGES
    st = s["stages"]
    assert {k: v["status"] for k, v in st.items()} == {
        "env": "passed", "tests": "skipped", "bench_mini": "passed", "bench_base": "skipped",
        "bench_modern_1k": "skipped", "bench_modern_8k": "skipped", "pretrain": "passed", "squad": "passed"}, run.stdout
    for name in ("env", "tests", "bench_mini", "pretrain", "squad"):
        assert st[name]["seconds"] > 0 and os.path.isfile(st[name]["log"]), name
    assert st["env"]["figures"]["cuda_available"] is False
    assert st["env"]["figures"]["bertforge_file"] == str(ROOT / "src" / "bertforge" / "__init__.py")
    # every CUDA test was collected and skipped for want of a GPU
    tests = st["tests"]["figures"]
    assert tests["skipped"] >= 9 and tests["passed"] == tests["failed"] == 0
    assert "CUDA" in st["tests"]["reason"] and "dry run" in st["bench_base"]["reason"]
    bench = st["bench_mini"]["figures"]
    from bertforge.tokenizer import load_tokenizer

    assert bench["batch_source"] == "text of train.jsonl" and bench["preset"] == "tiny"
    assert bench["vocab_size"] == load_tokenizer(str(excerpt / "tokenizer")).get_vocab_size()
    assert bench["train_tokens_per_second"] > 0 and bench["matmul_peak_dtype"] == "fp32" and 0 < bench["train_mfu"] < 1.5
    pre = st["pretrain"]["figures"]
    assert pre["steps"] >= 1 and pre["device"] == "cpu" and pre["mfu"] > 0 and math.isfinite(pre["mlm_loss"])
    squad = st["squad"]["figures"]
    assert 0 <= squad["f1"] <= 100 and squad["steps"] == math.ceil(squad["train_windows"] / 8) and squad["steps"] >= 2
    assert _tree(ROOT) == before  # nothing written into the source tree
    for bulky in ("cache", "tmp", "tests/tmp", "pretrain/checkpoints"):  # pruned: too much to bring back from a GPU
        assert not (out / bulky).exists(), bulky


@pytest.mark.slow
def test_gpu_check_refuses_bad_arguments(tmp_path):
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "none"), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "gpu_prepare.py" in r.stderr
    assert not (tmp_path / "out").exists()
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "a", "b", "--fast"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == "error: unknown option --fast (expected --dry)"


def test_bench_text_needs_a_tokenizer(capsys):
    assert main(["bench", "--text", "books.jsonl"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --text and --tokenizer go together"]


def test_squad_slice_keeps_whole_paragraphs(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from gpu_prepare import squad_slice
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    src = tmp_path / "s.json"
    data = {"version": "1.1", "data": [{"title": t, "paragraphs": [
        {"context": "c", "qas": [{"id": f"{t}{p}{q}", "question": "?", "answers": []} for q in range(3)]} for p in range(2)]}
        for t in "ab"]}
    src.write_text(json.dumps(data))
    assert squad_slice(str(src), str(tmp_path / "d.json"), 7) == 9  # 3 paragraphs of 3 questions reach 7
    got = json.loads((tmp_path / "d.json").read_text())
    assert got["version"] == "1.1" and [len(a["paragraphs"]) for a in got["data"]] == [2, 1]
