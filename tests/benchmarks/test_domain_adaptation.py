"""benchmarks/domain_adaptation.py: --dry runs every stage of the chain on toy data written here; the split
follows its stated rule and the held-out reviews reach no training step; (a) and (b) get equal compute; a chain
run again skips what is done and refuses other settings in the same folder; the full plan fits two hours."""

from __future__ import annotations

import pytest

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

from bertforge.demo.corpus import generate_stories, sentiment_split

from ..conftest import data_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "domain_adaptation.py"
MAIN_ARMS = ["a", "b", "c", "a+v"]


def _script():
    spec = importlib.util.spec_from_file_location("domain_adaptation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _toy_data(root: pathlib.Path) -> pathlib.Path:
    """A stand-in for ../shared/data: stories as books, three-sentence reviews, two of them duplicates."""
    (root / "gutenberg").mkdir(parents=True)
    (root / "imdb").mkdir()
    for name, seed in (("train-000", 1), ("train-001", 2), ("validation", 3)):  # books of 40 stories each
        stories = [" ".join(s) for s in generate_stories(240, seed)]
        books = ["\n\n".join(stories[i:i + 40]) for i in range(0, 240, 40)]
        (root / "gutenberg" / f"{name}.jsonl").write_text("".join(json.dumps({"text": b}) + "\n" for b in books))
    sentences = sentiment_split(600, seen=True, seed=0)
    rows = []
    for i in range(200):
        label = i % 2
        picked = [t for t, lbl in sentences if (lbl == "positive") == bool(label)][3 * (i // 2): 3 * (i // 2) + 3]
        rows.append({"text": f"Review {i}. " + " ".join(picked), "label": label})
    rows.insert(50, rows[3])  # a labelled review again, where the held-out ones are
    rows.append(rows[60])  # a held-out review again, in the continuation text
    (root / "imdb" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _run(*args: str, timeout: int = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "BERTFORGE_DATA"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_dry_chain_end_to_end_then_resumed_stage_by_stage(tmp_path, monkeypatch, capsys):
    data, out = _toy_data(tmp_path / "data"), tmp_path / "run"
    r = _run("--data-dir", str(data), "--out", str(out), "--dry")  # as a user runs it; then in this process
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((out / "results.json").read_text())
    assert res["mode"] == "dry" and res["complete"] and res["max_seq_length"] == 128
    arms = {a["key"]: a for a in res["arms"]}
    assert list(arms) == MAIN_ARMS
    for key in ("a", "b", "c"):
        acc = arms[key]["accuracy"]
        assert acc["n"] == 3 and list(acc["per_seed"]) == ["0", "1", "2"], key
        assert 0 <= acc["min"] <= acc["mean"] <= acc["max"] <= 1
        assert math.isfinite(arms[key]["heldout_mlm"]["loss"])
    assert arms["a+v"]["heldout_mlm"] is None  # its loss is over another vocabulary
    assert arms["a+v"]["accuracy"]["n"] == 3 and arms["a+v"]["pretraining"]["settings"]["add_vocab"] == 20
    assert arms["a+v"]["pretraining"]["vocab_size"] > arms["a"]["pretraining"]["vocab_size"]
    # equal compute: (a) and (b) ran the same steps at the same batch size, from the same model
    pa, pb = arms["a"]["pretraining"], arms["b"]["pretraining"]
    assert pa["steps"] == pb["steps"] == res["sizes"]["cont_steps"]
    assert pa["settings"]["batch_size"] == pb["settings"]["batch_size"] == res["sizes"]["batch_size"]
    assert pa["settings"]["recipe"] == pb["settings"]["recipe"] == "continue"  # the continued-pretraining recipe
    assert set(res["checks"]) == {"a_lowest_seed_above_b_highest", "a_heldout_loss_below_b"}
    assert "| (a) continued on IMDB reviews |" in (out / "results.md").read_text()
    _check_split(data, out, res)

    # killed after some stages: their records gone, the same command runs those again and skips the rest
    for name in ("finetune-base-s1", "accuracy-base-s1", "mlm-cont-imdb-2"):
        (out / "stages" / f"{name}.json").unlink()
    monkeypatch.setenv("BERTFORGE_THREADS", "1")
    monkeypatch.delenv("BERTFORGE_DATA", raising=False)
    da = _script()
    assert da.main(["--data-dir", str(data), "--out", str(out), "--dry"]) == 0
    ran = sorted(line.split()[1].rstrip(":") for line in capsys.readouterr().out.splitlines() if "done in" in line)
    assert ran == ["accuracy-base-s1", "finetune-base-s1", "mlm-cont-imdb-2"]
    assert "--overwrite" in (out / "logs" / "finetune-base-s1.log").read_text().splitlines()[0]
    res2 = json.loads((out / "results.json").read_text())
    assert res2["arms"] == res["arms"]  # the same figures: every stage is seeded

    # other settings in the same folder are refused before anything runs
    before = sorted(p.name for p in (out / "stages").iterdir())
    assert da.main(["--data-dir", str(data), "--out", str(out), "--dry", "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "use another --out" in err
    assert sorted(p.name for p in (out / "stages").iterdir()) == before


def _check_split(data: pathlib.Path, out: pathlib.Path, res: dict) -> None:
    """The stated rule, on the toy file; the held-out reviews only ever evaluated."""
    rows, unique, seen = _jsonl(data / "imdb" / "train.jsonl"), [], set()
    for row in rows:
        if row["text"] not in seen:
            seen.add(row["text"])
            unique.append(row)
    labelled, heldout, unlabelled = (_jsonl(out / "splits" / f"{n}.jsonl") for n in ("labelled", "heldout",
                                                                                        "unlabelled"))
    assert labelled == unique[:40] and heldout == unique[40:80]
    assert unlabelled == [{"text": r["text"]} for r in unique[80:200]]
    texts = [{r["text"] for r in part} for part in (labelled, heldout, unlabelled)]
    assert not (texts[0] & texts[1] or texts[1] & texts[2] or texts[0] & texts[2])
    assert res["split"]["files"]["heldout"]["reviews"] == 40
    heldout_path = str(out / "splits" / "heldout.jsonl")
    for command in res["commands"]:
        if heldout_path in command:
            assert command.startswith(("bertforge evaluate mlm", "bertforge evaluate classify")), command


def test_plan_lists_every_arm_and_refuses_bad_input(tmp_path, capsys):
    da = _script()
    data = _toy_data(tmp_path / "data")
    assert da.main(["--plan", "--json", "--data-dir", str(data), "--out", str(tmp_path / "run"),
                    "--try", "doubled", "lr-screen", "labelled-text"]) == 0
    names = [s["stage"] for s in json.loads(capsys.readouterr().out)["stages"]]
    screened = [f"cont-{text}-500-lr{lr:g}" for lr in da.LR_SCREEN if lr != da.recipe_lr() for text in ("imdb",
                                                                                                      "books")]
    assert len(screened) >= 4  # the recipe's own rate is the main arm's
    for model in ("base", "cont-imdb-500", "cont-books-500", "cont-imdb-vocab2000-500", "cont-imdb-1000",
                  "cont-books-1000", "cont-labelled-500", *screened):
        assert f"finetune-{model}-s2" in names and f"accuracy-{model}-s0" in names, model
    assert len(names) == len(set(names)) and not (tmp_path / "run").exists()
    reviews = data / "imdb" / "train.jsonl"
    reviews.write_text("".join(reviews.read_text().splitlines(keepends=True)[:80]))  # none left to continue on
    for trouble in ("too few", "not found"):
        assert da.main(["--data-dir", str(data), "--out", str(tmp_path / "run"), "--dry"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and trouble in err, err
        assert not (tmp_path / "run").exists()
        reviews.unlink(missing_ok=True)


def test_full_plan_fits_two_hours_and_the_real_split(capsys):
    data = data_path("imdb", "train.jsonl").parents[1]
    da = _script()
    assert da.main(["--plan", "--json", "--data-dir", str(data), "--out", "/nonexistent/run"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["total_minutes"] < 120 and len(p["stages"]) == 1 + 1 + 3 + 3 + 2 * 3 * 4
    base = next(s for s in p["stages"] if s["stage"] == "pretrain-base")
    assert 25 <= base["estimated_minutes"] <= 35  # about 30 minutes from scratch
    parts = da.split_reviews(da.read_reviews(str(data / "imdb" / "train.jsonl")), 2000, 5000)
    assert [len(parts["labelled"]), len(parts["heldout"])] == [2000, 5000] and len(parts["unlabelled"]) > 17000
    texts = [{r["text"] for r in part} for part in parts.values()]
    assert not (texts[0] & texts[1] or texts[1] & texts[2] or texts[0] & texts[2])
    for name in ("labelled", "heldout"):
        assert 0.45 < sum(r["label"] for r in parts[name]) / len(parts[name]) < 0.55


def test_failed_stage_is_one_line_and_keeps_what_is_done(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERTFORGE_THREADS", "1")
    monkeypatch.delenv("BERTFORGE_DATA", raising=False)
    data, out = _toy_data(tmp_path / "data"), tmp_path / "run"
    (data / "gutenberg" / "train-001.jsonl").write_text(json.dumps({"text": "A short book."}) + "\n")
    assert _script().main(["--data-dir", str(data), "--out", str(out), "--dry"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: stage pretrain-cont-books-2 failed (exit status 2): ")
    assert "Traceback" not in err and str(out / "logs" / "pretrain-cont-books-2.log") in err
    done = {p.stem for p in (out / "stages").iterdir()}
    assert {"split", "pretrain-base", "pretrain-cont-imdb-2", "accuracy-cont-imdb-2-s2"} <= done
    assert not any(name.startswith(("pretrain-cont-books", "mlm-base")) for name in done)
    res = json.loads((out / "results.json").read_text())
    assert not res["complete"] and res["arms"][0]["accuracy"]["n"] == 3
