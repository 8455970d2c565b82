"""Corpus readers and sentence splitting."""

import gzip
import os
import random
import json

import pytest

from bertforge import UserError
from bertforge.corpus import expand_paths, iter_documents, split_sentences

from ..conftest import data_path


def test_splits_hard_wrapped_prose():
    text = (
        "CHAPTER I\n\nMr. Smith went to\nWashington. He met Dr. J. R. Jones at 5 p.m. there.\n"
        '"Come here!" said he. "Why?" she asked.\n\nA new paragraph starts here. It has\ntwo sentences.'
    )
    assert split_sentences(text) == [
        "CHAPTER I",
        "Mr. Smith went to Washington.",
        "He met Dr. J. R. Jones at 5 p.m. there.",
        '"Come here!" said he.',
        '"Why?" she asked.',
        "A new paragraph starts here.",
        "It has two sentences.",
    ]


def test_splits_real_gutenberg_books_sensibly():
    path = data_path("gutenberg", "validation.jsonl")
    docs = list(iter_documents([str(path)]))
    assert len(docs) == 8
    sents = [s for d in docs for s in d]
    assert len(sents) > 20000
    # no sentence keeps a hard line break, and almost none is absurdly long
    assert not any("\n" in s for s in sents)
    assert sum(len(s) > 1000 for s in sents) / len(sents) < 0.01
    # abbreviations do not end sentences
    assert not any(s.endswith((" Mr.", " Mrs.", " Dr.")) for s in sents)


def test_readers(tmp_path):
    (tmp_path / "a.txt").write_text("One doc. Two sentences.", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "Doc one."}) + "\n\n" + json.dumps({"body": "Doc two. More."}) + "\n")
    with gzip.open(tmp_path / "c.txt.gz", "wt", encoding="utf-8") as f:
        f.write("Zipped text here.")
    (tmp_path / "google.txt").write_text("Sentence one of doc one.\nSentence two.\n\nDoc two only line.\n")
    assert list(iter_documents([str(tmp_path / "a.txt")])) == [["One doc.", "Two sentences."]]
    assert list(iter_documents([str(tmp_path / "b.jsonl")], text_field="body")) == [["Doc one."], ["Doc two.", "More."]]
    assert list(iter_documents([str(tmp_path / "c.txt.gz")])) == [["Zipped text here."]]
    assert list(iter_documents([str(tmp_path / "google.txt")], doc_separator="blank-line")) == [
        ["Sentence one of doc one.", "Sentence two."], ["Doc two only line."]]
    # a directory, a glob
    assert len(expand_paths([str(tmp_path)])) == 4
    assert expand_paths([str(tmp_path / "*.txt")]) == [str(tmp_path / "a.txt"), str(tmp_path / "google.txt")]
    # a file named twice (a folder and a file in it, overlapping patterns) is read once, where first named
    twice = expand_paths([str(tmp_path / "a.txt"), str(tmp_path), str(tmp_path / "*.txt")])
    assert twice[0] == str(tmp_path / "a.txt") and len(twice) == 4


