"""``bertforge prepare``: the shards equal the arrays of the single-process cache of 1b969d3, pretraining reads
them as it reads raw text, a killed preparation resumes to the same bytes, changed inputs are prepared again,
duplicates are counted (and dropped with --dedup), and torchrun ranks wait on a lock file, not in a collective."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge import UserError
from bertforge import prepared as prepared_module
from bertforge.children import child_pids
from bertforge.cli import main
from bertforge.data import build_corpus
from bertforge.prepared import Reading, prepare_corpus
from bertforge.shards import open_prepared
from bertforge.tokenizer import load_tokenizer

from .. import reference_corpora
from ..conftest import data_path
from ..helpers import DOCUMENTS, tiny_pretrain, torchrun

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minilm_tok(minilm_dir):
    return load_tokenizer(minilm_dir)


def _arrays(corpus) -> dict:
    import hashlib

    found = {"tokens.bin": np.asarray(corpus.tokens), "sent_ends.bin": np.asarray(corpus.sent_ends, dtype=np.int64),
             "doc_ends.bin": np.asarray(corpus.doc_ends, dtype=np.int64)}
    return {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in found.items()}


@pytest.mark.parametrize("case", sorted(reference_corpora.CASES))
@pytest.mark.parametrize("small_parts", [False, True], ids=["whole", "parts"])
def test_arrays_equal_those_of_the_1b969d3_cache(case, small_parts, minilm_tok, tmp_path, monkeypatch):
    """Cut into many parts and prepared by two workers, or whole: the arrays of the old single pass, bit for bit."""
    import bertforge.files as files_module

    if small_parts:
        monkeypatch.setattr(prepared_module, "MIN_PART_BYTES", 2000)
        monkeypatch.setattr(files_module, "READ_BYTES", 700)  # blocks end inside lines, paragraphs, documents
    writer, sep = reference_corpora.CASES[case]
    paths = writer(str(tmp_path / "in"))
    corpus = prepare_corpus(paths, minilm_tok, str(tmp_path / "out"), Reading(doc_separator=sep), workers=2)
    assert (len(corpus.meta["shards"]) > 5) == small_parts
    assert _arrays(corpus) == reference_corpora.REFERENCE[case]


def test_gutenberg_arrays_equal_those_of_the_1b969d3_cache(minilm_tok, tmp_path):
    path = str(data_path("gutenberg", "validation.jsonl"))
    corpus = prepare_corpus([path], minilm_tok, str(tmp_path / "out"), workers=2)
    assert _arrays(corpus) == reference_corpora.REFERENCE["gutenberg-validation"]


def _prepare(args, tmp_path, name="prep", expect=0, capsys=None):
    out = tmp_path / name
    assert main(["--quiet", "prepare", "--out", str(out), "--no-progress", *args]) == expect
    return out


def _files(folder) -> dict:
    found = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            found[os.path.relpath(p, folder)] = open(p, "rb").read()
    return found


def test_pretraining_from_a_prepared_folder_is_pretraining_from_the_raw_text(small_text_corpus, minilm_dir,
                                                                              tmp_path):
    """The same batches: the same losses and weights after a few steps, no tokenization at the start."""
    out = _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--workers", "2"], tmp_path)

    def run(data, dest, cache, tokenizer=None):
        return main(["--quiet", *tiny_pretrain(data, dest, "--cache-dir", str(cache), "--eval-every", "0",
                                               "--save-every", "0", "--max-eval-instances", "16", tokenizer=tokenizer,
                                               length=64, steps=3)])

    raw, ready = tmp_path / "raw", tmp_path / "ready"
    assert run(small_text_corpus, raw, tmp_path / "cache", tokenizer=minilm_dir) == 0
    assert run(out, ready, tmp_path / "none") == 0
    assert os.listdir(tmp_path / "none") == []  # nothing tokenized; the epoch's plan has no file name
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (raw, ready))
    assert a["mlm_loss"] == b["mlm_loss"] and a["steps"] == b["steps"] == 3
    assert (raw / "model.safetensors").read_bytes() == (ready / "model.safetensors").read_bytes()
    assert (ready / "vocab.txt").read_text() == (out / "vocab.txt").read_text()


def test_a_prepared_folder_brings_its_tokenizer(small_text_corpus, minilm_dir, tmp_path, story_tokenizer, capsys):
    out = _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path)
    other = tmp_path / "tok"
    from bertforge.tokenizer import save_tokenizer

    save_tokenizer(story_tokenizer, str(other))
    common = ["--preset", "tiny", "--max-steps", "1"]
    assert main(["--quiet", "pretrain", "--data", str(out), "--tokenizer", str(other), "--out", str(tmp_path / "a"),
                 *common]) == 2
    assert "another tokenizer than the prepared corpus" in capsys.readouterr().err
    assert main(["--quiet", "pretrain", "--data", str(out), str(small_text_corpus), "--out", str(tmp_path / "b"),
                 *common]) == 2
    assert "given alone" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(UserError, match="another tokenizer"):
        build_corpus([str(out)], story_tokenizer)


@pytest.mark.slow
def test_a_killed_prepare_resumes_to_the_same_bytes(small_text_corpus, minilm_dir, tmp_path):
    """SIGKILL after the second shard (no clean-up runs), then the same command: the manifest and every shard as
    an uninterrupted preparation writes them."""
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        shutil.copy(small_text_corpus, folder / f"part-{i}.jsonl")
    size = small_text_corpus.stat().st_size  # (one shard per file: neither cut nor grouped)
    run = (f"import sys, bertforge.prepared as p; p.PART_BYTES = p.MIN_PART_BYTES = {size}; "
           "from bertforge.cli import main; sys.exit(main(sys.argv[1:]))")
    args = ["-c", run, "--quiet", "prepare", "--data", str(folder), "--tokenizer", minilm_dir, "--workers", "1",
            "--no-progress"]
    whole = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "whole")], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    env = {**os.environ, "BERTFORGE_FAULT": "shard:*:2"}  # the second shard
    killed = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "cut")], env=env, capture_output=True)
    assert killed.returncode == -9
    assert not (tmp_path / "cut" / "manifest.json").exists() and len(os.listdir(tmp_path / "cut" / "shards")) == 2
    again = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "cut")], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert _files(tmp_path / "cut") == _files(tmp_path / "whole")


def test_a_worker_that_dies_is_one_error_and_the_finished_shards_stay(small_text_corpus, minilm_dir, tmp_path,
                                                                      monkeypatch, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(4):
        shutil.copy(small_text_corpus, folder / f"part-{i}.jsonl")
    _one_shard_per_file(monkeypatch, small_text_corpus.stat().st_size)
    monkeypatch.setenv("BERTFORGE_FAULT", "shard:*")  # each worker is killed after its first shard
    _prepare(["--data", str(folder), "--tokenizer", minilm_dir, "--workers", "2"], tmp_path, expect=1)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a worker process of bertforge prepare died" in err
    monkeypatch.delenv("BERTFORGE_FAULT")
    out = _prepare(["--data", str(folder), "--tokenizer", minilm_dir, "--workers", "2"], tmp_path)
    assert json.loads((out / "manifest.json").read_text())["documents"] > 0


def _one_shard_per_file(monkeypatch, size: int) -> None:
    """Files of ``size`` bytes neither cut nor grouped with others: a shard each."""
    monkeypatch.setattr(prepared_module, "PART_BYTES", size)
    monkeypatch.setattr(prepared_module, "MIN_PART_BYTES", size)


def test_an_input_rewritten_with_its_size_and_time_kept_is_prepared_again(minilm_dir, tmp_path, monkeypatch):
    _one_shard_per_file(monkeypatch, 16)
    (tmp_path / "in").mkdir()
    a, b = tmp_path / "in" / "a.txt", tmp_path / "in" / "b.txt"
    a.write_text("Tom went to the park. He saw a dog.\n")
    b.write_text("The other file stays as it is.\n")
    out = _prepare(["--data", str(tmp_path / "in"), "--tokenizer", minilm_dir], tmp_path)
    st = a.stat()
    kept = (out / "shards" / "00001" / "tokens.bin").stat().st_ino
    (tmp_path / "new.txt").write_text("Ann sat on a mat. She ate a cake.".ljust(st.st_size - 1) + "\n")
    shutil.copy2(tmp_path / "new.txt", a)  # rewritten in place, as cp -p does
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r: the old time
    assert a.stat().st_size == st.st_size and a.stat().st_mtime_ns == st.st_mtime_ns
    _prepare(["--data", str(tmp_path / "in"), "--tokenizer", minilm_dir], tmp_path)
    corpus = build_corpus([str(out)], load_tokenizer(minilm_dir))
    assert corpus.document_text(0, load_tokenizer(minilm_dir)).startswith("ann sat")
    assert (out / "shards" / "00001" / "tokens.bin").stat().st_ino == kept  # the unchanged input's shard kept


def test_other_settings_need_overwrite(small_text_corpus, minilm_dir, story_tokenizer, tmp_path, capsys):
    out = _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path)
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--dedup"], tmp_path, expect=2)
    assert "prepared with other reader settings (--text-field, --doc-separator, --dedup)" in capsys.readouterr().err
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--dedup", "--overwrite"], tmp_path)
    assert json.loads((out / "manifest.json").read_text())["reading"]["dedup"] is True
    (out / "settings.json").unlink()  # what the shards were prepared with, lost: another tokenizer is not taken
    other = tmp_path / "other-tok"
    from bertforge.tokenizer import save_tokenizer

    save_tokenizer(story_tokenizer, str(other))
    _prepare(["--data", str(small_text_corpus), "--tokenizer", str(other), "--dedup"], tmp_path, expect=2)
    assert "not the settings.json that says what they were prepared with" in capsys.readouterr().err
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--dedup", "--overwrite"], tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me\n")
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path, name="mine", expect=2)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me\n"
    # --overwrite of a prepared folder follows the output rule of every command: a file or folder of the user's
    # in it is never deleted (the command is refused, naming it)
    (out / "notes.txt").write_text("keep me too\n")
    (out / "mine").mkdir()
    capsys.readouterr()
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--overwrite"], tmp_path, expect=2)
    assert "also holds files bertforge did not write (mine, notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me too\n" and (out / "mine").is_dir()


def test_duplicates_are_counted_and_dropped_with_dedup(minilm_dir, tmp_path):
    """Exact duplicate documents and paragraphs (spaces collapsed): counted always; --dedup keeps the first."""
    docs = ["First story. It is long.\n\nA shared paragraph here.", "Second story.\n\nA shared  paragraph\nhere.",
            "First story. It is long.\n\nA shared paragraph here.", "Third, new.\n\nThird, new."]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    tok = load_tokenizer(minilm_dir)
    kept = _prepare(["--data", str(tmp_path / "in"), "--tokenizer", minilm_dir], tmp_path, name="kept")
    dropped = _prepare(["--data", str(tmp_path / "in"), "--tokenizer", minilm_dir, "--dedup"], tmp_path, name="dropped")
    m = json.loads((kept / "manifest.json").read_text())["duplicates"]
    assert (m["documents"], m["paragraphs"], m["dropped"]) == (1, 4, False)  # doc 3; its 2 paragraphs, 1 + 1 more
    a, b = build_corpus([str(kept)], tok), build_corpus([str(dropped)], tok)
    assert a.n_documents == 4 and b.n_documents == 3
    texts = [b.document_text(d, tok) for d in range(b.n_documents)]
    assert texts == ["first story. it is long. a shared paragraph here.", "second story.", "third, new."]
    assert json.loads((dropped / "manifest.json").read_text())["duplicates"]["paragraphs"] == 4
    # a corpus too large to count in memory is counted bucket by bucket, to the same figures
    records = json.loads((kept / "manifest.json").read_text())["shards"]
    by_bucket = prepared_module._duplicates(str(kept), records, SimpleNamespace(dedup=False), buckets=4, in_memory=0)
    assert by_bucket == {**m, "dropped": False}


def test_dedup_prepares_a_later_shard_again_when_an_earlier_input_changed(minilm_dir, tmp_path, monkeypatch):
    """What --dedup drops from a part depends on the parts before it: a finished later shard whose drops changed
    with an earlier input was kept, with the old input's duplicate still left out."""
    monkeypatch.setattr(prepared_module, "MIN_PART_BYTES", 40)
    monkeypatch.setattr(prepared_module, "PART_BYTES", 40)
    tok, reading = load_tokenizer(minilm_dir), Reading(doc_separator="line", dedup=True)
    a, b = tmp_path / "A.txt", tmp_path / "B.txt"
    a.write_text("The cat sat on the mat.\nThe dog ran in the park.\n")
    b.write_text("The bird sang a song.\nThe cat sat on the mat.\n")  # its second line: A's first
    assert prepare_corpus([str(a), str(b)], tok, str(tmp_path / "out"), reading, workers=1).n_documents == 3
    a.write_text("The fish swam in the pond.\nThe dog ran in the park.\n")  # no longer
    os.utime(a, (1, 1))
    resumed = prepare_corpus([str(a), str(b)], tok, str(tmp_path / "out"), reading, workers=1)
    fresh = prepare_corpus([str(a), str(b)], tok, str(tmp_path / "fresh"), reading, workers=1)
    assert resumed.n_documents == fresh.n_documents == 4 and resumed.identity() == fresh.identity()


