"""Helpers for tests: the tiny texts, small models built on the spot (nothing downloaded), free ports."""

from __future__ import annotations

import os
import socket
import sys

import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.tokenizer import train_vocabulary


# The tiny corpora the tests share: short sentences (a tokenizer and a classifier's rows), and documents of two
# sentences (pretraining, next-sentence pairs).
SENTENCES = ["the cat sat on the mat.", "a dog ran in the park.", "the bird sang a song.", "good movie", "bad film"] * 4
DOCUMENTS = ["the cat sat on the mat. it was warm there.", "a dog ran in the park. the sun was up.",
             "the bird sang a song. it sang all day long.", "a fish swam in the pond. the water was cold."] * 6


def free_port() -> int:
    """A TCP port free now on this machine (for torchrun's rendezvous: no two tests share a fixed one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int = 2) -> list[str]:
    """The command that starts ``n`` local processes of a module under torchrun, on a free port."""
    return [os.path.join(os.path.dirname(sys.executable), "torchrun"), f"--nproc_per_node={n}", "--master_port",
            str(free_port())]


def tiny_pretrain(data, out, *extra: str, tokenizer=None, length: int = 32, batch: int = 8, steps: int | None = 2,
                  preset: str | None = "tiny", progress: bool = False) -> list[str]:
    """`pretrain` on a tiny BERT for a few steps: the arguments after `bertforge` (a `--quiet` goes before them).

    ``data`` is one path or a list of them; ``extra`` comes last. ``steps=None`` leaves how long it runs to
    ``extra`` (--max-steps, --max-time, --epochs); ``preset=None`` leaves the model to it (--init, --model-config,
    a --config file); ``progress=True`` shows the bar (--progress) instead of log lines (--no-progress)."""
    paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    argv = ["pretrain", "--data", *map(str, paths)]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    argv += ["--out", str(out)]
    if preset is not None:
        argv += ["--preset", preset]
    argv += ["--max-seq-length", str(length), "--batch-size", str(batch)]
    if steps is not None:
        argv += ["--max-steps", str(steps)]
    return [*argv, "--progress" if progress else "--no-progress", *extra]


def tiny_model_dir(path, texts, vocab_size=800, seed=0, kind="wordpiece") -> str:
    """A randomly initialised tiny BERT with a tokenizer trained on ``texts``, saved as a model directory."""
    tok = train_vocabulary(texts, vocab_size, kind=kind, min_frequency=1)
    torch.manual_seed(seed)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=512)
    BertForPreTraining(cfg).save_pretrained(str(path), tokenizer=tok)
    return str(path)


def padded_batch(vocab: int, B: int = 4, T: int = 24, seed: int = 0):
    """(input_ids, attention_mask, token_type_ids) of B sequences of different lengths, two segments each."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    lengths = [T, T - 7, 9, T - 1][:B]
    for i, n in enumerate(lengths):
        am[i, n:] = 0
        ids[i, n:] = 0
    tt = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(lengths):
        tt[i, n // 2 : n] = 1  # two segments
    return ids, am, tt


def same_run(a, b) -> None:
    """Two fine-tuning folders end alike: weights bit for bit, every metrics row (their clocks aside)."""
    import json

    from safetensors.torch import load_file

    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    rows = [[{k: v for k, v in json.loads(x).items() if k != "elapsed"} for x in (o / "metrics.jsonl").read_text()
             .splitlines()] for o in (a, b)]
    assert rows[0] == rows[1]
