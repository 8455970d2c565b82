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
    # the folder is still bertforge's own output: --overwrite replaces it
    assert main([*argv, "--overwrite"]) == 0
