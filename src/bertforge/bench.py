"""``bertforge bench``: bertforge against transformers on the same config, batch and machine, in one process.

``--task pretrain`` (the default) times pretraining and inference; ``--task classify|squad|embed`` a fine-tuning
step (:func:`run_finetune_bench`; embed's against sentence-transformers' MultipleNegativesRankingLoss step).

Training: a full pretraining step exactly as ``bertforge pretrain`` runs it (:meth:`bertforge.train.engine.Engine.step`
with the masked-LM objective, :class:`bertforge.objectives.MaskedLM`: forward with dropout masks keyed by
sequence on the CPU, backward, clipping, fused AdamW) against ``transformers.BertForPreTraining`` (SDPA
attention, AdamW, clipping) on the same masked batch held in memory: random tokens, or with ``text`` and
``tokenizer`` a batch of real text built as ``bertforge pretrain`` builds it.  transformers' AdamW is torch's
default (foreach) on the CPU, as its Trainer's ``adamw_torch``, and fused on CUDA.  Both run under the same
precision (bf16 autocast on CUDA by default), neither compiled.  The two alternate round by round so that
drift on a shared machine hits both alike; the medians are compared.  Model FLOP utilisation is reported
against the matmul peak that the bench measures on the same device, in the precision of the run (fp32 on the
CPU, bf16 under autocast), so that it reads as a fraction of what the device can do.

Inference: the encoder's forward pass over variable-length batches (SST-2 sentences when the data is at
hand, else the demo corpus' sentences), each batch padded to its longest sentence for both (transformers'
dynamic padding), in eval mode under ``torch.inference_mode()``.

transformers (and sentence-transformers for embed) is needed only by this command (install the ``test`` extra);
nothing else in the package imports it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import time

import torch

from .commands import positive_int
from .config import ImplConfig, PretrainConfig, TrainConfig
from .devices import autocast_context, resolve_device, setup_backend
from .errors import UserError
from .models import FAMILIES, BertConfig, BertForPreTraining, BertModel, family
from .models.flops import flops_per_token
from .objectives import MaskedLM
from .train.engine import Engine, build_optimizer


def matmul_peak(device: torch.device, seconds: float = 0.5, sizes: tuple[int, ...] = (1024, 2048, 4096),
                dtype: torch.dtype = torch.float32) -> float:
    """Matmul throughput (FLOP/s) in ``dtype``: the best of square matmuls of a few sizes, ``seconds`` each."""
    best = 0.0
    if device.type != "cpu":
        sizes = (8192,)
    elif dtype != torch.float32:
        sizes = sizes[:1]  # bf16 matmuls crawl on CPUs without AMX
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        _sync(device)
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or k < 2:
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

    from .data import Masker, MaskingConfig, PretrainingLoader, build_corpus
    from .tokenizer import load_tokenizer

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
        from .demo.corpus import generate_stories

        sentences = [" ".join(s[i : i + 2]) for s in generate_stories(400, seed=3) for i in range(0, len(s), 2)]
    from .tokenizer import train_vocabulary

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


def _alternate(rounds: int, ours, theirs, what: str, out,
               names: tuple[str, str] = ("bertforge", "transformers")) -> list[tuple[float, float]]:
    """(ours, theirs) tokens per second of each round: ``ours(r)`` then ``theirs(r)``, round after round, so
    that drift on a shared machine hits both alike."""
    rows = []
    for r in range(rounds):
        a, b = ours(r), theirs(r)
        rows.append((a, b))
        out(f"{what} round {r + 1}: {names[0]} {a:8.0f} tok/s   {names[1]} {b:8.0f} tok/s   x{a / b:.2f}")
    return rows


def _medians(rows: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median tokens per second of bertforge and of transformers, and the median of the per-round speed-ups."""
    return (statistics.median(a for a, _ in rows), statistics.median(b for _, b in rows),
            statistics.median(a / b for a, b in rows))


