"""The README's commands run as shown: every ``bertforge`` line of its ``bash`` blocks, at a toy size (a tiny model,
two steps, short sequences: only the sizes are changed), on data laid out as the README names it. The quick start
runs in a folder of its own; the pretraining, fine-tuning and prediction blocks in one, in the README's order,
each using what the one before wrote. Lines with ``...`` or ``/shared`` are sketches for many machines, not run."""

from __future__ import annotations

import json
import pathlib
import re
import shlex

import pytest

from bertforge.cli import main
from bertforge.demo.corpus import write_story_corpus

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"

# only the sizes change (the model, the length of the run, the batch, the sequences, the vocabulary): the README's
# are dropped, and the toy ones below given instead
TOY = {"--preset": ["--preset", "tiny"], "--vocab-size": ["--vocab-size", "300"], "--max-time": [], "--max-steps": [],
       "--batch-size": []}
EXTRA = {
    "pretrain": ["--max-steps", "2", "--batch-size", "8", "--max-seq-length", "32", "--eval-every", "0",
                 "--max-eval-instances", "8", "--no-progress"],
    "classify": ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "48", "--no-progress"],
    "squad": ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "64", "--doc-stride", "16",
              "--max-query-length", "16", "--no-progress"],
    "embed": ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "64", "--no-progress"],
    "ner": ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "64", "--no-progress"],
}


def _blocks() -> list[list[str]]:
    """The ``bertforge`` command lines of each bash block, in order (sketches for many machines left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    out = []
    for block in blocks:
        lines = [line.split("  #")[0].strip() for line in block.splitlines()]
        cmds = [line for line in lines if line.startswith("bertforge ") and not line.endswith("...")
                and "/shared" not in line]
        if cmds:
            out.append(cmds)
    return out


def _toy(line: str) -> list[str]:
    """A README command line as argv, at a toy size."""
    argv, toy = shlex.split(line)[1:], []
    for flag, instead in TOY.items():
        while flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
            toy += instead
    kind = argv[1] if argv[0] == "finetune" else argv[0]
    return [*argv, *toy, *EXTRA.get(kind, [])]


def _squad(path: pathlib.Path, stories: list[str]) -> None:
    paragraphs = []
    for i, text in enumerate(stories[:12]):
        word = text.split()[1]
        paragraphs.append({"context": text, "qas": [{"id": f"q{i}", "question": f"Who is {word}?",
                                                       "answers": [{"text": word, "answer_start": text.index(word)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))


def _data(root: pathlib.Path) -> None:
    """The files the README's commands name, in its layout."""
    stories = root / "books" / "stories.jsonl"
    stories.parent.mkdir(parents=True)
    write_story_corpus(stories, n_docs=60, seed=0)
    texts = [json.loads(line)["text"] for line in stories.read_text().splitlines()]
    (root / "my_book.txt").write_text("\n\n".join(texts))
    (root / "sst2").mkdir()
    for split in ("train", "dev"):
        (root / "sst2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{t.split('.')[0]}\t{i % 2}\n" for i, t in enumerate(texts[:40])))
    (root / "squad").mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        _squad(root / "squad" / name, texts)
    (root / "wnut16").mkdir()  # each story's first sentence, its second word an entity
    tagged = ["\n".join(f"{w}\t{'B-person' if i == 1 else 'O'}" for i, w in enumerate(t.split(".")[0].split()))
              for t in texts[:30]]
    for split in ("train", "dev"):
        (root / "wnut16" / f"{split}.conll").write_text("\n\n".join(tagged) + "\n")


@pytest.mark.slow
def test_every_command_of_the_readme_runs_as_shown(tmp_path, monkeypatch, capsys):
    blocks = _blocks()
    kinds = ["tokenizer", "pretrain", "finetune", "finetune", "finetune", "predict"]
    assert [b[0].split()[1] for b in blocks] == kinds, blocks
    assert sum(map(len, blocks)) >= 21  # (the parse keeps every command of those blocks)
    for folder, run in (("quick-start", blocks[:1]), ("guide", blocks[1:])):
        (tmp_path / folder).mkdir()
        _data(tmp_path / folder)
        monkeypatch.chdir(tmp_path / folder)
        for block in run:
            for line in block:
                argv = _toy(line)
                assert main(["--quiet", *argv]) == 0, f"{line}\n{capsys.readouterr().err[-2000:]}"
