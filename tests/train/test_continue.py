"""``pretrain --init MODEL``: the continued-pretraining recipe (``--recipe continue``) unless a flag or a config
file says otherwise, recorded with the run and kept by ``--resume``; a masked-LM head the model lacks starts tied
to its word embeddings at BERT's initialisation, and the log says so."""

from __future__ import annotations

import json
import shutil
import pathlib

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig
from bertforge.cli import main
from bertforge.config import RECIPES
from bertforge.errors import UserError
from bertforge.models import BertForMaskedLM, BertModel
from bertforge.settings import pretrain_settings
from bertforge.tokenizer import train_vocabulary
from ..helpers import DOCUMENTS

DROPOUT = 0.05  # the models' own: neither BERT's 0.1 nor the budget recipe's 0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    """A corpus, a BERT with a masked-LM head (``headed``) and a bare ``BertModel`` (``bare``) of one vocabulary."""
    w = tmp_path_factory.mktemp("inputs")
    (w / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCUMENTS))
    tok = train_vocabulary(DOCUMENTS, 60, kind="wordlevel", min_frequency=1)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=64,
                            hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT)
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(str(w / "headed"), tokenizer=tok)
    BertModel(cfg).save_pretrained(str(w / "bare"), tokenizer=tok)
    return w


def _pretrain(w: pathlib.Path, out: pathlib.Path, *flags: str) -> list[str]:
    return ["--quiet", "pretrain", "--data", str(w / "corpus.jsonl"), "--out", str(out), "--max-seq-length", "32",
            "--batch-size", "4", "--eval-every", "0", "--max-eval-instances", "4", "--no-progress", *flags]


def _recipe_values(saved: dict) -> dict:
    flat = {k: v for section in ("model", "data", "train") for k, v in saved[section].items()}
    return {k: flat[k] for k in RECIPES["continue"]}


def test_init_alone_trains_and_records_the_continue_recipe(inputs, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_pretrain(inputs, out, "--init", str(inputs / "headed"), "--max-steps", "1")) == 0, capsys.readouterr()
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["recipe"] == "continue" and saved["model"]["preset"] is None
    assert _recipe_values(saved) == RECIPES["continue"]
    assert (saved["train"]["lr"], saved["data"]["mask_prob"], saved["data"]["nsp"]) == (1e-4, 0.15, False)
    assert (saved["train"]["adam_beta2"], saved["model"]["dropout"]) == (0.999, None)  # None: the model's own
    log = (out / "train.log").read_text()
    assert "the continue recipe: lr 0.0001" in log and f"dropout the model's ({DROPOUT:g})" in log, log
    assert "no masked-LM head" not in log  # this model has one


def test_the_continue_recipe_trains_with_the_models_own_dropout_and_starting_values(inputs, tmp_path):
    from bertforge.ops import Dropout
    from bertforge.train.plan import Given, pretraining_objective, start_plan

    cfg = pretrain_settings(str(tmp_path / "o"), str(inputs / "corpus.jsonl"), init=str(inputs / "headed"))
    model = pretraining_objective(cfg, start_plan(Given(init=True)), BertConfig.load(str(inputs / "headed")), None).model
    assert {m.p for m in model.modules() if isinstance(m, Dropout)} == {DROPOUT}
    saved = load_file(str(inputs / "headed" / "model.safetensors"))
    weights = model.state_dict()  # every weight as trained: no new starting value over them (the decoder: tied)
    assert set(saved) == set(weights) - {"cls.predictions.decoder.weight"}
    for name, w in saved.items():
        assert torch.equal(weights[name], w), name


def test_flags_and_a_config_file_win_over_the_recipe(inputs, tmp_path):
    init, data, out = str(inputs / "headed"), str(inputs / "corpus.jsonl"), str(tmp_path / "o")
    cfg = pretrain_settings(out, data, init=init, lr=3e-4, dropout=0.0)
    assert (cfg.recipe, cfg.train.lr, cfg.model.dropout, cfg.data.mask_prob) == ("continue", 3e-4, 0.0, 0.15)
    config = tmp_path / "run.yaml"
    config.write_text("lr: 3e-5\nmask_prob: 0.2\n")
    cfg = pretrain_settings(out, data, config=str(config), init=init, mask_prob=0.25)
    assert (cfg.recipe, cfg.train.lr, cfg.data.mask_prob, cfg.train.adam_beta2) == ("continue", 3e-5, 0.25, 0.999)
    config.write_text(f"init: {init}\n")  # a config file's --init is an --init run too
    cfg = pretrain_settings(out, data, config=str(config))
    assert (cfg.recipe, cfg.train.lr, cfg.model.preset) == ("continue", 1e-4, None)
    for recipe in ("budget", "bert"):  # a recipe named, by flag or by the file, is that recipe
        config.write_text(f"recipe: {recipe}\n")
        for cfg in (pretrain_settings(out, data, init=init, recipe=recipe),
                    pretrain_settings(out, data, config=str(config), init=init)):
            assert (cfg.recipe, cfg.train.lr, cfg.data.mask_prob) == (recipe, RECIPES[recipe]["lr"],
                                                                       RECIPES[recipe]["mask_prob"])
    cfg = pretrain_settings(out, data)  # no --init: a new model, the budget recipe
    assert (cfg.recipe, cfg.train.lr) == ("budget", 1e-3)
    with pytest.raises(UserError, match="--recipe continue continues pretraining a trained model: give --init"):
        pretrain_settings(out, data, recipe="continue").validate()


