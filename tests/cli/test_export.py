"""``bertforge export onnx`` and ``--backend``: the folders it writes, what loads them, the int8 gate, bad input."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch

from bertforge import pipeline
from bertforge.cli import main
from bertforge.embeddings import EmbeddingSettings, write_settings
from bertforge.models import BertConfig, BertForSequenceClassification, BertModel
from bertforge.tokenizer import train_vocabulary

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
pytestmark = pytest.mark.slow  # (each test exports a graph: several seconds)

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "rain falls on the town at night"]


@pytest.fixture(scope="module")
def tok():
    return train_vocabulary(TEXTS * 4, 80, min_frequency=1)


def save(model_class, folder, tok, **config) -> str:
    torch.manual_seed(0)
    model_class(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), **config)).save_pretrained(
        str(folder), tokenizer=tok)
    return str(folder)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tok) -> str:
    folder = save(BertModel, tmp_path_factory.mktemp("st") / "model", tok)
    write_settings(folder, EmbeddingSettings(pooling="mean", normalize=True, max_seq_length=64), 128)
    return folder


@pytest.fixture(scope="module")
def exported_embedder(embedder, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("exported") / "st")
    assert main(["--quiet", "export", "onnx", "--model", embedder, "--out", out, "--int8"]) == 0
    return out


def test_an_embeddings_folder_exports_inside_a_copy_that_sentence_transformers_reads(embedder, exported_embedder):
    st = pytest.importorskip("sentence_transformers")
    out = exported_embedder
    assert {"modules.json", "1_Pooling", "2_Normalize", "config.json", "tokenizer.json"} <= set(os.listdir(out))
    assert sorted(os.listdir(os.path.join(out, "onnx"))) == ["export.json", "model.onnx",
                                                            "model_qint8_avx512_vnni.onnx"]
    reference = st.SentenceTransformer(embedder, device="cpu")
    theirs = reference.encode(TEXTS, convert_to_numpy=True)
    # the graph through onnxruntime, then the folder's own pooling and normalisation modules
    session = ort.InferenceSession(os.path.join(out, "onnx", "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
    features = reference.tokenize(TEXTS)
    hidden = session.run(None, {i.name: features[i.name].numpy() for i in session.get_inputs()})[0]
    pooled = reference[1]({"token_embeddings": torch.from_numpy(hidden),
                           "attention_mask": features["attention_mask"]})
    vectors = reference[2](pooled)["sentence_embedding"].numpy()
    assert abs(vectors - theirs).max() < 1e-4
    # and bertforge's own pipeline on it, fp32 and int8
    assert abs(pipeline("embed", model=out, backend="onnx")(TEXTS) - theirs).max() < 1e-4
    int8 = pipeline("embed", model=out, backend="onnx-int8")(TEXTS)
    assert float((int8 * theirs).sum(-1).min()) > 0.9
    if _optimum_loads():  # sentence-transformers' own ONNX backend, where its Optimum installs
        ours = st.SentenceTransformer(out, backend="onnx", device="cpu").encode(TEXTS, convert_to_numpy=True)
        assert abs(ours - theirs).max() < 1e-4


def _optimum_loads() -> bool:
    try:
        importlib.import_module("optimum.onnxruntime")
    except Exception:  # not installed, or not for this transformers
        return False
    return True


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tok) -> tuple[str, str]:
    """(a sequence classifier's folder, a JSONL file of labelled texts)."""
    root = tmp_path_factory.mktemp("clf")
    folder = save(BertForSequenceClassification, root / "clf", tok, id2label={0: "neg", 1: "pos"})
    data = root / "dev.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "pos" if i % 2 else "neg"}) + "\n"
                            for i, t in enumerate(TEXTS * 2)))
    return folder, str(data)


@pytest.fixture(scope="module")
def exported_classifier(classifier, tmp_path_factory) -> tuple[str, str]:
    """(the classifier exported fp32 and int8 with the accuracy check, what the export printed)."""
    folder, data = classifier
    out, printed = tmp_path_factory.mktemp("clf-onnx") / "onnx", io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["--quiet", "export", "onnx", "--model", folder, "--out", str(out), "--int8", "--check-data", data])
    assert code == 0, printed.getvalue()
    return str(out), printed.getvalue()


def test_predict_and_evaluate_take_the_backend(classifier, exported_classifier, capsys):
    _, data = classifier
    out, printed = exported_classifier
    out = pathlib.Path(out)
    assert "accuracy on" in printed and "onnx-int8" in printed
    check = json.loads((out / "onnx" / "export.json").read_text())["check"]
    assert check["task"] == "classify" and check["torch"] == check["onnx"]
    figures = {}
    for backend in ("torch", "onnx", "onnx-int8"):
        assert main(["evaluate", "classify", "--model", str(out), "--data", str(data), "--backend", backend]) == 0
        figures[backend] = json.loads(capsys.readouterr().out)
    assert figures["onnx"]["loss"] == pytest.approx(figures["torch"]["loss"], abs=1e-5)
    assert figures["onnx-int8"]["loss"] == pytest.approx(figures["torch"]["loss"], abs=1e-2)
    for backend in ("torch", "onnx"):
        assert main(["predict", "classify", "--model", str(out), "--json", "--backend", backend, TEXTS[0]]) == 0
        figures[backend] = json.loads(capsys.readouterr().out)
    assert figures["onnx"][0]["score"] == pytest.approx(figures["torch"][0]["score"], abs=1e-5)