# ------------------------------------------------------------------------------------------------ pretraining
def run_bench(preset: str = "mini", batch_size: int = 32, seq_len: int = 128, steps: int = 3, rounds: int = 7,
              vocab_size: int | None = None, device: str = "auto", data_dir: str | None = None, inference: bool = True,
              threads: int | None = None, out=print, text: str | None = None, tokenizer: str | None = None,
              precision: str = "auto", compile: bool = False, arch: str = "bert") -> dict:  # noqa: A002
    """Alternate bertforge and transformers; print per-round figures and return the medians.  With
    ``compile``, also alternate the pretraining step compiled (``--compile``) and eager.  ``arch``: the model
    family; one that pretrains by masked LM alone times that step against transformers' class of the same name
    (with ``sparse_prediction``: the head on the masked tokens only, as ours), training only."""
    if (text is None) != (tokenizer is None):
        raise UserError("--text and --tokenizer go together")
    if arch not in FAMILIES:
        raise UserError(f"--arch must be {' or '.join(FAMILIES)}, not {arch!r}")
    transformers = _import_transformers()
    impl, dev, autocast = _backend(device, threads, precision)
    batch, vocab_size, source = _training_batch(text, tokenizer, batch_size, seq_len, vocab_size)
    if not family(arch).next_sentence:
        if compile:
            raise UserError(f"bench --arch {arch} times the eager step; --compile is BERT's here")
        from .tokenizer import load_tokenizer, special_ids

        ids = special_ids(load_tokenizer(tokenizer)) if tokenizer else None
        return _masked_lm_bench(family(arch), preset, batch, vocab_size, source, ids, transformers, impl, dev,
                                autocast, steps, rounds, out)
    cfg = BertConfig.preset(preset, vocab_size=vocab_size)
    peak, peak_name = _matmul_peak_of_run(dev, autocast)
    fpt = flops_per_token(cfg, seq_len, 0.15)
    out(_versions(dev, transformers))
    out(f"config {preset}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocabulary {vocab_size}; "
        f"batch {batch_size} x {seq_len} of {source}; {fpt / 1e6:.1f} MFLOP/token; "
        f"{peak_name} matmul peak {peak / 1e9:.0f} GFLOP/s")

    hf_cfg = transformers.BertConfig(**cfg.to_dict())
    hf_cfg._attn_implementation = "sdpa"
    batch = {k: v.to(dev) for k, v in batch.items()}
    tokens = int(batch["attention_mask"].sum())  # real tokens, as bertforge pretrain counts them
    rows = _pretraining_rounds(cfg, hf_cfg, transformers, batch, tokens, impl, dev, autocast, steps, rounds, out)
    ours_tps, theirs_tps, speedup = _medians(rows)
    res = {
        "device": str(dev), "preset": preset, "batch_size": batch_size, "seq_len": seq_len, "batch_source": source,
        "train_padding_fraction": 1 - tokens / batch["attention_mask"].numel(), "vocab_size": vocab_size,
        "train_tokens_per_second": ours_tps, "transformers_train_tokens_per_second": theirs_tps,
        "train_speedup_vs_transformers": speedup,
        "train_mfu": ours_tps * fpt / peak, "transformers_train_mfu": theirs_tps * fpt / peak,
        "matmul_peak_gflops": peak / 1e9, "matmul_peak_dtype": peak_name, "model_flops_per_token": fpt,
    }
    out(f"train: bertforge {ours_tps:.0f} tok/s (MFU {res['train_mfu']:.1%}), transformers {theirs_tps:.0f} tok/s "
        f"(MFU {res['transformers_train_mfu']:.1%}), median speed-up x{res['train_speedup_vs_transformers']:.2f}")
    if compile:
        res.update(_compile_rounds(cfg, batch, tokens, impl, dev, steps, rounds, out))
    if inference:
        res.update(_inference_bench(cfg, hf_cfg, transformers, dev, autocast, batch_size, vocab_size, data_dir,
                                    rounds, out))
    out(json.dumps(res))
    out(f"train_speedup_vs_transformers={res['train_speedup_vs_transformers']:.2f}")
    return res


def _training_batch(text: str | None, tokenizer: str | None, batch_size: int, seq_len: int,
                    vocab_size: int | None) -> tuple[dict, int, str]:
    """(batch with the keys of keyed dropout, vocabulary size, what the batch holds)."""
    if text:
        batch, n_vocab = text_batch(text, tokenizer, batch_size, seq_len)
        if vocab_size is not None and vocab_size != n_vocab:
            raise UserError(f"--vocab-size {vocab_size} is not the tokenizer's {n_vocab} tokens")
        vocab_size, source = n_vocab, f"text of {os.path.basename(text)}"
    else:
        vocab_size = vocab_size or 30522
        batch, source = pretraining_batch(batch_size, seq_len, vocab_size), "random tokens"
    batch["sequence_ids"] = torch.arange(batch_size)  # the keys of keyed dropout, as in pretraining
    return batch, vocab_size, source


