"""The pretraining data pipeline: instance statistics, determinism, resumption, sharding, the cache."""

import os

import numpy as np
import pytest
import torch

from bertforge import UserError
from bertforge.corpus import iter_texts
from bertforge.data import (
    Masker,
    MaskingConfig,
    PretrainingLoader,
    build_corpus,
    create_instances,
    split_documents,
)
from bertforge.tokenizer import load_tokenizer, special_ids, train_vocabulary

from ..conftest import data_path


@pytest.fixture(scope="module")
def gutenberg(tmp_path_factory, minilm_dir):
    """The held-out books with a real WordPiece vocabulary (bert-base-uncased's: training one took seconds)."""
    path = str(data_path("gutenberg", "validation.jsonl"))
    tok = load_tokenizer(minilm_dir)
    corpus = build_corpus([path], tok, cache_dir=str(tmp_path_factory.mktemp("cache")))
    return tok, corpus


def test_instance_statistics_on_gutenberg(gutenberg):
    tok, corpus = gutenberg
    cfg = MaskingConfig(max_seq_length=128)
    masker = Masker(tok, cfg)
    sp = special_ids(tok)
    docs = np.arange(corpus.n_documents)
    loader = PretrainingLoader(corpus, docs, masker, batch_size=50, seed=0)
    doc_token_ends = np.asarray([corpus.sent_ends[e - 1] for e in corpus.doc_ends])
    n = masked = as_mask = unchanged = is_next = pad = positions = real = 0
    special_masked = 0
    while n < 10_000:
        epoch, rows = loader.next_rows()
        inst, _ = loader.instances(epoch)
        b = loader.build(epoch, rows)
        ids, lab, am, nsp = b["input_ids"], b["labels"], b["attention_mask"], b["next_sentence_label"]
        assert ids.shape[1] <= 128
        sel = lab != -100
        masked += int(sel.sum())
        as_mask += int((ids[sel] == sp.mask).sum())
        unchanged += int((ids[sel] == lab[sel]).sum())
        real += int(am.sum()) - 3 * ids.shape[0]  # maskable tokens: all but [CLS] and two [SEP]
        special_masked += int(sel[:, 0].sum()) + int(((lab == sp.cls) | (lab == sp.sep) | (lab == sp.pad)).sum())
        is_next += int((nsp == 0).sum())
        pad += int((am == 0).sum())
        positions += am.numel()
        n += ids.shape[0]
        for k in rows:  # NotNext segments come from another document; IsNext ones from the same
            a0, a1, b0, b1, rnd = inst[k]
            da, db = np.searchsorted(doc_token_ends, a0, "right"), np.searchsorted(doc_token_ends, b0, "right")
            assert (da != db) if rnd else (da == db)
    frac = masked / real
    print(f"\nmasked {frac:.4f}, [MASK] {as_mask / masked:.4f}, unchanged {unchanged / masked:.4f}, "
          f"IsNext {is_next / n:.4f}, padding fraction {pad / positions:.4f} over {n} instances")
    assert abs(frac - 0.15) < 0.01
    assert abs(as_mask / masked - 0.8) < 0.02
    assert abs(unchanged / masked - 0.1) < 0.02  # (a random replacement equal to the original is rare)
    assert abs((masked - as_mask - unchanged) / masked - 0.1) < 0.02
    assert abs(is_next / n - 0.5) < 0.02
    assert special_masked == 0
    assert pad / positions < 0.1


