"""``bertforge export onnx``: a model folder as an ONNX graph for onnxruntime (fp32, and int8 with ``--int8``).

What is exported is the head the folder holds, asked of the models registry (:func:`~bertforge.models.role_of_config`
by its config.json's ``architectures``; a sentence-transformers folder's encoder), with the interface the
ecosystem reads (Optimum's ONNX configs, sentence-transformers' ONNX backend): the family's inputs
(``input_ids``, ``attention_mask``, and ``token_type_ids`` where the family has token types), batch and sequence
axes dynamic, and the role's outputs by transformers' names (:data:`~bertforge.models.OUTPUTS`).  An embeddings
folder's graph gives ``last_hidden_state``: pooling and normalisation stay in its sentence-transformers modules.

The output is a copy of the model folder (weights, config, tokenizer, sentence-transformers modules, the run's
settings) with ``onnx/model.onnx`` added, and with ``--int8`` ``onnx/model_qint8_avx512_vnni.onnx`` beside it:
onnxruntime's dynamic quantization of the matmuls' weights (int8, per output channel, activations quantized per batch
at run time), what sentence-transformers' ``export_dynamic_quantized_onnx_model`` writes for an AVX-512 VNNI
CPU.  Each graph is checked against the torch model on a batch of mixed lengths; ``--check-data FILE`` also
scores both graphs and the torch model with the task's evaluation on FILE, and refuses an int8 graph that falls
more than :data:`GATE` below the torch model's figure.

The model is traced on its plain path: under :func:`~bertforge.ops.exporting` the fast paths of
:mod:`bertforge.ops` (unpadding, row gathers, custom kernels) step aside, as under ``torch.compile``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import shutil
import time
import warnings
from typing import Any

import torch

from .commands import positive_int
from .embeddings import ST_FILES, read_settings
from .errors import UserError, shown
from .loading import model_dir
from .models import OUTPUTS, family_of_config, load_config, role_of_config
from .outputs import MARKER, MODEL_FILES, Output, register_output
from .runtime import BACKENDS, EXTRA, ONNX_DIR, OnnxModel
from .train.runfolder import SETTINGS_FILES, TASK
from .usage import COMMANDS

log = logging.getLogger("bertforge")

KIND = "export"
SETTINGS_FILE = SETTINGS_FILES["finetune"]  # (a fine-tuning run's settings: evaluate reads its columns from them)
COPIED = (MODEL_FILES - {MARKER}) | ST_FILES | {SETTINGS_FILE, "README.md"}  # (the marker is the export's own)
REPORT = "export.json"
register_output(KIND, COPIED | {ONNX_DIR})

GATE = 0.01  # the most an int8 graph may fall below the torch model: 1 point of a 0-1 metric
TOLERANCE = 1e-4  # the fp32 graph against the torch model (absolute, on every output)
MIN_OPSET = 18  # torch.onnx's exporter writes from this opset on
# ONNX's Attention operator (one fused kernel in onnxruntime, where opset 18 spells attention out in matmuls,
# softmax and masking); onnxruntime runs it from 1.22 on, --opset 18 for older runtimes
OPSET = 23


def onnx_modules():
    """(onnx, onnxruntime), or one error naming the extra."""
    try:
        import onnx
        import onnxruntime
        importlib.import_module("onnxscript")  # (torch.onnx's exporter needs it)
    except ImportError as e:
        raise UserError(f"export onnx needs {e.name}: {EXTRA}") from None
    return onnx, onnxruntime


def exported_head(path: str) -> tuple[type, Any, str, bool]:
    """(model class, config, role, whether it is a sentence-transformers folder) of the head folder ``path`` holds;
    one error when it is not a model folder or holds a head the exporter does not know."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise UserError(f"{path} is not a model folder (no config.json)")
    config = load_config(path)
    fam = family_of_config(config)
    st = read_settings(path) is not None
    role = "encoder" if st else role_of_config(config)
    if role is None:
        named = (config.extra.get("architectures") or ["no class"])[0]
        known = ", ".join(c.__name__ for c in fam.heads.values())
        raise UserError(f"{path} holds {shown(named)} (its config.json says), a head export onnx does not know; it "
                        f"exports {known}")
    if role == "pretraining":  # its masked-LM head (next sentence has no exported head)
        role = "masked_lm"
    return fam.head(role, path), config, role, st


