"""Evaluation: pretraining (MLM and NSP loss and accuracy), classification (accuracy, macro-F1) and
SQuAD v1.1 (exact match and F1, computed exactly as the official ``evaluate-v1.1.py``).

Every model evaluation runs in ``model.eval()`` under ``torch.inference_mode()`` and restores the
training mode it found.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import string
import sys
from collections import Counter
from collections.abc import Iterable

import numpy as np
import torch

from .batching import length_sorted_batches, pad_batch, to_device
from .errors import UserError
from .logs import progress

log = logging.getLogger("bertforge")


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    was = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was)


_shown: contextvars.ContextVar[bool] = contextvars.ContextVar("bertforge_inference_progress", default=False)
PROGRESS_LOG_SECONDS = 60.0  # without a terminal, a line this often


@contextlib.contextmanager
def inference_progress():
    """Within it (``evaluate`` and ``predict``), every inference over rows says how far it is."""
    token = _shown.set(True)
    try:
        yield
    finally:
        _shown.reset(token)


def by_length(model, features: list[dict], pad_id: int, device, batch_size: int, fn, desc: str | None = None) -> list:
    """``fn(model output, batch)`` -> one result per row, over batches of similar lengths (little padding) in eval
    mode; the results in the features' order.  ``desc``: the progress's name; shown with it, or within
    :func:`inference_progress`."""
    out: list = [None] * len(features)
    batches = length_sorted_batches([len(f["input_ids"]) for f in features], batch_size)
    total, name = len(features), desc or "scoring"

    def said(done: int, seconds: float) -> None:
        if done < total:  # (the last batch's line would only repeat the total)
            log.info("%s: %d of %d rows (%d%%), %.0f s", name, done, total, 100 * done // total, seconds)

    if desc is None and not _shown.get():  # a fine-tuning run's evaluations: its training bar alone
        advancing = contextlib.nullcontext(lambda n: None)
    else:
        advancing = progress(total, name, sys.stderr.isatty(), said, PROGRESS_LOG_SECONDS, unit="row")
    with advancing as advance, eval_mode(model):
        for idx in batches:
            b = to_device(pad_batch([features[i] for i in idx], pad_id), device)
            for i, r in zip(idx, fn(model(**b), b)):
                out[i] = r
            advance(len(idx))
    return out


# ------------------------------------------------------------------------------------------------ pretraining
def mlm_output(out) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(masked-LM logits, masked-LM loss) of a pretraining or masked-LM model's output."""
    if hasattr(out, "prediction_logits"):
        return out.prediction_logits, out.mlm_loss
    return out.logits, out.loss


def evaluate_pretraining(model, batches: list[dict], device, autocast=None, baseline_token: int | None = None,
                         mask_id: int | None = None) -> dict:
    """MLM loss and accuracy over the selected positions, NSP loss and accuracy, over fixed batches.

    ``mlm_accuracy`` counts every selected position, the 10% left unchanged (which a model can copy) and the
    10% randomised included; with ``mask_id``, ``mlm_accuracy_masked`` counts the [MASK] positions only, the
    figure to compare with ``bertforge evaluate mlm`` and with models trained with other masking."""
    mlm_sum = mlm_n = mlm_ok = base_ok = 0.0
    masked_n = masked_ok = 0.0
    nsp_sum = nsp_n = nsp_ok = 0.0
    with eval_mode(model):
        for b in batches:
            b = to_device(b, device)
            kw = dict(labels=b["labels"], loss_reduction="sum", dense_logits=False)  # the labelled rows' logits
            if "next_sentence_label" in b:
                kw["next_sentence_label"] = b["next_sentence_label"]
            with autocast or contextlib.nullcontext():
                out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], **kw)
            logits, loss = mlm_output(out)
            target = b["labels"][b["labels"] != -100]
            mlm_sum += float(loss)
            mlm_n += target.numel()
            hit = logits.argmax(-1) == target
            mlm_ok += float(hit.sum())
            if mask_id is not None:
                at_mask = b["input_ids"][b["labels"] != -100] == mask_id
                masked_n, masked_ok = masked_n + float(at_mask.sum()), masked_ok + float((hit & at_mask).sum())
            if baseline_token is not None:
                base_ok += float((target == baseline_token).sum())
            if "next_sentence_label" in b:
                y = b["next_sentence_label"]
                nsp_sum += float(out.nsp_loss)
                nsp_n += y.numel()
                nsp_ok += float((out.seq_relationship_logits.argmax(-1) == y).sum())
    res = {
        "mlm_loss": mlm_sum / max(1, mlm_n),
        "mlm_accuracy": mlm_ok / max(1, mlm_n),
        "masked_tokens": int(mlm_n),
    }
    if mask_id is not None:
        res["mlm_accuracy_masked"] = masked_ok / max(1, masked_n)
    if baseline_token is not None:
        res["mlm_baseline_accuracy"] = base_ok / max(1, mlm_n)
    if nsp_n:
        res.update(nsp_loss=nsp_sum / nsp_n, nsp_accuracy=nsp_ok / nsp_n, sequences=int(nsp_n))
    return res


