import pytest
"""bertforge demo --quick: the whole pipeline end to end on the built-in corpus (at a toy size)."""

import json
import math
import time
from dataclasses import replace

from bertforge.cli import main
from bertforge.demo.run import DemoSettings
from bertforge.demo.corpus import (
    LAUGHED,
    LOVED,
    NEGATIVE,
    POSITIVE,
    SEEN,
    SMILED,
    VERY,
    generate_stories,
    sentiment_split,
)


@pytest.mark.slow
def test_demo_quick_runs_end_to_end(tmp_path, capsys, monkeypatch, plots_on):
    """`demo --quick` through the command line, every stage and output, at a toy size (what it reaches at its
    real size, seed by seed, is in the README's demo section)."""
    toy = replace(DemoSettings.quick(), stories=300, mlm_steps=60, nsp_steps=20, finetune_epochs=1)
    monkeypatch.setattr(DemoSettings, "quick", classmethod(lambda cls: toy))
    out = tmp_path / "demo"
    t0 = time.time()
    assert main(["--quiet", "demo", "--quick", "--out", str(out), "--no-progress", "--seed", "3"]) == 0
    elapsed = time.time() - t0
    printed = capsys.readouterr().out
    assert "MLM accuracy" in printed and "NSP accuracy" in printed and "sentiment accuracy" in printed
    s = json.loads((out / "metrics.json").read_text())
    for k in ("mlm_accuracy", "mlm_baseline", "nsp_accuracy", "sentiment_accuracy", "sentiment_accuracy_no_pretraining"):
        assert math.isfinite(s[k]) and 0 <= s[k] <= 1, k
    assert s["seed"] == 3 and s["settings"]["seed"] == 3 and s["seconds"] > 0
    assert s["settings"]["mlm_steps"] == 60 and s["pretrain_steps"] == [60, 20]  # the toy settings ran
    assert s["mlm_accuracy"] > s["mlm_baseline"]  # even the quick run learns more than word frequencies
    samples = json.loads((out / "samples.json").read_text())
    for f in ("report.md", "report.html", "results.png", "pretrained/plots/loss.png", "pretrained/plots/accuracy.png",
              "pretrained-mlm/plots/loss.png", "sentiment-pretrained/plots/metrics.png", "sentiment-scratch/plots/metrics.png",
              "pretrained/model.safetensors"):
        assert (out / f).is_file(), f
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert len(samples["fill_mask"]) >= 3 and len(samples["next_sentence"]) >= 3
    print(f"demo --quick took {elapsed:.0f}s")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert main(["demo", "--quick", "--out", str(other)]) == 2  # never overwrites a folder that is not a demo's
    assert (other / "keep.txt").read_text() == "mine"


def test_demo_corpus_is_deterministic_and_large_enough():
    a, b = generate_stories(2000, seed=0), generate_stories(2000, seed=0)
    assert a == b and len(a) == 2000 and a != generate_stories(2000, seed=1)
    train, test = sentiment_split(200, True, 1), sentiment_split(400, False, 3)
    seen = set(POSITIVE[:SEEN] + NEGATIVE[:SEEN])
    assert all(any(w.strip(".") in seen for w in t.split()) for t, _ in train)
    assert not any(any(w.strip(".") in seen for w in t.split()) for t, _ in test)  # test adjectives are never seen
    cues = set(SMILED + LOVED + LAUGHED + VERY)  # the stories' mood words: never in a labelled sentence
    assert not any(w.strip(".,").lower() in cues for t, _ in train + test for w in t.split())
    assert sum(lab == "positive" for _, lab in test) == 200
    words = {w.strip(".,").lower() for s in a for sent in s for w in sent.split()}
    assert set(POSITIVE + NEGATIVE) <= words  # every sentiment adjective occurs in the stories


def test_every_story_has_one_mood_that_its_adjectives_and_reactions_share():
    for story in generate_stories(300, seed=5):
        words = [w.strip(".,").lower() for sent in story for w in sent.split()]
        pos, neg = sum(w in POSITIVE for w in words), sum(w in NEGATIVE for w in words)
        assert (pos == 0) != (neg == 0) and pos + neg >= 3  # adjectives of one mood only
        m = 0 if pos else 1
        reactions = [w for w in words if w in SMILED + LOVED + LAUGHED + VERY]
        assert reactions and all(w in (SMILED[m], LOVED[m], LAUGHED[m], VERY[m]) for w in reactions)
        assert VERY[m] in reactions