def test_segments_are_whole_sentences_until_truncated():
    """A segment starts and ends on sentence boundaries unless it had to be truncated to fit."""
    from bertforge.demo.corpus import generate_stories
    from bertforge.tokenizer import from_vocab

    stories = generate_stories(30, seed=1)
    words = sorted({w for s in stories for sent in s for w in sent.lower().replace(".", " .").replace(",", " ,").split()})
    tok = from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words, kind="wordlevel")
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = f"{d}/s.jsonl"
        with open(p, "w") as f:
            for s in stories:
                f.write(json.dumps({"text": " ".join(s)}) + "\n")
        corpus = build_corpus([p], tok, cache_dir=d)
        cfg = MaskingConfig(max_seq_length=512, short_seq_prob=0.0)  # nothing needs truncating
        inst = create_instances(corpus, np.arange(corpus.n_documents), np.arange(corpus.n_documents), cfg, seed=0)
        starts = set(int(x) for x in corpus.sent_ends) | {0}
        for a0, a1, b0, b1, _ in inst:
            assert {int(a0), int(a1), int(b0), int(b1)} <= starts


def test_determinism_resume_and_sharding(small_text_corpus, story_tokenizer):
    corpus = build_corpus([str(small_text_corpus)], story_tokenizer)
    masker = Masker(story_tokenizer, MaskingConfig(max_seq_length=64))
    docs = np.arange(corpus.n_documents)

    def loader(**kw):
        return PretrainingLoader(corpus, docs, masker, batch_size=16, seed=5, **kw)

    a, b = loader(), loader()
    first = [a.next_batch() for _ in range(30)]  # crosses an epoch boundary
    assert a.epoch >= 1
    for x, y in zip(first, [b.next_batch() for _ in range(30)]):
        for k in x:
            assert torch.equal(x[k], y[k])
    # restored at position k, a loader continues with exactly the batches the original produced
    c, ref = loader(), loader()
    for _ in range(7):
        ref.next_batch()
    c.load_state_dict(ref.state_dict())
    for _ in range(25):
        x, y = ref.next_batch(), c.next_batch()
        assert all(torch.equal(x[k], y[k]) for k in x)
    # two ranks together see exactly the rows of one process
    one = loader()
    r0, r1 = loader(rank=0, world=2), loader(rank=1, world=2)
    for _ in range(12):
        e, rows = one.next_rows()
        _, rows0 = r0.next_rows()
        _, rows1 = r1.next_rows()
        assert np.array_equal(np.concatenate([rows0, rows1]), rows)
    # another seed, other batches
    other = PretrainingLoader(corpus, docs, masker, batch_size=16, seed=6).next_batch()
    assert not torch.equal(other["input_ids"], first[0]["input_ids"])


def test_masks_differ_between_epochs(small_text_corpus, story_tokenizer):
    corpus = build_corpus([str(small_text_corpus)], story_tokenizer)
    masker = Masker(story_tokenizer, MaskingConfig(max_seq_length=64, nsp=False))
    loader = PretrainingLoader(corpus, np.arange(corpus.n_documents), masker, batch_size=4, seed=0, shuffle=False)
    e0 = loader.build(0, np.arange(4))
    e1 = loader.build(1, np.arange(4))
    assert not torch.equal(e0["labels"], e1["labels"])
    assert "next_sentence_label" not in e0
    assert torch.all(e0["token_type_ids"] == 0)  # one segment without NSP


def test_whole_word_masking(gutenberg):
    tok, corpus = gutenberg
    masker = Masker(tok, MaskingConfig(max_seq_length=128, whole_word_mask=True))
    loader = PretrainingLoader(corpus, np.arange(corpus.n_documents), masker, batch_size=64, seed=1)
    b = loader.next_batch()
    cont = masker.is_continuation
    lab, am = b["labels"], b["attention_mask"]
    orig = torch.where(lab != -100, lab, b["input_ids"])  # approximately the original ids (unmasked kept)
    checked = 0
    for i in range(lab.shape[0]):
        for p in range(1, int(am[i].sum()) - 1):
            if lab[i, p] != -100 and cont[int(orig[i, p + 1])] and orig[i, p + 1] != masker.sp.sep:
                # the next piece continues this word, so it is masked too
                assert lab[i, p + 1] != -100
                checked += 1
    assert checked > 10