def _matmul_peak_of_run(dev: torch.device, autocast) -> tuple[float, str]:
    """(matmul FLOP/s, precision name) in the precision the run computes in: MFU is measured against it."""
    peak_dtype = getattr(autocast, "fast_dtype", torch.float32)
    peak_name = {torch.float32: "tf32" if dev.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32",
                 torch.bfloat16: "bf16", torch.float16: "fp16"}[peak_dtype]
    return matmul_peak(dev, dtype=peak_dtype), peak_name


def _pretraining_rounds(cfg: BertConfig, hf_cfg, transformers, batch: dict, tokens: int, impl: ImplConfig,
                        dev: torch.device, autocast, steps: int, rounds: int, out) -> list[tuple[float, float]]:
    """(bertforge, transformers) training tokens per second of each round of ``steps`` steps on the same batch,
    after a warm-up step of each."""
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg).to(dev).train()
    engine = Engine(MaskedLM(ours, PretrainConfig()), TrainConfig(lr=1e-4), impl, dev)  # seed 0
    theirs = transformers.BertForPreTraining(hf_cfg).to(dev).train()
    opt_theirs = _transformers_optimizer(theirs, 1e-4, dev)
    theirs_batch = {k: v for k, v in batch.items() if k != "sequence_ids"}

    def step_ours():
        engine.step([batch])

    def step_theirs():
        transformers_step(theirs, opt_theirs, theirs_batch, autocast)

    for fn in (step_ours, step_theirs):  # warm-up
        fn()
    return _alternate(rounds, *(_rate(dev, fn, steps, tokens) for fn in (step_ours, step_theirs)), "train", out)


