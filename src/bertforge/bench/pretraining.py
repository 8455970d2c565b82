"""``bertforge bench`` (``--task pretrain``): the pretraining step of either family and the encoder's inference
against transformers; ``--compile`` against eager."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from contextlib import nullcontext

import torch

from ..config import ImplConfig, PretrainConfig, TrainConfig
from ..errors import UserError
from ..models import FAMILIES, BertConfig, BertForPreTraining, BertModel, family
from ..models.flops import flops_per_token
from ..objectives import MaskedLM
from ..train.engine import Engine
from .common import (_alternate, _backend, fp32_arms, fp32_engine, _fp32_figures, _import_transformers,
                     _inference_batches, matmul_peak, _medians, pretraining_batch, _rate, text_batch,
                     _transformers_optimizer, transformers_step, _versions)


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
        from ..tokenizer import load_tokenizer, special_ids

        ids = special_ids(load_tokenizer(tokenizer)) if tokenizer else None
        return _masked_lm_bench(family(arch), preset, batch, vocab_size, source, ids, transformers, impl, dev,
                                autocast, steps, rounds, out)
    cfg = BertConfig.preset(preset, vocab_size=vocab_size)
    peak, peak_name, fpt = _announce(cfg, seq_len, dev, autocast, transformers, out,
                                     f"config {preset}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                                     f"vocabulary {vocab_size}; batch {batch_size} x {seq_len} of {source}")

    hf_cfg = transformers.BertConfig(**cfg.to_dict())
    hf_cfg._attn_implementation = "sdpa"
    batch = {k: v.to(dev) for k, v in batch.items()}
    tokens = int(batch["attention_mask"].sum())  # real tokens, as bertforge pretrain counts them
    rows = _pretraining_rounds(cfg, hf_cfg, transformers, batch, tokens, impl, dev, autocast, steps, rounds, out)
    res = {"device": str(dev), "preset": preset, "batch_size": batch_size, "seq_len": seq_len, "batch_source": source,
           "train_padding_fraction": 1 - tokens / batch["attention_mask"].numel(), "vocab_size": vocab_size,
           **_train_figures(rows, peak, peak_name, fpt, dev, impl, out)}
    if compile:
        res.update(_compile_rounds(cfg, batch, tokens, impl, dev, steps, rounds, out))
    if inference:
        res.update(_inference_bench(cfg, hf_cfg, transformers, dev, autocast, batch_size, vocab_size, data_dir,
                                    rounds, out))
    return _said(res, out)


def _train_figures(rows: list, peak: float, peak_name: str, fpt: float, dev: torch.device, impl: ImplConfig,
                   out) -> dict:
    """A pretraining bench's figures of the training step (the medians of its rounds ``rows``, the MFU of each
    side), said in one line."""
    ours, theirs, speedup = _medians(rows)
    res = {"train_tokens_per_second": ours, "transformers_train_tokens_per_second": theirs,
           "train_speedup_vs_transformers": speedup, "train_mfu": ours * fpt / peak,
           "transformers_train_mfu": theirs * fpt / peak, "matmul_peak_gflops": peak / 1e9,
           "matmul_peak_dtype": peak_name, "model_flops_per_token": fpt,
           **(_fp32_figures(rows, "train") if fp32_arms(dev, impl) else {})}
    out(f"train: bertforge {ours:.0f} tok/s (MFU {res['train_mfu']:.1%}), transformers {theirs:.0f} tok/s "
        f"(MFU {res['transformers_train_mfu']:.1%}), median speed-up x{speedup:.2f}")
    return res


def _said(res: dict, out) -> dict:
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


def _announce(cfg, seq_len: int, dev: torch.device, autocast, transformers, out, config: str
              ) -> tuple[float, str, float]:
    """(the matmul peak, its precision's name, model FLOPs per token) of a pretraining bench, said with ``config``
    (what is benched) and the versions."""
    peak, peak_name = _matmul_peak_of_run(dev, autocast)
    fpt = flops_per_token(cfg, seq_len, 0.15)
    out(_versions(dev, transformers))
    out(f"{config}; {fpt / 1e6:.1f} MFLOP/token; {peak_name} matmul peak {peak / 1e9:.0f} GFLOP/s")
    return peak, peak_name, fpt


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
    return _step_rounds(engine, batch, lambda ac: transformers_step(theirs, opt_theirs, theirs_batch, ac), autocast,
                        impl, dev, steps, tokens, rounds, out)


def _step_rounds(engine: Engine, batch: dict, step_theirs, autocast, impl: ImplConfig, dev: torch.device, steps: int,
                 tokens: int, rounds: int, out) -> list[tuple[float, ...]]:
    """(bertforge, transformers) training tokens per second of each round of ``steps`` steps on ``batch``, after a
    warm-up step of each (``step_theirs(autocast)``: the reference's step); under bf16 on the CPU the same models
    stepped in fp32 too (ours with an optimizer of its own)."""
    arms = {"bertforge": lambda: engine.step([batch]), "transformers": lambda: step_theirs(autocast)}
    if fp32_arms(dev, impl):
        engine32 = fp32_engine(engine, 1e-4)
        arms.update({"bertforge fp32": lambda: engine32.step([batch]),
                     "transformers fp32": lambda: step_theirs(nullcontext())})
    for fn in arms.values():  # warm-up
        fn()
    rates = [_rate(dev, fn, steps, tokens) for fn in arms.values()]
    return _alternate(rounds, *rates[:2], "train", out, more=dict(zip(list(arms)[2:], rates[2:])))


def _masked_lm_bench(fam, preset: str, batch: dict, vocab_size: int, source: str, sp, transformers,
                     impl: ImplConfig, dev: torch.device, autocast, steps: int, rounds: int, out) -> dict:
    """``bench --arch`` of a family ``fam`` that pretrains by masked LM alone: our masked-LM step
    (:class:`~bertforge.objectives.MaskedLM`) against transformers' on the same weights and batch, alternating
    rounds; ``sp``: the special ids of the tokenizer of ``--text`` (None: random tokens, :func:`pretraining_batch`'s
    0, 2 and 3)."""
    from ..tokenizer import SpecialIds

    B, T = batch["input_ids"].shape
    cfg = fam.config_class.preset(preset, vocab_size=vocab_size)
    cfg.adopt_special_ids(sp if sp is not None else SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    peak, peak_name, fpt = _announce(cfg, T, dev, autocast, transformers, out,
                                     f"config {preset} ({fam.label}): {cfg.num_hidden_layers} layers, hidden "
                                     f"{cfg.hidden_size}, intermediate {cfg.intermediate_size}, vocabulary "
                                     f"{vocab_size}; batch {B} x {T} of {source}")
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
    rows = _step_rounds(engine, batch, lambda ac: transformers_step(theirs, opt_theirs, theirs_batch, ac), autocast,
                        impl, dev, steps, tokens, rounds, out)
    return _said({"device": str(dev), "arch": fam.name, "preset": preset, "batch_size": B, "seq_len": T,
                  "batch_source": source, "vocab_size": vocab_size, "parameters": ours.num_parameters(),
                  "loss_difference": abs(a - b) / max(1.0, abs(b)),
                  **_train_figures(rows, peak, peak_name, fpt, dev, impl, out)}, out)


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
