"""Model directories: safe formats, atomic writes, clear errors."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertModel,
    UserError,
)
from bertforge.atomic import atomic_dir


def _save(tmp_path, cls=BertForPreTraining, **kw):
    torch.manual_seed(0)
    m = cls(BertConfig.preset("tiny", vocab_size=100, **kw))
    m.save_pretrained(tmp_path / "m")
    return m, tmp_path / "m"


def test_files_and_no_pickle(tmp_path):
    _, d = _save(tmp_path)
    assert sorted(os.listdir(d)) == ["config.json", "model.safetensors"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == ["BertForPreTraining"] and cfg["model_type"] == "bert"
    assert "cls.predictions.decoder.weight" not in load_file(d / "model.safetensors")  # tied, stored once


def test_base_checkpoint_into_task_model_reports_new_head(tmp_path, minilm_dir):
    m = BertForSequenceClassification.from_pretrained(minilm_dir, config=None)
    assert m.loading_info["newly_initialized"] == ["classifier.weight", "classifier.bias"]
    qa = BertForQuestionAnswering.from_pretrained(minilm_dir)
    assert qa.loading_info["newly_initialized"] == ["qa_outputs.weight", "qa_outputs.bias"]
    assert "bert.pooler.dense.weight" not in qa.state_dict()
    assert any(k.startswith("bert.pooler.") for k in qa.loading_info["unused"])
    # the encoder weights really came from the checkpoint (which has no bert. prefix)
    raw = load_file(os.path.join(minilm_dir, "model.safetensors"))
    assert torch.equal(qa.bert.encoder.layer[0].attention.self.query.weight, raw["encoder.layer.0.attention.self.query.weight"])


def test_task_checkpoint_into_base_model(tmp_path):
    m, d = _save(tmp_path)
    base = BertModel.from_pretrained(d)
    assert torch.equal(base.embeddings.word_embeddings.weight, m.bert.embeddings.word_embeddings.weight)
    assert any(k.startswith("cls.") for k in base.loading_info["unused"])


def test_shape_mismatch_is_one_clear_error(tmp_path):
    _, d = _save(tmp_path)
    cfg = BertConfig.preset("tiny", vocab_size=120)
    with pytest.raises(UserError, match="word_embeddings.weight \\(100, 128\\) vs \\(120, 128\\)"):
        BertForPreTraining.from_pretrained(d, config=cfg)


def test_classifier_with_other_labels(tmp_path):
    _, d = _save(tmp_path, BertForSequenceClassification, id2label={0: "a", 1: "b"})
    cfg = BertConfig.load(str(d))
    cfg.id2label, cfg.label2id = {0: "x", 1: "y", 2: "z"}, None
    cfg.__post_init__()
    with pytest.raises(UserError, match="classifier.weight"):
        BertForSequenceClassification.from_pretrained(d, config=cfg)
    m = BertForSequenceClassification.from_pretrained(d, config=cfg, reinit_head=True)
    assert m.classifier.weight.shape == (3, 128)


def test_missing_encoder_weights_fail(tmp_path):
    _, d = _save(tmp_path)
    sd = load_file(d / "model.safetensors")
    del sd["bert.encoder.layer.1.output.dense.weight"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(UserError, match="lacks weights.*layer.1.output.dense.weight"):
        BertForPreTraining.from_pretrained(d)


def test_legacy_gamma_beta_names_load(tmp_path):
    m, d = _save(tmp_path)
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in load_file(d / "model.safetensors").items()}
    save_file(sd, d / "model.safetensors")
    again = BertForPreTraining.from_pretrained(d)
    assert torch.equal(again.bert.embeddings.LayerNorm.weight, m.bert.embeddings.LayerNorm.weight)


def test_pickle_only_directory_is_refused(tmp_path):
    _, d = _save(tmp_path)
    os.remove(d / "model.safetensors")
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UserError, match="safetensors only"):
        BertForPreTraining.from_pretrained(d)


def test_missing_directory(tmp_path):
    with pytest.raises(UserError, match="not found"):
        BertModel.from_pretrained(tmp_path / "nope")


def test_atomic_dir_keeps_old_directory_on_crash(tmp_path):
    m, d = _save(tmp_path)
    before = (d / "model.safetensors").read_bytes()

    class Boom(Exception):
        pass

    with pytest.raises(Boom), atomic_dir(str(d)) as tmp:
        (open(os.path.join(tmp, "model.safetensors"), "wb")).write(b"half")
        raise Boom()
    assert (d / "model.safetensors").read_bytes() == before
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no temporary left behind
    # a crash while writing a new directory leaves nothing under the final name
    with pytest.raises(Boom), atomic_dir(str(tmp_path / "new")):
        raise Boom()
    assert not (tmp_path / "new").exists()


def test_save_into_existing_run_folder_keeps_other_files(tmp_path):
    m, d = _save(tmp_path)
    (d / "metrics.jsonl").write_text("{}\n")
    m.save_pretrained(d)
    assert (d / "metrics.jsonl").exists()
    assert not [n for n in os.listdir(d) if n.startswith(".")]
