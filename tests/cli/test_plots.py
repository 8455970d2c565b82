"""A run's PNG plots: drawn from its metrics.jsonl, and skipped where BERTFORGE_PLOTS=0 (as this suite's runs do)."""

from __future__ import annotations

import json

from bertforge.plots import plot_finetuning


def test_plots_are_drawn_unless_turned_off(tmp_path, monkeypatch):
    rows = [{"type": "train", "step": s, "loss": 1.0 / s, "lr": 1e-4} for s in (1, 2, 3)]
    rows.append({"type": "eval", "step": 3, "loss": 0.5, "f1": 0.7})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("BERTFORGE_PLOTS", "0")
    assert plot_finetuning(str(tmp_path / "metrics.jsonl"), str(tmp_path / "off"), [("f1", "F1")]) == []
    assert not (tmp_path / "off").exists()
    monkeypatch.delenv("BERTFORGE_PLOTS")
    made = plot_finetuning(str(tmp_path / "metrics.jsonl"), str(tmp_path / "on"), [("f1", "F1")])
    assert sorted(p.name for p in (tmp_path / "on").iterdir()) == ["loss.png", "lr.png", "metrics.png"]
    assert len(made) == 3 and all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in made)
