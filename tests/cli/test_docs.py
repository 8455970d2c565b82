"""The README and the guide (docs/guide/) as a user meets them: every fenced shell block runs as it is written, in
the documents' order, on data laid out as they name it, and every relative link resolves.

A block marked ``<!-- tested at toy sizes: ... -->`` runs with the sizes that comment names replaced (a tiny
model, two steps, short sequences); a block marked ``<!-- not run ...: REASON -->`` is not run (the set-up
itself, many machines); every other block runs unchanged. The README's quick start runs in a folder of its own;
the guide's pages in one, in the order below, each using what the one before wrote."""

from __future__ import annotations

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

import bertforge
from bertforge.cli import main
from bertforge.demo.corpus import write_story_corpus

from ..helpers import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = [ROOT / "docs" / "guide" / f"{page}.md" for page in ("pretraining", "finetuning", "runs", "models",
                                                             "distributed")]
SHELL = ("bash", "sh", "shell", "console")

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
    "rerank": ["--max-steps", "2", "--batch-size", "2", "--num-negatives", "2", "--max-seq-length", "64",
               "--no-progress"],
}


def _blocks(doc: pathlib.Path) -> list[tuple[str, list[str]]]:
    """(marker, command lines) of each shell block of ``doc``: the marker is "toy", "skip" or "" (run as written).
    A line continued by a backslash is one command; comments after ``  #`` are dropped."""
    out, lines = [], doc.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.fullmatch(r"```(\w+)", lines[i].strip())
        if not fence:
            i += 1
            continue
        end = lines.index("```", i + 1)
        above = next((x.strip() for x in reversed(lines[:i]) if x.strip()), "")
        marker = ""
        if above.startswith("<!--"):
            assert above.startswith(("<!-- tested at toy sizes:", "<!-- not run")), f"{doc.name}: {above}"
            marker = "toy" if "toy sizes" in above else "skip"
            assert marker == "toy" or ":" in above, f"{doc.name}: say why a block is not run: {above}"
        if fence.group(1) in SHELL:
            body = "\n".join(lines[i + 1 : end]).replace("\\\n", " ")
            cmds = [x.split("  #")[0].strip() for x in body.splitlines()]
            out.append((marker, [c for c in cmds if c]))
        i = end + 1
    return out


def _toy(line: str) -> list[str]:
    """A command line as argv (``bertforge`` first), at a toy size."""
    argv, toy = shlex.split(line), []
    for flag, instead in TOY.items():
        while flag in argv:
            i = argv.index(flag)
            del argv[i:i + 2]
            toy += instead
    kind = argv[2] if argv[1] == "finetune" else argv[1]
    return [*argv, *toy, *EXTRA.get(kind, [])]


def _squad(path: pathlib.Path, stories: list[str]) -> None:
    """Each story a paragraph, asked who did what its first sentence says (the answer: the name it starts with)."""
    paragraphs = []
    for i, text in enumerate(stories[:12]):
        name, words = text.split()[0], text.split(".")[0].split()[1:5]
        paragraphs.append({"context": text, "qas": [{"id": f"q{i}", "question": f"Who {' '.join(words)}?",
                                                       "answers": [{"text": name, "answer_start": 0}]}]})
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


def _run(line: str, toy: bool, capsys) -> None:
    """One command line of a block, as the docs write it (at toy sizes in a toy block)."""
    words = shlex.split(line)
    if words[0] == "source":
        return  # (the environment: the tests already run inside it)
    if words[0] == "python" and words[1] == "-c":  # run here: a process of its own would only import torch again
        exec(compile(words[2], "<the docs' python -c>", "exec"), {"__name__": "__main__"})
        return
    if words[0] == "torchrun":  # the venv's torchrun with the line's own flags (and a free port)
        assert "-m" in words and words[words.index("-m") + 1] == "bertforge", line
        m = words.index("-m")
        rest = " ".join(shlex.quote(w) for w in words[m + 1 :])
        argv = _toy(rest)[1:] if toy else words[m + 2 :]
        launcher = [str(pathlib.Path(sys.executable).parent / "torchrun"), *words[1:m], "--master_port",
                    str(free_port())]
        r = subprocess.run([*launcher, "-m", "bertforge", "--quiet", *argv], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, f"{line}\n{r.stderr[-2000:]}"
        return
    assert words[0] == "bertforge", f"a command the docs' test cannot run: {line}"
    argv = _toy(line)[1:] if toy else words[1:]
    assert main(["--quiet", *argv]) == 0, f"{line}\n{capsys.readouterr().err[-2000:]}"


@pytest.mark.slow
def test_every_shell_block_of_the_readme_and_the_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    readme, guide = _blocks(README), [b for page in GUIDE for b in _blocks(page)]
    assert [m for m, _ in readme] == ["skip", "toy"]  # the set-up, the quick start
    assert sum(len(c) for m, c in guide if m != "skip") >= 25, guide  # (the parse keeps every command)
    for folder, blocks in (("quick-start", readme), ("guide", guide)):
        (tmp_path / folder).mkdir()
        _data(tmp_path / folder)
        monkeypatch.chdir(tmp_path / folder)
        for marker, lines in blocks:
            for line in lines if marker != "skip" else []:
                _run(line, marker == "toy", capsys)


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_of_the_docs_resolves():
    docs = [README, *GUIDE, ROOT / "RESULTS.md", ROOT / "benchmarks" / "README.md"]
    assert all(p.is_file() for p in GUIDE)
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve()
            assert file.exists(), f"{doc.name}: {target}"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{doc.name}: {target}"


def test_the_readme_names_every_module():
    text = README.read_text(encoding="utf-8")
    src = pathlib.Path(bertforge.__file__).parent
    missing = [str(p.relative_to(src)) for p in src.rglob("*.py")
               if p.name != "__init__.py" and "__pycache__" not in p.parts and p.name not in text]
    assert not missing, missing
    assert len(text.splitlines()) <= 220
