"""The tasks' contract, parametrized over the tasks registry: every registered task reads its files, encodes
them, trains a step, evaluates (the run's figures, and `evaluate NAME` and the API on the saved folder alike),
predicts through its pipeline, and leaves a folder the reference library loads with the same outputs.

A task added to the registry must add its sample here (``SAMPLES``): the first test fails until it does."""

from __future__ import annotations

import importlib.util
import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from bertforge import evaluate, pipeline
from bertforge.cli import main
from bertforge.tasks import TASKS

from ..helpers import padded_batch, tiny_model_dir

ONNX = importlib.util.find_spec("onnxruntime") is not None and importlib.util.find_spec("onnxscript") is not None

PEOPLE, PLACES = ["anna", "boris", "carla", "dmitri"], ["paris", "oslo", "lima", "rome"]
FACTS = [f"{p} lives in {q} and works near the {w} market" for p, q, w in
         zip(PEOPLE * 2, PLACES[1:] + PLACES[:1] + PLACES, ["fish", "flower", "book", "bread"] * 2)]


def _jsonl(path: pathlib.Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _classify(d: pathlib.Path) -> tuple[str, str]:
    rows = [{"text": f, "label": "north" if i % 2 else "south"} for i, f in enumerate(FACTS)]
    return _jsonl(d / "train.jsonl", rows), _jsonl(d / "dev.jsonl", rows[:4])


def _squad(d: pathlib.Path) -> tuple[str, str]:
    paragraphs = [{"context": f, "qas": [{"id": f"q{i}", "question": f"where does {f.split()[0]} live",
                                          "answers": [{"text": f.split()[3], "answer_start": f.index(f.split()[3])}]}]}
                  for i, f in enumerate(FACTS)]
    (d / "squad.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return str(d / "squad.json"), str(d / "squad.json")


def _embed(d: pathlib.Path) -> tuple[str, str]:
    # (words every fact has: a first stage then ranks other people's facts too, negatives to mine)
    rows = [{"query": f"near which market does {f.split()[0]} work", "positive": f} for f in FACTS]
    return _jsonl(d / "pairs.jsonl", rows), _jsonl(d / "dev-pairs.jsonl", rows[:4])


def _ner(d: pathlib.Path) -> tuple[str, str]:
    def sentence(f: str) -> str:
        tags = ["B-per", "O", "O", "B-loc"] + ["O"] * (len(f.split()) - 4)
        return "\n".join(f"{w}\t{t}" for w, t in zip(f.split(), tags))

    (d / "train.conll").write_text("\n\n".join(sentence(f) for f in FACTS) + "\n")
    (d / "dev.conll").write_text("\n\n".join(sentence(f) for f in FACTS[:4]) + "\n")
    return str(d / "train.conll"), str(d / "dev.conll")


def transformers_difference(task, folder: str) -> float:
    """transformers' class of the task model's name against ours, on a padded batch of two segments."""
    transformers = pytest.importorskip("transformers")
    ours = task.model_class.from_pretrained(folder).eval()
    theirs = getattr(transformers, task.model_class.__name__).from_pretrained(folder).eval()
    ids, mask, types = padded_batch(ours.config.vocab_size, T=16)
    with torch.no_grad():
        return task(task.settings_class()).reference_difference(
            ours, theirs, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})


def sentence_transformers_difference(task, folder: str) -> float:
    """sentence-transformers' vectors of the folder against our pipeline's."""
    st = pytest.importorskip("sentence_transformers")
    texts = ["where does anna work", FACTS[1]]
    theirs = st.SentenceTransformer(folder, device="cpu").encode(texts, convert_to_numpy=True)
    return float(abs(pipeline(task.predict_name, model=folder, device="cpu")(texts) - theirs).max())


def cross_encoder_difference(task, folder: str) -> float:
    """sentence-transformers' CrossEncoder scores of the folder against our pipeline's."""
    st = pytest.importorskip("sentence_transformers")
    pairs = [("where does anna work", FACTS[0]), ("where does anna work", FACTS[1])]
    theirs = st.CrossEncoder(folder, device="cpu").predict(pairs)
    return float(abs(pipeline(task.predict_name, model=folder, device="cpu").predict(pairs) - theirs).max())


@dataclass
class Sample:
    write: Callable[[pathlib.Path], tuple[str, str]]  # (training file, validation file) in a folder
    predict: Callable[[object], object]  # a call of the task's pipeline
    settings: dict | None = None  # the task's own settings for a tiny run (flags and the API's keywords)
    reference: Callable[[type, str], float] = transformers_difference  # the reference library's difference


SAMPLES = {
    "classify": Sample(_classify, lambda p: p(["anna lives in oslo"])),
    "squad": Sample(_squad, lambda p: p(question="where does anna live", context=FACTS[0]), {"doc_stride": 8}),
    "embed": Sample(_embed, lambda p: p(["where does anna work"]), reference=sentence_transformers_difference),
    "ner": Sample(_ner, lambda p: p(["anna lives in oslo"])),
    "rerank": Sample(_embed, lambda p: p("where does anna work", FACTS[:3]), {"num_negatives": 2, "top_k": 4},
                     reference=cross_encoder_difference),
}


def test_every_registered_task_has_a_sample():
    assert set(TASKS) <= set(SAMPLES), f"add a sample of {set(TASKS) - set(SAMPLES)} to this file"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return tiny_model_dir(tmp_path_factory.mktemp("base") / "model", FACTS + ["where does work live"], vocab_size=120)


def _trained(name: str, base: str, tmp_path: pathlib.Path, capsys) -> tuple[pathlib.Path, str, dict, dict]:
    """(the folder a 2-step run of task ``name`` saved, its validation file, the evaluation's settings of the task's
    sample, the figures the run printed)."""
    task, sample = TASKS[name], SAMPLES[name]
    train, validation = sample.write(tmp_path)
    settings = sample.settings or {}
    flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    taken = {k: v for k, v in settings.items() if task.evaluate_flags is None or k in task.evaluate_flags}
    out = tmp_path / "out"
    assert main(["--quiet", "finetune", name, "--model", base, "--train", train, "--validation", validation,
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32", "--lr", "1e-3",
                 "--no-progress", *flags]) == 0, capsys.readouterr().err
    return out, validation, taken, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_task_reads_trains_evaluates_predicts_and_leaves_a_reference_folder(name, base, tmp_path, capsys, plots_on):
    task, sample = TASKS[name], SAMPLES[name]
    out, validation, taken, printed = _trained(name, base, tmp_path, capsys)
    assert {p.name for p in (out / "plots").iterdir()} == {"loss.png", "metrics.png", "lr.png"}
    evaluate_flags = [x for k, v in taken.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    assert set(task.printed) <= set(printed), printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_step"] == 2 and all(metrics[k] == printed[k] for k in task.printed)

    # the saved folder scores its validation file as the run did, by the API and by `evaluate NAME`
    api = evaluate(task.evaluate_name, model=str(out), data=validation, max_seq_length=32, **taken)
    assert all(api[k] == pytest.approx(printed[k], abs=1e-6) for k in task.printed), (api, printed)
    assert main(["--quiet", "evaluate", task.evaluate_name, "--model", str(out), "--data", validation,
                 "--max-seq-length", "32", *evaluate_flags]) == 0
    said = json.loads(capsys.readouterr().out)
    assert all(said[k] == pytest.approx(api[k], abs=1e-6) for k in task.printed), (said, api)

    assert sample.predict(pipeline(task.predict_name, model=str(out), device="cpu")) is not None

    # the reference library loads the folder and computes our outputs
    assert sample.reference(task, str(out)) < 1e-4


@pytest.mark.slow
@pytest.mark.skipif(not ONNX, reason="export onnx needs the onnx extra")
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_tasks_folder_exports_to_onnx_and_scores_as_the_torch_model(name, base, tmp_path, capsys):
    """The folder exports (its head, whatever the task), and the graph scores the validation file as the torch model
    does through the task's own evaluation and pipeline (``--backend onnx``: one pre- and post-processing)."""
    task, sample = TASKS[name], SAMPLES[name]
    out, validation, taken, _ = _trained(name, base, tmp_path, capsys)
    assert main(["--quiet", "export", "onnx", "--model", str(out), "--out", str(tmp_path / "onnx")]) == 0
    torch_figures = evaluate(task.evaluate_name, model=str(out), data=validation, max_seq_length=32, **taken)
    graph = evaluate(task.evaluate_name, model=str(tmp_path / "onnx"), data=validation, max_seq_length=32,
                     backend="onnx", **taken)
    assert all(graph[k] == pytest.approx(torch_figures[k], abs=1e-4) for k in task.printed), (graph, torch_figures)
    assert sample.predict(pipeline(task.predict_name, model=str(tmp_path / "onnx"), backend="onnx")) is not None
