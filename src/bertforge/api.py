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

from typing import Any

from .errors import UserError


def train_tokenizer(inputs: list[str] | str, out: str, vocab_size: int, model: str = "wordpiece", cased: bool = False,
                    min_frequency: int = 2, text_field: str = "text", doc_separator: str = "file",
                    overwrite: bool = False, progress: bool = False) -> dict:
    """``bertforge tokenizer train``: a WordPiece or word-level vocabulary trained on ``inputs``, written to
    ``out`` (a folder transformers' ``AutoTokenizer`` loads).  Returns its size and kind."""
    import logging

    from .config import DOC_SEPARATORS, TOKENIZER_MODELS
    from .corpus import expand_paths, iter_texts
    from .files import OutputLock, atomic_dir, check_inputs_outside, check_output, recover_beside, write_marker
    from .tokenizer import save_tokenizer
    from .tokenizer import train_tokenizer as train

    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    if model not in TOKENIZER_MODELS or doc_separator not in DOC_SEPARATORS:
        raise UserError(f"model must be one of {TOKENIZER_MODELS} and doc_separator one of {DOC_SEPARATORS}")
    if not isinstance(vocab_size, int) or vocab_size < 1 or min_frequency < 0:
        raise UserError("--vocab-size must be positive and --min-frequency zero or more")
    if check_output(out, "tokenizer", overwrite):
        check_inputs_outside(out, inputs)
    expand_paths(inputs)  # every input exists, before any work
    with OutputLock(out):
        recover_beside(out)  # an interrupted earlier run's leftovers, then the rule again
        replace = check_output(out, "tokenizer", overwrite)
        tok = train(iter_texts(inputs, text_field, doc_separator), vocab_size, kind=model, lowercase=not cased,
                    min_frequency=min_frequency, show_progress=progress)
        with atomic_dir(out, replace=replace) as tmp:
            save_tokenizer(tok, tmp)
            write_marker(tmp, "tokenizer")
    size = tok.get_vocab_size(with_added_tokens=True)
    log = logging.getLogger("bertforge")
    if size < vocab_size:
        log.warning("asked for %d tokens; the corpus gave %d (too little text or too few distinct words)", vocab_size, size)
    log.info("wrote a %s vocabulary of %d tokens to %s", model, size, out)
    return {"vocab_size": size, "model": model, "out": out}


def run_pretraining(out: str, data: list[str] | str | None = None, resume: bool = False, overwrite: bool = False,
                    config: str | None = None, **settings: Any) -> dict:
    """``bertforge pretrain``: settings by their flag names (``preset``, ``tokenizer``, ``max_steps``,
    ``max_time="30m"``, ``batch_size``, ``lr``, ...), over a YAML/JSON ``config`` file if given, over the
    saved configuration on ``resume``.  Returns the final metrics (also in ``out/metrics.json``)."""
    import os

    from .config import PretrainConfig, parse_duration, read_config_file
    from .files import read_json_object
    from .pretrain import CONFIG_FILE
    from .pretrain import pretrain as run

    from_file = read_config_file(config) if config else {}
    recipe = settings.get("recipe", from_file.get("recipe"))
    if resume and out and os.path.isfile(os.path.join(out, CONFIG_FILE)):
        saved = read_json_object(os.path.join(out, CONFIG_FILE), CONFIG_FILE)
        if isinstance(saved.get("model"), dict):  # saved before these settings existed: the run started BERT's way
            saved["model"].setdefault("position_init", "normal")
            saved["model"].setdefault("attention_init", "normal")
        cfg = PretrainConfig.from_dict(saved)
        if recipe is not None and recipe != cfg.recipe:
            raise UserError(f"--recipe {recipe}: the run in {out} was started with --recipe {cfg.recipe}, and a "
                            "resumed run keeps its settings")
    else:  # the recipe's defaults, then the config file's and the explicit settings over them
        cfg = PretrainConfig.for_recipe(recipe if recipe is not None else "budget")
    for flat, where in ((from_file, f"config file {config}"), (settings, "settings")):
        flat = {k.replace("-", "_"): v for k, v in flat.items()}
        if "max_time" in flat:
            flat["max_time"] = parse_duration(flat["max_time"])
        if "cased" in flat:
            flat["lowercase"] = not flat.pop("cased")
        cfg.update_flat(flat, where=where)
    if data is not None:
        cfg.data.data = [data] if isinstance(data, str) else list(data)
    cfg.out = out
    if cfg.train.eval_every == 0:
        cfg.train.eval_every = None
    if cfg.train.save_every == 0:
        cfg.train.save_every = None
    return run(cfg, resume=resume, overwrite=overwrite)


