"""Writes that fail: a full disk or a file-size limit during a save ends with one ``error:`` line naming the
output and the cause, and leaves the output as it was before the run (absent for a new run, an earlier one
intact for ``--overwrite``).  The file-size limit is real: ``ulimit -f`` in a subprocess, as a user sets it."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest
import torch

from bertforge.cli import main

from ..helpers import SENTENCES, tiny_model_dir, tiny_pretrain
from ..cli.test_hostile import snapshot


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    w = tmp_path_factory.mktemp("inputs")
    (w / "corpus.txt").write_text("\n\n".join(SENTENCES) + "\n")
    (w / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in SENTENCES))
    tiny_model_dir(w / "model", SENTENCES, vocab_size=40, kind="wordlevel")
    rows = [{"text": "good movie", "label": "pos"}, {"text": "bad film", "label": "neg"}]
    (w / "cls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return w


def pretrain_args(w: pathlib.Path, out: pathlib.Path) -> list[str]:
    return tiny_pretrain(w / "corpus.jsonl", out, "--eval-every", "0", "--max-eval-instances", "4", tokenizer=w / "model",
                         batch=4, steps=1)


def tokenizer_args(w: pathlib.Path, out: pathlib.Path, vocab: int = 30) -> list[str]:
    return ["tokenizer", "train", "--input", str(w / "corpus.txt"), "--vocab-size", str(vocab), "--model", "wordlevel",
            "--min-frequency", "1", "--out", str(out)]


def limited(args: list[str], kib: int, cache: pathlib.Path) -> tuple[int, list[str]]:
    """``bertforge ARGS`` under ``ulimit -f KIB``: (exit status, stderr lines)."""
    cmd = f"ulimit -f {kib}; exec {shlex.quote(sys.executable)} -m bertforge --quiet {shlex.join(args)}"
    env = {**os.environ, "BERTFORGE_CACHE": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, p.stderr.strip().splitlines()


def assert_one_error(rc: int, err: list[str], *needles: str) -> None:
    errors = [line for line in err if line.startswith("error: ")]
    assert rc == 2 and len(errors) == 1 and err[-1] == errors[0], (rc, err)
    assert not any("Traceback" in line for line in err), err
    for needle in needles:
        assert needle in errors[0], errors[0]


@pytest.mark.slow
def test_pretraining_first_save_past_the_file_size_limit(inputs, tmp_path):
    """The model file is larger than the limit: the new output is not left half-written (nothing in the way of a
    rerun, which the next test makes)."""
    out = tmp_path / "run"
    rc, err = limited(pretrain_args(inputs, out), 64, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))  # EFBIG: "File too large"
    assert sorted(os.listdir(tmp_path)) == ["cache"]  # no output, no lock, no temporary folder


@pytest.mark.slow
def test_pretraining_overwrite_past_the_file_size_limit_keeps_the_earlier_output(inputs, tmp_path):
    out = tmp_path / "run"
    assert main(["--quiet", *pretrain_args(inputs, out)]) == 0
    before = snapshot(tmp_path)
    rc, err = limited([*pretrain_args(inputs, out), "--overwrite", "--seed", "1"], 64, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_finetuning_last_save_past_the_file_size_limit(inputs, tmp_path):
    out = tmp_path / "cls"
    args = ["finetune", "classify", "--model", str(inputs / "model"), "--train", str(inputs / "cls.jsonl"),
            "--validation", str(inputs / "cls.jsonl"), "--epochs", "1", "--no-progress", "--out", str(out)]
    rc, err = limited(args, 64, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_tokenizer_train_past_the_file_size_limit(inputs, tmp_path):
    out = tmp_path / "tok"
    rc, err = limited(tokenizer_args(inputs, out), 1, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))
    assert sorted(os.listdir(tmp_path)) == []
    assert main(["--quiet", *tokenizer_args(inputs, out, vocab=12)]) == 0
    before = snapshot(tmp_path)
    rc, err = limited([*tokenizer_args(inputs, out), "--overwrite"], 1, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))
    assert snapshot(tmp_path) == before  # the earlier vocabulary, intact


@pytest.mark.parametrize("target", ["folder", "nothing"])
def test_an_output_that_is_a_symbolic_link_is_refused_as_one(inputs, tmp_path, capsys, target):
    """Whether it points to an empty folder or nowhere: the message says what it is."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / ("real" if target == "folder" else "missing"))
    before = snapshot(tmp_path)
    for args in (tokenizer_args(inputs, tmp_path / "link"), pretrain_args(inputs, tmp_path / "link")):
        rc = main(["--quiet", *args])
        assert_one_error(rc, capsys.readouterr().err.strip().splitlines(), "is a symbolic link")
        assert snapshot(tmp_path) == before


def test_a_failed_write_inside_torch_save_is_the_oserror_with_its_errno(tmp_path, monkeypatch):
    """Found in review: torch.save into a file reports a write that fails midway (a file-size limit, a full disk)
    as a RuntimeError ("unexpected pos"), whose cause the error path could not see; write_file raises the OSError."""
    import builtins
    import errno

    import bertforge.atomic as atomic

    class Small:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 4096:
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(atomic, "open", lambda path, mode: Small(builtins.open(path, mode)), raising=False)
    with pytest.raises(OSError) as e:
        atomic.write_file(str(tmp_path / "o.pt"), lambda f: torch.save({"w": torch.zeros(10_000)}, f))
    assert e.value.errno == errno.EFBIG and atomic.write_failure(e.value) == errno.EFBIG


@pytest.mark.slow
def test_prepare_past_the_file_size_limit_names_its_folder_and_leaves_none(inputs, tmp_path):
    out = tmp_path / "prep"  # (two inputs, two workers: the failed write is a worker's)
    args = ["prepare", "--data", str(inputs / "corpus.txt"), str(inputs / "corpus.jsonl"), "--tokenizer",
            str(inputs / "model"), "--workers", "2", "--no-progress", "--out", str(out)]
    rc, err = limited(args, 1, tmp_path / "cache")
    assert_one_error(rc, err, "cannot write", str(out), os.strerror(27))
    assert sorted(os.listdir(tmp_path)) == []
