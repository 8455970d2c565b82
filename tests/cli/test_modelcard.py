"""The model card (README.md) written into every model directory."""

import json

from bertforge import modelcard
from bertforge.cli import main


def test_base_license_is_read_from_the_front_matter(tmp_path, minilm_dir):
    assert modelcard.base_license(minilm_dir) == "apache-2.0"
    (tmp_path / "README.md").write_text("# no front matter\nlicense: mit\n")
    assert modelcard.base_license(str(tmp_path)) is None
    (tmp_path / "README.md").write_text("---\nlicense: [\n---\n")  # broken YAML: no license, no error
    assert modelcard.base_license(str(tmp_path)) is None
    assert modelcard.base_license(str(tmp_path / "missing")) is None


def test_a_finetuned_model_carries_its_command_figures_and_the_base_license(tmp_path, minilm_dir):
    rows = ["sentence\tlabel"] + [f"{w} film number {i}\t{i % 2}" for i, w in enumerate(["a", "the", "one", "my"] * 4)]
    (tmp_path / "t.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    argv = ["--quiet", "finetune", "classify", "--model", minilm_dir, "--train", str(tmp_path / "t.tsv"), "--validation",
            str(tmp_path / "t.tsv"), "--out", str(tmp_path / "cls"), "--epochs", "1", "--max-seq-length", "16", "--no-progress"]
    assert main(argv) == 0
    card = (tmp_path / "cls" / "README.md").read_text()
    accuracy = json.loads((tmp_path / "cls" / "metrics.json").read_text())["accuracy"]
    assert card.startswith("---\n") and "license: apache-2.0" in card and "pipeline_tag: text-classification" in card
    assert f"| accuracy | {accuracy:.4g} |" in card
    assert "bertforge --quiet finetune classify --model" in card and "BertForSequenceClassification" in card
    assert "base_model: nreimers/MiniLM-L6-H384-uncased\n" in card  # its config's _name_or_path, not "model"
    # the folder is still bertforge's own output: --overwrite replaces it
    assert main([*argv, "--overwrite"]) == 0


def test_a_card_names_a_portable_base_model_and_no_local_path(tmp_path, monkeypatch, capsys):
    """``base_model`` is a Hub id (from the Hub cache's folder, or the ``_name_or_path`` transformers records),
    never a local folder's name; no absolute local path anywhere in the card."""
    from ..helpers import tiny_model_dir

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # the paths below are absolute, outside the working directory
    texts = ["good fun day", "bad sad mess"] * 4
    hub = tiny_model_dir(tmp_path / "hub" / "models--acme--tiny-bert" / "snapshots" / "0123abc", texts, vocab_size=30,
                         kind="wordlevel")
    local = tiny_model_dir(tmp_path / "mine", texts, vocab_size=30, kind="wordlevel")
    assert modelcard.hub_id(hub) == "acme/tiny-bert" and modelcard.hub_id(local) is None
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    for recorded, found in (("bert-base-uncased", "bert-base-uncased"), ("google/bert_uncased_L-2_H-128_A-2",) * 2,
                            (str(tmp_path / "mine"), None), ("", None), ("../mine", None)):
        (tmp_path / "mine" / "config.json").write_text(json.dumps({**config, "_name_or_path": recorded}))
        assert modelcard.hub_id(local) == found, recorded
    (tmp_path / "mine" / "config.json").write_text(json.dumps(config))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t, "label": t[0]}) + "\n" for t in texts))
    for base, out in ((hub, tmp_path / "a"), (local, tmp_path / "b")):
        assert main(["--quiet", "finetune", "classify", "--model", base, "--train", str(tmp_path / "t.jsonl"),
                     "--validation", str(tmp_path / "t.jsonl"), "--out", str(out), "--max-steps", "1",
                     "--max-seq-length", "8", "--no-progress"]) == 0
    a, b = (tmp_path / "a" / "README.md").read_text(), (tmp_path / "b" / "README.md").read_text()
    assert "base_model: acme/tiny-bert\n" in a and "base_model" not in b and "Started from `mine`" in b
    assert "--model 0123abc --train t.jsonl" in a and "--model mine --train t.jsonl" in b
    for card in (a, b):
        assert str(tmp_path) not in card and "- `t.jsonl`" in card
    capsys.readouterr()


def test_the_card_names_torchrun_when_the_run_was_launched_by_it(monkeypatch):
    """Found in a new user's trial: a run under torchrun carried `bertforge pretrain ...` as its command."""
    from bertforge.modelcard import command_line

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert command_line(["pretrain", "--out", "o"]) == ["bertforge", "pretrain", "--out", "o"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert command_line(["pretrain"]) == ["torchrun", "--nproc_per_node=2", "-m", "bertforge", "pretrain"]
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert command_line(["pretrain"])[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=8"]
