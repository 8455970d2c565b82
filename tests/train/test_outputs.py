"""The one output object (:class:`bertforge.outputs.Output`): the rule, the lock, the recovery of an interrupted
write and the whole-or-nothing write, which every command that writes a folder goes through."""

from __future__ import annotations

import os

import pytest

from bertforge.errors import UserError
from bertforge.outputs import MARKER, Output, marker_kind, register_output

register_output("toy", {"a.txt"})


def _write(output: Output, text: str) -> None:
    with output, output.atomic() as tmp:
        with open(os.path.join(tmp, "a.txt"), "w") as f:
            f.write(text)


def test_a_new_output_is_written_whole_and_marked(tmp_path):
    out = tmp_path / "sub" / "out"
    output = Output(str(out), "toy")
    assert output.check() is False
    _write(output, "one")
    assert (out / "a.txt").read_text() == "one" and marker_kind(str(out)) == "toy"
    assert sorted(os.listdir(tmp_path / "sub")) == ["out"]  # no lock file, no temporary folder left


def test_an_earlier_output_is_replaced_only_with_overwrite_and_only_if_ours(tmp_path):
    out = tmp_path / "out"
    _write(Output(str(out), "toy"), "one")
    with pytest.raises(UserError, match="pass --overwrite"):
        Output(str(out), "toy").check()
    with pytest.raises(UserError, match="replaces only a tokenizer output"):
        Output(str(out), "tokenizer", overwrite=True).check()
    replacing = Output(str(out), "toy", overwrite=True)
    assert replacing.check() is True
    _write(replacing, "two")
    assert replacing.replace and (out / "a.txt").read_text() == "two"
    (out / "mine.txt").write_text("a user's")  # a file bertforge did not write: never deleted
    with pytest.raises(UserError, match="mine.txt"):
        Output(str(out), "toy", overwrite=True).check()
    (out / "mine.txt").unlink()
    with pytest.raises(UserError, match="holds the input"):  # nor an output that holds the run's inputs
        Output(str(out), "toy", overwrite=True, inputs=[str(out / "a.txt")]).check()


def test_a_second_writer_is_refused_and_the_rule_is_applied_again_under_the_lock(tmp_path):
    out = tmp_path / "out"
    first, checked_early = Output(str(out), "toy"), Output(str(out), "toy")
    assert checked_early.check() is False  # the folder is free when this one checks...
    with first:
        with pytest.raises(UserError, match="another bertforge run is writing"):
            Output(str(out), "toy").__enter__()
        with first.atomic() as tmp:
            open(os.path.join(tmp, "a.txt"), "w").close()
    with pytest.raises(UserError, match="already exists"):  # ...and refused once another run has written there
        checked_early.__enter__()
    assert sorted(os.listdir(tmp_path)) == ["out"]  # every lock released, its file removed


def test_what_an_interrupted_write_left_beside_is_put_right(tmp_path):
    out = tmp_path / "out"
    old = tmp_path / ".out.old-123"  # the previous output, moved aside by a swap that did not finish
    old.mkdir()
    (old / MARKER).write_text('{"kind": "toy"}\n')
    half = tmp_path / ".out.tmp-456"  # a half-written new one
    half.mkdir()
    Output(str(out), None).recover()
    assert marker_kind(str(out)) == "toy" and not half.exists() and not old.exists()


def test_without_the_lock_nothing_is_checked_or_taken(tmp_path):
    out = tmp_path / "out"
    _write(Output(str(out), "toy"), "one")
    with Output(str(out), "toy", overwrite=True) as first:  # rank 0 holds the lock and replaces the output...
        with Output(str(out), "toy", lock=False) as other:  # ...another torchrun process enters all the same
            assert first.replace and not other.replace  # (checked, it would be refused: no --overwrite)


def test_folders_made_for_the_lock_go_when_nothing_was_written(tmp_path):
    with Output(str(tmp_path / "a" / "b" / "out"), "toy"):
        assert (tmp_path / "a" / "b").is_dir()
    assert not (tmp_path / "a").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "out").mkdir()
    (tmp_path / "c" / "out" / "x").write_text("not ours")
    with pytest.raises(UserError, match="already exists"):  # the rule refused it under the lock: released
        Output(str(tmp_path / "c" / "out"), "toy").__enter__()
    assert sorted(os.listdir(tmp_path / "c")) == ["out"]
