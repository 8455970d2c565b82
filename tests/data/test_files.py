"""Reading user files and texts that are not clean Unicode (issue 66, class 2): a lone surrogate escape in JSON
(a tweet cut inside an emoji), bytes that are not UTF-8 on the command line, a table field longer than csv's
default limit. Each used to end in a traceback; each is now read, with a warning that names where."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import BertConfig
from bertforge.cli import main
from bertforge.files import json_lines, read_json
from bertforge.models import BertForSequenceClassification
from bertforge.tokenizer import train_vocabulary


def test_a_lone_surrogate_escape_is_read_as_a_replacement_character(tmp_path, caplog):
    lines = ['{"text": "good \\ud83d day", "label": "pos"}', '{"text": "\\ud83d\\ude00 a pair", "label": "neg"}']
    rows = [obj for _, obj in json_lines(lines, "tweets.jsonl")]
    assert rows[0]["text"] == "good \ufffd day" and rows[1]["text"] == "\U0001F600 a pair"  # a valid pair stays
    assert [r.message for r in caplog.records if "lone surrogate" in r.message] == [
        "tweets.jsonl:1: a lone surrogate escape (half of a character, such as an emoji cut in two) was read as "
        "U+FFFD"]
    (tmp_path / "s.json").write_text('{"data": ["\\udc00"]}')
    assert read_json(str(tmp_path / "s.json")) == {"data": ["\ufffd"]}


@pytest.fixture
def classifier(tmp_path) -> str:
    tok = train_vocabulary(["good day", "bad day", "cafe"] * 4, 40, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    cfg.id2label = {0: "neg", 1: "pos"}
    BertForSequenceClassification(cfg).save_pretrained(str(tmp_path / "m"), tokenizer=tok)
    return str(tmp_path / "m")


def test_such_texts_reach_a_model_from_files_and_the_command_line(classifier, tmp_path, capsys):
    data = tmp_path / "s.jsonl"
    data.write_text('{"text": "good \\ud83d day", "label": "pos"}\n{"text": "bad day", "label": "neg"}\n')
    assert main(["evaluate", "classify", "--model", classifier, "--data", str(data)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["examples"] == 2 and f"{data}:1: a lone surrogate escape" in out.err
    latin1 = b"caf\xe9".decode("utf-8", "surrogateescape")  # as Python gives a Latin-1 byte of argv
    assert main(["predict", "classify", "--model", classifier, "--json", latin1]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)[0]["text"] == "caf\ufffd" and "not UTF-8" in out.err
    long = tmp_path / "long.tsv"  # a field over csv's default limit of 131,072 characters
    long.write_text("sentence\tlabel\n" + "good " * 40_000 + "\tpos\nbad day\tneg\n")
    assert main(["--quiet", "evaluate", "classify", "--model", classifier, "--data", str(long)]) == 0
    assert json.loads(capsys.readouterr().out)["examples"] == 2
