"""Tokenizers: parity with transformers on real text, training, saving, loading, errors."""

import json
import os
import shutil

import pytest
from tokenizers import Tokenizer

from bertforge import UserError
from bertforge.tokenizer import (
    load_tokenizer,
    save_tokenizer,
    special_ids,
    train_vocabulary,
)

from ..conftest import data_path

transformers = pytest.importorskip("transformers")

EXTRA = [
    "Héllo wörld — naïve café, crème brûlée!",
    "東京は日本の首都です。 Москва́ и Κόσμος",
    "Ça va? Ñandú, Ærøskøbing, İstanbul, ß and ﬁ ligatures",
    "emoji 😀 and tabs\tand\u00a0non-breaking spaces",
]


def _assert_same(ours: Tokenizer, hf, texts, pairs=None):
    for i, t in enumerate(texts):
        second = pairs[i] if pairs else None
        a = ours.encode(t, second) if second else ours.encode(t)
        b = hf(t, second, return_offsets_mapping=True) if second else hf(t, return_offsets_mapping=True)
        assert a.ids == b["input_ids"], t
        assert a.type_ids == b["token_type_ids"], t
        assert [tuple(o) for o in a.offsets] == [tuple(o) for o in b["offset_mapping"]], t


@pytest.fixture(scope="module")
def bare_vocab(minilm_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    shutil.copy(os.path.join(minilm_dir, "vocab.txt"), d / "vocab.txt")
    return d


def test_bare_vocab_txt_matches_bert_tokenizer_fast(bare_vocab, sst2_sentences):
    ours = load_tokenizer(str(bare_vocab / "vocab.txt"))
    hf = transformers.BertTokenizerFast.from_pretrained(str(bare_vocab))
    _assert_same(ours, hf, sst2_sentences + EXTRA)


def test_squad_contexts_and_pairs_match(bare_vocab):
    squad = json.loads(data_path("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
    contexts, questions = [], []
    for art in squad["data"]:
        for para in art["paragraphs"]:
            contexts.append(para["context"])
            questions.append(para["qas"][0]["question"])
    train = json.loads(data_path("squad", "train-8k-v1.1.json").read_text(encoding="utf-8"))
    for art in train["data"]:
        for para in art["paragraphs"]:
            contexts.append(para["context"])
            questions.append(para["qas"][0]["question"])
    contexts, questions = contexts[:200], questions[:200]
    assert len(contexts) == 200
    assert any(any(ord(c) > 127 for c in t) for t in contexts)  # accents and non-Latin text are in there
    ours = load_tokenizer(str(bare_vocab))
    hf = transformers.BertTokenizerFast.from_pretrained(str(bare_vocab))
    _assert_same(ours, hf, contexts)
    _assert_same(ours, hf, questions, pairs=contexts)


def test_model_directory_tokenizer_json_matches(minilm_dir, sst2_sentences):
    ours = load_tokenizer(minilm_dir)
    hf = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    _assert_same(ours, hf, sst2_sentences[:100] + EXTRA)


def test_cased_vocab_from_tokenizer_config(bare_vocab, tmp_path):
    d = tmp_path / "cased"
    d.mkdir()
    shutil.copy(bare_vocab / "vocab.txt", d / "vocab.txt")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tok = load_tokenizer(str(d))
    assert "[UNK]" in tok.encode("Hello").tokens  # bert-base-uncased has no upper-case pieces
    assert "hello" in load_tokenizer(str(bare_vocab)).encode("Hello").tokens


@pytest.mark.parametrize("kind", ["wordpiece", "wordlevel"])
def test_trained_tokenizer_loads_in_transformers(kind, tmp_path, small_text_corpus):
    from bertforge.corpus import iter_texts

    texts = list(iter_texts([str(small_text_corpus)]))
    tok = train_vocabulary(texts, 300, kind=kind)
    assert [tok.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    save_tokenizer(tok, str(tmp_path / "t"))
    assert sorted(os.listdir(tmp_path / "t")) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    auto = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t"))
    raw = Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json"))
    assert auto.mask_token == "[MASK]" and auto.pad_token == "[PAD]"
    for t in texts[:200] + ["Unseen words like xylophone appear."]:
        assert auto(t)["input_ids"] == raw.encode(t).ids
        assert auto(t, "And a second part.")["token_type_ids"] == raw.encode(t, "And a second part.").type_ids
    if kind == "wordpiece":
        assert any(t.startswith("##") for t in tok.get_vocab())
    else:
        assert not any(t.startswith("##") for t in tok.get_vocab())
        assert tok.encode("Tom went, quickly.").tokens == ["[CLS]", "tom", "went", ",", "[UNK]", ".", "[SEP]"]
    # our loader reads it back identically
    again = load_tokenizer(str(tmp_path / "t"))
    assert again.encode(texts[0]).ids == tok.encode(texts[0]).ids


def test_special_ids_by_name(bare_vocab):
    sp = special_ids(load_tokenizer(str(bare_vocab)))
    assert (sp.pad, sp.unk, sp.cls, sp.sep, sp.mask) == (0, 100, 101, 102, 103)


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "vocab.txt").write_text("hello\nworld\n")
    with pytest.raises(UserError, match="no \\[UNK\\]"):
        load_tokenizer(str(tmp_path / "v"))


def test_cli_tokenizer_train(tmp_path, small_text_corpus, capsys):
    from bertforge.cli import main

    rc = main(["tokenizer", "train", "--input", str(small_text_corpus), "--vocab-size", "200", "--out", str(tmp_path / "tok"), "--model", "wordlevel"])
    assert rc == 0
    assert load_tokenizer(str(tmp_path / "tok")).get_vocab_size() <= 200
    assert "more than the" not in capsys.readouterr().err
    # WordPiece keeps every character (and its ## continuation): a size below that is exceeded, and said
    assert main(["tokenizer", "train", "--input", str(small_text_corpus), "--vocab-size", "20", "--out",
                 str(tmp_path / "small")]) == 0
    n = load_tokenizer(str(tmp_path / "small")).get_vocab_size()
    assert n > 20 and f"the vocabulary holds {n} tokens, more than the 20 asked" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--input", str(tmp_path / "nope.txt"), "--vocab-size", "200", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["wordpiece", "wordlevel"])
def test_the_same_text_gives_the_same_vocabulary(kind):
    """The trainers number tokens and break ties between equal counts as a hash map iterates (differently in every
    process and every run): the same text must still give the same vocabulary, in the same order, every time
    (``tokenizer train --overwrite`` into the corpus' own folder gave another one, issue 69)."""
    import random

    from bertforge.tokenizer import vocab_tokens

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 6))) for _ in range(400)]
    texts = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(100)]
    runs = {tuple(vocab_tokens(train_vocabulary(texts, 300, kind=kind, min_frequency=1))) for _ in range(6)}
    assert len(runs) == 1
    once = iter(texts)  # a one-shot iterator is read twice all the same
    assert tuple(vocab_tokens(train_vocabulary(once, 300, kind=kind, min_frequency=1))) in runs