def mlm_blocks(tok, documents, max_seq_length: int, seed: int = 0, mask_prob: float = 0.15,
               max_blocks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed masked-LM evaluation protocol: the documents' tokens run together and cut into blocks of
    ``max_seq_length`` ([CLS] block [SEP]), each other token replaced by [MASK] with probability ``mask_prob``
    (a seeded generator; every chosen token becomes [MASK], none is kept or randomised).  Returns
    (input_ids, labels) of shape (blocks, max_seq_length); labels are -100 except at the masked tokens.
    The same for any model with this tokenizer, whatever its training masking was."""
    from .tokenizer import special_ids

    sp = special_ids(tok)
    run: list[int] = []
    for enc in tok.encode_batch([" ".join(d) for d in documents], add_special_tokens=False):
        run.extend(enc.ids)
    n = max_seq_length - 2
    blocks = [run[i : i + n] for i in range(0, len(run) - n + 1, n)][: max_blocks or None]
    if not blocks:
        raise UserError(f"the text holds {len(run)} tokens, fewer than one block of {n}; lower --max-seq-length")
    ids = torch.tensor([[sp.cls, *b, sp.sep] for b in blocks], dtype=torch.long)  # (N, T)
    rng = np.random.default_rng(seed)
    chosen = torch.from_numpy(rng.random(ids.shape) < mask_prob)
    chosen[:, 0] = chosen[:, -1] = False
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return ids.masked_fill(chosen, sp.mask), labels


def masked_lm_accuracy(model, ids: torch.Tensor, labels: torch.Tensor, device, batch_size: int = 32) -> dict:
    """Accuracy and loss of a masked-LM model over the masked positions of :func:`mlm_blocks`' blocks."""
    ok = total = 0
    loss_sum = 0.0
    with eval_mode(model):
        for i in range(0, len(ids), batch_size):
            x, y = ids[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
            out = model(x, torch.ones_like(x), labels=y, loss_reduction="sum", dense_logits=False)
            logits, loss = mlm_output(out)  # (M, V) sparse
            target = y[y != -100]
            if loss is None:  # an exported graph (--backend onnx): every position's logits, no loss
                logits = logits[y != -100]
                loss = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")
            ok += int((logits.argmax(-1) == target).sum())
            loss_sum += float(loss)
            total += target.numel()
    return {"mlm_accuracy": ok / max(1, total), "mlm_loss": loss_sum / max(1, total), "masked_tokens": total,
            "blocks": len(ids)}


def fill_mask_samples(model, tok, batch: dict, device, n: int = 3, k: int = 5) -> list[str]:
    """Readable top-k predictions at a few masked positions of the first sequences of a batch."""
    lines = []
    with eval_mode(model):
        b = to_device(batch, device)
        out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
        logits = mlm_output(out)[0]  # (B, T, V)
        probs = logits.float().softmax(-1)
        for i in range(min(n, b["input_ids"].shape[0])):
            ids = b["input_ids"][i][b["attention_mask"][i].bool()].tolist()
            labels = b["labels"][i][: len(ids)]
            shown = [tok.id_to_token(t) for t in ids]
            positions = (labels != -100).nonzero().flatten().tolist()[:3]
            context = " ".join(shown[max(0, positions[0] - 12) : positions[0] + 12]) if positions else ""
            lines.append(f"  ...{context}...")
            for p in positions:
                top = probs[i, p].topk(k)
                cands = ", ".join(f"{tok.id_to_token(int(t))} {float(q):.3f}" for q, t in zip(top.values, top.indices))
                lines.append(f"    [{p}] true={tok.id_to_token(int(labels[p]))!s}: {cands}")
    return lines


# ------------------------------------------------------------------------------------------------ classification
def classification_metrics(y_true: Iterable[int], y_pred: Iterable[int], num_labels: int) -> dict:
    """Accuracy and macro-averaged F1 (a class never predicted nor present is left out of the average)."""
    t, p = np.asarray(list(y_true)), np.asarray(list(y_pred))
    acc = float((t == p).mean()) if len(t) else 0.0
    f1s = []
    for c in range(num_labels):
        tp = float(((p == c) & (t == c)).sum())
        fp = float(((p == c) & (t != c)).sum())
        fn = float(((p != c) & (t == c)).sum())
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": acc, "macro_f1": float(np.mean(f1s)) if f1s else 0.0}


# ------------------------------------------------------------------------------------------------ SQuAD v1.1
# The functions below reproduce the official evaluate-v1.1.py line for line in behaviour.
def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official SQuAD v1.1)."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _overlap(prediction: str, ground_truth: str) -> tuple[int, int, int]:
    p = normalize_answer(prediction).split()
    g = normalize_answer(ground_truth).split()
    common = Counter(p) & Counter(g)
    return sum(common.values()), len(p), len(g)


def f1_score(prediction: str, ground_truth: str) -> float:
    same, np_, ng = _overlap(prediction, ground_truth)
    if same == 0:
        return 0
    precision = 1.0 * same / np_
    recall = 1.0 * same / ng
    return (2 * precision * recall) / (precision + recall)


def precision_score(prediction: str, ground_truth: str) -> float:
    same, np_, _ = _overlap(prediction, ground_truth)
    return 0 if same == 0 else same / np_


def recall_score(prediction: str, ground_truth: str) -> float:
    same, _, ng = _overlap(prediction, ground_truth)
    return 0 if same == 0 else same / ng


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def squad_evaluate(dataset: list[dict], predictions: dict[str, str]) -> dict:
    """Official SQuAD v1.1 scores (percentages) of ``predictions`` ({id: text}) on the ``data`` list of a
    SQuAD JSON file.  A question without a prediction scores 0.  A question without reference answers
    cannot be scored (the official script fails on it): it is left out of the averages and counted in
    ``questions_without_answers``.  ``precision`` and ``recall`` are token-level, each the maximum over the
    reference answers and averaged like F1 (not official)."""
    f1 = exact_match = precision = recall = total = 0
    missing = no_reference = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                ground_truths = [a["text"] for a in qa.get("answers") or []]
                if not ground_truths:
                    no_reference += 1
                    continue
                total += 1
                if str(qa["id"]) not in predictions:
                    missing += 1
                    continue
                prediction = predictions[str(qa["id"])]
                exact_match += metric_max_over_ground_truths(exact_match_score, prediction, ground_truths)
                f1 += metric_max_over_ground_truths(f1_score, prediction, ground_truths)
                precision += metric_max_over_ground_truths(precision_score, prediction, ground_truths)
                recall += metric_max_over_ground_truths(recall_score, prediction, ground_truths)
    scored = max(total, 1)
    return {
        "exact_match": 100.0 * exact_match / scored,
        "f1": 100.0 * f1 / scored,
        "precision": 100.0 * precision / scored,
        "recall": 100.0 * recall / scored,
        "questions": total,
        "unanswered": missing,
        "questions_without_answers": no_reference,
    }
