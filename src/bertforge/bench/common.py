"""What every bench shares: the matmul peak, the batches, the reference step, the alternating rounds and
their medians."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time

import torch

from ..config import ImplConfig, TrainConfig
from ..devices import autocast_context, native_bf16, resolve_device, resolve_precision, setup_backend
from ..errors import UserError
from ..train.engine import Engine, build_optimizer


def matmul_peak(device: torch.device, seconds: float = 0.5, sizes: tuple[int, ...] = (1024, 2048, 4096),
                dtype: torch.dtype = torch.float32) -> float:
    """Matmul throughput (FLOP/s) in ``dtype``: the best of square matmuls of a few sizes, ``seconds`` each."""
    best = 0.0
    if device.type != "cpu":
        sizes = (8192,)
    elif dtype != torch.float32 and not native_bf16():
        sizes = sizes[:1]  # emulated bf16 matmuls (no AVX-512 BF16 or AMX) run at a fraction of fp32's speed
    for i, n in enumerate(sizes):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        if i == 0:  # one warm-up (threads, kernels) serves every size: a CPU's largest product can take seconds
            a @ b
        _sync(device)
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            k += 1
        _sync(device)
        best = max(best, 2 * n**3 * k / (time.perf_counter() - t0))
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def transformers_step(model, optimizer, batch: dict, autocast) -> None:
    """One training step as transformers' Trainer takes it: forward (its loss), backward, clipping at 1.0, AdamW."""
    with autocast:
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def pretraining_batch(B: int, T: int, vocab: int, mask_prob: float = 0.15, seed: int = 0) -> dict:
    """[CLS] A [SEP] B [SEP] of random ordinary tokens (ids 5..vocab), ``mask_prob`` of them masked 80/10/10."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    half = T // 2
    ids[:, 0], ids[:, half], ids[:, -1] = 2, 3, 3
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, half + 1 :] = 1
    special = torch.zeros(B, T, dtype=torch.bool)
    special[:, [0, half, T - 1]] = True
    chosen = (torch.rand(B, T, generator=g) < mask_prob) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    r = torch.rand(B, T, generator=g)
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(ids, 4), ids)
    inputs = torch.where(chosen & (r >= 0.9), torch.randint(5, vocab, (B, T), generator=g), inputs)
    return {"input_ids": inputs, "token_type_ids": tt, "attention_mask": torch.ones(B, T, dtype=torch.long),
            "labels": labels, "next_sentence_label": torch.randint(0, 2, (B,), generator=g)}


def text_batch(text: str, tokenizer: str, B: int, T: int, seed: int = 0) -> tuple[dict, int]:
    """A masked batch of real text, built as ``bertforge pretrain`` builds its batches (sentence pairs, NSP
    labels, 80/10/10 masking; full-length targets), and the tokenizer's vocabulary size."""
    import numpy as np

    from ..data import Masker, MaskingConfig, PretrainingLoader, build_corpus
    from ..tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    corpus = build_corpus([text], tok)
    masker = Masker(tok, MaskingConfig(T, short_seq_prob=0.0))
    loader = PretrainingLoader(corpus, np.arange(corpus.n_documents), masker, B, seed)
    return loader.next_batch(), tok.get_vocab_size(with_added_tokens=True)


def _inference_batches(B: int, vocab: int, data_dir: str | None, n_batches: int) -> tuple[list[dict], str]:
    """Variable-length batches in file order, each padded to its longest sequence."""
    sentences, source = _sst2_sentences(data_dir), "demo corpus sentences"
    if sentences is not None:
        source = "SST-2 dev sentences"
    if sentences is None:
        from ..demo.corpus import generate_stories

        sentences = [" ".join(s[i : i + 2]) for s in generate_stories(400, seed=3) for i in range(0, len(s), 2)]
    from ..tokenizer import train_vocabulary

    tok = train_vocabulary(sentences, min(vocab, 8000), kind="wordpiece")
    encs = tok.encode_batch(sentences[: B * n_batches])
    batches = []
    for i in range(0, len(encs) - B + 1, B):
        chunk = encs[i : i + B]
        T = max(len(e.ids) for e in chunk)
        ids = torch.zeros(B, T, dtype=torch.long)
        am = torch.zeros(B, T, dtype=torch.long)
        for j, e in enumerate(chunk):
            ids[j, : len(e.ids)] = torch.tensor(e.ids)
            am[j, : len(e.ids)] = 1
        batches.append({"input_ids": ids, "attention_mask": am, "token_type_ids": torch.zeros_like(ids)})
    return batches, source