def test_bad_input_is_one_error_naming_the_line(minilm_dir, tmp_path, monkeypatch, capsys):
    """A malformed line in a later part of a file names its line in the whole file."""
    monkeypatch.setattr(prepared_module, "MIN_PART_BYTES", 500)
    lines = [json.dumps({"text": f"Document number {i}. It has two sentences."}) for i in range(60)]
    lines[47] = '{"text": "broken'
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    _prepare(["--data", str(tmp_path / "bad.jsonl"), "--tokenizer", minilm_dir, "--workers", "2"], tmp_path,
             expect=2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl:48: not valid JSON" in err


@pytest.mark.slow
def test_torchrun_ranks_wait_for_the_preparation_outside_any_collective(minilm_dir, tmp_path):
    """Two processes, a process-group timeout shorter than the preparation: one prepares, the other waits on
    the lock file, and the run succeeds (the old barrier failed here)."""
    from bertforge.demo.corpus import write_story_corpus

    corpus = write_story_corpus(tmp_path / "stories.jsonl", n_docs=2000)
    # the preparation made 8 s longer than it is (tests/slow_prepare.py), the timeout 4 s: both margins hold on
    # any host, where a real corpus's preparation and the processes' start-up (which the timeout also bounds)
    # vary with its speed and load
    env = {**os.environ, "BERTFORGE_DIST_TIMEOUT": "4", "BERTFORGE_THREADS": "2", "SLOW_PREPARE_SECONDS": "8"}
    r = subprocess.run([*torchrun(2), "-m", "tests.slow_prepare",
                        *tiny_pretrain(corpus, tmp_path / "run", "--eval-every", "0", "--save-every", "0",
                                       "--max-eval-instances", "8", "--cache-dir", str(tmp_path / "cache"),
                                       tokenizer=minilm_dir, length=64)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    # rank 0 speaks for both: it prepared (and rank 1 waited), or it waited for rank 1
    took = [float(x.split(" in ")[1].split(" s")[0]) for x in r.stderr.splitlines() if "rank 0 prepared it)" in x]
    took += [float(x.split("(waited ")[1].split(" s")[0]) for x in r.stderr.splitlines() if "(waited " in x]
    assert len(took) == 1 and took[0] > 4, r.stderr[-3000:]  # prepared once, for longer than the timeout
    assert len(os.listdir(tmp_path / "cache")) == 1


def _sleep_for(job: dict) -> float:
    import time

    time.sleep(job["s"])
    return job["s"]


@pytest.mark.slow
def test_ctrl_c_stops_the_workers_without_a_traceback(minilm_tok, monkeypatch):
    """An interrupt while waiting for the workers: KeyboardInterrupt and the workers gone, and no exception in the
    pool's own thread (pool.map cancelled its futures, on which that thread then failed: a traceback on stderr).
    A SIGINT that lands while Python runs a finalizer is lost (printed as "Exception ignored"), as a user's
    Ctrl-C can be: a second one follows after 10 s, so that such a race ends the test instead of hanging it."""
    import multiprocessing
    import signal
    import threading

    failed = []
    before = set(multiprocessing.active_children())  # (another test's, under xdist: not this one's to judge)
    before_pids = child_pids()
    monkeypatch.setattr(threading, "excepthook", failed.append)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # also where a shell started us ignoring it
    jobs = [{"s": 0.01}] + [{"s": 30.0} for _ in range(200)]  # most still queued, cancelled by pool.map
    try:
        for _ in range(4):  # the pool's thread meets the cancelled futures or not, by a race: several tries
            timers = [threading.Timer(s, os.kill, (os.getpid(), signal.SIGINT)) for s in (0.4, 10.0)]
            for timer in timers:
                timer.start()
            with pytest.raises(KeyboardInterrupt):
                for _ in prepared_module._map(_sleep_for, jobs, minilm_tok, 2):
                    pass
            for timer in timers:
                timer.cancel()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert failed == []
    for p in set(multiprocessing.active_children()) - before:  # (one the pool's thread killed may be exiting)
        p.join(5)
    left = {}  # as the system sees them: running, or not reaped
    for pid in child_pids() - before_pids:
        with contextlib.suppress(OSError):
            left[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert not left, f"child processes left, by pid and state: {left}"  # a running one would still sleep 30 s
    assert not set(multiprocessing.active_children()) - before


def test_ctrl_c_keeps_the_finished_shards_and_says_that_the_same_command_finishes(small_text_corpus, minilm_dir,
                                                                                  tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(prepared_module, "PART_BYTES", 4096)  # several parts of one file
    monkeypatch.setattr(prepared_module, "MIN_PART_BYTES", 4096)
    args = ["--data", str(small_text_corpus), "--tokenizer", minilm_dir, "--workers", "1"]
    whole = _files(_prepare(args, tmp_path, "whole"))
    fill = prepared_module._fill_shard
    calls = []

    def interrupted_at_the_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return fill(*args)

    monkeypatch.setattr(prepared_module, "_fill_shard", interrupted_at_the_second)
    out = _prepare(args, tmp_path, expect=130)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: interrupted; the shards prepared so far are kept in {out}: the same command finishes "
                   "the preparation"]
    monkeypatch.setattr(prepared_module, "_fill_shard", fill)
    _prepare(args, tmp_path)
    assert _files(out) == whole


def test_a_damaged_shard_is_prepared_again_and_bad_input_leaves_nothing(small_text_corpus, minilm_dir, tmp_path,
                                                                         capsys):
    out = _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path)
    whole = _files(out)
    tokens = out / "shards" / "00000" / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:100])
    with pytest.raises(UserError, match="is damaged"):
        build_corpus([str(out)], load_tokenizer(minilm_dir))
    _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path)  # the same command mends it
    assert _files(out) == whole
    (tmp_path / "bad.jsonl").write_text('{"text": 5}\n')
    (tmp_path / "empty.txt").write_text("")
    for given, said in (("bad.jsonl", "bad.jsonl:1: field 'text' is not a string"), ("empty.txt", "is empty"),
                        ("prep", "is a prepared corpus already")):
        _prepare(["--data", str(tmp_path / given), "--tokenizer", minilm_dir, "--doc-separator", "line"], tmp_path,
                 name="new", expect=2)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
        assert not (tmp_path / "new").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".new")]
    (tmp_path / "new").mkdir()  # a folder made for it is left as it was: empty
    _prepare(["--data", str(tmp_path / "bad.jsonl"), "--tokenizer", minilm_dir], tmp_path, name="new", expect=2)
    assert os.listdir(tmp_path / "new") == [] and "field 'text'" in capsys.readouterr().err
    # a damaged manifest of another shape is one error line, not a traceback
    manifest = json.loads((out / "manifest.json").read_text())
    for damaged in ([1], {**manifest, "held_out": "x"}, {**manifest, "held_out": {"documents": [10**6]}}):
        (out / "manifest.json").write_text(json.dumps(damaged))
        with pytest.raises(UserError, match="is damaged"):
            build_corpus([str(out)], load_tokenizer(minilm_dir))


