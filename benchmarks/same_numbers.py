"""Does a change compute the same numbers?  Short runs of every training path, written by one source tree and
compared bit for bit with another's: the weights (``torch.equal``) and every ``metrics.jsonl`` row but times.

    PYTHONPATH=OLD/src python benchmarks/same_numbers.py run runs/old
    PYTHONPATH=NEW/src python benchmarks/same_numbers.py run runs/new
    python benchmarks/same_numbers.py compare runs/old runs/new        # exit status 1 when anything differs

The runs (one thread, so that the float summation order is the same): BERT's recipe with NSP and 2
accumulation steps, the budget recipe, ELECTRA, and fine-tuning a classifier with and without checkpoints.
"""

from __future__ import annotations

import json
import os
import sys

RUNS = ("bert", "budget", "electra", "electra/generator", "cls", "cls_ckpt")
TIMES = {"elapsed", "tokens_per_second", "train_seconds", "wall_seconds"}


def run(root: str) -> None:
    os.environ["BERTFORGE_THREADS"] = "1"
    os.environ["BERTFORGE_CACHE"] = os.path.join(root, "cache")
    from bertforge.cli import main
    from bertforge.demo_corpus import write_story_corpus

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