def test_cache_is_reused_and_keyed(small_text_corpus, story_tokenizer, tmp_path, monkeypatch):
    c1 = build_corpus([str(small_text_corpus)], story_tokenizer, cache_dir=str(tmp_path))
    import bertforge.prepared as prepared
    import bertforge.shards as shards

    def boom(*a, **k):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(prepared, "read_part", boom)
    c2 = build_corpus([str(small_text_corpus)], story_tokenizer, cache_dir=str(tmp_path))
    assert c2.folder == c1.folder and np.array_equal(c1.tokens, c2.tokens)
    other = train_vocabulary(iter_texts([str(small_text_corpus)]), 200, kind="wordlevel")
    with pytest.raises(AssertionError, match="tokenized again"):  # another tokenizer: another cache
        build_corpus([str(small_text_corpus)], other, cache_dir=str(tmp_path))
    assert c1.tokens.dtype == np.uint16 and not isinstance(c1.tokens, np.memmap)  # small shards are read
    monkeypatch.setattr(shards, "MAPPED_BYTES", 0)  # large ones are memory-mapped
    assert isinstance(build_corpus([str(small_text_corpus)], story_tokenizer, cache_dir=str(tmp_path)).tokens, np.memmap)


def test_empty_corpus_and_too_few_documents(tmp_path, story_tokenizer):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(UserError, match="empty"):
        build_corpus([str(tmp_path / "empty.txt")], story_tokenizer, cache_dir=str(tmp_path / "c"))
    (tmp_path / "one.txt").write_text("Tom went to the park. He saw a dog.")
    corpus = build_corpus([str(tmp_path / "one.txt")], story_tokenizer, cache_dir=str(tmp_path / "c"))
    with pytest.raises(UserError, match="1 document"):
        split_documents(corpus, seed=0)