def _masked_lm_bench(fam, preset: str, batch: dict, vocab_size: int, source: str, sp, transformers,
                     impl: ImplConfig, dev: torch.device, autocast, steps: int, rounds: int, out) -> dict:
    """``bench --arch`` of a family ``fam`` that pretrains by masked LM alone: our masked-LM step
    (:class:`~bertforge.objectives.MaskedLM`) against transformers' on the same weights and batch, alternating
    rounds; ``sp``: the special ids of the tokenizer of ``--text`` (None: random tokens, :func:`pretraining_batch`'s
    0, 2 and 3)."""
    from .tokenizer import SpecialIds

    B, T = batch["input_ids"].shape
    cfg = fam.config_class.preset(preset, vocab_size=vocab_size)
    cfg.adopt_special_ids(sp if sp is not None else SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    peak, peak_name = _matmul_peak_of_run(dev, autocast)
    fpt = flops_per_token(cfg, T, 0.15)
    out(_versions(dev, transformers))
    out(f"config {preset} ({fam.label}): {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, intermediate "
        f"{cfg.intermediate_size}, vocabulary {vocab_size}; batch {B} x {T} of {source}; {fpt / 1e6:.1f} "
        f"MFLOP/token; {peak_name} matmul peak {peak / 1e9:.0f} GFLOP/s")
    torch.manual_seed(0)
    ours = fam.head("masked_lm")(cfg).to(dev).train()
    run = PretrainConfig()
    run.model.arch, run.data.nsp = fam.name, False
    engine = Engine(MaskedLM(ours, run), TrainConfig(lr=1e-4), impl, dev)
    hf_cfg = getattr(transformers, type(cfg).__name__).from_dict({**cfg.to_dict(), "sparse_prediction": True})
    hf_cfg._attn_implementation = "sdpa"
    theirs = getattr(transformers, type(ours).__name__)(hf_cfg).to(dev)
    theirs.load_state_dict(ours.state_dict())
    theirs.train()
    opt_theirs = _transformers_optimizer(theirs, 1e-4, dev)
    batch = {k: v.to(dev) for k, v in batch.items()}
    theirs_batch = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
    with torch.no_grad():  # the same loss from the same weights before any step
        a = float(ours.masked_lm_loss(batch["input_ids"], batch["attention_mask"], batch["labels"]))
        b = float(theirs(**theirs_batch).loss) * int((batch["labels"] != -100).sum())
    tokens = int(batch["attention_mask"].sum())
    rates = [_rate(dev, fn, steps, tokens) for fn in (lambda: engine.step([batch]),
                                                      lambda: transformers_step(theirs, opt_theirs, theirs_batch,
                                                                                autocast))]
    for rate in rates:  # warm-up
        rate(1)
    rows = _alternate(rounds, *rates, "train", out)
    ours_tps, theirs_tps, speedup = _medians(rows)
    res = {"device": str(dev), "arch": fam.name, "preset": preset, "batch_size": B, "seq_len": T,
           "batch_source": source, "vocab_size": vocab_size, "parameters": ours.num_parameters(),
           "loss_difference": abs(a - b) / max(1.0, abs(b)), "train_tokens_per_second": ours_tps,
           "transformers_train_tokens_per_second": theirs_tps, "train_speedup_vs_transformers": speedup,
           "train_mfu": ours_tps * fpt / peak, "transformers_train_mfu": theirs_tps * fpt / peak,
           "matmul_peak_gflops": peak / 1e9, "matmul_peak_dtype": peak_name, "model_flops_per_token": fpt}
    out(f"train: bertforge {ours_tps:.0f} tok/s (MFU {res['train_mfu']:.1%}), transformers {theirs_tps:.0f} tok/s "
        f"(MFU {res['transformers_train_mfu']:.1%}), median speed-up x{speedup:.2f}")
    out(json.dumps(res))
    out(f"train_speedup_vs_transformers={speedup:.2f}")
    return res


def _compile_rounds(cfg: BertConfig, batch: dict, tokens: int, impl: ImplConfig, dev: torch.device, steps: int,
                    rounds: int, out) -> dict:
    """The pretraining step under ``torch.compile`` against the same step eager, alternating: what
    ``--compile`` buys on this device (it stays off by default unless it pays)."""
    engines = []
    for compiled in (True, False):
        torch.manual_seed(0)
        model = BertForPreTraining(cfg).to(dev).train()
        run_impl = dataclasses.replace(impl, compile=compiled)
        engines.append(Engine(MaskedLM(model, PretrainConfig()), TrainConfig(lr=1e-4), run_impl, dev))

    t0 = time.perf_counter()
    for _ in range(2):  # the compilation, and the recompilation once the step number is seen to vary
        engines[0].step([batch])
    compile_seconds = time.perf_counter() - t0
    engines[1].step([batch])
    rates = [_rate(dev, functools.partial(engine.step, [batch]), steps, tokens) for engine in engines]
    rows = _alternate(rounds, *rates, "compile", out, ("compiled", "eager"))
    compiled_tps, eager_tps, speedup = _medians(rows)
    out(f"compile: compiled {compiled_tps:.0f} tok/s, eager {eager_tps:.0f} tok/s, median speed-up x{speedup:.2f} "
        f"(the first two compiled steps took {compile_seconds:.0f} s)")
    return {"compiled_train_tokens_per_second": compiled_tps, "eager_train_tokens_per_second": eager_tps,
            "compiled_speedup_vs_eager": speedup, "compile_seconds": compile_seconds}


def _inference_bench(cfg: BertConfig, hf_cfg, transformers, dev: torch.device, autocast, batch_size: int,
                     vocab_size: int, data_dir: str | None, rounds: int, out) -> dict:
    """The encoders' forward pass over the same variable-length batches, in eval mode under
    ``torch.inference_mode()``, alternating round by round; the results' inference entries."""
    batches, source = _inference_batches(batch_size, vocab_size, data_dir, n_batches=24)
    enc_ours = BertModel(cfg).to(dev).eval()
    enc_theirs = transformers.BertModel(hf_cfg).to(dev).eval()
    batches = [{k: v.to(dev) for k, v in b.items()} for b in batches]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)

    def infer(model, hf: bool):
        def run():
            with torch.inference_mode(), autocast:
                for b in batches:
                    model(**b) if hf else model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        return run

    fo, ft = infer(enc_ours, False), infer(enc_theirs, True)
    fo(), ft()
    rows = _alternate(rounds, _rate(dev, fo, 1, real), _rate(dev, ft, 1, real), "inference", out)
    ours_tps, theirs_tps, speedup = _medians(rows)
    res = {
        "inference_source": source, "inference_padding_fraction": 1 - real / padded,
        "inference_tokens_per_second": ours_tps, "transformers_inference_tokens_per_second": theirs_tps,
        "inference_speedup_vs_transformers": speedup,
    }
    out(f"inference ({source}, {len(batches)} batches of {batch_size}, {res['inference_padding_fraction']:.0%} "
        f"padding): bertforge {ours_tps:.0f} tok/s, transformers {theirs_tps:.0f} tok/s, "
        f"median speed-up x{speedup:.2f}")
    return res


