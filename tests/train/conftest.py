"""Fixtures of the training tests."""

from __future__ import annotations

import pytest

from bertforge.cli import main


@pytest.fixture(scope="module")
def story_tok_dir(small_text_corpus, tmp_path_factory):
    """A word-level vocabulary of the demo stories (tests/conftest.py's ``small_text_corpus``)."""
    d = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["--quiet", "tokenizer", "train", "--input", str(small_text_corpus), "--vocab-size", "400",
                 "--model", "wordlevel", "--out", str(d)]) == 0
    return str(d)