def test_resume_keeps_the_continue_recipe(inputs, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_pretrain(inputs, out, "--init", str(inputs / "headed"), "--max-steps", "1", "--save-every", "1",
                          "--lr", "2e-4")) == 0
    first = json.loads((out / "pretrain_config.json").read_text())
    for flags, said in ((["--recipe", "budget"], "--recipe continue -> budget"),
                        (["--mask-prob", "0.3"], "--mask-prob 0.15 -> 0.3"),
                        (["--dropout", "0"], "--dropout None -> 0")):
        capsys.readouterr()
        assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "2", *flags]) == 2
        assert said in capsys.readouterr().err
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "2", "--no-progress"]) == 0
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["recipe"] == "continue" and saved["train"]["lr"] == 2e-4  # the run's own, flag included
    assert _recipe_values(saved) == _recipe_values(first) == {**RECIPES["continue"], "lr": 2e-4}
    assert json.loads((out / "metrics.json").read_text())["steps"] == 2


def test_a_missing_masked_lm_head_starts_tied_at_berts_initialisation_and_the_log_says_so(inputs, tmp_path,
                                                                                          minilm_dir):
    from bertforge.train.plan import Given, pretraining_objective, start_plan

    bare, out = str(inputs / "bare"), tmp_path / "run"
    assert main(_pretrain(inputs, out, "--init", bare, "--max-steps", "1")) == 0
    log = (out / "train.log").read_text()
    assert f"{bare} has no masked-LM head: a new one starts with its decoder tied to the word embeddings, its " \
           "transform at BERT's initialisation" in log, log
    after = load_file(str(out / "model.safetensors"))  # trained on, and still tied
    assert "cls.predictions.decoder.weight" not in after or torch.equal(
        after["cls.predictions.decoder.weight"], after["bert.embeddings.word_embeddings.weight"])
    # how it starts, from our bare BertModel and from transformers' (all-MiniLM-L6-v2)
    from bertforge.objectives.mlm import new_head_said

    cfg = pretrain_settings(str(tmp_path / "o"), str(inputs / "corpus.jsonl"), init=bare)
    for path, model in ((bare, pretraining_objective(cfg, start_plan(Given(init=True)), BertConfig.load(bare), None).model),
                        (minilm_dir, BertForMaskedLM.from_pretrained(minilm_dir))):  # transformers' bare BertModel
        head, words = model.cls.predictions, model.bert.embeddings.word_embeddings.weight
        saved = load_file(f"{path}/model.safetensors")
        assert head.decoder.weight is words and torch.equal(words, saved["embeddings.word_embeddings.weight"])
        std = model.config.initializer_range
        w = head.transform.dense.weight.detach()
        assert abs(float(w.std()) / std - 1) < 0.05 and abs(float(w.mean())) < 0.1 * std, path
        assert not head.transform.dense.bias.any() and not head.bias.any()
        ln = head.transform.LayerNorm
        assert bool((ln.weight == 1).all()) and not ln.bias.any()
        assert "decoder tied to the word embeddings" in new_head_said(model, path)


def test_the_log_says_that_a_new_models_starting_values_are_not_used_with_init(inputs, tmp_path):
    # --init with --recipe budget (or --position-init sinusoidal) said "position_init sinusoidal" as if the run had
    # started from sines: a model from --init starts from its own weights
    from bertforge.settings import recipe_said

    init, data, out = str(inputs / "headed"), str(inputs / "corpus.jsonl"), str(tmp_path / "o")
    config = BertConfig.load(init)
    said = recipe_said(pretrain_settings(out, data, init=init, recipe="budget"), config)
    assert "position_init sinusoidal (not used: --init's model starts from its own weights)" in said, said
    assert "attention_init local (not used: --init's model starts from its own weights)" in said, said
    said = recipe_said(pretrain_settings(out, data, init=init, position_init="sinusoidal"), config)
    assert "position_init sinusoidal (the recipe's: normal; not used: --init's model" in said, said
    assert "not used" not in recipe_said(pretrain_settings(out, data, init=init), config)
    assert "not used" not in recipe_said(pretrain_settings(out, data), config)  # a new model starts from them


def test_init_with_a_tokenizer_of_another_vocabulary_of_the_same_size_is_refused(inputs, tmp_path, capsys):
    """Found by hostile testing: --tokenizer with --init was checked by its size alone, so a vocabulary of the same
    size (the ids of two tokens swapped here) trained each embedding row as another token's, without a word."""
    words = (inputs / "headed" / "vocab.txt").read_text().split("\n")
    words[10], words[11] = words[11], words[10]
    (tmp_path / "swapped.txt").write_text("\n".join(words))
    (tmp_path / "same.txt").write_text((inputs / "headed" / "vocab.txt").read_text())
    init = ["--init", str(inputs / "headed"), "--max-steps", "1"]
    assert main(_pretrain(inputs, tmp_path / "a", *init, "--tokenizer", str(tmp_path / "swapped.txt"))) == 2
    assert "maps tokens to other ids than --init" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert main(_pretrain(inputs, tmp_path / "b", *init, "--tokenizer", str(inputs / "headed"))) == 0


def test_resume_reads_init_again_only_when_it_starts_again(inputs, tmp_path, capsys):
    """A run with a checkpoint does not read --init again (its folder may move); one that starts again from step 0
    does, so another --init is refused then, naming both."""
    out = tmp_path / "run"
    assert main(_pretrain(inputs, out, "--init", str(inputs / "headed"), "--max-steps", "2", "--save-every", "1")) == 0
    moved = tmp_path / "moved"
    shutil.copytree(inputs / "headed", moved)
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "3", "--init", str(moved),
                 "--no-progress"]) == 0, capsys.readouterr().err
    shutil.rmtree(out / "checkpoints")  # as a run killed before its first checkpoint
    (out / "metrics.json").unlink()
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--init", str(inputs / "bare"),
                 "--no-progress"]) == 2
    assert "--init " in capsys.readouterr().err