def run_finetuning(task: str, model: str = "", train: str = "", validation: str = "", out: str = "",
                   overwrite: bool = False, resume: bool = False, config: str | None = None, **settings: Any) -> dict:
    """``bertforge finetune classify|squad``: settings by their flag names (``epochs``, ``lr``,
    ``batch_size``, ``max_seq_length``, ``text_column``, ``doc_stride``, ...) over a YAML/JSON ``config``
    file if given (or a run's ``finetune_config.json``), the task's own defaults for the rest; ``resume``
    continues a run checkpointed by ``save_every``.  Returns the best evaluation's metrics (also in
    ``out/metrics.json``)."""
    import dataclasses

    from .config import finetune_file_settings, read_config_file
    from .finetune import finetune as run
    from .tasks import TASKS

    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    kind = TASKS[task]
    own = {f.name for f in dataclasses.fields(kind.settings_class)}
    if config:
        from_file = finetune_file_settings(read_config_file(config), config)
        unknown = sorted(set(from_file) - set(kind.config().flat_fields()) - own)
        if unknown:
            raise UserError(f"config file {config}: unknown key(s) for finetune {task}: {', '.join(unknown)}")
        given = {"model": model, "train_file": train, "validation_file": validation, "out": out}
        model, train, validation, out = (v or from_file.pop(k, "") for k, v in given.items())
        for k in given:
            from_file.pop(k, None)
        settings = {**from_file, **settings}
    task_settings = {k: v for k, v in settings.items() if k in own}
    cfg = kind.config(model=model, train_file=train, validation_file=validation, out=out,
                      **{k: v for k, v in settings.items() if k not in own})
    return run(kind(kind.settings_class(**task_settings)), cfg, overwrite=overwrite, resume=resume)


def evaluate_classifier(model: str, data: str, max_seq_length: int = 128, batch_size: int = 64, device: str = "auto",
                        **columns: Any) -> dict:
    """``bertforge evaluate classify``: accuracy, macro-F1 and loss of a fine-tuned classifier on ``data``."""
    from .config import ClassifyConfig, validate_fields
    from .tasks.classify import evaluate_classifier as run

    settings = ClassifyConfig(**columns)
    validate_fields(settings)
    return run(model, data, settings, max_seq_length, batch_size, device)


def evaluate_squad(data: str, predictions: str | None = None, model: str | None = None, max_seq_length: int = 384,
                   batch_size: int = 64, device: str = "auto", write_predictions: str | None = None,
                   overwrite: bool = False, **settings: Any) -> dict:
    """``bertforge evaluate squad``: official SQuAD v1.1 exact match and F1 of a predictions file, or of a
    fine-tuned question-answering model's predictions."""
    from .config import SquadConfig, validate_fields
    from .files import check_output_file
    from .tasks import squad

    if bool(predictions) == bool(model):
        raise UserError("give --predictions FILE or --model DIR (one of them)")
    if predictions:
        return squad.evaluate_predictions_file(data, predictions)
    if write_predictions:
        check_output_file(write_predictions, overwrite, "--write-predictions", inputs=(data,))
    cfg = SquadConfig(**settings)
    validate_fields(cfg)
    return squad.evaluate_squad_model(model, data, cfg, max_seq_length, batch_size, device, write_predictions)


def evaluate_mlm(model: str, data: list[str] | str, max_seq_length: int = 128, seed: int = 0, batch_size: int = 32,
                 max_blocks: int | None = None, text_field: str = "text", doc_separator: str = "file",
                 device: str = "auto") -> dict:
    """``bertforge evaluate mlm``: held-out masked-LM accuracy on a fixed protocol
    (:func:`bertforge.evaluation.mlm_blocks`: running text in blocks, 15% of the tokens replaced by [MASK],
    seeded), the same tokens for any two models with one tokenizer: ours, or a transformers checkpoint with
    an MLM head.  Returns accuracy and loss over the masked positions."""
    import os

    from .checkpoint import has_weight
    from .config import BertConfig, ImplConfig
    from .corpus import iter_documents
    from .devices import resolve_device
    from .electra import ElectraForMaskedLM, generator_config_of, is_generator_dir
    from .evaluation import masked_lm_accuracy, mlm_blocks
    from .model import BertForMaskedLM
    from .tokenizer import check_vocab_fits, load_tokenizer

    if not os.path.isdir(model):
        raise UserError(f"model directory not found: {model}")
    for name, v in (("--max-seq-length", max_seq_length), ("--batch-size", batch_size)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 3:
            raise UserError(f"{name} must be an integer of at least 3, not {v!r}")
    electra = is_generator_dir(model)  # an ELECTRA run's generator/
    if not electra and not has_weight(model, "cls.predictions.transform.dense.weight"):
        raise UserError(f"{model} has no masked-LM head (cls.predictions); evaluate mlm needs one (of an ELECTRA "
                        "run, evaluate its generator/ folder)")
    config = generator_config_of(model)[0] if electra else BertConfig.load(model)
    if max_seq_length > config.max_position_embeddings:
        raise UserError(f"--max-seq-length {max_seq_length} exceeds the model's {config.max_position_embeddings} positions")
    tok = load_tokenizer(model)
    check_vocab_fits(tok, config.vocab_size, model)
    paths = [data] if isinstance(data, str) else list(data)
    ids, labels = mlm_blocks(tok, iter_documents(paths, text_field, doc_separator), max_seq_length, seed,
                             max_blocks=max_blocks)
    dev = resolve_device(ImplConfig(device=device))
    m = (ElectraForMaskedLM if electra else BertForMaskedLM).from_pretrained(model).to(dev)
    return {**masked_lm_accuracy(m, ids, labels, dev, batch_size), "max_seq_length": max_seq_length, "seed": seed}


__all__ = ["evaluate_classifier", "evaluate_mlm", "evaluate_squad", "run_finetuning", "run_pretraining", "train_tokenizer"]
