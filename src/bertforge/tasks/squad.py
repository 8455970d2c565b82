"""SQuAD v1.1 extractive question answering: features, post-processing, fine-tuning and evaluation.

Windows: a context longer than the room left beside the question is split into overlapping windows.
``doc_stride`` follows transformers' convention: it is the number of context tokens two consecutive windows
share (Google's ``run_squad.py`` uses it as the step between window starts instead).

Post-processing (pure NumPy, testable on hand-written logits, as transformers' ``utils_qa.py``): for each
question, the ``n_best`` start and end positions of every window are paired; pairs outside the context,
reversed, or longer than ``max_answer_length`` tokens are skipped; the highest start + end logit wins, and
its text is cut from the original context through the tokenizer's character offsets.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ..batching import pad_batch
from ..commands import add_setting_flags, emit, positive_int, task_settings
from ..config import FinetuneConfig, progress_shown, setting
from ..corpus import table_rows
from ..errors import UserError, checked, require_type, shown
from ..evaluation import by_length, squad_evaluate
from ..inference import Pipeline, paired
from ..atomic import atomic_write_text
from ..files import json_object_or_none, read_json
from ..models import BertConfig, BertForQuestionAnswering, for_folder, head_class
from ..loading import check_max_seq_length, load_for_inference, model_dir, refuse_other_head
from ..tokenizer import special_ids
from .base import FinetuneTask, given_settings, validating

log = logging.getLogger("bertforge")
MAX_SEQ_LENGTH = 384  # SQuAD's windows of question and context: BERT's and transformers' run_qa's


@dataclass
class SquadConfig:
    doc_stride: int = setting(128, "tokens shared by consecutive windows of a long context (transformers' "
                                   "convention)", check="non-negative")
    max_query_length: int = setting(64, "question tokens kept", check="positive")
    n_best: int = setting(20, "start and end candidates per window", check="positive")
    max_answer_length: int = setting(30, "longest answer in tokens", check="positive")



@dataclass
class Example:
    id: str
    question: str
    context: str
    answers: list[dict]  # [{"text", "answer_start"}]


def _kind(value) -> str:
    """What a value is, for a message: ``null``, or its type and (bounded) value."""
    return "null" if value is None else f"{type(value).__name__} {shown(value)}"


def squad_from_rows(rows, path: str) -> dict:
    """The SQuAD JSON structure (``{"data": [articles]}``) of flat rows, as Hugging Face's ``squad`` dataset
    and its Parquet files hold them: ``id``, ``title``, ``context``, ``question``, ``answers`` (``{"text":
    [...], "answer_start": [...]}``, or a list of ``{"text", "answer_start"}``)."""
    articles: dict[str, dict] = {}
    for n, r in enumerate(rows):
        for key in ("id", "context", "question", "answers"):
            if key not in r:
                raise UserError(f"{path}: row {n}: no field {key!r} (SQuAD rows hold id, title, context, question, "
                                "answers)")
        for key in ("context", "question"):
            if not isinstance(r[key], str):
                raise UserError(f"{path}: row {n}: {key!r} must be text, not {_kind(r[key])}")
        ans = r["answers"]
        if isinstance(ans, dict):  # columnar, as the datasets library stores them
            pairs = zip(ans.get("text") or [], ans.get("answer_start") or [])
            answers = [{"text": t, "answer_start": a} for t, a in pairs]
        else:
            answers = list(ans or [])
        title = r.get("title") or ""
        art = articles.setdefault(title, {"title": title, "paragraphs": {}})
        para = art["paragraphs"].setdefault(r["context"], {"context": r["context"], "qas": []})
        para["qas"].append({"id": r["id"], "question": r["question"], "answers": answers})
    return {"data": [{"title": a["title"], "paragraphs": list(a["paragraphs"].values())} for a in articles.values()]}


def read_squad_json(path: str) -> dict:
    """A SQuAD v1.1 JSON file, or the same questions as rows of a .parquet file or an ``hf:`` dataset."""
    rows = table_rows(path)
    if rows is not None:
        return squad_from_rows(rows, path)
    d = read_json(path, "SQuAD file")
    if not isinstance(d, dict) or not isinstance(d.get("data"), list):
        raise UserError(f"{path}: not a SQuAD file (expected an object with a 'data' list)")
    return d


def read_examples(path: str) -> tuple[list[Example], list[dict]]:
    """(examples, the file's ``data`` list): every question of a SQuAD v1.1 JSON file.  A malformed record
    is an error naming the file, the record and the field."""
    d = read_squad_json(path)
    examples = []
    seen: dict[str, str] = {}  # question id -> where it first appeared: predictions are keyed by id

    def need(obj, key: str, kind: type | tuple, where: str, default=None):
        if not isinstance(obj, dict):
            raise UserError(f"{path}: {where} must be a JSON object")
        v = obj.get(key, default)
        if not isinstance(v, kind) or isinstance(v, bool):
            what = "missing" if key not in obj else f"{type(v).__name__ if v is not None else 'null'}"
            expected = {str: "a string", list: "a list", int: "an integer"}.get(kind, "a string or an integer")
            raise UserError(f"{path}: {where}: '{key}' must be {expected}, not {what}")
        return v

    for i, article in enumerate(d["data"]):
        for j, para in enumerate(need(article, "paragraphs", list, f"data[{i}]")):
            where = f"data[{i}].paragraphs[{j}]"
            ctx = need(para, "context", str, where)
            for k, qa in enumerate(need(para, "qas", list, where)):
                w = f"{where}.qas[{k}]"
                qid = need(qa, "id", (str, int), w)
                if str(qid) in seen:
                    raise UserError(f"{path}: {w}: question id {shown(str(qid))} is also the id of {seen[str(qid)]}; "
                                    "each question needs its own id")
                seen[str(qid)] = w
                w = f"{w} (id {qid})"
                question = need(qa, "question", str, w)
                answers = need(qa, "answers", list, w, default=[])
                for n, a in enumerate(answers):
                    need(a, "text", str, f"{w}.answers[{n}]")
                    need(a, "answer_start", int, f"{w}.answers[{n}]")
                examples.append(Example(str(qid), question, ctx, list(answers)))
    if not examples:
        raise UserError(f"{path} holds no questions")
    return examples, d["data"]


def answer_char_span(ex: Example) -> tuple[int, int] | None:
    """The first answer's [start, end) characters, or None when its text is not at ``answer_start``."""
    if not ex.answers:
        return None
    a = ex.answers[0]
    start = int(a.get("answer_start", -1))
    text = a.get("text", "")
    if start < 0 or not text or ex.context[start : start + len(text)] != text:
        return None
    return start, start + len(text)


def build_features(tok: Tokenizer, examples: list[Example], max_seq_length: int, doc_stride: int,
                   max_query_length: int, training: bool) -> tuple[list[dict], int]:
    """Windows of every example: input ids, token types, the character offsets of context tokens (None
    elsewhere) and, for training, start/end token positions ([CLS] = 0 when the window lacks the answer).
    Returns (features, number of training examples skipped because the answer does not match)."""
    sp = special_ids(tok)
    questions = tok.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    q_ids = [e.ids[:max_query_length] for e in questions]
    cut = sum(len(e.ids) > max_query_length for e in questions)
    if cut:
        log.warning("%d question(s) longer than --max-query-length %d tokens were truncated", cut, max_query_length)
    # contexts are tokenized once per paragraph
    uniq = {}
    for ex in examples:
        uniq.setdefault(ex.context, None)
    ctx_list = list(uniq)
    encs = tok.encode_batch(ctx_list, add_special_tokens=False)
    ctx_enc = {c: (e.ids, e.offsets) for c, e in zip(ctx_list, encs)}
    feats: list[dict] = []
    skipped = 0
    for ei, ex in enumerate(examples):
        span = answer_char_span(ex) if training else None
        if training and span is None:
            skipped += 1
            continue
        c_ids, c_off = ctx_enc[ex.context]
        q = q_ids[ei]
        room = max_seq_length - len(q) - 3
        if room < 1 or doc_stride >= room:
            raise UserError(f"--max-seq-length {max_seq_length} leaves {max(room, 0)} context tokens per window beside "
                            f"a {len(q)}-token question, and --doc-stride {doc_stride} must be fewer: raise "
                            "--max-seq-length, or lower --max-query-length or --doc-stride")
        tok_start = tok_end = None
        if span is not None:
            s, e = span
            inside = [i for i, (a, b) in enumerate(c_off) if b > s and a < e]
            if not inside:
                skipped += 1
                continue
            tok_start, tok_end = inside[0], inside[-1]
        w0 = 0
        while True:
            w1 = min(w0 + room, len(c_ids))
            ids = [sp.cls] + q + [sp.sep] + c_ids[w0:w1] + [sp.sep]
            tt = [0] * (len(q) + 2) + [1] * (w1 - w0 + 1)
            base = len(q) + 2
            offsets: list = [None] * base + [tuple(o) for o in c_off[w0:w1]] + [None]
            f = {"input_ids": ids, "token_type_ids": tt, "offsets": offsets, "example": ei}
            if training:
                if tok_start >= w0 and tok_end < w1:
                    f["start_positions"], f["end_positions"] = base + tok_start - w0, base + tok_end - w0
                else:
                    f["start_positions"] = f["end_positions"] = 0
            feats.append(f)
            if w1 >= len(c_ids):
                break
            w0 = w1 - doc_stride
    return feats, skipped


def postprocess(examples: list[Example], features: list[dict], start_logits: list[np.ndarray],
                end_logits: list[np.ndarray], n_best: int = 20, max_answer_length: int = 30,
                ranked: dict | None = None, top_k: int = 1) -> tuple[dict[str, str], dict[str, float]]:
    """({question id: answer text}, {question id: score}) from per-feature start/end logits; ``ranked``, when
    given, receives {question id: [(score, (start, end)), ...]}, the ``top_k`` best different spans as character
    offsets in the context.  The score is the answer's probability in its window: P(start) * P(end), each a
    softmax over the window's context tokens (as transformers' question-answering pipeline scores); 0 and
    (-1, -1) only for a context without tokens."""
    by_example: dict[int, list[int]] = {}
    for fi, f in enumerate(features):
        by_example.setdefault(f["example"], []).append(fi)
    answers: dict[str, str] = {}
    scores: dict[str, float] = {}
    for ei, ex in enumerate(examples):
        found = []  # (logit, score, span): each window's best candidates, in the windows' order
        for fi in by_example.get(ei, []):
            offs = features[fi]["offsets"]
            ctx = np.array([o is not None for o in offs])  # only context tokens can start or end an answer
            if not ctx.any():
                continue
            s_log = np.where(ctx, start_logits[fi][: len(offs)], -np.inf)
            e_log = np.where(ctx, end_logits[fi][: len(offs)], -np.inf)
            s_p, e_p = _softmax(s_log), _softmax(e_log)
            for logit, s, e in _ranked_pairs(s_log, e_log, int(ctx.sum()), n_best, max_answer_length)[:top_k]:
                found.append((logit, float(s_p[s] * e_p[e]), (offs[s][0], offs[e][1])))
        found.sort(key=lambda c: -c[0])  # (stable: of equal logits, the first window's)
        _, best_score, best_span = found[0] if found else (0.0, 0.0, (-1, -1))
        answers[ex.id] = ex.context[best_span[0] : best_span[1]] if best_span[0] >= 0 else ""
        scores[ex.id] = best_score
        if ranked is not None:
            different = {}
            for _, score, span in found:
                different.setdefault(span, score)
            ranked[ex.id] = [(score, span) for span, score in different.items()][:top_k] or [(0.0, (-1, -1))]
    return answers, scores


def _softmax(x: np.ndarray) -> np.ndarray:
    p = np.exp(x - x.max())  # -inf outside the context: probability 0
    return p / p.sum()


def _ranked_pairs(s_log: np.ndarray, e_log: np.ndarray, n_ctx: int, n_best: int,
                  max_len: int) -> list[tuple[float, int, int]]:
    """(start + end logit, start, end) token positions, best first, among the ``n_best`` best starts and ends
    (utils_qa's search) that make a span of at most ``max_len`` tokens; when none of those pairs does (the best
    ends all before the best starts), the best over every such span alone.  Logits are -inf outside the
    context, which holds ``n_ctx`` tokens."""
    k = min(n_best, n_ctx)
    starts, ends = np.argsort(-s_log, kind="stable")[:k], np.argsort(-e_log, kind="stable")[:k]
    pairs = [(s_log[s] + e_log[e], s, e) for s in starts for e in ends if s <= e < s + max_len]
    if pairs:
        return sorted(pairs, key=lambda p: -p[0])  # (stable: max()'s choice first)
    n = len(s_log)
    span = s_log[:, None] + e_log[None, :]  # (start, end)
    gap = np.arange(n)[None, :] - np.arange(n)[:, None]
    span[(gap < 0) | (gap >= max_len)] = -np.inf
    s, e = divmod(int(np.argmax(span)), n)
    return [(span[s, e], s, e)]


def qa_logits(model, features: list[dict], pad_id: int, device,
              batch_size: int = 64) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of every feature (batches sorted by length, eval mode)."""
    def rows(out, b: dict) -> list[tuple[np.ndarray, np.ndarray]]:
        s, e = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
        return [(s[r, :n], e[r, :n]) for r, n in enumerate(b["attention_mask"].sum(1).tolist())]

    found = by_length(model, features, pad_id, device, batch_size, rows)
    return [s for s, _ in found], [e for _, e in found]


def predict_answers(model, tok: Tokenizer, examples: list[Example], cfg: SquadConfig, max_seq_length: int, device,
                    batch_size: int = 64) -> tuple[dict[str, str], dict[str, float]]:
    feats, _ = build_features(tok, examples, max_seq_length, cfg.doc_stride, cfg.max_query_length, training=False)
    s, e = qa_logits(model, feats, special_ids(tok).pad, device, batch_size)
    return postprocess(examples, feats, s, e, cfg.n_best, cfg.max_answer_length)


class SquadTask(FinetuneTask):
    """SQuAD v1.1: windows of long contexts, the official F1 picks the best epoch."""

    name = "squad"
    model_class = BertForQuestionAnswering
    settings_class = SquadConfig
    select = "f1"
    pipeline_tag = "question-answering"
    bench_files = ("squad/train-8k-v1.1.json", "squad/dev-v1.1.json")
    plotted = [("exact_match", "exact match"), ("f1", "F1")]
    defaults = {"max_seq_length": MAX_SEQ_LENGTH, "epochs": 2}
    batch = 16

    help = "SQuAD v1.1 extractive question answering"
    printed = ("exact_match", "f1", "precision", "recall")
    evaluate_name = "squad"
    evaluate_help = "official SQuAD v1.1 exact match and F1"
    evaluate_settings = SquadConfig

    @classmethod
    def evaluation(cls):
        return evaluate_squad

    @classmethod
    def evaluate_arguments(cls, p) -> None:
        p.add_argument("--data", required=True, help="SQuAD v1.1 JSON with reference answers")
        p.add_argument("--predictions", help="predictions JSON {question id: answer}")
        p.add_argument("--model", help="a fine-tuned question-answering model directory")
        p.add_argument("--write-predictions", help="with --model: also write its predictions to this file")
        p.add_argument("--max-seq-length", type=positive_int, help=f"default: {MAX_SEQ_LENGTH}, or the model's "
                                                                   "positions if fewer")
        p.add_argument("--batch-size", type=positive_int, default=64)
        p.add_argument("--overwrite", action="store_true", help="with --write-predictions: replace an existing file")
        p.add_argument("--device", default="auto")
        add_setting_flags(p, SquadConfig())

    predict_name = "qa"
    predict_help = "extractive question answering"
    aliases = ("question-answering",)

    @classmethod
    def pipeline_class(cls) -> type:
        return QAPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        p.add_argument("--question")
        p.add_argument("--context")
        p.add_argument("--input", help="a SQuAD v1.1 JSON file: predictions {id: answer}")
        p.add_argument("--max-seq-length", type=positive_int, default=MAX_SEQ_LENGTH)
        p.add_argument("--top-k", type=positive_int, default=1, help="the k best answers to the question")
        add_setting_flags(p, SquadConfig())

    @classmethod
    def predict(cls, a) -> None:
        cfg = task_settings(a, SquadConfig)
        if a.input and (a.question is not None or a.context is not None):
            raise UserError("give --question/--context or --input, not both")
        if a.input and a.top_k != 1:
            raise UserError("--top-k gives a question's k best answers; with --input each question gets its best one "
                            "(the predictions file SQuAD scores)")
        p = QAPipeline(a.model, device=a.device, batch_size=a.batch_size, progress=progress_shown(None))
        if a.input:
            examples, _ = read_examples(a.input)
            res = p(examples=examples, squad=cfg, max_seq_length=a.max_seq_length)
            emit(a, res, lambda r: [f"{k}\t{v}" for k, v in r.items()])
            return
        if a.question is None or a.context is None:  # given but empty: the pipeline says which
            raise UserError("give --question and --context, or --input squad.json")
        res = p(a.question, a.context, squad=cfg, max_seq_length=a.max_seq_length, top_k=a.top_k)
        emit(a, res, lambda r: [f"{x['answer']}  (score {x['score']:.2f}, characters {x['start']}-{x['end']})"
                                for x in (r if a.top_k > 1 else [r])])

    def texts(self) -> list[str]:
        return [e.context + " " + e.question for e in self.train_ex]

    def configure(self, config) -> bool:
        """A family whose span head shares its weights' name with other heads (a ``classifier``): from a folder
        whose head is another task's (a sentence or token classifier's), a new one of 2 outputs."""
        if config.id2label is None or head_class(config, self.model_class).other_head(config) is None:
            return False
        config.id2label = config.label2id = None
        return True

    def read(self, cfg: FinetuneConfig) -> None:
        self.train_ex, self.val_ex = self.split_validation(read_examples(cfg.data.train_file)[0], cfg,
                                                           lambda path: read_examples(path)[0],
                                                           key=lambda ex: ex.context)
        self.val_data = squad_from_rows([vars(ex) for ex in self.val_ex], "validation")["data"]  # as evaluated
        if cfg.data.max_train_examples:
            self.train_ex = self.train_ex[: cfg.data.max_train_examples]

    def encode(self, tok: Tokenizer, cfg: FinetuneConfig):
        st, n = self.settings, cfg.data.max_seq_length
        feats, self.skipped = build_features(tok, self.train_ex, n, st.doc_stride, st.max_query_length, training=True)
        if self.skipped:
            log.warning("%d of %d training questions skipped: the answer text is not at answer_start in the context",
                        self.skipped, len(self.train_ex))
        if not feats:
            raise UserError(f"{cfg.data.train_file}: no training question has an answer that matches its context")
        self.val_feats, _ = build_features(tok, self.val_ex, n, st.doc_stride, st.max_query_length, training=False)
        self.pad, self.eval_batch_size, self.n_windows = special_ids(tok).pad, cfg.data.eval_batch_size, len(feats)
        log.info("fine-tuning %s on %d questions (%d windows)%s", cfg.model, len(self.train_ex) - self.skipped,
                 len(feats), validating(len(self.val_ex), f"questions ({len(self.val_feats)} windows)"))
        return feats, lambda fs: pad_batch(fs, self.pad, ("start_positions", "end_positions"))

    def evaluate(self, model, device):
        s, e = qa_logits(model, self.val_feats, self.pad, device, self.eval_batch_size)
        preds, _ = postprocess(self.val_ex, self.val_feats, s, e, self.settings.n_best, self.settings.max_answer_length)
        return squad_evaluate(self.val_data, preds), preds

    def unlearnt(self, metrics, artifacts) -> str | None:
        if getattr(self, "chance", None) is None:  # each question answered with its context's first words, as
            # many as the training answers' median: what a reader that learnt nothing of the questions can match
            lengths = sorted(len(ex.answers[0]["text"].split()) for ex in self.train_ex if ex.answers)
            self.first_words = max(1, lengths[len(lengths) // 2]) if lengths else 1
            self.chance = squad_evaluate(self.val_data, {ex.id: " ".join(ex.context.split()[: self.first_words])
                                                         for ex in self.val_ex})["f1"]
        if metrics["f1"] <= self.chance:
            return (f"its F1 on the {len(self.val_ex)} validation questions, {metrics['f1']:.1f}, is no better than "
                    f"the {self.chance:.1f} of answering each with the first {self.first_words} word(s) of its "
                    "context")
        return None

    def eval_size(self) -> int:
        return len(self.val_feats)

    def eval_tokens(self) -> int:
        return sum(len(f["input_ids"]) for f in self.val_feats)

    def write_outputs(self, folder: str, preds) -> dict:
        with open(os.path.join(folder, "predictions.json"), "w", encoding="utf-8") as f:
            json.dump(preds, f, indent=1, ensure_ascii=False)
        return {}

    def reference_difference(self, ours, theirs, batch: dict) -> float:
        o, h, real = ours(**batch), theirs(**batch), batch["attention_mask"].bool()
        return max(float((x[real].float() - y[real].float()).abs().max())
                   for x, y in ((o.start_logits, h.start_logits), (o.end_logits, h.end_logits)))

    def train_figures(self) -> dict:
        return {"train_questions": len(self.train_ex) - self.skipped, "skipped_train_questions": self.skipped,
                "train_windows": self.n_windows}


def evaluate_squad_model(path: str, data: str, task: SquadConfig, max_seq_length: int | None = None,
                         batch_size: int = 64, device: str = "auto", predictions_out: str | None = None) -> dict:
    """``bertforge evaluate squad --model``: official EM/F1 of a saved QA model on a SQuAD file."""
    model_class, config = for_folder(model_dir(path), BertForQuestionAnswering)
    max_seq_length = check_max_seq_length(config, max_seq_length, path, default=MAX_SEQ_LENGTH)
    examples, data_list = read_examples(data)
    refuse_other_head(path, model_class, config)
    head = model_class.head_weight
    m = load_for_inference(path, model_class, device, config,
                           head=(head, f"{path} has no trained question-answering head ({head.split('.')[0]})"))
    preds, _ = predict_answers(m.model, m.tokenizer, examples, task, max_seq_length, m.device, batch_size)
    if predictions_out:
        atomic_write_text(predictions_out, json.dumps(preds, indent=1, ensure_ascii=False))
    return squad_evaluate(data_list, preds)


def _run_kept_first(predictions: str) -> int | None:
    """The ``--max-eval-samples`` of the fine-tuning run whose folder holds ``predictions`` (None: none, or no
    such run)."""
    saved = json_object_or_none(os.path.join(os.path.dirname(os.path.abspath(predictions)), "finetune_config.json"))
    value = (((saved or {}).get("finetune") or {}).get("data") or {}).get("max_eval_examples")
    return value if isinstance(value, int) else None


def evaluate_predictions_file(data: str, predictions: str) -> dict:
    """``bertforge evaluate squad --data FILE --predictions FILE``: the official v1.1 evaluation."""
    _, data_list = read_examples(data)
    preds = read_json(predictions, "predictions file")
    if not isinstance(preds, dict) or not all(isinstance(v, str) for v in preds.values()):
        raise UserError(f"{predictions}: expected a JSON object {{question id: answer text}}")
    ids = [str(qa["id"]) for a in data_list for p in a["paragraphs"] for qa in p["qas"] if qa.get("answers")]
    n = len(preds)
    if 0 < n < len(ids) and set(preds) == set(ids[:n]) and _run_kept_first(predictions) == n:
        log.warning("the predictions of %s cover the first %d of the %d questions of %s (the run's "
                    "--max-eval-samples %d): scored over those %d", predictions, n, len(ids), data, n, n)
        first = set(ids[:n])
        data_list = [{**a, "paragraphs": [{**p, "qas": [qa for qa in p["qas"] if str(qa["id"]) in first]}
                                          for p in a["paragraphs"]]} for a in data_list]
        return {**squad_evaluate(data_list, preds), "questions_in_data": len(ids)}
    res = squad_evaluate(data_list, preds)
    if res["unanswered"] * 2 > res["questions"]:  # (scored as wrong, as the official script does)
        log.warning("%d of the %d questions of %s have no prediction in %s: another data file's predictions?",
                    res["unanswered"], res["questions"], data, predictions)
    return res


@checked(batch_size=1)
def evaluate_squad(data: str | os.PathLike, predictions: str | os.PathLike | None = None,
                   model: str | os.PathLike | None = None, max_seq_length: int | None = None, batch_size: int = 64,
                   device: str = "auto", write_predictions: str | os.PathLike | None = None, overwrite: bool = False,
                   **settings: Any) -> dict:
    """``bertforge evaluate squad``: official SQuAD v1.1 exact match and F1 of a predictions file, or of a
    fine-tuned question-answering model's predictions (``max_seq_length`` by default 384, or the model's
    positions when it has fewer)."""
    from ..outputs import check_output_file

    if bool(predictions) == bool(model):
        raise UserError("give --predictions FILE or --model DIR (one of them)")
    data = os.fspath(data)
    predictions, write_predictions = (os.fspath(p) if p else p for p in (predictions, write_predictions))
    if predictions:
        return evaluate_predictions_file(data, predictions)
    if write_predictions:
        check_output_file(write_predictions, overwrite, "--write-predictions", inputs=(data,))
    cfg = given_settings(SquadConfig(), settings, "evaluate_squad's settings")
    return evaluate_squad_model(os.fspath(model), data, cfg, max_seq_length, batch_size, device, write_predictions)


# ------------------------------------------------------------------------------------------------ pipeline
class QAPipeline(Pipeline):
    task = "qa"
    model_class = BertForQuestionAnswering
    head = ("question-answering head (qa_outputs)", "fine-tune it with bertforge finetune squad")

    def _check(self, config: BertConfig) -> None:
        refuse_other_head(self.dir, head_class(config, self.model_class), config)

    @checked(max_seq_length=3, top_k=1)
    def __call__(self, *inputs: Any, question: str | list[str] | None = None, context: str | list[str] | None = None,
                 examples: list | None = None, squad: SquadConfig | None = None, max_seq_length: int = MAX_SEQ_LENGTH,
                 top_k: int = 1) -> Any:
        """The calls of transformers' question-answering pipeline: ``qa(question, context)``,
        ``qa(question=..., context=...)`` or ``qa({"question": ..., "context": ...})`` give ``{"answer",
        "score" (the answer's probability), "start", "end" (character offsets in the context)}``, or with
        ``top_k`` above 1 a list of up to ``top_k`` of them, the best first; lists of questions (with a context
        each, or one for all) or a list of such dicts give a list of them.  ``examples``, a list of
        :class:`~bertforge.tasks.squad.Example`, gives ``{id: answer}``."""
        squad = squad or SquadConfig()
        if examples is not None:
            if inputs or question is not None or context is not None:
                raise UserError("give examples, or questions and contexts, not both")
            for i, ex in enumerate(examples):
                require_type(ex, Example, f"examples[{i}]")
            answers = self._answer(examples, squad, max_seq_length, 1, whole=False)  # (as evaluation scores them)
            return {k: rows[0]["answer"] for k, rows in answers.items()}
        pairs, single = _qa_inputs(inputs, question, context)
        examples = [Example(str(i), q, c, []) for i, (q, c) in enumerate(pairs)]
        answers = self._answer(examples, squad, max_seq_length, top_k)
        res = [answers[ex.id] if top_k > 1 else answers[ex.id][0] for ex in examples]
        return res[0] if single else res

    def _answer(self, examples: list, squad: SquadConfig, max_seq_length: int, top_k: int,
                whole: bool = True) -> dict[str, list]:
        """{id: [{"answer", "score", "start", "end"}, ...]}, the ``top_k`` best of each of ``examples``, the
        answers widened to whole words where ``whole``.  The windows overlap by ``doc_stride`` as in evaluation
        where every window has room for it beside the longest question, else by a quarter window."""
        max_len = min(max_seq_length, self.max_length)
        fits = squad.doc_stride < max_len - squad.max_query_length - 3
        feats, _ = build_features(self.tok, examples, max_len, squad.doc_stride if fits else max_len // 4,
                                  squad.max_query_length, training=False)
        s, e = qa_logits(self.model, feats, self.sp.pad, self.device, self.batch_size)
        ranked: dict = {}
        postprocess(examples, feats, s, e, squad.n_best, squad.max_answer_length, ranked=ranked, top_k=top_k)
        found = {}
        for ex in examples:  # whole words, as transformers' QA pipeline gives them (SQuAD scoring keeps the spans)
            found[ex.id] = []
            for score, span in ranked[ex.id]:
                a, b = whole_words(ex.context, *span) if whole else span
                found[ex.id].append({"answer": ex.context[a:b] if a >= 0 else "", "score": score, "start": a,
                                     "end": b})
        return found




def _qa_inputs(inputs: tuple, question, context) -> tuple[list[tuple[str, str]], bool]:
    """((question, context) pairs, whether one question was asked) of a question-answering call, each checked:
    two strings, ``question=`` and ``context=`` (strings, lists, or a list of questions and one context for
    all, as transformers allows), a ``{"question", "context"}`` dict or a list of them."""
    if inputs and (question is not None or context is not None):
        raise UserError("give the question and context as arguments or as question= and context=, not both")
    if len(inputs) == 2:
        question, context = inputs
    elif len(inputs) == 1 and isinstance(inputs[0], (dict, list, tuple)):
        single = isinstance(inputs[0], dict)
        items = [inputs[0]] if single else list(inputs[0])
        for i, item in enumerate(items):
            where = "the input" if single else f"input[{i}]"
            if not isinstance(item, dict) or set(item) != {"question", "context"}:
                raise UserError(f"{where} must be a dict of 'question' and 'context', not {shown(item)}")
        return [_qa_pair(d["question"], d["context"], "" if single else f"[{i}]") for i, d in enumerate(items)], single
    elif inputs:
        raise UserError(f"qa takes a question and a context, question= and context=, or a dict of them or a list "
                        f"of dicts, not {shown(inputs)}")
    require_type(question, str | list[str], "question")
    require_type(context, str | list[str], "context")
    single = isinstance(question, str)
    if isinstance(context, str) and not single:
        context = [context] * len(question)
    questions, contexts = paired(question, context, "context")
    return [_qa_pair(q, c, "" if single else f"[{i}]") for i, (q, c) in enumerate(zip(questions, contexts))], single


def _qa_pair(question, context, where: str) -> tuple[str, str]:
    """(question, context), refused when either is no string or holds no text."""
    for name, v in (("question", question), ("context", context)):
        require_type(v, str, f"{name}{where}")
        if not v.strip():
            raise UserError(f"{name}{where} is empty" + ("; qa needs a text to find the answer in"
                                                          if name == "context" else ""))
    return question, context


def whole_words(context: str, start: int, end: int) -> tuple[int, int]:
    """The span [start, end) of ``context`` widened to whole words where it cuts one (subword tokens can
    start or end inside a word: "##ing"); (-1, -1) stays as it is."""
    if start < 0 or end <= start:
        return start, end
    while start > 0 and context[start - 1].isalnum() and context[start].isalnum():
        start -= 1
    while end < len(context) and context[end].isalnum() and context[end - 1].isalnum():
        end += 1
    return start, end
