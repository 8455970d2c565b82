"""Does a change compute the same numbers?  Short runs of every training path, written by one source tree and
compared bit for bit with another's: the weights (``torch.equal``) and every ``metrics.jsonl`` row but times.

    PYTHONPATH=OLD/src python benchmarks/same_numbers.py run runs/old
    PYTHONPATH=NEW/src python benchmarks/same_numbers.py run runs/new
    python benchmarks/same_numbers.py compare runs/old runs/new        # exit status 1 when anything differs

The runs (one thread, so that the float summation order is the same; fp32, or bf16 with ``BERTFORGE_CPU_BF16=1``):
BERT's recipe with NSP and 2 accumulation steps, the budget recipe, ELECTRA, fine-tuning a classifier with and
without checkpoints, continued pretraining (``--init``) with and without ``--add-vocab``, a run stopped half-way and
resumed, a run from a ``prepare``d folder, a SQuAD, a NER and an embeddings fine-tune, and ModernBERT pretrained and
fine-tuned as a classifier.  Every run goes through the command line only, so that the script runs on older trees.
"""

from __future__ import annotations

import json
import os
import re
import sys

RUNS = ("bert", "budget", "electra", "electra/generator", "cls", "cls_ckpt", "init", "wp", "add_vocab", "resumed",
        "prepared", "squad", "ner", "embed", "modern", "modern_cls")
TIMES = {"elapsed", "tokens_per_second", "train_seconds", "wall_seconds"}


