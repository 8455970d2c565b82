"""``pretrain --init MODEL --add-vocab N``: the data's words and subwords appended to the model's vocabulary
(every old id kept), new rows starting as the mean of their old pieces', and the output a BERT directory that
transformers loads with the larger vocabulary; a resumed run keeps it."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig
from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.models import BertForMaskedLM
from bertforge.tokenizer import load_tokenizer, save_tokenizer, vocab_tokens
from bertforge.vocabulary import check_extensible, extend_tokenizer, new_tokens, old_pieces
from ..helpers import DOCUMENTS

DOMAIN = ["The zorblaxian fleet met the zorblaxian envoys near Qwertonia.",
          "Qwertonia trades with every zorblaxian colony; Qwertonia is rich.",
          "A zorblaxian ship landed on a zorblaxian moon. The envoys of Qwertonia spoke with the crew."]
TEXTS = DOMAIN + DOCUMENTS[:2] * 2


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, minilm_dir) -> pathlib.Path:
    """A small domain corpus, and a tiny BERT with bert-base-uncased's vocabulary (all-MiniLM-L6-v2's tokenizer)
    and a masked-LM head whose output bias is not zero, so that the new rows' bias shows its rule."""
    w = tmp_path_factory.mktemp("vocab")
    (w / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 6))
    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=64))
    with torch.no_grad():
        model.cls.predictions.bias.normal_()
    model.save_pretrained(str(w / "model"), tokenizer=tok)
    return w


def _pretrain(w: pathlib.Path, out: pathlib.Path, *flags: str) -> list[str]:
    # lr 1e-12: a training step that moves no weight by a float32 step, so the saved rows are the starting ones
    return ["--quiet", "pretrain", "--data", str(w / "corpus.jsonl"), "--init", str(w / "model"), "--out", str(out),
            "--max-seq-length", "32", "--batch-size", "4", "--eval-every", "0", "--max-eval-instances", "4",
            "--lr", "1e-12", "--no-progress", *flags]


def test_added_vocabulary_loads_in_transformers_with_old_ids_and_mean_rows(inputs, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    assert main(_pretrain(inputs, out, "--add-vocab", "3", "--max-steps", "1")) == 0
    old_tok, before = load_tokenizer(str(inputs / "model")), load_file(str(inputs / "model" / "model.safetensors"))
    old_n = old_tok.get_vocab_size()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == old_n + 3
    vocab = tok.get_vocab()
    assert all(vocab[t] == i for t, i in old_tok.get_vocab().items())  # every old id unchanged
    assert tok.tokenize("Zorblaxian QWERTONIA") == ["zorblaxian", "qwertonia"]  # one piece each, lower-cased
    assert (out / "vocab.txt").read_text().split("\n")[old_n:old_n + 2] == ["zorblaxian", "qwertonia"]
    model = transformers.BertForMaskedLM.from_pretrained(str(out))
    assert model.config.vocab_size == json.loads((out / "config.json").read_text())["vocab_size"] == old_n + 3
    words = model.bert.embeddings.word_embeddings.weight.detach()
    assert model.get_output_embeddings().weight.data_ptr() == words.data_ptr()  # the decoder stays tied
    bias = model.cls.predictions.bias.detach()
    assert torch.allclose(words[:old_n], before["bert.embeddings.word_embeddings.weight"], atol=1e-6)
    assert torch.allclose(bias[:old_n], before["cls.predictions.bias"], atol=1e-6)
    pieces = old_tok.encode("zorblaxian", add_special_tokens=False).ids
    assert len(pieces) > 1
    new = vocab["zorblaxian"]
    assert torch.allclose(words[new], before["bert.embeddings.word_embeddings.weight"][pieces].mean(0), atol=1e-6)
    assert torch.allclose(bias[new], before["cls.predictions.bias"][pieces].mean(0), atol=1e-6)
    ids = tok("the zorblaxian fleet", return_tensors="pt")
    assert model(**ids).logits.shape[-1] == old_n + 3
    assert json.loads((out / "pretrain_config.json").read_text())["model"]["add_vocab"] == 3
    assert "added 3 tokens to the vocabulary (30522 -> 30525)" in (out / "train.log").read_text()


def test_a_modernbert_grows_its_vocabulary_as_bert_does(inputs, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertforge.models.modernbert import ModernBertConfig, ModernBertForMaskedLM
    from bertforge.tokenizer import special_ids

    tok, base = load_tokenizer(str(inputs / "model")), tmp_path / "modern"
    sp = special_ids(tok)
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=64, local_attention=8, pad_token_id=sp.pad,
        cls_token_id=sp.cls, bos_token_id=sp.cls, sep_token_id=sp.sep, eos_token_id=sp.sep))
    with torch.no_grad():
        model.decoder.bias.normal_()  # (ModernBERT's decoder carries the output bias)
    model.save_pretrained(str(base), tokenizer=tok)
    out = tmp_path / "run"
    args = _pretrain(inputs, out, "--add-vocab", "3", "--max-steps", "1")
    args[args.index("--init") + 1] = str(base)
    assert main(args) == 0
    before, old_n = load_file(str(base / "model.safetensors")), tok.get_vocab_size()
    grown = transformers.ModernBertForMaskedLM.from_pretrained(str(out))
    rows, bias = grown.model.embeddings.tok_embeddings.weight.detach(), grown.decoder.bias.detach()
    assert rows.shape[0] == bias.shape[0] == grown.config.vocab_size == old_n + 3
    assert grown.decoder.weight.data_ptr() == rows.data_ptr()  # the decoder stays tied
    assert torch.allclose(rows[:old_n], before["model.embeddings.tok_embeddings.weight"], atol=1e-6)
    assert torch.allclose(bias[:old_n], before["decoder.bias"], atol=1e-6)
    new = load_tokenizer(str(out)).token_to_id("zorblaxian")
    pieces = tok.encode("zorblaxian", add_special_tokens=False).ids
    assert new >= old_n and len(pieces) > 1
    assert torch.allclose(rows[new], before["model.embeddings.tok_embeddings.weight"][pieces].mean(0), atol=1e-6)
    assert torch.allclose(bias[new], before["decoder.bias"][pieces].mean(0), atol=1e-6)
    assert f"added 3 tokens to the vocabulary ({old_n} -> {old_n + 3})" in (out / "train.log").read_text()