# ---- the cache is used only when it is right
def _texts(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return [str(tmp_path / name)]


def test_cache_sees_a_file_rewritten_with_its_size_and_time_kept(tmp_path, story_tokenizer):
    """As ``cp -p``, ``rsync -t``, ``tar`` or ``touch -r`` leave a file: other text, the same size and mtime."""
    import shutil

    paths = _texts(tmp_path, "a.txt", "Tom went to the park. He saw a dog.\n")
    first = build_corpus(paths, story_tokenizer, cache_dir=str(tmp_path / "c"))
    old = np.array(first.tokens)
    st = (tmp_path / "a.txt").stat()
    (tmp_path / "new.txt").write_text("Ann sat on a mat. She ate a cake.".ljust(st.st_size - 1) + "\n")  # as long
    shutil.copy2(tmp_path / "new.txt", tmp_path / "a.txt")  # rewritten in place, as cp -p does
    os.utime(tmp_path / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r: the old time
    assert (tmp_path / "a.txt").stat().st_size == st.st_size
    again = build_corpus(paths, story_tokenizer, cache_dir=str(tmp_path / "c"))
    assert again.document_text(0, story_tokenizer).startswith("ann sat")
    assert not np.array_equal(np.array(again.tokens), old)


def _damage_truncated(folder):
    p = folder / "shards" / "00000" / "tokens.bin"
    p.write_bytes(p.read_bytes()[:-6])


def _damage_garbage(folder):
    p = folder / "shards" / "00000" / "tokens.bin"
    p.write_bytes(bytes(len(p.read_bytes())))  # zeros of the right size, as a crash can leave a file


def _damage_sentence_ends(folder):
    p = folder / "shards" / "00000" / "sent_ends.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 9, len(p.read_bytes()), dtype=np.uint8).tobytes())


def _damage_meta(folder):
    p = folder / "manifest.json"
    p.write_text(p.read_text()[:40])


@pytest.mark.parametrize("damage", [_damage_truncated, _damage_garbage, _damage_sentence_ends, _damage_meta],
                         ids=["truncated", "garbage", "sentence-ends", "broken-meta"])
def test_a_damaged_cache_entry_is_moved_aside_and_built_again(damage, small_text_corpus, story_tokenizer, tmp_path,
                                                               caplog):
    import pathlib

    cache = tmp_path / "c"
    good = build_corpus([str(small_text_corpus)], story_tokenizer, cache_dir=str(cache))
    tokens, ends = np.array(good.tokens), np.array(good.sent_ends)
    del good  # the memory maps
    damage(pathlib.Path(next(p for p in cache.iterdir() if p.name.startswith("corpus-"))))
    with caplog.at_level("WARNING", logger="bertforge"):
        again = build_corpus([str(small_text_corpus)], story_tokenizer, cache_dir=str(cache))
    assert np.array_equal(np.array(again.tokens), tokens) and np.array_equal(np.array(again.sent_ends), ends)
    assert "damaged" in caplog.text and "tokenizing again" in caplog.text
    assert len([p for p in cache.iterdir() if ".damaged-" in p.name]) == 1  # kept aside, for a look


@pytest.mark.slow
def test_what_a_killed_build_left_is_removed(small_text_corpus, tmp_path):
    """A build killed midway (SIGKILL: no clean-up ran) leaves an unfinished entry with a half-written shard; the
    next build finishes it and removes what the killed one was writing."""
    import subprocess
    import sys

    cache = tmp_path / "c"
    script = (
        "import os, signal, sys\n"
        "import bertforge.data as data, bertforge.prepared as prepared\n"
        "from bertforge.corpus import iter_texts\n"
        "from bertforge.tokenizer import train_vocabulary\n"
        "path, cache = sys.argv[1:]\n"
        "tok = train_vocabulary(iter_texts([path]), 600, kind='wordlevel')  # the same in both processes\n"
        "real = prepared.read_part\n"
        "def killed(*a, **k):\n"
        "    for i, doc in enumerate(real(*a, **k)):\n"
        "        if i == 50:\n"
        "            os.kill(os.getpid(), signal.SIGKILL)\n"
        "        yield doc\n"
        "if os.environ.get('KILL'):\n"
        "    prepared.read_part = killed\n"
        "    prepared.BATCH_SENTENCES = 16\n"
        "data.build_corpus([path], tok, cache_dir=cache, workers=1)\n"
    )
    run = [sys.executable, "-c", script, str(small_text_corpus), str(cache)]
    killed = subprocess.run(run, env={**os.environ, "KILL": "1"}, capture_output=True, timeout=120)
    entry = next(p for p in cache.iterdir() if p.name.startswith("corpus-"))
    assert killed.returncode == -9 and not (entry / "manifest.json").exists()
    assert [p.name for p in (entry / "shards").iterdir() if ".tmp-" in p.name]  # half-written
    assert subprocess.run(run, capture_output=True, timeout=120).returncode == 0
    assert not [p.name for p in cache.iterdir() if p.name.startswith(".")]  # no lock left
    assert not [p.name for p in (entry / "shards").iterdir() if p.name.startswith(".")]
    assert len(list(cache.iterdir())) == 1 and (entry / "manifest.json").exists()


def test_a_cache_that_cannot_be_written_is_one_error(tmp_path, story_tokenizer, monkeypatch):
    import errno

    import bertforge.prepared as prepared

    paths = _texts(tmp_path, "a.txt", "Tom went to the park. He saw a dog.\n")
    (tmp_path / "file").write_text("not a folder\n")
    with pytest.raises(UserError, match="cache .*file is not a folder; choose another with --cache-dir"):
        build_corpus(paths, story_tokenizer, cache_dir=str(tmp_path / "file"))

    def disk_full(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(prepared._Summed, "write", disk_full)
    with pytest.raises(UserError, match="cannot write the tokenized-corpus cache .*: No space left on device"):
        build_corpus(paths, story_tokenizer, cache_dir=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()  # nothing half-written, no lock, no folder made for it


def test_instance_plan_on_disk_gives_the_same_batches(gutenberg, tmp_path, monkeypatch):
    """The plan kept on disk (as training keeps it) yields exactly the batches of the plan in memory, across
    epochs and in blocks smaller than an epoch; its files have no name, so nothing is left in the folder."""
    import bertforge.data as data

    tok, corpus = gutenberg
    monkeypatch.setattr(data, "PLAN_CHUNK", 100)  # several blocks per epoch
    masker = Masker(tok, MaskingConfig(max_seq_length=128))
    docs = np.arange(corpus.n_documents)
    mem = PretrainingLoader(corpus, docs, masker, batch_size=64, seed=3)
    disk = PretrainingLoader(corpus, docs, masker, batch_size=64, seed=3, plan_dir=str(tmp_path))
    for epoch in (0, 1):
        (i_mem, o_mem), (i_disk, o_disk) = mem.instances(epoch), disk.instances(epoch)
        assert len(i_mem) > 3 * 100
        assert isinstance(i_disk, np.memmap) and isinstance(o_disk, np.memmap)
        assert np.array_equal(i_mem, i_disk) and np.array_equal(o_mem, o_disk)
        assert not np.array_equal(o_disk, np.arange(len(o_disk)))  # shuffled
    assert np.array_equal(create_instances(corpus, docs, docs, masker.cfg, seed=11),
                          np.concatenate(list(data.instance_chunks(corpus, docs, docs, masker.cfg, seed=11))))
    disk.epoch, disk.step = 0, disk.steps_in_epoch(0) - 2  # crosses into epoch 1
    mem.load_state_dict(disk.state_dict())
    for _ in range(4):
        x, y = mem.next_batch(), disk.next_batch()
        assert all(torch.equal(x[k], y[k]) for k in x)
    assert disk.epoch == 1
    assert mem.steps_in_epochs(3) == disk.steps_in_epochs(3)
    assert os.listdir(tmp_path) == []


def test_instance_plan_on_a_full_disk_is_one_error(small_text_corpus, story_tokenizer, tmp_path, monkeypatch):
    import errno
    import tempfile

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    corpus = build_corpus([str(small_text_corpus)], story_tokenizer)
    masker = Masker(story_tokenizer, MaskingConfig(max_seq_length=64))
    loader = PretrainingLoader(corpus, np.arange(corpus.n_documents), masker, batch_size=4, seed=0,
                               plan_dir=str(tmp_path))
    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    with pytest.raises(UserError, match="cannot write the epoch's instance plan in .*No space left on device"):
        loader.next_batch()


def test_a_local_dataset_folder_is_cached_by_its_content(tmp_path, story_tokenizer):
    """Found by hostile testing: an hf: dataset was cached by its name, so a local dataset folder whose rows
    changed trained on the old rows."""
    pa = pytest.importorskip("pyarrow")
    pytest.importorskip("datasets")
    import pyarrow.parquet as pq

    ds = tmp_path / "ds"
    ds.mkdir()
    rows = ["Tom went to the park. He saw a dog.", "Anna read a book. It was long."] * 3
    pq.write_table(pa.table({"text": rows}), ds / "train.parquet")
    first = build_corpus([f"hf:{ds}"], story_tokenizer, cache_dir=str(tmp_path / "cache"))
    pq.write_table(pa.table({"text": [r.replace("dog", "cat") for r in rows]}), ds / "train.parquet")
    second = build_corpus([f"hf:{ds}"], story_tokenizer, cache_dir=str(tmp_path / "cache"))
    assert second.folder != first.folder and not np.array_equal(first.tokens, second.tokens)


def test_word_starts_for_whole_word_masking_in_wordpiece_bpe_and_word_level_vocabularies():
    from bertforge.data import continuation_pieces

    assert continuation_pieces(["[CLS]", "play", "##ing", "##s"]).tolist() == [False, False, True, True]
    # byte-level BPE (ModernBERT's, RoBERTa's): a word starts at Ġ, the pieces after it continue it
    bpe = ["[CLS]", "\u0120play", "ing", "\u0120the", "##"]  # ("##": a BPE token of its own, a hashtag's)
    assert continuation_pieces(bpe).tolist() == [True, False, True, False, True]
    assert continuation_pieces(["\u2581the", "re"]).tolist() == [False, True]  # SentencePiece's mark
    assert continuation_pieces(["the", "cat"]).tolist() == [False, False]  # word level: every token a word


def test_a_folder_of_a_few_documents_holds_out_about_five_percent(small_text_corpus, tmp_path, capsys):
    """Issue 67, item 1: a folder of three books held out one whole book (a third of the text and more) where
    the README promises about 5%: a corpus of a few documents is cut into parts first, as a single file is."""
    import json
    import re

    from bertforge.cli import main

    texts = [json.loads(line)["text"] for line in small_text_corpus.read_text().splitlines()]
    (tmp_path / "books").mkdir()
    for i in range(3):  # three books of equal size
        (tmp_path / "books" / f"b{i}.txt").write_text(" ".join(texts[i * 40 : (i + 1) * 40]))
    assert main(["pretrain", "--data", str(tmp_path / "books"), "--out", str(tmp_path / "o"), "--preset", "tiny",
                 "--vocab-size", "300", "--max-steps", "1", "--batch-size", "4", "--max-seq-length", "32",
                 "--eval-every", "0", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "cut into" in err, err[-2000:]
    trained, held = map(int, re.search(r"documents \((\d+) tokens\), \d+ held out for evaluation \((\d+) tokens\)",
                                       err).groups())
    assert 0 < held / (trained + held) <= 0.1


def test_a_single_held_out_text_is_cut_into_parts_for_next_sentence_prediction(small_text_corpus, story_tokenizer,
                                                                               tmp_path):
    """--eval-data of one document (a .txt file): its NotNext segments come from other parts of it, as
    training's do, not from the instance's own document."""
    from bertforge.config import PretrainConfig
    from bertforge.data import PretrainingData
    from bertforge.demo.corpus import generate_stories
    from bertforge.devices import Dist

    (tmp_path / "valid.txt").write_text(" ".join(" ".join(s) for s in generate_stories(20, 9)))
    cfg = PretrainConfig()
    cfg.data.data, cfg.data.eval_data = [str(small_text_corpus)], [str(tmp_path / "valid.txt")]
    cfg.data.cache_dir, cfg.data.max_seq_length, cfg.data.nsp = str(tmp_path / "cache"), 64, True
    data = PretrainingData(cfg, story_tokenizer, Dist(), False)
    assert data.eval_corpus.n_documents > 1 and len(data.eval_docs) == data.eval_corpus.n_documents
    assert data.eval_set()  # (its instances draw their random next segments from the other parts)


def test_a_single_held_out_document_scores_none_of_the_training_text(tmp_path):
    """With one document held out, NotNext segments came from the training documents: text the model trains
    on was masked and scored as held-out. Every segment is the held-out document's now."""
    import json

    from bertforge.config import PretrainConfig
    from bertforge.data import PretrainingData
    from bertforge.devices import Dist
    from bertforge.tokenizer import special_ids, train_vocabulary

    docs = [[f"w{d}x{s}a w{d}x{s}b w{d}x{s}c w{d}x{s}d." for s in range(12)] for d in range(20)]  # words of one doc
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in docs))
    tok = train_vocabulary([" ".join(d) for d in docs], 2000, kind="wordlevel", min_frequency=1)
    cfg = PretrainConfig()
    cfg.data.data, cfg.data.cache_dir, cfg.data.max_seq_length, cfg.data.nsp = [str(tmp_path / "c.jsonl")], \
        str(tmp_path / "cache"), 32, True
    cfg.train.batch_size = 4
    data = PretrainingData(cfg, tok, Dist(), False)
    assert len(data.eval_docs) == 1
    held = int(data.eval_docs[0])
    own = {tok.token_to_id(w) for s in docs[held] for w in s.rstrip(".").split()} | {tok.token_to_id(".")}
    specials = set(special_ids(tok).as_set())
    for batch in data.eval_set():
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        seen = set(original[batch["attention_mask"].bool()].tolist()) - specials
        assert seen <= own, sorted(tok.id_to_token(i) for i in seen - own)[:5]
