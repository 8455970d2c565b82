"""Where inference runs: PyTorch (the default, fp32; ``torch-bf16``: its matmuls in bf16 under autocast, on a
CPU that has native bf16 or a GPU) or onnxruntime over a graph ``bertforge export onnx`` wrote.

An exported folder keeps the model folder's files (config, tokenizer, sentence-transformers modules) and adds
``onnx/model.onnx`` (fp32) and, exported with ``--int8``, ``onnx/model_qint8_avx512_vnni.onnx`` (the name
sentence-transformers gives a dynamically quantized graph).  :class:`OnnxModel` stands in for the torch model
wherever inference calls one (:func:`bertforge.evaluation.by_length`): same inputs, outputs under the same
names, so that every task's pre- and post-processing is the one the torch path runs.

The backend is chosen per call (``pipeline(..., backend="onnx")``) or for a whole command
(:func:`inference_backend`, what ``--backend`` sets), and read where a folder is loaded
(:func:`bertforge.loading.load_for_inference`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

from .errors import UserError, shown

# backend -> the graph it runs, in the folder's onnx/ (None: the torch model)
BACKENDS: dict[str, str | None] = {"torch": None, "torch-bf16": None, "onnx": "model.onnx",
                                   "onnx-int8": "model_qint8_avx512_vnni.onnx"}
GRAPHS = tuple(b for b, graph in BACKENDS.items() if graph is not None)
ONNX_DIR = "onnx"
EXTRA = "pip install 'bertforge[onnx]'"

_backend: contextvars.ContextVar[str] = contextvars.ContextVar("bertforge_backend", default="torch")


def checked_backend(name: Any) -> str:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {shown(name)}; expected one of {', '.join(BACKENDS)}")
    return name


@contextlib.contextmanager
def inference_backend(name: str) -> Iterator[None]:
    """Within it, every model folder loaded for inference without a backend of its own runs on ``name``."""
    token = _backend.set(checked_backend(name))
    try:
        yield
    finally:
        _backend.reset(token)


def add_backend_flag(p) -> None:
    """``--backend`` of ``predict`` and ``evaluate`` (``p``: an argparse parser)."""
    p.add_argument("--backend", choices=tuple(BACKENDS), default="torch",
                   help="torch (fp32), torch-bf16 (bf16 autocast: CPUs with native bf16, GPUs), or onnxruntime "
                        "over the graph `bertforge export onnx` wrote in --model (onnx: fp32, onnx-int8: its --int8 "
                        "graph)")


def current_backend(name: str | None = None) -> str:
    """``name``, or the one :func:`inference_backend` set (``torch`` outside it)."""
    return checked_backend(name) if name is not None else _backend.get()


def onnxruntime_module(what: str = "the onnx backend"):
    """onnxruntime, or one error naming the extra that installs it."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(f"{what} needs onnxruntime: {EXTRA}") from None
    return onnxruntime


def graph_path(folder: str, backend: str) -> str:
    """The graph file of ``backend`` in ``folder``; one error saying how to write it when it is missing."""
    path = os.path.join(folder, ONNX_DIR, BACKENDS[backend])
    if not os.path.isfile(path):
        how = " --int8" if backend == "onnx-int8" else ""
        raise UserError(f"{folder} has no {ONNX_DIR}/{BACKENDS[backend]} for --backend {backend}; write it with "
                        f"bertforge export onnx --model MODEL --out {folder}{how}")
    return path


def session(path: str, threads: int | None = None):
    """An onnxruntime CPU session over the graph at ``path``, on torch's number of threads (as the torch path)."""
    ort = onnxruntime_module()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # warnings of the graph optimizer are not the user's
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own types for a damaged or foreign file
        raise UserError(f"{path} is not a graph onnxruntime can run: {str(e).splitlines()[0]}") from None


class OnnxModel:
    """An exported graph called as the torch model it was exported from: ``model(input_ids, attention_mask,
    token_type_ids)`` gives an object with the graph's outputs (``logits``, ``start_logits``/``end_logits`` or
    ``last_hidden_state``) as CPU tensors, and no loss (labels are not inputs of a graph).  ``config`` is the
    folder's.  Inference only: it has no training mode."""

    training = False

    def __init__(self, path: str, config: Any, threads: int | None = None):
        self.path, self.config = path, config
        self.session = session(path, threads)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 token_type_ids: torch.Tensor | None = None, **_: Any) -> SimpleNamespace:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        if given["attention_mask"] is None:
            given["attention_mask"] = torch.ones_like(input_ids)
        if given["token_type_ids"] is None:
            given["token_type_ids"] = torch.zeros_like(input_ids)
        feed = {name: given[name].to(torch.int64).cpu().numpy() for name in self.inputs}
        found = self.session.run(None, feed)
        return SimpleNamespace(loss=None, **{name: torch.from_numpy(v) for name, v in zip(self.outputs, found)})

    @property
    def num_labels(self) -> int:
        return self.config.num_labels

    def eval(self) -> OnnxModel:
        return self

    def train(self, mode: bool = True) -> OnnxModel:
        if mode:
            raise RuntimeError("an exported graph does not train")
        return self

    def to(self, *_: Any, **__: Any) -> OnnxModel:
        return self


def load_graph(folder: str, backend: str, config: Any, outputs: tuple[str, ...]) -> OnnxModel:
    """The graph of ``backend`` in ``folder``, refused unless it gives ``outputs`` (the head the task reads)."""
    onnxruntime_module(f"--backend {backend}")
    model = OnnxModel(graph_path(folder, backend), config)
    if not set(outputs) <= set(model.outputs):
        raise UserError(f"{model.path} gives {', '.join(model.outputs)}, not {', '.join(outputs)}: it was exported "
                        "from a model with another head")
    return model


class Bf16Model:
    """A torch model whose calls run under bf16 autocast (fp32 weights; the matmuls in bf16, softmax and layer
    norm statistics in fp32), its floating outputs given back in fp32 so that every task's post-processing is
    the fp32 path's.  Everything else (``config``, ``eval``, ...) is the model's."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model, self.device = model, device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            out = self.model(*args, **kwargs)
        if torch.is_tensor(out):
            return out.float() if out.is_floating_point() else out
        for name, value in vars(out).items():
            if torch.is_tensor(value) and value.is_floating_point():
                setattr(out, name, value.float())
        return out

    def eval(self) -> Bf16Model:
        self.model.eval()
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