def _sst2_sentences(data_dir: str | None) -> list[str] | None:
    """SST-2's dev sentences under ``data_dir`` (None when they are not there)."""
    sst = os.path.join(data_dir, "sst2", "dev.tsv") if data_dir else ""
    if not os.path.isfile(sst):
        return None
    with open(sst, encoding="utf-8") as f:
        return [line.split("\t")[0] for line in f.read().splitlines()[1:]]


def _import_transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("bertforge bench compares against transformers: pip install 'bertforge[test]'") from None
    return transformers


def _backend(device: str, threads: int | None, precision: str):
    """(settings, device, autocast) of a bench, set up as a run sets them up."""
    impl = ImplConfig(device=device, threads=threads, precision=precision)
    dev = resolve_device(impl)
    setup_backend(dev, impl)
    return impl, dev, autocast_context(dev, impl)


def _transformers_optimizer(model, lr: float, dev: torch.device) -> torch.optim.Optimizer:
    if dev.type == "cuda":  # fused, as ours
        return build_optimizer(model, TrainConfig(lr=lr), dev)
    # torch's default, as transformers' Trainer (adamw_torch) uses it
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)


def _versions(dev: torch.device, transformers) -> str:
    return (f"device {dev}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"transformers {transformers.__version__}")


def _seconds(dev: torch.device, fn) -> float:
    """Wall time of ``fn()``, the device's queue drained before and after."""
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t0


def _rate(dev: torch.device, step, steps: int, tokens: int):
    """A side of :func:`_alternate`: the tokens per second of ``steps`` calls of ``step()``, each of ``tokens``."""
    def run():
        for _ in range(steps):
            step()
    return lambda r: steps * tokens / _seconds(dev, run)


def _alternate(rounds: int, ours, theirs, what: str, out, names: tuple[str, str] = ("bertforge", "transformers"),
               more: dict | None = None) -> list[tuple[float, ...]]:
    """(ours, theirs, *more) tokens per second of each round: ``ours(r)``, ``theirs(r)`` and each of ``more``
    (name -> rate) in turn, round after round, so that drift on a shared machine hits every arm alike."""
    rows, more = [], more or {}
    for r in range(rounds):
        rows.append((ours(r), theirs(r), *(rate(r) for rate in more.values())))
        extra = "".join(f"   {n} {x:8.0f}" for n, x in zip(more, rows[-1][2:]))
        out(f"{what} round {r + 1}: {names[0]} {rows[-1][0]:8.0f} tok/s   {names[1]} {rows[-1][1]:8.0f} tok/s   "
            f"x{rows[-1][0] / rows[-1][1]:.2f}{extra}")
    return rows


def _medians(rows: list[tuple[float, ...]]) -> tuple[float, float, float]:
    """Median tokens per second of bertforge and of transformers, and the median of the per-round speed-ups."""
    return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
            statistics.median(r[0] / r[1] for r in rows))


def fp32_arms(dev: torch.device, impl: ImplConfig) -> bool:
    """Whether a bench also times both tools in fp32: under bf16 on the CPU, where what bf16 buys is the
    question (on GPUs bf16 is the norm)."""
    return dev.type == "cpu" and resolve_precision(dev, impl) == "bf16"


def fp32_engine(engine: Engine, lr: float) -> Engine:
    """``engine``'s objective stepped in fp32, with an optimizer of its own: a bf16 bench's fp32 arm."""
    return Engine(engine.objective, TrainConfig(lr=lr), dataclasses.replace(engine.impl, precision="fp32"),
                  engine.device)


def _fp32_figures(rows: list[tuple[float, ...]], what: str) -> dict:
    """The fp32 arms' medians (rows of bf16 ours, bf16 theirs, fp32 ours, fp32 theirs), and bf16's gains."""
    return {f"fp32_{what}_tokens_per_second": statistics.median(r[2] for r in rows),
            f"transformers_fp32_{what}_tokens_per_second": statistics.median(r[3] for r in rows),
            f"{what}_bf16_speedup_vs_fp32": statistics.median(r[0] / r[2] for r in rows),
            f"{what}_speedup_vs_transformers_fp32": statistics.median(r[0] / r[3] for r in rows)}
