"""benchmarks/defaults_screen.py: a run cut short goes on from its checkpoint, a new one starts afresh, a finished
one is read back (the screen's long runs span sessions)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _screen():
    spec = importlib.util.spec_from_file_location("defaults_screen", ROOT / "benchmarks" / "defaults_screen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_cut_short_resumes_and_a_finished_one_is_read_back(tmp_path, monkeypatch, capsys):
    screen = _screen()
    runs = tmp_path / "out" / "wnut16" / "a"
    (runs / "s1" / "checkpoints" / "step-00000010").mkdir(parents=True)  # s1: cut short; s0: never started
    commands = []

    def run(cmd, stdout=None, stderr=None):
        commands.append(cmd)
        out = pathlib.Path(cmd[cmd.index("--out") + 1])
        (out / "metrics.json").write_text(json.dumps({"f1": 0.5}))
        (out / "finetune_config.json").write_text(json.dumps({"finetune": {
            "train": {"batch_size": 8, "lr": 5e-5, "epochs": 10}, "data": {"max_seq_length": 128},
                "impl": {"precision": "bf16"}}}))
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(screen.subprocess, "run", run)
    argv = ["defaults_screen.py", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"), "--case", "wnut16",
            "--seeds", "0", "1", "--arm", "a=--epochs 10"]
    monkeypatch.setattr(sys, "argv", argv)
    assert screen.main() == 0
    assert ["--overwrite" in c for c in commands] == [True, False]
    assert ["--resume" in c for c in commands] == [False, True]
    assert all(c[-2:] == ["--epochs", "10"] for c in commands)
    rows = [json.loads(r) for r in (tmp_path / "out" / "wnut16" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["precision"] == "bf16" for r in rows)  # what auto resolved to, per run
    commands.clear()
    assert screen.main() == 0 and commands == []  # finished: read back, not run again
    assert "median 0.5000" in capsys.readouterr().out