# ------------------------------------------------------------------------------------------------ fine-tuning
def _finetune_data(task: str, data_dir: str | None, train: str | None, tmp: str) -> tuple[str, str]:
    """(training file, validation file) of the fine-tuning bench: ``train``, else the task's files under
    ``data_dir`` (its ``bench_files``), else (classification only) the demo's sentiment sentences."""
    from .tasks import TASKS

    if train:
        return train, train
    wanted, validation = TASKS[task].bench_files
    if data_dir and os.path.isfile(os.path.join(data_dir, wanted)):
        return os.path.join(data_dir, wanted), os.path.join(data_dir, validation)
    found = TASKS[task].bench_default_data(tmp)
    if found is not None:
        return found
    raise UserError(f"bench --task {task} needs --train FILE or --data-dir (holding {wanted})")


def run_finetune_bench(task: str, model: str | None = None, preset: str = "mini", batch_size: int = 32,
                       seq_len: int | None = None, steps: int = 3, rounds: int = 7, device: str = "auto",
                       data_dir: str | None = None, train: str | None = None, n_batches: int = 16,
                       group_by_length: bool = False, threads: int | None = None, precision: str = "auto",
                       arch: str = "bert", out=print) -> dict:
    """A real fine-tuning step of ``bertforge finetune TASK`` (its batches, loss and :class:`Engine` step) against
    transformers' class of the same name (of the folder's model family, or of ``arch``'s for a random preset;
    SDPA attention, AdamW, clipping) on the
    same model weights and the same variable-length batches (each padded to its longest example, as both
    tools' dynamic padding; ``group_by_length`` sorts them by length first, as the Trainer's option), in one
    process, alternating round by round; the medians of real tokens per second are compared."""
    import tempfile

    from .tasks import TASKS

    transformers = _import_transformers()
    if task not in TASKS:
        raise UserError(f"bench --task must be pretrain, {' or '.join(TASKS)}, not {task!r}")
    seq_len = seq_len or TASKS[task].config().data.max_seq_length
    impl, dev, autocast = _backend(device, threads, precision)
    kind = TASKS[task]
    with tempfile.TemporaryDirectory() as tmp:
        train_file, val_file = _finetune_data(task, data_dir, train, tmp)
        cfg = kind.config(model=model or os.path.join(tmp, "model"), train_file=train_file, validation_file=val_file,
                          out=os.path.join(tmp, "out"), max_seq_length=seq_len, batch_size=batch_size,
                          max_train_examples=batch_size * n_batches)
        t, ours, theirs, config, batches = _finetune_setup(kind, cfg, transformers, tmp,
                                                           preset if model is None else None, arch, batch_size,
                                                           n_batches, group_by_length, dev)
    ours = ours.to(dev).train()
    engine = Engine(t.objective(ours, 0, 1), TrainConfig(lr=5e-5), impl, dev)
    opt_theirs = _transformers_optimizer(theirs, 5e-5, dev)
    masks = [[b[k] for k in ("attention_mask", "positive_attention_mask", "negative_attention_mask") if k in b]
             for b in batches]  # (embed: the queries' and the passages')
    real = [sum(int(m.sum()) for m in ms) for ms in masks]
    padded = sum(m.numel() for ms in masks for m in ms)
    out(_versions(dev, transformers))
    out(f"fine-tuning {task}: {model or preset} ({type(ours).__name__}, {config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}), "
        f"{len(batches)} batches of {batch_size} from {os.path.basename(train_file)} (up to {seq_len} tokens, "
        f"{1 - sum(real) / padded:.0%} padding{', grouped by length' if group_by_length else ''})")
    logit_diff = _logit_difference(t, ours, theirs, batches[0])
    rows = _finetune_rounds(engine, t.bench_step(theirs), opt_theirs, batches, real, batch_size, dev, autocast, steps,
                            rounds, out)
    ours_tps, theirs_tps, speedup = _medians(rows)
    res = {"device": str(dev), "task": task, "model": model or preset, "batch_size": batch_size,
           "max_seq_length": seq_len, "batches": len(batches), "padding_fraction": 1 - sum(real) / padded,
           "group_by_length": group_by_length, "max_logit_difference": logit_diff,
           "finetune_tokens_per_second": ours_tps, "transformers_finetune_tokens_per_second": theirs_tps,
           "finetune_speedup_vs_transformers": speedup}
    out(json.dumps(res))
    out(f"finetune_speedup_vs_transformers={res['finetune_speedup_vs_transformers']:.2f}")
    return res