def test_a_prepared_folder_is_recognised_by_every_command_that_takes_a_corpus(small_text_corpus, minilm_dir,
                                                                              tmp_path, capsys):
    """Found by hostile testing: the commands that read raw text read a prepared folder as text (its vocab.txt
    became the corpus, exit 0), and a copy that lost the marker dotfile was read as text by pretraining too."""
    out = _prepare(["--data", str(small_text_corpus), "--tokenizer", minilm_dir], tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / ".bertforge").unlink()  # as `cp -r prep/* dst/` leaves it
    assert main(["--quiet", *tiny_pretrain(copy, tmp_path / "run", "--eval-every", "0", "--max-eval-instances", "4",
                                           batch=4, steps=1)]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "vocab.txt").read_text() == (copy / "vocab.txt").read_text()  # the folder's own
    raw = tmp_path / "raw"  # a text corpus that happens to hold a manifest.json and a shards/ folder is text
    (raw / "shards").mkdir(parents=True)
    (raw / "manifest.json").write_text('{"files": 1}')
    (raw / "shards" / "a.txt").write_text("The cat sat on the mat. It was warm.")
    from bertforge.corpus import iter_documents

    assert list(iter_documents([str(raw)])) == [["The cat sat on the mat.", "It was warm."]]
    for argv in (["tokenizer", "train", "--input", str(out), "--vocab-size", "100", "--out", str(tmp_path / "tok")],
                 ["evaluate", "mlm", "--model", str(tmp_path / "run"), "--data", str(copy)]):
        capsys.readouterr()
        assert main(["--quiet", *argv]) == 2
        assert "is a prepared corpus (token shards, not text)" in capsys.readouterr().err


