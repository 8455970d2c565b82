import json

import pytest

from bertforge import BertConfig, UserError
from bertforge.config import PretrainConfig, parse_duration
from bertforge.models.bert import PRESETS


@pytest.mark.parametrize("name,layers,hidden,heads", [("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8),
                                                       ("medium", 8, 512, 8), ("base", 12, 768, 12)])
def test_presets(name, layers, hidden, heads):
    c = BertConfig.preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden
    assert set(PRESETS) == {"tiny", "mini", "small", "medium", "base"}


def test_unknown_preset():
    with pytest.raises(UserError, match="unknown preset"):
        BertConfig.preset("huge")


def test_config_json_is_read_by_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    c = BertConfig.preset("mini", vocab_size=1234, id2label={0: "neg", 1: "pos"})
    c.save(tmp_path / "config.json", architectures=["BertForSequenceClassification"])
    t = transformers.BertConfig.from_pretrained(tmp_path)
    assert t.model_type == "bert"
    assert (t.vocab_size, t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.intermediate_size) == (1234, 256, 4, 4, 1024)
    assert t.id2label == {0: "neg", 1: "pos"} and t.label2id == {"neg": 0, "pos": 1}
    assert t.architectures == ["BertForSequenceClassification"]
    # and back: a transformers config.json loads into ours, unknown keys kept
    t.save_pretrained(tmp_path / "t")
    back = BertConfig.load(str(tmp_path / "t"))
    assert back.vocab_size == 1234 and back.id2label == {0: "neg", 1: "pos"}
    assert "transformers_version" in back.extra


def test_bad_configs(tmp_path):
    with pytest.raises(UserError, match="multiple"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="malformed JSON"):
        BertConfig.load(str(p))
    p.write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(UserError, match="not 'bert'"):
        BertConfig.load(str(p))


def test_pretrain_config_flat_update_and_round_trip():
    c = PretrainConfig()
    c.update_flat({"batch-size": 64, "preset": "tiny", "max_steps": 10, "nsp": False})
    assert (c.train.batch_size, c.model.preset, c.train.max_steps, c.data.nsp) == (64, "tiny", 10, False)
    assert PretrainConfig.from_dict(c.to_dict()) == c
    with pytest.raises(UserError, match="unknown key"):
        c.update_flat({"batch_sise": 3})


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration():
    with pytest.raises(UserError):
        parse_duration("soon")


def test_help_shows_each_default_from_its_one_definition(capsys):
    """Flags and their help come from the config dataclasses; each task's own defaults show."""
    from bertforge.cli import main
    from bertforge.config import RECIPES, finetune_lr_rule

    assert main(["pretrain", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    lr, bert_lr, continue_lr = RECIPES["budget"]["lr"], RECIPES["bert"]["lr"], RECIPES["continue"]["lr"]
    assert (f"peak learning rate (default: {lr}) [--recipe bert: {bert_lr}; --recipe continue: {continue_lr}]" in out
            and "(default: mini)" in out)
    assert main(["finetune", "squad", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 384)" in out and "--doc-stride" in out
    assert f"peak learning rate (default: {finetune_lr_rule()})" in out and "by the model's width" in out
    assert main(["finetune", "classify", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tokens per example (longer ones are truncated or windowed) (default: 128)" in out
    assert main(["evaluate", "squad", "--help"]) == 0
    assert "default: 384, or the model's positions if fewer" in " ".join(capsys.readouterr().out.split())


def test_messages_are_bounded_and_alias_bombs_refused(tmp_path, capsys):
    """A value echoed in an error is cut to a readable length; a YAML file whose aliases expand exponentially
    is refused without being expanded (nine lines that stand for a billion values)."""
    from bertforge.cli import main

    bomb = tmp_path / "bomb.yaml"
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\nlr: *a8\n")
    long = tmp_path / "long.yaml"
    long.write_text("lr: " + "x" * 100_000 + "\n")
    for path in (bomb, long):
        assert main(["pretrain", "--config", str(path), "--data", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and len(err[0]) < 400, err[0][:400]
    assert not (tmp_path / "o").exists()