def _finetune_setup(kind, cfg, transformers, tmp: str, random_preset: str | None, arch: str, batch_size: int,
                    n_batches: int, group_by_length: bool, dev: torch.device):
    """(the task, our model, the reference model with the same weights (:meth:`FinetuneTask.bench_reference`), the
    model's config, the batches on ``dev``) of the task ``kind`` as ``bertforge finetune`` reads and encodes it;
    with ``random_preset``, the model is that preset of family ``arch``, randomly initialised, written to
    ``cfg.model`` first."""
    from .models import for_folder
    from .tokenizer import load_tokenizer

    t = kind(kind.settings_class())
    t.read(cfg)
    if random_preset is not None:
        _random_model(t.texts(), cfg.model, random_preset, arch)
    tok = load_tokenizer(cfg.model)
    model_class, config = for_folder(cfg.model, kind.model_class)
    reinit = t.configure(config)
    batches = _finetune_batches(t, tok, cfg, batch_size, n_batches, group_by_length, dev)
    torch.manual_seed(0)
    ours = model_class.from_pretrained(cfg.model, config=config, reinit_head=reinit)
    same = os.path.join(tmp, "same")
    ours.save_pretrained(same, tokenizer=tok)  # the same weights for transformers
    t.write_model(same, config)
    return t, ours, t.bench_reference(same, model_class, transformers, dev), config, batches


def _random_model(texts: list[str], folder: str, preset: str, arch: str, labels: dict[int, str] | None = None
                  ) -> None:
    """A randomly initialised ``preset`` of family ``arch`` with a WordPiece vocabulary of ``texts``, saved to
    ``folder``: its pretraining head, or with ``labels`` a sequence classifier of them."""
    from .tokenizer import save_tokenizer, special_ids, train_vocabulary

    tok = train_vocabulary(texts, 8000, kind="wordpiece")
    save_tokenizer(tok, folder)
    torch.manual_seed(0)
    fam = family(arch)
    config = fam.config_class.preset(preset, vocab_size=tok.get_vocab_size())
    config.adopt_special_ids(special_ids(tok))
    if labels:
        config.id2label = labels
    role = "sequence_classification" if labels else "pretraining" if fam.next_sentence else "masked_lm"
    fam.head(role)(config).save_pretrained(folder, tokenizer=tok)


def _finetune_batches(t, tok, cfg, batch_size: int, n_batches: int, group_by_length: bool,
                      dev: torch.device) -> list[dict]:
    """Up to ``n_batches`` full batches of the task's training features, collated as fine-tuning collates
    them."""
    from .batching import group_by_length as group_by_length_order
    from .batching import to_device

    features, collate = t.encode(tok, cfg)
    features = features[: batch_size * n_batches]
    if group_by_length:  # fine-tuning's own grouping; the bench's few batches make one group: sorted, longest first
        order = group_by_length_order(list(range(len(features))), [len(f["input_ids"]) for f in features],
                                      batch_size)
        features = [features[i] for i in order]
    batches = [to_device(collate(features[i : i + batch_size]), dev)
               for i in range(0, len(features) - batch_size + 1, batch_size)]
    if not batches:
        raise UserError(f"fewer than {batch_size} training examples for one batch")
    return batches


def _logit_difference(t, ours, theirs, batch: dict) -> float:
    """The largest difference of the two models' outputs on ``batch`` (:meth:`FinetuneTask.reference_difference`):
    the same model on the same batch, so they agree."""
    with torch.no_grad():
        ours.eval(), theirs.eval()
        b = {k: v for k, v in batch.items() if k in ("input_ids", "token_type_ids", "attention_mask")}
        diff = t.reference_difference(ours, theirs, b)
        ours.train(), theirs.train()
    return diff


def _finetune_rounds(engine: Engine, theirs, opt_theirs, batches: list[dict], real: list[int], batch_size: int,
                     dev: torch.device, autocast, steps: int, rounds: int, out) -> list[tuple[float, float]]:
    """(bertforge, transformers) real tokens per second of each round of ``steps`` steps (round r takes the
    batches after round r - 1's, cycling), after a warm-up step of each."""
    ids = torch.arange(batch_size, device=dev)  # the keys of keyed dropout, as in fine-tuning

    def step_ours(b):
        engine.step([{**b, "sequence_ids": ids}])

    def step_theirs(b):
        transformers_step(theirs, opt_theirs, {k: v for k, v in b.items() if k != "sequence_ids"}, autocast)

    def timed(step):
        def rate(r: int) -> float:
            picks = [(r * steps + k) % len(batches) for k in range(steps)]

            def run():
                for i in picks:
                    step(batches[i])
            return sum(real[i] for i in picks) / _seconds(dev, run)
        return rate

    step_ours(batches[0]), step_theirs(batches[0])  # warm-up
    return _alternate(rounds, timed(step_ours), timed(step_theirs), "fine-tuning", out)