def test_an_input_that_yields_no_tokens_leaves_a_folder_that_trains(minilm_dir, tmp_path, capsys):
    """Found by hostile testing: a file of spaces (or a JSONL whose text is empty) left an empty shard, and every
    run from the folder then died on it ("cannot mmap an empty file")."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "blank.txt").write_text("   \n\n  \n")
    (tmp_path / "in" / "empty.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    (tmp_path / "in" / "story.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCUMENTS))
    out = _prepare(["--data", str(tmp_path / "in"), "--tokenizer", minilm_dir, "--workers", "1"], tmp_path)
    assert main(["--quiet", *tiny_pretrain(out, tmp_path / "run", "--eval-every", "0", "--max-eval-instances", "4",
                                           batch=4, steps=1)]) == 0, capsys.readouterr().err


@pytest.mark.slow
def test_a_corpus_of_many_small_files_prepares_and_trains_under_a_low_open_file_limit(minilm_dir, tmp_path):
    """Found by hostile testing: every shard held three memory maps (a file descriptor each), one shard per input
    file, so a folder of a few hundred small files stopped prepare and pretraining with "Too many open files"
    under the usual limit of 1,024. Here 150 files under a limit of 320 (prepare's duplicate count holds 256 files
open at once, whatever the corpus)."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i in range(150):
        (corpus / f"doc{i:03d}.txt").write_text(f"The cat sat on mat number {i}. It was warm there, and the sun "
                                                "was up. A dog ran in the park.\n")
    prep, run = tmp_path / "prep", tmp_path / "run"
    script = (f"ulimit -n 320 && {sys.executable} -m bertforge --quiet prepare --data {corpus} --tokenizer "
              f"{minilm_dir} --out {prep} --workers 1 --no-progress && {sys.executable} -m bertforge --quiet pretrain "
              f"--data {prep} --out {run} --preset tiny --max-steps 1 --batch-size 4 --max-seq-length 32 "
              "--eval-every 0 --max-eval-instances 4 --no-progress")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((prep / "manifest.json").read_text())["documents"] == 150
    assert (run / "metrics.json").is_file()


