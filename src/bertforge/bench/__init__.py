"""``bertforge bench``: bertforge against transformers on the same config, batch and machine, in one process.

``--task pretrain`` (the default) times pretraining and inference; ``--task classify|squad|embed`` a fine-tuning
step (:func:`run_finetune_bench`; embed's against sentence-transformers' MultipleNegativesRankingLoss step).

Training: a full pretraining step exactly as ``bertforge pretrain`` runs it (:meth:`bertforge.train.engine.Engine.step`
with the masked-LM objective, :class:`bertforge.objectives.MaskedLM`: forward with dropout masks keyed by
sequence on the CPU, backward, clipping, fused AdamW) against ``transformers.BertForPreTraining`` (SDPA
attention, AdamW, clipping) on the same masked batch held in memory: random tokens, or with ``text`` and
``tokenizer`` a batch of real text built as ``bertforge pretrain`` builds it.  transformers' AdamW is torch's
default (foreach) on the CPU, as its Trainer's ``adamw_torch``, and fused on CUDA.  Both run under the same
precision (``--precision``, resolved as a run resolves it), neither compiled; under bf16 on the CPU both
tools are also timed in fp32 on the same batches, in the same rounds.  The arms alternate round by round so
that drift on a shared machine hits them alike; the medians are compared.  Model FLOP utilisation is reported
against the matmul peak that the bench measures on the same device, in the precision of the run (fp32, or bf16
under autocast), so that it reads as a fraction of what the device can do.

Inference: the encoder's forward pass over variable-length batches (SST-2 sentences when the data is at
hand, else the demo corpus' sentences), each batch padded to its longest sentence for both (transformers'
dynamic padding), in eval mode under ``torch.inference_mode()``.

transformers (and sentence-transformers for embed) is needed only by this command (install the ``test`` extra);
nothing else in the package imports it.
"""

from __future__ import annotations

import os

from ..commands import positive_int
from ..errors import UserError
from ..usage import COMMANDS
from ..models import FAMILIES
from .common import matmul_peak, pretraining_batch, text_batch, transformers_step
from .finetuning import run_finetune_bench
from .pretraining import run_bench
from .serving import run_onnx_bench

__all__ = ["run_bench", "run_finetune_bench", "run_onnx_bench", "matmul_peak", "pretraining_batch", "text_batch",
           "transformers_step", "add_bench_parser", "cmd_bench"]


def add_bench_parser(sub) -> None:
    """``bertforge bench``'s parser (``sub``: the command line's sub-parsers)."""
    from ..tasks import TASKS

    b = sub.add_parser("bench", help=COMMANDS["bench"])
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
    b.add_argument("--precision", default="auto", help="auto (as a run resolves it), fp32, bf16")
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