def test_an_untied_decoder_grows_its_own_rows_and_a_bpe_vocabulary_is_refused(minilm_dir):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    from bertforge.models.modernbert import ModernBertConfig, ModernBertForMaskedLM
    from bertforge.vocabulary import extend_model

    old = load_tokenizer(minilm_dir)
    n = old.get_vocab_size()
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(
        vocab_size=n, hidden_size=16, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=32, tie_word_embeddings=False, pad_token_id=0, cls_token_id=101, bos_token_id=101,
        sep_token_id=102, eos_token_id=102))
    decoder = model.decoder.weight.detach().clone()
    assert extend_model(model, extend_tokenizer(old, ["zorblaxian"])) == ["zorblaxian"]
    pieces = old.encode("zorblaxian", add_special_tokens=False).ids
    assert model.decoder.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert torch.allclose(model.decoder.weight[n], decoder[pieces].mean(0))
    assert torch.equal(model.decoder.weight[:n], decoder) and model.config.vocab_size == n + 1
    bpe = Tokenizer(BPE({"[UNK]": 0, "a": 1}, [], unk_token="[UNK]"))
    with pytest.raises(UserError, match="extends a WordPiece vocabulary; the given one is BPE"):
        check_extensible(bpe, "the given one")


def test_resume_keeps_the_extended_vocabulary(inputs, tmp_path):
    out = tmp_path / "run"
    assert main(_pretrain(inputs, out, "--add-vocab", "2", "--max-steps", "1", "--save-every", "1")) == 0
    files = {n: (out / n).read_bytes() for n in ("vocab.txt", "tokenizer.json")}
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "2", "--no-progress"]) == 0
    assert {n: (out / n).read_bytes() for n in files} == files
    assert load_file(str(out / "model.safetensors"))["bert.embeddings.word_embeddings.weight"].shape[0] == 30524
    # a run stopped before its first checkpoint starts again from --init's model, grown to the run's vocabulary
    shutil.rmtree(out / "checkpoints")
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "1", "--no-progress"]) == 0
    assert {n: (out / n).read_bytes() for n in files} == files
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 30524