def test_parquet_and_hf_datasets_local(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    (tmp_path / "ds").mkdir()
    pq.write_table(pa.table({"text": ["First doc. Yes.", "Second doc."], "id": [1, 2]}), tmp_path / "ds" / "train.parquet")
    assert list(iter_documents([str(tmp_path / "ds" / "train.parquet")])) == [["First doc.", "Yes."], ["Second doc."]]
    pytest.importorskip("datasets")
    assert list(iter_documents([f"hf:{tmp_path / 'ds'}"])) == [["First doc.", "Yes."], ["Second doc."]]
    with pytest.raises(UserError, match="no column 'body'"):
        list(iter_documents([str(tmp_path / "ds" / "train.parquet")], text_field="body"))


def test_bad_input(tmp_path):
    with pytest.raises(UserError, match="not found"):
        list(iter_documents([str(tmp_path / "missing.txt")]))
    with pytest.raises(UserError, match="no files match"):
        list(iter_documents([str(tmp_path / "*.jsonl")]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not valid JSON"):
        list(iter_documents([str(bad)]))
    for text, said in (("[" * 100_000 + "]" * 100_000, "nested too deeply"), ("1" * 5000, "Exceeds the limit")):
        bad.write_text(text + "\n")  # (json.loads raises other errors than JSONDecodeError on these)
        with pytest.raises(UserError, match=rf"bad\.jsonl:1: not valid JSON \({said}"):
            list(iter_documents([str(bad)]))
    # an upper-case suffix is the same format, read alone or found in a folder
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "UP.JSONL").write_text('{"text": "One doc."}\n{"text": "Two docs."}\n')
    assert len([d for d in iter_documents([str(tmp_path / "up" / "UP.JSONL")])]) == 2
    assert len([d for d in iter_documents([str(tmp_path / "up")])]) == 2
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"body": "x"}\n')
    with pytest.raises(UserError, match="nofield.jsonl:1: no field 'text'"):
        list(iter_documents([str(nofield)]))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 ok\nna\u00efve".encode("latin-1"))
    with pytest.raises(UserError, match="latin.txt: invalid UTF-8 at byte 3 \\(line 1\\)"):
        list(iter_documents([str(latin)]))


def test_a_runs_own_files_are_never_its_input(tmp_path, capsys):
    """An output written inside the input folder is not read back as corpus: retraining a tokenizer there with
    --overwrite sees only the text, and a pretraining run there stays resumable (its metrics.jsonl, train.log
    and vocab.txt are not text to train on)."""
    import shutil

    from bertforge.cli import main
    from bertforge.demo.corpus import write_story_corpus

    from ..helpers import tiny_pretrain

    data = tmp_path / "data"
    data.mkdir()
    write_story_corpus(data / "stories.jsonl", n_docs=60, seed=0)
    (data / ".hidden").mkdir()
    (data / ".hidden" / "notes.txt").write_text("hidden folders are not corpus")
    before = expand_paths([str(data)])
    assert before == [str(data / "stories.jsonl")]
    tok = ["--quiet", "tokenizer", "train", "--input", str(data), "--vocab-size", "300", "--model", "wordlevel",
           "--out", str(data / "tok")]
    assert main(tok) == 0
    vocab = (data / "tok" / "vocab.txt").read_text()
    assert expand_paths([str(data)]) == before
    assert main([*tok, "--overwrite"]) == 0
    assert (data / "tok" / "vocab.txt").read_text() == vocab
    shutil.rmtree(data / "tok")

    def run(steps, *extra):
        return main(["--quiet", *tiny_pretrain(data, data / "run", "--log-every", "1", "--save-every", "2",
                                               "--max-eval-instances", "16", *extra, steps=steps)])

    assert run(2) == 0
    assert expand_paths([str(data)]) == before
    # a glob that also matches the run's own files (its vocab.txt) takes the text alone, as a directory does
    (data / "more.txt").write_text("More text. Here.")
    assert expand_paths([str(data / "**" / "*.txt")]) == [str(data / "more.txt")]
    assert expand_paths([str(data / "run" / "*.txt")]) == [str(data / "run" / "vocab.txt")]  # (asked for by name)
    (data / "more.txt").unlink()
    assert run(3, "--resume") == 0, capsys.readouterr().err


def test_every_command_that_reads_a_folder_passes_over_bertforge_outputs_inside_it(tmp_path, monkeypatch, capsys):
    """Outputs written inside the corpus' own folder, whatever their names, are never read back as its text: by
    tokenizer training (with --overwrite into the same folder), prepare, pretrain, --add-vocab and evaluate mlm
    (issue 69)."""
    import shutil

    from bertforge import corpus, prepared
    from bertforge.cli import main
    from bertforge.outputs import MARKER
    from bertforge.demo.corpus import write_story_corpus

    from ..helpers import tiny_pretrain

    dt = tmp_path / "DT"
    dt.mkdir()
    write_story_corpus(dt / "stories.jsonl", n_docs=60, seed=0)
    rng = random.Random(0)  # words of many equal counts: ties the tokenizers library breaks differently each run
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 6))) for _ in range(400)]
    (dt / "more.txt").write_text("".join(" ".join(rng.choice(words) for _ in range(10)) + ".\n" for _ in range(100)))
    clean = tmp_path / "clean"
    shutil.copytree(dt, clean)

    read: list[str] = []
    real = corpus.expand_paths

    def spy(paths):
        found = real(paths)
        read.extend(found)
        return found

    monkeypatch.setattr(corpus, "expand_paths", spy)
    monkeypatch.setattr(prepared, "expand_paths", spy)

    def run(*argv):
        assert main(["--quiet", *map(str, argv)]) == 0, capsys.readouterr().err

    tok = ["tokenizer", "train", "--input", dt, "--vocab-size", "300"]
    run(*tok, "--out", dt / "notes")  # a tokenizer folder with a name a corpus could have
    run(*tok, "--out", dt / "notes", "--overwrite")
    run("tokenizer", "train", "--input", clean, "--vocab-size", "300", "--out", tmp_path / "clean_tok")
    assert (dt / "notes" / "vocab.txt").read_text() == (tmp_path / "clean_tok" / "vocab.txt").read_text()
    run("prepare", "--data", dt, "--tokenizer", dt / "notes", "--out", dt / "chapter2", "--workers", "1",
        "--no-progress")
    run(*tiny_pretrain(dt, dt / "texts", tokenizer=dt / "notes"))
    run(*tiny_pretrain(dt, tmp_path / "grown", "--init", dt / "texts", "--add-vocab", "5", preset=None))
    run("evaluate", "mlm", "--model", dt / "texts", "--data", dt, "--max-seq-length", "32")
    outputs = [p for p in dt.iterdir() if (p / MARKER).is_file()]
    assert sorted(p.name for p in outputs) == ["chapter2", "notes", "texts"]
    assert read and {os.path.dirname(f) for f in read} == {str(dt), str(clean)}, sorted(set(read))
    # a prepared folder copied without its marker (cp -r prep/* dst/) is no text either
    (dt / "copy").mkdir()
    for p in (dt / "chapter2").iterdir():
        if p.name != MARKER:
            (shutil.copytree if p.is_dir() else shutil.copy)(p, dt / "copy" / p.name)
    assert str(dt / "copy" / "vocab.txt") not in real([str(dt)])
