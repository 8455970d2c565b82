"""``bertforge bench --task TASK``: a fine-tuning step of each task against its reference library."""

from __future__ import annotations

import functools
import json
import os
from contextlib import nullcontext

import torch

from ..config import FinetuneDataConfig, TrainConfig
from ..errors import UserError
from ..models import family
from ..train.engine import Engine
from .common import (_alternate, _backend, fp32_arms, fp32_engine, _fp32_figures, _import_transformers, _medians,
                     _seconds, _transformers_optimizer, transformers_step, _versions)


def _finetune_data(task: str, data_dir: str | None, train: str | None, tmp: str) -> tuple[str, str]:
    """(training file, validation file) of the fine-tuning bench: ``train``, else the task's files under
    ``data_dir`` (its ``bench_files``), else (classification only) the demo's sentiment sentences."""
    from ..tasks import TASKS

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

    from ..tasks import TASKS

    transformers = _import_transformers()
    if task not in TASKS:
        raise UserError(f"bench --task must be pretrain, {' or '.join(TASKS)}, not {task!r}")
    seq_len = (seq_len or TASKS[task].config().data.max_seq_length  # (None: the task's by the model folder)
               or (TASKS[task].length_of(model) if model else FinetuneDataConfig().max_seq_length))
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
                            rounds, out, fp32_arms(dev, impl))
    ours_tps, theirs_tps, speedup = _medians(rows)
    res = {"device": str(dev), "task": task, "model": model or preset, "batch_size": batch_size,
           "max_seq_length": seq_len, "batches": len(batches), "padding_fraction": 1 - sum(real) / padded,
           "group_by_length": group_by_length, "max_logit_difference": logit_diff,
           "finetune_tokens_per_second": ours_tps, "transformers_finetune_tokens_per_second": theirs_tps,
           "finetune_speedup_vs_transformers": speedup, **(_fp32_figures(rows, "finetune") if len(rows[0]) > 2 else {})}
    out(json.dumps(res))
    out(f"finetune_speedup_vs_transformers={res['finetune_speedup_vs_transformers']:.2f}")
    return res


def _finetune_setup(kind, cfg, transformers, tmp: str, random_preset: str | None, arch: str, batch_size: int,
                    n_batches: int, group_by_length: bool, dev: torch.device):
    """(the task, our model, the reference model with the same weights (:meth:`FinetuneTask.bench_reference`), the
    model's config, the batches on ``dev``) of the task ``kind`` as ``bertforge finetune`` reads and encodes it;
    with ``random_preset``, the model is that preset of family ``arch``, randomly initialised, written to
    ``cfg.model`` first."""
    from ..models import for_folder
    from ..tokenizer import load_tokenizer

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
    from ..tokenizer import save_tokenizer, special_ids, train_vocabulary

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
    from ..batching import group_by_length as group_by_length_order
    from ..batching import to_device

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
                     dev: torch.device, autocast, steps: int, rounds: int, out, fp32: bool = False
                     ) -> list[tuple[float, ...]]:
    """(bertforge, transformers) real tokens per second of each round of ``steps`` steps (round r takes the
    batches after round r - 1's, cycling), after a warm-up step of each; with ``fp32``, both in fp32 too."""
    ids = torch.arange(batch_size, device=dev)  # the keys of keyed dropout, as in fine-tuning
    engine32 = fp32_engine(engine, 5e-5) if fp32 else None

    def step_ours(b, e=engine):
        e.step([{**b, "sequence_ids": ids}])

    def step_theirs(b, ac=autocast):
        transformers_step(theirs, opt_theirs, {k: v for k, v in b.items() if k != "sequence_ids"}, ac)

    def timed(step):
        def rate(r: int) -> float:
            picks = [(r * steps + k) % len(batches) for k in range(steps)]

            def run():
                for i in picks:
                    step(batches[i])
            return sum(real[i] for i in picks) / _seconds(dev, run)
        return rate

    more = {"bertforge fp32": functools.partial(step_ours, e=engine32),
            "transformers fp32": functools.partial(step_theirs, ac=nullcontext())} if fp32 else {}
    for step in (step_ours, step_theirs, *more.values()):  # warm-up
        step(batches[0])
    return _alternate(rounds, timed(step_ours), timed(step_theirs), "fine-tuning", out,
                      more={name: timed(step) for name, step in more.items()})