__all__ = ["run_bench", "run_finetune_bench", "matmul_peak", "pretraining_batch", "text_batch"]


# ------------------------------------------------------------------------------------------------ the command
# ------------------------------------------------------------------------------------------------ serving
def _serving_inputs(tok, data_dir: str | None, max_len: int) -> list[tuple[str, str, list[dict]]]:
    """(key, what, features) of the serving bench: single sentences (SST-2 dev, else the demo's) and SQuAD-length
    question-passage pairs (SQuAD dev, else demo paragraphs), cut at ``max_len`` tokens."""
    from tokenizers import Tokenizer

    t = Tokenizer.from_str(tok.to_str())
    t.enable_truncation(max_len, strategy="longest_first")
    sentences = _sst2_sentences(data_dir)
    squad = os.path.join(data_dir, "squad", "dev-v1.1.json") if data_dir else ""
    if sentences is not None and os.path.isfile(squad):
        with open(squad, encoding="utf-8") as f:
            pairs = [(q["question"], p["context"]) for a in json.load(f)["data"] for p in a["paragraphs"]
                     for q in p["qas"]]
        names = ("SST-2 dev sentences", "SQuAD dev question-context pairs")
    else:
        from .demo.corpus import generate_stories

        stories = [" ".join(s) for s in generate_stories(300, seed=3)]
        sentences, pairs = stories, [(s[:40], s) for s in stories]
        names = ("demo sentences", "demo question-passage pairs")
    rows = [t.encode_batch(sentences[:256]), t.encode_batch(pairs[:256])]
    return [(key, n, [{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in encs])
            for key, n, encs in zip(("sentences", "pairs"), names, rows)]


def run_onnx_bench(model: str | None = None, preset: str = "mini", arch: str = "bert", rounds: int = 3,
                   data_dir: str | None = None, threads: int | None = None, out=print,
                   texts: tuple[int, int] = (64, 256)) -> dict:
    """Inference of the same inputs through bertforge's torch model (fp32) and its ONNX graphs (fp32 and int8,
    ``bertforge export onnx --int8``) run by onnxruntime, at batch 1 and 32, through the one inference loop of
    evaluate and predict (:func:`~bertforge.evaluation.by_length`), rounds alternating; medians of real tokens
    per second.  ``model``: any model folder (default: a random ``preset`` of ``arch``, as a classifier);
    ``texts``: how many texts each batch size runs."""
    import tempfile

    from .evaluation import by_length
    from .export import export_onnx, exported_head
    from .runtime import BACKENDS, OnnxModel
    from .tokenizer import load_tokenizer, special_ids

    _backend("cpu", threads, "fp32")
    res: dict = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:
            from .demo.corpus import generate_stories

            model = os.path.join(tmp, "model")
            _random_model([" ".join(s) for s in generate_stories(300, seed=3)], model, preset, arch,
                          {0: "negative", 1: "positive"})
        export_onnx(model, os.path.join(tmp, "onnx"), int8=True)
        model_class, config, role, _ = exported_head(model)
        models = {"torch": model_class.from_pretrained(model, config=config).eval()}
        models.update({b: OnnxModel(os.path.join(tmp, "onnx", "onnx", BACKENDS[b]), config) for b in BACKENDS
                       if b != "torch"})
        tok = load_tokenizer(model)
        pad = special_ids(tok).pad
        out(f"serving {model_class.__name__} ({config.num_hidden_layers} layers, hidden {config.hidden_size}), "
            f"{res['threads']} threads, torch {torch.__version__}")
        def nothing(out, batch):  # (the outputs are not read: the forward passes are timed)
            return [None] * len(batch["input_ids"])

        for key, what, feats in _serving_inputs(tok, data_dir, min(384, config.max_position_embeddings)):
            for B, n in zip((1, 32), texts):
                rows = feats[:n]
                real = sum(len(f["input_ids"]) for f in rows)
                speeds: dict[str, list[float]] = {b: [] for b in models}
                for r in range(rounds + 1):  # the first round warms up, untimed
                    for b, m in models.items():
                        t0 = time.perf_counter()
                        by_length(m, rows, pad, torch.device("cpu"), B, nothing)
                        if r:
                            speeds[b].append(real / (time.perf_counter() - t0))
                med = {b: statistics.median(v) for b, v in speeds.items()}
                res[f"{key}_batch{B}"] = {**{f"{b}_tokens_per_second": round(v) for b, v in med.items()},
                            **{f"{b}_vs_torch": round(med[b] / med["torch"], 2) for b in med if b != "torch"},
                            "texts": len(rows), "mean_tokens": round(real / len(rows), 1)}
                out(f"{what}, batch {B} ({len(rows)} texts, {real / len(rows):.0f} tokens each): "
                    + "   ".join(f"{b} {v:8.0f} tok/s" for b, v in med.items())
                    + f"   onnx x{med['onnx'] / med['torch']:.2f}, onnx-int8 x{med['onnx-int8'] / med['torch']:.2f}")
    out(json.dumps(res))
    return res


def add_bench_parser(sub) -> None:
    """``bertforge bench``'s parser (``sub``: the command line's sub-parsers)."""
    from .tasks import TASKS

    b = sub.add_parser("bench", help="pretraining, inference or fine-tuning speed against transformers, side by side")
    b.add_argument("--task", default="pretrain", choices=("pretrain", *TASKS),
                   help="pretrain (training step and inference), or a fine-tuning task's step (against its "
                        "reference library: transformers, or sentence-transformers for embeddings)")
    b.add_argument("--preset", default="mini")
    b.add_argument("--arch", choices=tuple(FAMILIES),
                   help="the model family of the random --preset model (default: bert; pretrain with a family "
                        "without next sentence prediction: its masked-LM step, training only)")
    b.add_argument("--model",
                   help="fine-tuning tasks: a model directory of any family to fine-tune (default: a random --preset "
                        "model of --arch)")
    b.add_argument("--train", help="fine-tuning tasks: the training file (default: SST-2, SQuAD train-8k or WNUT-16 "
                                   "under --data-dir)")
    b.add_argument("--group-by-length", action="store_true", help="fine-tuning tasks: batches of similar lengths")
    b.add_argument("--batch-size", type=positive_int, default=32)
    b.add_argument("--seq-len", type=positive_int, help="default: 128, or the task's length")
    b.add_argument("--steps", type=positive_int, default=3, help="training steps per timed round")
    b.add_argument("--rounds", type=positive_int, help="alternating rounds (the median is reported; default 7, with "
                                                        "--backend onnx 3)")
    b.add_argument("--vocab-size", type=positive_int, help="default: the tokenizer's with --tokenizer, else 30522")
    b.add_argument("--device", default="auto")
    b.add_argument("--precision", default="auto", help="auto (bf16 autocast on CUDA, fp32 on CPU), fp32, bf16")
    b.add_argument("--text",
                   help="build the training batch from this corpus file (with --tokenizer) instead of random tokens")
    b.add_argument("--tokenizer", help="tokenizer or model directory, or vocab.txt, for --text")
    b.add_argument("--threads", type=positive_int)
    b.add_argument("--data-dir", default=os.environ.get("BERTFORGE_DATA"), help="for SST-2 sentences (inference)")
    b.add_argument("--no-inference", dest="inference", action="store_false")
    b.add_argument("--backend", choices=("torch", "onnx"), default="torch",
                   help="onnx: inference of --model (or a random --preset classifier) through torch fp32 against its "
                        "ONNX graphs, fp32 and int8, at batch 1 and 32 (needs the onnx extra)")
    b.add_argument("--compile", action="store_true",
                   help="also time the pretraining step under torch.compile against the same step eager")
    b.set_defaults(func=cmd_bench)


def cmd_bench(a) -> int:
    if a.backend == "onnx":
        run_onnx_bench(a.model, a.preset, a.arch or "bert", a.rounds or 3, a.data_dir, a.threads,
                       out=lambda line: print(line, flush=True))
        return 0
    a.rounds = a.rounds or 7
    if a.task != "pretrain":
        if a.arch is not None and a.model:
            raise UserError("bench --arch names the family of a random --preset model; --model's family is read "
                            "from its config.json")
        run_finetune_bench(a.task, a.model, a.preset, a.batch_size, a.seq_len, a.steps, a.rounds, a.device, a.data_dir,
                           a.train, group_by_length=a.group_by_length, threads=a.threads, precision=a.precision,
                           arch=a.arch or "bert", out=lambda line: print(line, flush=True))
        return 0
    run_bench(a.preset, a.batch_size, a.seq_len or 128, a.steps, a.rounds, a.vocab_size, a.device, a.data_dir,
              a.inference, a.threads, out=lambda line: print(line, flush=True), text=a.text, tokenizer=a.tokenizer,
              precision=a.precision, compile=a.compile, arch=a.arch or "bert")
    return 0