def test_a_checkpointed_run_resumes_without_its_init_folder(inputs, tmp_path, capsys):
    """The grown tokenizer and model are in the run's own checkpoint: --init's folder may move (issue 69)."""
    init = tmp_path / "init"
    shutil.copytree(inputs / "model", init)
    args = [str(init) if a == str(inputs / "model") else a for a in _pretrain(inputs, tmp_path / "run", "--add-vocab",
                                                                              "2", "--max-steps", "1", "--save-every", "1")]
    assert main(args) == 0
    init.rename(tmp_path / "moved")
    assert main(["--quiet", "pretrain", "--out", str(tmp_path / "run"), "--resume", "--max-steps", "2",
                 "--no-progress"]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["steps"] == 2


def test_continuation_entries_are_usable_and_start_from_continuation_pieces(minilm_dir):
    old = load_tokenizer(minilm_dir)
    n = old.get_vocab_size()
    tok = extend_tokenizer(old, ["##laxian"])
    assert vocab_tokens(tok)[n:] == ["##laxian"]
    assert tok.encode("Zorlaxian", add_special_tokens=False).tokens == ["z", "##or", "##laxian"]
    assert tok.encode("laxian", add_special_tokens=False).tokens[0] != "##laxian"  # no word starts with it
    # "laxian" continues a word: its pieces are ## pieces ("lax" as a word of its own would be another token)
    assert [old.id_to_token(i) for i in old_pieces(old, ["##laxian", "laxian"])[0]] == ["##la", "##xia", "##n"]
    assert [old.id_to_token(i) for i in old_pieces(old, ["laxian"])[0]] == ["lax", "##ian"]
    assert old_pieces(tok, ["##laxian"], n) == old_pieces(old, ["##laxian"])  # the new entry is no old piece


def test_candidates_are_the_most_used_pieces_the_vocabulary_lacks(minilm_dir):
    old = load_tokenizer(minilm_dir)
    texts = DOMAIN * 3 + ["a blorp."] * 3 + ["one glimzat."]  # glimzat: used once, not a candidate
    found = new_tokens(old, texts, 10)
    assert found[:2] == ["zorblaxian", "qwertonia"] and "blorp" in found and "glimzat" not in found
    assert not set(found) & set(old.get_vocab())
    assert new_tokens(old, texts, 1) == ["zorblaxian"]


def test_a_number_beyond_any_corpus_gives_what_the_data_holds(minilm_dir):
    # the trainer reserves room for its whole target: --add-vocab 10**12 aborted the process, 10**20 overflowed
    old = load_tokenizer(minilm_dir)
    texts = DOMAIN * 3
    assert new_tokens(old, texts, 10**12) == new_tokens(old, texts, 10**20) == new_tokens(old, texts, 100)


def test_ids_without_a_token_are_refused_or_said(minilm_dir, tmp_path, caplog):
    # an id without a token (or a token past the model's rows) was taken as one more token: --add-vocab then gave
    # an old id to a new token, and a run without it trained on ids beyond the embedding matrix

    (tmp_path / "gap").mkdir()
    state = json.loads(pathlib.Path(minilm_dir, "tokenizer.json").read_text())
    vocab = state["model"]["vocab"]
    del vocab[next(t for t, i in vocab.items() if i == 7)]
    vocab["zorblaxian"] = len(vocab) + 1
    (tmp_path / "gap" / "tokenizer.json").write_text(json.dumps(state))
    with pytest.raises(UserError, match="ids are not 0 to 30521, one token each \\(no token has id 7"):
        load_tokenizer(str(tmp_path / "gap"))
    (tmp_path / "dup").mkdir()
    lines = pathlib.Path(minilm_dir, "vocab.txt").read_text().split("\n")
    lines[5] = "the"
    (tmp_path / "dup" / "vocab.txt").write_text("\n".join(lines))
    tok = load_tokenizer(str(tmp_path / "dup"))  # read as transformers reads it, and said
    assert "lists 'the' twice (lines 6 and 1997): id 5 is read as no token" in caplog.text
    transformers = pytest.importorskip("transformers")
    hf = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "dup"))
    text = "the cat sat on the mat"
    assert tok.encode(text).ids == hf(text)["input_ids"] and tok.token_to_id("the") == 1996
    # the id keeps a token no text gives: the tokenizer saved from it reads back the same (a prepared folder's
    # own tokenizer.json was refused) and grows past its last row
    save_tokenizer(tok, str(tmp_path / "saved"))
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.get_vocab() == tok.get_vocab() and again.id_to_token(5) == "[unused-repeat-5]"
    check_extensible(tok, "its tokenizer")


def test_a_config_files_whole_number_written_as_a_float_is_an_integer(tmp_path):
    # "add_vocab: 2.0" passed validation as an integer and then reached the trainer as a float (a traceback)
    from bertforge.settings import pretrain_settings

    (tmp_path / "run.yaml").write_text("init: model\nadd_vocab: 2.0\nmax_steps: 3.0\n")
    cfg = pretrain_settings(str(tmp_path / "o"), ["corpus.txt"], config=str(tmp_path / "run.yaml"))
    cfg.validate()
    assert (cfg.model.add_vocab, cfg.train.max_steps) == (2, 3)
    assert type(cfg.model.add_vocab) is int and type(cfg.train.max_steps) is int
