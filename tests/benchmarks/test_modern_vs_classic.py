"""benchmarks/modern_vs_classic.py: --dry runs every stage of both arms on the shared data at toy sizes, and a chain
run again skips what is done."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ..conftest import data_path

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "modern_vs_classic.py"


@pytest.mark.slow
def test_dry_run_pretrains_scores_and_fine_tunes_both_arms(tmp_path):
    data = data_path("sst2", "train.tsv").parents[1]
    out = tmp_path / "dry"
    r = subprocess.run([sys.executable, str(SCRIPT), "--data-dir", str(data), "--out", str(out), "--dry"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    for arch in ("bert", "modernbert"):
        arm = s["arms"][arch]
        assert arm["steps"] == 3 and 0 <= arm["heldout_mlm_accuracy"] <= 1 and len(arm["sst2_accuracy"]) == 1
    assert json.loads((out / "modernbert" / "config.json").read_text())["model_type"] == "modernbert"
    assert json.loads((out / "bert" / "config.json").read_text())["model_type"] == "bert"
    assert "| modernbert |" in r.stdout
    again = subprocess.run([sys.executable, str(SCRIPT), "--data-dir", str(data), "--out", str(out), "--dry"],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == r.stdout  # every stage skipped: the same table
