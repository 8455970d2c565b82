"""``bertforge bench --backend onnx``: serving through torch fp32 against the exported graphs, fp32 and int8."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from .common import _backend, _sst2_sentences
from .finetuning import _random_model


def _serving_inputs(tok, data_dir: str | None, max_len: int) -> list[tuple[str, str, list[dict]]]:
    """(key, what, features) of the serving bench: single sentences (SST-2 dev, else the demo's) and SQuAD-length
    question-passage pairs (SQuAD dev, else demo paragraphs), cut at ``max_len`` tokens."""
    from ..tokenizer import copy_of

    t = copy_of(tok, max_len)
    sentences = _sst2_sentences(data_dir)
    squad = os.path.join(data_dir, "squad", "dev-v1.1.json") if data_dir else ""
    if sentences is not None and os.path.isfile(squad):
        with open(squad, encoding="utf-8") as f:
            pairs = [(q["question"], p["context"]) for a in json.load(f)["data"] for p in a["paragraphs"]
                     for q in p["qas"]]
        names = ("SST-2 dev sentences", "SQuAD dev question-context pairs")
    else:
        from ..demo.corpus import generate_stories

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

    from ..evaluation import by_length
    from ..export import export_onnx, exported_head
    from ..runtime import BACKENDS, GRAPHS, OnnxModel
    from ..tokenizer import load_tokenizer, special_ids

    _backend("cpu", threads, "fp32")
    res: dict = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        if model is None:
            from ..demo.corpus import generate_stories

            model = os.path.join(tmp, "model")
            _random_model([" ".join(s) for s in generate_stories(300, seed=3)], model, preset, arch,
                          {0: "negative", 1: "positive"})
        export_onnx(model, os.path.join(tmp, "onnx"), int8=True)
        model_class, config, role, _ = exported_head(model)
        models = {"torch": model_class.from_pretrained(model, config=config).eval()}
        models.update({b: OnnxModel(os.path.join(tmp, "onnx", "onnx", BACKENDS[b]), config) for b in GRAPHS})
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
