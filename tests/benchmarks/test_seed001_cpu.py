"""benchmarks/seed001_cpu.py: the plan fits 110 minutes; --dry runs every stage, raw books to the dev score, on
the shared data at toy sizes; the held-out training articles reach no training step and dev none before the
last stage; a chain run again skips what is done and refuses other settings in the same folder."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ..conftest import data_path

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "seed001_cpu.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_plan_fits_110_minutes():
    r = _run("--plan")
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and [line.split()[0] for line in lines] == [
        "split", "prepare", "pretrain", "finetune", "heldout", "dev", "total"]
    minutes = [int(line.split()[1]) for line in lines]
    assert lines[-1] == f"total {sum(minutes[:-1])} min" and minutes[-1] <= 110
    assert _run("--plan", "--pretrain-minutes", "80").returncode == 1  # over the limit: said by the status


@pytest.mark.slow
def test_dry_chain_from_raw_books_to_the_dev_score(tmp_path):
    data = data_path()
    out = tmp_path / "dry"
    r = _run("--data-dir", str(data), "--out", str(out), "--dry", "--seed", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert list(s["stages"]) == ["split", "prepare", "pretrain", "finetune", "heldout", "dev"]
    assert s["dev"]["f1"] is not None and s["heldout"]["f1"] is not None
    held = json.loads((out / "split" / "heldout.json").read_text())["data"]
    train = json.loads((out / "split" / "train.json").read_text())["data"]
    assert not {a["title"] for a in held} & {a["title"] for a in train}
    assert sum(len(p["qas"]) for a in train for p in a["paragraphs"]) == 48
    ft = json.loads((out / "squad" / "finetune_config.json").read_text())
    assert ft["finetune"]["data"]["validation_file"] in ("", None)  # nothing chosen on held-out data or dev
    assert "dev-v1.1" not in (out / "logs" / "finetune.log").read_text()
    assert all(s["stages"][st]["argv"][-3:-1] == ["--seed", "1"] for st in ("pretrain", "finetune"))
    dev = s["stages"]["dev"]["argv"]  # the dry run scores dev's first 48 questions, as split wrote them
    assert dev[dev.index("--data") + 1] == str(out / "split" / "dev.json")
    assert sum(len(p["qas"]) for a in json.loads((out / "split" / "dev.json").read_text())["data"]
               for p in a["paragraphs"]) == 48
    again = _run("--data-dir", str(data), "--out", str(out), "--dry", "--seed", "1")
    assert again.returncode == 0 and json.loads((out / "summary.json").read_text())["stages"] == s["stages"]
    other = _run("--data-dir", str(data), "--out", str(out), "--dry", "--seed", "2")
    assert other.returncode == 2 and "other settings" in other.stderr