class _Graph(torch.nn.Module):
    """The model with positional inputs and a tuple of the role's outputs: what the exporter traces."""

    def __init__(self, model: torch.nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.model, self.outputs = model, outputs

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        out = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(getattr(out, name) for name in self.outputs)


def example_batch(config: Any, inputs: tuple[str, ...], lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch of random tokens, one sequence of each length ([CLS] ... [SEP] ids not needed: any
    ids of the vocabulary), with a second segment in its second half where the family has token types."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(0, config.vocab_size, (len(lengths), T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    ids = ids * mask
    types = ((torch.arange(T)[None] >= torch.tensor(lengths)[:, None] // 2) & mask.bool()).long()
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {k: batch[k] for k in inputs}


def trace(model: torch.nn.Module, config: Any, inputs: tuple[str, ...], outputs: tuple[str, ...], path: str,
          opset: int = OPSET) -> None:
    """Write ``model``'s graph to ``path``: ``inputs`` with dynamic batch and sequence axes, ``outputs`` named."""
    from .ops import exporting

    longest = config.max_position_embeddings
    batch = example_batch(config, inputs, [min(16, longest), min(9, longest)])  # (sizes 0 and 1 would be fixed)
    B, T = torch.export.Dim("batch"), torch.export.Dim("sequence", min=1, max=longest)
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # (its notes on operators of packages it did not find: not the user's)
    with torch.no_grad(), exporting(), warnings.catch_warnings(), contextlib.ExitStack() as undo:
        undo.callback(quiet.setLevel, level)
        warnings.simplefilter("ignore")  # the exporter's own notes (deprecations, axis names) are not the user's
        torch.onnx.export(_Graph(model, outputs).eval(), tuple(batch.values()), path, input_names=list(inputs),
                          output_names=list(outputs), dynamic_shapes={k: {0: B, 1: T} for k in inputs},
                          opset_version=opset, dynamo=True, external_data=False, verbose=False,
                          report=False, optimize=True)


def max_difference(model: torch.nn.Module, graph: OnnxModel, config: Any, inputs: tuple[str, ...],
                   outputs: tuple[str, ...], lengths: list[int], seed: int = 0) -> float:
    """The largest absolute difference between ``graph``'s outputs and ``model``'s at the real positions of a
    batch of ``lengths`` (padding included)."""
    batch = example_batch(config, inputs, lengths, seed)
    with torch.inference_mode():
        ref = model(**batch)
    got = graph(**batch)
    keep = batch["attention_mask"].bool()
    worst = 0.0
    for name in outputs:
        a, b = getattr(ref, name).float(), getattr(got, name).float()
        if a.dim() >= 2 and a.shape[:2] == keep.shape:  # per token: the real positions only
            a, b = a[keep], b[keep]
        worst = max(worst, float((a - b).abs().max()))
    return worst


def quantize(fp32: str, int8: str) -> None:
    """onnxruntime's dynamic quantization of ``fp32``'s weight matmuls, written to ``int8``: weights int8 per output
    channel, activations uint8 per batch at run time, over the graph onnxruntime's optimizer has simplified (its
    pre-processing).  Per tensor, or with the activation-by-activation matmuls of attention quantized too, the
    embeddings stray far further from fp32's (docs/log/onnx-export.md)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    simplified = int8 + ".pre"
    try:
        quant_pre_process(fp32, simplified, skip_symbolic_shape=True)
        quantize_dynamic(simplified, int8, weight_type=QuantType.QInt8, per_channel=True, reduce_range=False,
                         op_types_to_quantize=["MatMul", "Gemm"], extra_options={"MatMulConstBOnly": True})
    finally:
        if os.path.exists(simplified):
            os.remove(simplified)


def export_onnx(model: str | os.PathLike, out: str | os.PathLike, int8: bool = False, opset: int = OPSET,
                check_data: str | os.PathLike | None = None, task: str | None = None,
                overwrite: bool = False) -> dict:
    """``bertforge export onnx``: the folder ``model`` with its ONNX graph(s), written to ``out``; returns what was
    written and measured (also in ``out/onnx/export.json``)."""
    if task is not None and check_data is None:  # (else it would be taken and do nothing)
        raise UserError(f"--task {task} names the evaluation that --check-data runs: give --check-data FILE too")
    onnx_modules()
    path, out = model_dir(model), os.fspath(out)
    if opset < MIN_OPSET:
        raise UserError(f"--opset {opset}: torch.onnx's exporter writes opset {MIN_OPSET} or later")
    model_class, config, role, st = exported_head(path)
    check = _check_task(path, config, role, task) if check_data is not None else None
    fam = family_of_config(config)
    outputs = OUTPUTS[role]
    output = Output(out, KIND, overwrite, inputs=[path])
    output.check()
    # the torch model's figure first: a --check-data the task cannot read is refused before any work
    scored = {"torch": _score(check, path, os.fspath(check_data))} if check is not None else {}
    torch_model = model_class.from_pretrained(path, config=config).eval()
    report: dict[str, Any] = {"model": path, "head": model_class.__name__, "inputs": list(fam.inputs),
                              "outputs": list(outputs), "sentence_transformers": st}
    with output, output.atomic() as tmp:
        for name in sorted(os.listdir(path)):
            if name in COPIED:  # the files themselves where they are links (a hub cache's snapshot)
                src = os.path.join(path, name)
                (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, os.path.join(tmp, name))
        os.makedirs(os.path.join(tmp, ONNX_DIR))
        fp32 = os.path.join(tmp, ONNX_DIR, BACKENDS["onnx"])
        t0 = time.perf_counter()
        log.info("tracing %s (%s) for onnxruntime", model_class.__name__, ", ".join(outputs))
        trace(torch_model, config, fam.inputs, outputs, fp32, opset)
        report["seconds"] = round(time.perf_counter() - t0, 1)
        report["graphs"] = {"onnx": _checked(torch_model, fp32, config, fam.inputs, outputs, exact=True)}
        if int8:
            q = os.path.join(tmp, ONNX_DIR, BACKENDS["onnx-int8"])
            quantize(fp32, q)
            report["graphs"]["onnx-int8"] = _checked(torch_model, q, config, fam.inputs, outputs, exact=False)
        if check is not None:
            report["check"] = _gate(check, tmp, os.fspath(check_data), scored, int8)
        with open(os.path.join(tmp, ONNX_DIR, REPORT), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return report


def _checked(torch_model, graph_file: str, config, inputs, outputs, exact: bool) -> dict:
    """The graph's file size and its largest difference from the torch model, over a batch of mixed lengths; an
    fp32 graph off by more than :data:`TOLERANCE` is refused (the trace went wrong)."""
    longest = config.max_position_embeddings
    lengths = sorted({1, 7, min(128, longest), min(512, longest), min(longest, 2048)})
    try:
        diff = max_difference(torch_model, OnnxModel(graph_file, config), config, inputs, outputs, lengths)
    except UserError:
        raise
    except Exception as e:  # onnxruntime's own error types: a graph this runtime cannot run
        raise UserError(f"onnxruntime cannot run the exported graph ({str(e).splitlines()[0][:200]}); nothing is "
                        f"written (an older onnxruntime: --opset {MIN_OPSET})") from None
    name = os.path.basename(graph_file)
    log.info("%s: %.1f MB, largest difference from the torch model %.2g (lengths %s)", name,
             os.path.getsize(graph_file) / 1e6, diff, ", ".join(map(str, lengths)))
    if exact and not diff <= TOLERANCE:
        raise UserError(f"the exported graph differs from the torch model by {diff:.3g} (more than {TOLERANCE:g}); "
                        "nothing is written")
    return {"file": f"{ONNX_DIR}/{name}", "megabytes": round(os.path.getsize(graph_file) / 1e6, 2),
            "max_abs_difference": diff, "lengths": lengths}


def _check_task(path: str, config, role: str, task: str | None):
    """The fine-tuning task whose evaluation scores ``--check-data``: ``task`` (an ``evaluate`` name), the run's
    own (its settings file), or the one task that trains the folder's head."""
    from .files import json_object_or_none
    from .tasks import TASKS

    found = {t.evaluate_name: t for t in TASKS.values() if t.evaluate_name}
    if task is not None:
        if task not in found:
            raise UserError(f"unknown --task {shown(task)}; expected one of {', '.join(found)}")
        return found[task]
    ran = (json_object_or_none(os.path.join(path, SETTINGS_FILE)) or {}).get(TASK)
    if isinstance(ran, str) and ran in TASKS and TASKS[ran].evaluate_name:
        return TASKS[ran]
    heads = [t for t in found.values() if t.model_class.role == role and t.holds(config)]
    if len(heads) != 1:
        raise UserError(f"--check-data: which evaluation scores {path}? give --task "
                        f"({', '.join(t.evaluate_name for t in heads) or ', '.join(found)})")
    return heads[0]


def _score(kind, folder: str, data: str, backend: str = "torch") -> float:
    """The task's metric (the one that picks a run's best epoch) of ``folder`` on ``data`` through ``backend``."""
    from .runtime import inference_backend

    with inference_backend(backend):
        res = kind.evaluation()(model=folder, data=data)
    if kind.select not in res:
        raise UserError(f"evaluate {kind.evaluate_name} gives no {kind.select} to check the graphs by")
    log.info("--check-data %s: %s %s %.4f", os.path.basename(data), backend, kind.select, res[kind.select])
    return float(res[kind.select])


def _gate(kind, folder: str, data: str, figures: dict, int8: bool) -> dict:
    """The task's evaluation of ``data`` through each graph beside the torch model's (``figures``); an int8 graph
    more than :data:`GATE` below the torch model on the task's metric is refused."""
    metric = kind.select
    for backend in ("onnx", *(("onnx-int8",) if int8 else ())):
        figures[backend] = _score(kind, folder, data, backend)
    scale = 100.0 if max(abs(v) for v in figures.values()) > 1.0 else 1.0  # (SQuAD's F1 is in points)
    if int8 and figures["torch"] - figures["onnx-int8"] > GATE * scale:
        raise UserError(f"the int8 graph's {metric} on {data} is {figures['onnx-int8']:.4f}, the torch model's "
                        f"{figures['torch']:.4f}: more than {GATE * scale:g} below; nothing is written (export without "
                        "--int8 for the fp32 graph)")
    return {"task": kind.evaluate_name, "data": data, "metric": metric, **figures}


# ------------------------------------------------------------------------------------------------ command line
def add_export_parser(sub) -> None:
    """``bertforge export onnx``'s parser (``sub``: the command line's sub-parsers)."""
    e = sub.add_parser("export", help=COMMANDS["export"])
    es = e.add_subparsers(dest="format", metavar="FORMAT")
    es.required = True
    o = es.add_parser("onnx", help="an ONNX graph of the folder's head, for onnxruntime and sentence-transformers")
    o.add_argument("--model", required=True, help="a model folder: any head bertforge trains, ours or transformers'")
    o.add_argument("--out", required=True, help="a new folder: a copy of the model folder with onnx/ added")
    o.add_argument("--int8", action="store_true", help=f"also {BACKENDS['onnx-int8']}: dynamic int8 quantization")
    o.add_argument("--opset", type=positive_int, default=OPSET,
                   help=f"ONNX opset (at least {MIN_OPSET}: {OPSET}'s Attention operator runs fused in onnxruntime "
                        f"1.22 or later; {MIN_OPSET} for older runtimes)")
    o.add_argument("--check-data", help="score the graphs and the torch model on this file (the task's evaluation "
                                        "format); an int8 graph more than 1 point below is refused")
    o.add_argument("--task", help="the evaluation --check-data runs (default: the folder's own task)")
    o.add_argument("--overwrite", action="store_true", help="replace an earlier export that bertforge wrote")
    o.set_defaults(func=cmd_export)


def cmd_export(a) -> int:
    report = export_onnx(a.model, a.out, a.int8, a.opset, a.check_data, a.task, a.overwrite)
    for backend, g in report["graphs"].items():
        print(f"{g['file']}: {g['megabytes']:.1f} MB, largest difference from the torch model "
              f"{g['max_abs_difference']:.2g}")
    check = report.get("check")
    if check:
        print(f"{check['metric']} on {check['data']}: " + ", ".join(f"{b} {check[b]:.4f}" for b in BACKENDS
                                                                   if b in check))
    return 0
