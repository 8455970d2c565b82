"""The Python API: one function per command, taking the command's settings by their flag names
(``max_steps=100`` for ``--max-steps 100``) and returning what the command prints (metrics as a dict).

    import bertforge

    bertforge.train_tokenizer(["corpus.txt"], "runs/tok", vocab_size=8000)
    m = bertforge.run_pretraining("runs/pt", data=["corpus.txt"], tokenizer="runs/tok", preset="mini", max_time="10m")
    m = bertforge.run_finetuning("classify", model="runs/pt", train="train.tsv", validation="dev.tsv", out="runs/sst2")
    bertforge.evaluate_classifier("runs/sst2", "test.tsv")
    bertforge.pipeline("fill-mask", model="runs/pt")("the [MASK] sat on the mat.")

The command line is a thin layer over these functions (``bertforge.cli``); bad input raises
:class:`~bertforge.errors.UserError` with the message the command would print.
"""

from __future__ import annotations

import os
from typing import Any

from . import tasks
from .errors import UserError, checked
from .predict import pipeline


@checked(vocab_size=1, min_frequency=0)
def train_tokenizer(inputs: list[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike, vocab_size: int,
                    model: str = "wordpiece", cased: bool = False, min_frequency: int = 2, text_field: str = "text",
                    doc_separator: str = "file", overwrite: bool = False, progress: bool = False) -> dict:
    """``bertforge tokenizer train``: a WordPiece or word-level vocabulary trained on ``inputs``, written to
    ``out`` (a folder transformers' ``AutoTokenizer`` loads).  Returns its size and kind."""
    import logging

    from .config import DOC_SEPARATORS, TOKENIZER_MODELS
    from .tokenizer import train_to_folder

    inputs, out = _paths(inputs, listed=True), os.fspath(out)
    if model not in TOKENIZER_MODELS or doc_separator not in DOC_SEPARATORS:
        raise UserError(f"model must be one of {TOKENIZER_MODELS} and doc_separator one of {DOC_SEPARATORS}")
    tok = train_to_folder(inputs, out, vocab_size, model, not cased, min_frequency, text_field, doc_separator,
                          overwrite, progress)
    size = tok.get_vocab_size(with_added_tokens=True)
    log = logging.getLogger("bertforge")
    if size < vocab_size:
        log.warning("asked for %d tokens; the corpus gave %d (too little text or too few distinct words)", vocab_size,
                    size)
    log.info("wrote a %s vocabulary of %d tokens to %s", model, size, out)
    return {"vocab_size": size, "model": model, "out": out}


@checked(workers=1)
def prepare(data: list[str | os.PathLike] | str | os.PathLike, tokenizer: str | os.PathLike, out: str | os.PathLike,
            workers: int | None = None, text_field: str = "text", doc_separator: str = "file", dedup: bool = False,
            overwrite: bool = False, progress: bool | None = None) -> dict:
    """``bertforge prepare``: ``data`` read, split into sentences and tokenized by ``workers`` processes (default:
    the cores this process may use) into token shards in ``out``, which ``run_pretraining(data=out)`` trains from
    with no tokenization; run again, it finishes what a killed run left.  Returns the manifest's totals."""
    from .config import DOC_SEPARATORS, progress_shown
    from .outputs import Output, check_inputs_outside
    from .prepared import Reading, prepare_corpus
    from .tokenizer import load_tokenizer

    data, out, tokenizer = _paths(data, listed=True), os.fspath(out), os.fspath(tokenizer)
    if doc_separator not in DOC_SEPARATORS:
        raise UserError(f"doc_separator must be one of {DOC_SEPARATORS}")
    Output(out, "prepared", resume=True).check()  # (a preparation cut short is continued)
    check_inputs_outside(out, data)
    corpus = prepare_corpus(data, load_tokenizer(tokenizer), out, Reading(text_field, doc_separator, dedup=dedup),
                            workers, progress_shown(progress), overwrite)
    m = corpus.meta
    return {"out": out, "documents": m["documents"], "sentences": m["sentences"], "tokens": m["tokens"],
            "shards": len(m["shards"]), "duplicates": m["duplicates"]}


@checked
def run_pretraining(out: str | os.PathLike, data: list[str | os.PathLike] | str | os.PathLike | None = None,
                    resume: bool = False, overwrite: bool = False, config: str | os.PathLike | None = None,
                    quiet: bool = False, **settings: Any) -> dict:
    """``bertforge pretrain``: settings by their flag names (``preset``, ``tokenizer``, ``max_steps``,
    ``max_time="30m"``, ``batch_size``, ``lr``, ...), over a YAML/JSON ``config`` file if given, over the
    saved configuration on ``resume``.  Returns the final metrics (also in ``out/metrics.json``).  The run says
    on stderr what the command line says (``quiet``: warnings only; a program that handles bertforge's log
    lines itself keeps them)."""
    from .logs import shown_on_stderr
    from .train.pretrain import pretrain
    from .settings import pretrain_settings

    out, data, config, settings = _paths(out), _paths(data, listed=True), _paths(config), _paths(settings)
    with shown_on_stderr(quiet):
        return pretrain(pretrain_settings(out, data, resume, config, **settings), resume=resume, overwrite=overwrite)


@checked
def run_finetuning(task: str, model: str | os.PathLike = "", train: str | os.PathLike = "",
                   validation: str | os.PathLike = "", out: str | os.PathLike = "", overwrite: bool = False,
                   resume: bool = False, config: str | os.PathLike | None = None, quiet: bool = False,
                   **settings: Any) -> dict:
    """``bertforge finetune classify|squad``: settings by their flag names (``epochs``, ``lr``,
    ``batch_size``, ``max_seq_length``, ``text_column``, ``doc_stride``, ...) over a YAML/JSON ``config``
    file if given (or a run's ``finetune_config.json``), the task's own defaults for the rest; ``resume``
    continues an interrupted run from its newest checkpoint; ``quiet`` as :func:`run_pretraining`'s.  Returns the
    best evaluation's metrics (also in
    ``out/metrics.json``)."""
    from .logs import shown_on_stderr
    from .train.finetune import finetune
    from .settings import finetune_settings
    from .tasks import TASKS

    model, train, validation, out, config = (_paths(p) for p in (model, train, validation, out, config))
    cfg, task_settings = finetune_settings(task, model, train, validation, out, config, **_paths(settings))
    with shown_on_stderr(quiet):
        return finetune(TASKS[task](task_settings), cfg, overwrite=overwrite, resume=resume)


@checked(seed=0, batch_size=1, max_blocks=1)
def evaluate_mlm(model: str | os.PathLike, data: list[str | os.PathLike] | str | os.PathLike,
                 max_seq_length: int = 128, seed: int = 0, batch_size: int = 32, max_blocks: int | None = None,
                 text_field: str = "text", doc_separator: str = "file", device: str = "auto") -> dict:
    """``bertforge evaluate mlm``: held-out masked-LM accuracy on a fixed protocol
    (:func:`bertforge.evaluation.mlm_blocks`: running text in blocks, 15% of the tokens replaced by [MASK],
    seeded), the same tokens for any two models with one tokenizer: ours, or a transformers checkpoint with
    an MLM head.  Returns accuracy and loss over the masked positions."""
    from .checkpoint import has_weight
    from .corpus import iter_documents
    from .evaluation import masked_lm_accuracy, mlm_blocks
    from .loading import check_max_seq_length, load_for_inference, masked_lm, model_dir

    model = model_dir(model)
    found = masked_lm(model)  # BERT's, or an ELECTRA run's generator/
    if not has_weight(model, found.head):
        raise UserError(f"{model} has no masked-LM head (cls.predictions); evaluate mlm needs one (of an ELECTRA "
                        "run, evaluate its generator/ folder)")
    check_max_seq_length(found.config, max_seq_length, model)
    m = load_for_inference(model, found.model_class, device, found.config)
    paths = _paths(data, listed=True)
    ids, labels = mlm_blocks(m.tokenizer, iter_documents(paths, text_field, doc_separator), max_seq_length, seed,
                             max_blocks=max_blocks)
    return {**masked_lm_accuracy(m.model, ids, labels, m.device, batch_size), "max_seq_length": max_seq_length,
            "seed": seed}


@checked(batch_size=1)
def embed(model: str | os.PathLike, texts: str | list[str], batch_size: int = 32, device: str = "auto",
          pooling: str | None = None, max_seq_length: int | None = None):
    """``bertforge predict embed``: a text's vector (C,), or (N, C) float32 for a list, as
    ``SentenceTransformer(model).encode`` gives them for a sentence-transformers folder (its pooling,
    normalisation and ``max_seq_length``); a plain BERT directory: the mean of the last layer, L2-normalised.
    ``pooling`` (``mean`` or ``cls``) overrides the folder's."""
    from .tasks.embed import EmbedPipeline

    return EmbedPipeline(model, device, batch_size, max_seq_length=max_seq_length, pooling=pooling)(texts)


def evaluate(task: str, backend: str = "torch", **settings: Any) -> dict:
    """``bertforge evaluate TASK``: the task's metrics of a saved model on a file (or of a predictions file), with the
    command's settings by their flag names: ``evaluate("classify", model=DIR, data=FILE, max_seq_length=128)``.
    ``task`` is a fine-tuning task's (:data:`bertforge.tasks.TASKS`: ``classify``, ``squad``, ``ner``,
    ``retrieval``, ``rerank``) or ``mlm``; ``backend="onnx"`` (or ``"onnx-int8"``) scores the graph that ``bertforge
    export onnx`` wrote in the model folder."""
    from .runtime import inference_backend
    from .tasks import evaluation

    with inference_backend(backend):
        return evaluate_mlm(**settings) if task == "mlm" else evaluation(task)(**settings)


# the tasks' own functions, under the names the API has always had
evaluate_classifier, evaluate_squad = tasks.classify.evaluate_classifier, tasks.squad.evaluate_squad
evaluate_ner, evaluate_retrieval = tasks.ner.evaluate_ner, tasks.embed.evaluate_retrieval

__all__ = ["embed", "evaluate", "evaluate_classifier", "evaluate_mlm", "evaluate_ner", "evaluate_retrieval",
           "evaluate_squad", "pipeline", "prepare", "run_finetuning", "run_pretraining", "train_tokenizer"]


def _paths(value: Any, listed: bool = False) -> Any:
    """Paths as strings, as the settings hold them: ``value`` itself, each item of a list, each value of a dict
    (``pathlib.Path`` or any ``os.PathLike``); with ``listed``, one path becomes a list of one."""
    if isinstance(value, dict):
        return {k: _paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_paths(v) for v in value]
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    return [value] if listed and isinstance(value, str) else value