def test_a_run_folder_of_links_exports_as_a_copy_of_its_files_and_again_over_it(classifier, tmp_path, capsys):
    """A folder whose files are links (a hub cache's snapshot) exports with the files themselves, and a run's
    folder (marked a fine-tuning output) gives an export's folder, which --overwrite replaces."""
    from bertforge.outputs import marker_kind, write_marker

    folder, _ = classifier
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in os.listdir(folder):
        (linked / name).symlink_to(pathlib.Path(folder, name))
    write_marker(str(linked), "finetune")
    out = tmp_path / "onnx"
    for extra in ([], ["--overwrite"]):
        assert main(["--quiet", "export", "onnx", "--model", str(linked), "--out", str(out), *extra]) == 0, \
            capsys.readouterr().err
        assert marker_kind(str(out)) == "export"
        assert (out / "config.json").is_file() and not (out / "config.json").is_symlink()
    assert sorted(os.listdir(out)) == sorted([*os.listdir(folder), ".bertforge", "onnx"])
    assert main(["predict", "classify", "--model", str(out), "--backend", "onnx", TEXTS[0]]) == 0

def test_a_pretrained_folder_exports_its_masked_lm_for_fill_mask(tmp_path, tok, capsys):
    from bertforge.models import BertForPreTraining

    folder = save(BertForPreTraining, tmp_path / "pretrained", tok)
    assert main(["--quiet", "export", "onnx", "--model", folder, "--out", str(tmp_path / "onnx")]) == 0
    ours = {b: pipeline("fill-mask", model=str(tmp_path / "onnx"), backend=b)("the [MASK] sat on the mat")
            for b in ("torch", "onnx")}
    assert [c["token"] for c in ours["onnx"]] == [c["token"] for c in ours["torch"]]
    (tmp_path / "held-out.txt").write_text(" ".join(TEXTS * 6))
    figures = {}
    for backend in ("torch", "onnx"):
        assert main(["--quiet", "evaluate", "mlm", "--model", str(tmp_path / "onnx"), "--data",
                     str(tmp_path / "held-out.txt"), "--max-seq-length", "16", "--backend", backend]) == 0
        figures[backend] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert figures["onnx"]["masked_tokens"] == figures["torch"]["masked_tokens"] > 0
    assert figures["onnx"]["mlm_loss"] == pytest.approx(figures["torch"]["mlm_loss"], abs=1e-4)
    assert main(["predict", "next-sentence", "--model", str(tmp_path / "onnx"), "--backend", "onnx", "a", "b"]) == 2
    assert "not prediction_logits, seq_relationship_logits" in capsys.readouterr().err


def _error(argv, capsys) -> str:
    assert main(["--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, tok, embedder, capsys):
    out = tmp_path / "out"
    assert "not a model folder" in _error(["export", "onnx", "--model", str(tmp_path), "--out", str(out)], capsys)
    folder = save(BertModel, tmp_path / "odd", tok)
    config = json.loads((tmp_path / "odd" / "config.json").read_text())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMultipleChoice"]}))
    assert "a head export onnx does not know" in _error(["export", "onnx", "--model", folder, "--out", str(out)],
                                                        capsys)
    (tmp_path / "file").write_text("x")
    assert "cannot be created" in _error(["export", "onnx", "--model", embedder, "--out",
                                          str(tmp_path / "file" / "out")], capsys)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    _error(["export", "onnx", "--model", embedder, "--out", str(out), "--check-data", str(bad)], capsys)
    assert "--opset 12" in _error(["export", "onnx", "--model", embedder, "--out", str(out), "--opset", "12"], capsys)
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]
    # a folder without a graph, for --backend onnx
    assert "write it with bertforge export onnx" in _error(
        ["predict", "embed", "--model", embedder, "--backend", "onnx-int8", "a text"], capsys)


def test_without_the_extra_export_names_it(tmp_path, embedder, monkeypatch, capsys):
    real = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name.split(".")[0] in ("onnx", "onnxruntime", "onnxscript"):
            raise ImportError(name=name.split(".")[0])
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    assert "pip install 'bertforge[onnx]'" in _error(["export", "onnx", "--model", embedder, "--out",
                                                      str(tmp_path / "o")], capsys)
    assert "pip install 'bertforge[onnx]'" in _error(["predict", "embed", "--model", embedder, "--backend", "onnx",
                                                      "a"], capsys)


def test_the_int8_gate_refuses_a_graph_below_the_torch_model(classifier, exported_classifier, tmp_path, monkeypatch,
                                                             capsys):
    import bertforge.export as export

    folder, _ = classifier
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "pos"}) + "\n" for t in TEXTS))
    # the graph of this very folder, traced once for the module (tracing is what an export spends its time on)
    graph = os.path.join(exported_classifier[0], "onnx", "model.onnx")
    monkeypatch.setattr(export, "trace", lambda model, config, inputs, outputs, path, *a: shutil.copyfile(graph, path))
    monkeypatch.setattr(export, "GATE", -1.0)  # any int8 graph falls "below" a gate under the torch figure
    err = _error(["export", "onnx", "--model", folder, "--out", str(tmp_path / "o"), "--int8", "--check-data",
                  str(data)], capsys)
    assert "the int8 graph's accuracy" in err and not (tmp_path / "o").exists()
    np.testing.assert_equal(os.path.exists(tmp_path / "o"), False)
