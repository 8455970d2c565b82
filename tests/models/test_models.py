"""The models wing's one door: the families registry (:mod:`bertforge.models.registry`) and the base every family
shares (:mod:`bertforge.models.base`)."""

import json

import pytest

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.models import (FAMILIES, BertConfig, ModernBertConfig, family, family_of, for_folder, head_class,
                              load_config)
from bertforge.models.base import PreTrainedModel
from bertforge.models.registry import ROLES
from bertforge.tokenizer import SpecialIds


def tiny(fam):
    config = fam.config_class.preset("tiny", vocab_size=64)
    config.adopt_special_ids(SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    return config


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_registers_its_config_heads_and_presets(name, tmp_path):
    fam = family(name)
    assert fam.heads and set(fam.heads) <= set(ROLES) and "encoder" in fam.heads and "masked_lm" in fam.heads
    for role, cls in fam.heads.items():
        assert issubclass(cls, PreTrainedModel) and cls.role == role and cls.config_class is fam.config_class
    config = tiny(fam)
    fam.heads["masked_lm"](config).save_pretrained(str(tmp_path))
    assert family_of(str(tmp_path)) is fam and type(load_config(str(tmp_path))) is fam.config_class
    cls, read = for_folder(str(tmp_path), "sequence_classification")
    assert cls is fam.heads["sequence_classification"] and read.to_dict() == config.to_dict(read.extra["architectures"])
    # a head class of any family names the role: the folder's family answers with its own
    other = next(f for f in FAMILIES.values() if f is not fam)
    assert head_class(read, other.heads["token_classification"]) is fam.heads["token_classification"]


def test_a_role_a_family_lacks_is_one_error_naming_the_folder():
    config = ModernBertConfig.preset("tiny", vocab_size=64)
    with pytest.raises(UserError, match=r"^DIR holds a ModernBERT, which bertforge does not use for pretraining yet"):
        head_class(config, "pretraining", "DIR")


def test_load_config_reads_config_json_once(tmp_path, monkeypatch):
    import bertforge.models.base as base

    BertConfig.preset("tiny", vocab_size=64).save(str(tmp_path / "config.json"))
    reads = []
    real = base.read_json_object
    monkeypatch.setattr(base, "read_json_object", lambda *a: reads.append(a) or real(*a))
    for_folder(str(tmp_path), "encoder")
    assert len(reads) == 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("key,value", [("num_attention_heads", 0), ("hidden_size", -8), ("intermediate_size", "big"),
                                       ("num_hidden_layers", 2.5), ("vocab_size", None), ("pad_token_id", 5000),
                                       ("num_labels", 0), ("problem_type", "multi_label_classification")])
def test_a_bad_size_in_any_familys_config_json_is_one_error_line(name, key, value, tmp_path, capsys):
    fam = family(name)
    fam.heads["masked_lm"](tiny(fam)).save_pretrained(str(tmp_path))
    d = json.loads((tmp_path / "config.json").read_text())
    d[key] = value
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match=key):
        load_config(str(tmp_path))
    assert main(["--quiet", "predict", "fill-mask", "--model", str(tmp_path), "a [MASK] b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and key in err[0], err


def test_what_a_config_json_says_of_labels_and_tying_is_read_or_refused(tmp_path, capsys):
    """num_labels without names gives transformers' LABEL_i; a BERT masked LM whose decoder is untied (its own
    weights, which bertforge's tied BERT would drop unread) is refused; so is a shard index of the wrong form."""
    fam = family("bert")
    fam.heads["masked_lm"](tiny(fam)).save_pretrained(str(tmp_path))
    d = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**d, "num_labels": 3}))
    assert load_config(str(tmp_path)).id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}
    (tmp_path / "config.json").write_text(json.dumps({**d, "tie_word_embeddings": False}))
    with pytest.raises(UserError, match="tie_word_embeddings: false"):
        fam.heads["masked_lm"].from_pretrained(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(d))
    from bertforge.checkpoint import read_state_dict

    (tmp_path / "model.safetensors").rename(tmp_path / "shard.safetensors")
    for index in ({"weight_map": ["shard.safetensors"]}, ["x"], {"weight_map": {"w": "../shard.safetensors"}}):
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(UserError, match="index.json|cannot read weights"):
            read_state_dict(str(tmp_path))