def test_reader_flags_with_a_prepared_corpus_are_its_own_or_refused(minilm_dir, tmp_path, capsys):
    """Found by hostile testing: --doc-separator and --text-field given with a prepared corpus were ignored, and
    recorded in the run's settings as if used. A prepared corpus was read when it was prepared."""
    (tmp_path / "g.txt").write_text("One sentence.\nAnother one.\n\nA second document.\nIts end.\n" * 20)
    out = _prepare(["--data", str(tmp_path / "g.txt"), "--tokenizer", minilm_dir, "--doc-separator", "blank-line",
                    "--workers", "1"], tmp_path)
    def run(dest, *extra):
        return main(["--quiet", *tiny_pretrain(out, dest, "--eval-every", "0", "--max-eval-instances", "4", *extra,
                                               batch=4, steps=1)])

    assert run(tmp_path / "a", "--doc-separator", "line") == 2
    assert "the prepared corpus" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert run(tmp_path / "b") == 0
    saved = json.loads((tmp_path / "b" / "pretrain_config.json").read_text())
    assert saved["data"]["doc_separator"] == "blank-line"  # what the corpus was read with


@pytest.mark.parametrize("dedup", [False, True])
def test_small_inputs_share_shards_with_the_same_arrays_and_digests(minilm_dir, tmp_path, monkeypatch, dedup):
    """Consecutive inputs smaller than a part make one shard between them (a corpus of many files, few shards),
    and the arrays, counts and each input's digest are those of a shard per input (duplicates dropped alike)."""
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i in range(40):  # every fifth a copy of the one before: duplicates across files
        (corpus / f"d{i:02d}.txt").write_text(f"The cat sat on mat number {i - (i % 5 == 4)}. It was warm.\n\n"
                                              f"A dog ran in park {i % 3}.\n")
    args = ["--data", str(corpus), "--tokenizer", minilm_dir, "--workers", "2", *(["--dedup"] if dedup else [])]
    shared = _prepare(args, tmp_path, "shared")
    _one_shard_per_file(monkeypatch, 1)
    apart = _prepare(args, tmp_path, "apart")
    a, b = (json.loads((f / "manifest.json").read_text()) for f in (shared, apart))
    assert len(a["shards"]) == 1 and len(b["shards"]) == 40
    assert [i["sha256"] for i in a["inputs"]] == [i["sha256"] for i in b["inputs"]]
    assert {k: a[k] for k in ("documents", "sentences", "tokens", "duplicates")} == \
        {k: b[k] for k in ("documents", "sentences", "tokens", "duplicates")}
    assert _arrays(open_prepared(str(shared))) == _arrays(open_prepared(str(apart)))