def run(root: str) -> None:
    os.environ["BERTFORGE_THREADS"] = "1"
    # fp32, as older trees run on any CPU (auto is bf16 on CPUs with native bf16); =1 compares bf16 runs
    os.environ.setdefault("BERTFORGE_CPU_BF16", "0")
    os.environ["BERTFORGE_CACHE"] = os.path.join(root, "cache")
    from bertforge.cli import main
    from bertforge.demo.corpus import write_story_corpus

    corpus, tok = os.path.join(root, "corpus"), os.path.join(root, "tok")
    os.makedirs(corpus, exist_ok=True)
    write_story_corpus(os.path.join(corpus, "stories.jsonl"), n_docs=120, seed=0)
    assert main(["--quiet", "tokenizer", "train", "--input", corpus, "--vocab-size", "400", "--model", "wordlevel",
                 "--out", tok]) == 0
    base = ["--data", corpus, "--tokenizer", tok, "--preset", "tiny", "--max-seq-length", "64", "--batch-size", "16",
            "--lr", "1e-3", "--log-every", "5", "--max-eval-instances", "64", "--no-progress", "--max-steps", "12",
            "--eval-every", "6", "--save-every", "6"]
    for name, extra in (("bert", ["--recipe", "bert", "--grad-accum", "2"]), ("budget", ["--recipe", "budget"]),
                        ("electra", ["--recipe", "budget", "--objective", "electra"])):
        assert main(["--quiet", "pretrain", "--out", os.path.join(root, name), *base, *extra]) == 0, name
    with open(os.path.join(corpus, "stories.jsonl"), encoding="utf-8") as f:
        rows = [(json.loads(line)["text"].split(".")[0].replace("\t", " "), str(i % 2)) for i, line in enumerate(f)]
    for split, part in (("train", rows[:96]), ("dev", rows[96:])):
        with open(os.path.join(root, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n" + "".join(f"{a}\t{b}\n" for a, b in part))
    finetune = ["--quiet", "finetune", "classify", "--model", os.path.join(root, "bert"), "--train",
                os.path.join(root, "train.tsv"), "--validation", os.path.join(root, "dev.tsv"), "--epochs", "2",
                "--batch-size", "8", "--max-seq-length", "32", "--no-progress", "--seed", "3"]
    assert main([*finetune, "--out", os.path.join(root, "cls"), "--eval-every", "5"]) == 0
    assert main([*finetune, "--out", os.path.join(root, "cls_ckpt"), "--save-every", "7", "--grad-accum", "2"]) == 0
    short = [a for a in base if a not in ("--tokenizer", tok, "--preset", "tiny")]
    short[short.index("--max-steps") + 1] = "6"
    budget = os.path.join(root, "budget")
    assert main(["--quiet", "pretrain", "--out", os.path.join(root, "init"), *short, "--init", budget]) == 0
    wp_tok, wp = os.path.join(root, "wp_tok"), os.path.join(root, "wp")  # --add-vocab extends a WordPiece one
    _wordpiece_vocab(tok, wp_tok)  # (written, not trained: WordPiece training may break ties another way each time)
    assert main(["--quiet", "pretrain", "--out", wp, *short, "--tokenizer", os.path.join(wp_tok, "vocab.txt"),
                 "--preset", "tiny"]) == 0
    assert main(["--quiet", "pretrain", "--out", os.path.join(root, "add_vocab"), *short, "--init", wp,
                 "--add-vocab", "20"]) == 0
    resumed = ["--quiet", "pretrain", "--out", os.path.join(root, "resumed"), *base, "--recipe", "budget"]
    half = list(resumed)
    half[half.index("--max-steps") + 1] = "6"
    assert main(half) == 0
    assert main([*resumed, "--resume"]) == 0
    prep = os.path.join(root, "prep")
    assert main(["--quiet", "prepare", "--data", corpus, "--tokenizer", tok, "--out", prep, "--workers", "1",
                 "--no-progress"]) == 0
    from_prep = [prep if a == corpus else a for a in base if a not in ("--tokenizer", tok)]
    assert main(["--quiet", "pretrain", "--out", os.path.join(root, "prepared"), *from_prep]) == 0
    squad = os.path.join(root, "squad.json")
    with open(squad, "w", encoding="utf-8") as f:
        json.dump(_squad(corpus), f)
    assert main(["--quiet", "finetune", "squad", "--model", budget, "--train", squad, "--validation", squad,
                 "--epochs", "2", "--batch-size", "8", "--max-seq-length", "64", "--doc-stride", "16",
                 "--max-query-length", "16", "--no-progress", "--seed", "1", "--out",
                 os.path.join(root, "squad")]) == 0
    ner = os.path.join(root, "ner.conll")
    _conll(corpus, ner)
    short_ft = ["--epochs", "2", "--batch-size", "8", "--max-seq-length", "32", "--no-progress", "--seed", "2"]
    for task, data in (("ner", ner), ("embed", squad)):
        assert main(["--quiet", "finetune", task, "--model", budget, "--train", data, "--validation", data, *short_ft,
                     "--out", os.path.join(root, task)]) == 0, task
    modern = os.path.join(root, "modern")
    assert main(["--quiet", "pretrain", "--out", modern, *base, "--arch", "modernbert", "--recipe", "budget"]) == 0
    modern_ft = [modern if a == os.path.join(root, "bert") else a for a in finetune]
    assert main([*modern_ft, "--out", os.path.join(root, "modern_cls"), "--eval-every", "5"]) == 0


def _conll(corpus: str, out: str) -> None:
    """A NER file of the stories' sentences: each story's hero (its first word) is a name (B-name)."""
    with open(os.path.join(corpus, "stories.jsonl"), encoding="utf-8") as f, open(out, "w", encoding="utf-8") as o:
        for i, line in enumerate(f):
            if i == 24:
                break
            sentences = [s.split() for s in json.loads(line)["text"].split(".") if s.strip()]
            hero = sentences[0][0]
            for words in sentences[:4]:
                o.write("".join(f"{w}\t{'B-name' if w.strip(',') == hero else 'O'}\n" for w in words) + "\n")


def _wordpiece_vocab(tok: str, out: str) -> None:
    """A WordPiece vocabulary: the letters, alone and as ``##`` pieces, and four in five of ``tok``'s words."""
    with open(os.path.join(tok, "vocab.txt"), encoding="utf-8") as f:
        words = f.read().split()
    special, words = [w for w in words if w.startswith("[")], [w for w in words if not w.startswith("[")]
    letters = sorted({c for w in words for c in w})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join([*special, *letters, *("##" + c for c in letters), *(
            w for i, w in enumerate(words) if i % 5 and len(w) > 1)]) + "\n")


def _squad(corpus: str) -> dict:
    """Questions on the stories: a sentence with one of its words asked for, answered from the paragraph."""
    paragraphs = []
    with open(os.path.join(corpus, "stories.jsonl"), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i == 24:
                break
            context = json.loads(line)["text"]
            sentence = context.split(".")[1].strip()
            words = list(re.finditer(r"\S+", sentence))
            word = words[len(words) // 2 + 1]
            question = sentence[:word.start()] + "what" + sentence[word.end():] + "?"
            start = context.index(sentence) + word.start()
            paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": question,
                                                           "answers": [{"text": word.group(), "answer_start": start}]}]})
    return {"version": "1.1", "data": [{"title": "stories", "paragraphs": paragraphs}]}


def rows(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in f]


def compare(a: str, b: str) -> int:
    import torch
    from safetensors.torch import load_file

    bad = 0
    for name in RUNS:
        wa = load_file(os.path.join(a, name, "model.safetensors"))
        wb = load_file(os.path.join(b, name, "model.safetensors"))
        same = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
        ra, rb = rows(os.path.join(a, name, "metrics.jsonl")), rows(os.path.join(b, name, "metrics.jsonl"))
        print(f"{name}: weights {'equal' if same else 'DIFFER'}, metrics {'equal' if ra == rb else 'DIFFER'}")
        bad += (not same) + (ra != rb)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        run(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
