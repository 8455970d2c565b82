"""``bertforge demo``: the whole of BERT end to end on the built-in corpus, in minutes, with no data to fetch.

Generated stories -> a word-level (or WordPiece) vocabulary -> pretraining of a tiny BERT (masked LM, then
masked LM and next sentence prediction) -> sentiment fine-tuning of every parameter, from the pretrained
model and, as a baseline, from random initialisation -> evaluation on held-out data, sample predictions,
plots and a report.  It runs the same engine and commands as real runs (``run_pretraining``,
``run_finetuning``, ``pipeline``): no separate toy code.

The sentiment sentences for validation and test use adjectives that the labelled ones never do, so only what
pretraining learned from the stories can tell the classifier their mood.  The stages are as they are so that
a model this small learns that at every seed, in ``--quick``'s budget too:

* pretraining runs in two stages of the same engine, a departure from BERT (which trains MLM and NSP together
  from the first step): stage 1 trains masked LM alone on running text (``--no-nsp``), and stage 2 continues
  from its weights (``--init``) with masked LM and next sentence prediction on sentence pairs.  With NSP from
  the first step, its loss and its pairs keep a tiny model to the stories' templates, not what words mean;
* stage 1 masks more of shorter sequences at a higher learning rate, so that a sentence and its neighbours
  tell what a masked adjective means;
* the stories put a word of the mood right before two of the three adjectives ("very splendid", "quite
  dismal"; never in a labelled sentence), and the model starts from weights wider than BERT's
  (``INIT_RANGE``), with which it learns the templates, and then the moods, sooner.

The measurements behind each choice are in docs/log/demo.md.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace

import torch

from ..config import PretrainConfig
from ..corpus import iter_texts
from ..models import BertConfig, BertForPreTraining
from ..outputs import Output, register_output, remove_output, write_marker
from ..predict import pipeline
from ..tasks.classify import ClassifyConfig
from ..tasks.classify import ClassificationTask, evaluate_classifier_model
from ..tokenizer import save_tokenizer, train_vocabulary
from ..train.finetune import finetune
from ..train.pretrain import pretrain
from .corpus import generate_stories, write_sentiment, write_story_corpus

log = logging.getLogger("bertforge")
# what a demo folder holds (its --overwrite replaces nothing else)
register_output("demo", {"data", "cache", "pretrained", "scratch-init", "sentiment-pretrained", "sentiment-scratch",
                         "pretrained-mlm", "summary.json", "metrics.json", "samples.json", "report.md", "report.html",
                         "results.png"})


@dataclass
class DemoSettings:
    stories: int = 3000
    mlm_steps: int = 700  # stage 1: masked LM alone, on running text
    nsp_steps: int = 300  # stage 2: masked LM and next sentence prediction, from stage 1's weights
    batch_size: int = 64
    lr: float = 3e-3  # stage 1
    mlm_mask_prob: float = 0.3  # stage 1 (stage 2 masks BERT's 15%)
    mlm_seq_length: int = 32  # stage 1's sequences: a sentence and its neighbours tell what an adjective means
    nsp_lr: float = 1e-3
    nsp_seq_length: int = 64  # stage 2's sequences
    finetune_epochs: int = 20
    finetune_lr: float = 2e-4
    dropout: float = 0.0  # short runs learn faster without dropout (as cramming found)
    freeze_embeddings: bool = False  # BERT fine-tunes every parameter; True keeps the word embeddings as pretrained
    seed: int = 0

    @classmethod
    def quick(cls) -> DemoSettings:
        # fewer stories and steps, and stage 2 in 32-token sequences too (a segment of one or two sentences is
        # enough to tell the next one)
        return cls(stories=2000, mlm_steps=450, nsp_steps=100, nsp_seq_length=32, finetune_epochs=10)


INIT_RANGE = 0.05  # BERT's 0.02 learns the stories' words and templates slower (see the module docstring)


def _model_config(vocab_size: int, dropout: float) -> str:
    """The demo's tiny BERT: 2 layers, hidden 128, 4 heads, 64 positions, initialised with standard deviation
    ``INIT_RANGE``; ``dropout`` in pretraining and fine-tuning alike."""
    config = BertConfig.preset("tiny", vocab_size=vocab_size, num_attention_heads=4, max_position_embeddings=64,
                               hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                               initializer_range=INIT_RANGE)
    return json.dumps(config.to_dict(["BertForPreTraining"]))


def run_demo(out: str = "demo-output", quick: bool = False, wordpiece: bool = False, progress: bool = False,
             settings: DemoSettings | None = None, seed: int | None = None) -> dict:
    """Run the demo into ``out``; return the summary: the figures (also in ``out/metrics.json``, fractions)
    and the sample predictions (``out/samples.json``).  ``seed`` sets the corpus, initialisation and data order."""
    s = settings or (DemoSettings.quick() if quick else DemoSettings())
    if seed is not None:
        s = replace(s, seed=seed)
    with Output(out, "demo", overwrite=True) as output:  # the demo replaces its own earlier output, nothing else
        if output.replace:
            remove_output(out, "demo")
        return _run_demo(out, s, wordpiece, progress)


def _run_demo(out: str, s: DemoSettings, wordpiece: bool, progress: bool) -> dict:
    t_start = time.perf_counter()
    os.makedirs(out, exist_ok=True)
    write_marker(out, "demo")
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)

    # 1. corpus and vocabulary
    stories = write_story_corpus(os.path.join(data, "stories.jsonl"), s.stories, seed=s.seed)
    senti = write_sentiment(data, seed=s.seed)
    kind = "wordpiece" if wordpiece else "wordlevel"
    tok = train_vocabulary(iter_texts([stories]), 1000 if wordpiece else 2000, kind=kind, min_frequency=1)
    tok_dir = os.path.join(data, "tokenizer")
    save_tokenizer(tok, tok_dir, model_max_length=64)
    model_cfg = os.path.join(data, "model_config.json")
    with open(model_cfg, "w", encoding="utf-8") as f:
        f.write(_model_config(tok.get_vocab_size(), s.dropout))
    log.info("demo: %d stories, %s vocabulary of %d tokens", s.stories, kind, tok.get_vocab_size())

    # 2. pretraining, with the engine of real runs, in two stages: masked LM alone first (NSP from the first
    # step keeps a tiny model from learning what words mean: see the module docstring), then MLM + NSP
    t0 = time.perf_counter()
    stage1 = os.path.join(out, "pretrained-mlm")
    common = {"data": [stories], "tokenizer": tok_dir, "max_seq_length": 64, "batch_size": s.batch_size,
              "log_every": 10, "seed": s.seed, "progress": progress, "warmup_ratio": 0.06,
              "cache_dir": os.path.join(out, "cache")}
    stage1_metrics = pretrain(_stage(common, out=stage1, nsp=False, model_config=model_cfg, lr=s.lr,
                                     max_steps=s.mlm_steps, mask_prob=s.mlm_mask_prob,
                                     max_seq_length=s.mlm_seq_length))
    cfg = _stage(common, out=os.path.join(out, "pretrained"), nsp=True, init=stage1, lr=s.nsp_lr,
                 max_steps=s.nsp_steps, max_seq_length=s.nsp_seq_length)
    pre = pretrain(cfg)
    pretrain_seconds = time.perf_counter() - t0

    # 3. sentiment: fine-tuned from the pretrained model, and from random initialisation
    scratch_init = os.path.join(out, "scratch-init")
    torch.manual_seed(s.seed)
    BertForPreTraining(BertConfig.load(cfg.out)).save_pretrained(scratch_init, tokenizer=tok)
    results = {}
    for name, init in (("pretrained", cfg.out), ("scratch", scratch_init)):
        if name == "scratch":
            log.info("the control: the same classifier from random weights, which should learn nothing of the "
                     "held-out sentences' adjectives (they appear only in the unlabelled stories)")
        ft = ClassificationTask.config(
            model=init, train_file=senti["train"], validation_file=senti["validation"],
            out=os.path.join(out, f"sentiment-{name}"), epochs=s.finetune_epochs, lr=s.finetune_lr, batch_size=16,
            max_seq_length=64, seed=s.seed, progress=progress, freeze_embeddings=s.freeze_embeddings)
        finetune(ClassificationTask(ClassifyConfig()), ft)
        results[name] = evaluate_classifier_model(ft.out, senti["test"], ClassifyConfig(), max_seq_length=64)
    shutil.rmtree(scratch_init, ignore_errors=True)
    shutil.rmtree(os.path.join(out, "cache"), ignore_errors=True)

    # 4. samples on held-out text: stories from another seed, never seen in training
    samples = _samples(cfg.out, s.seed)
    metrics = {
        "mlm_accuracy": pre["mlm_accuracy"],  # held-out stories, as pretraining's stage 2 saw them (sentence pairs)
        "mlm_baseline": pre["mlm_baseline_accuracy"],  # the most frequent token
        "mlm_accuracy_stage1": stage1_metrics["mlm_accuracy"],  # after stage 1, on running text
        "nsp_accuracy": pre["nsp_accuracy"],
        "nsp_baseline": 0.5,  # majority class
        "sentiment_accuracy": results["pretrained"]["accuracy"],
        "sentiment_accuracy_no_pretraining": results["scratch"]["accuracy"],
        "sentiment_baseline": 0.5,  # majority class
        "pretrain_steps": [s.mlm_steps, s.nsp_steps],  # stage 1, stage 2
        "pretrain_seconds": pretrain_seconds,
        "seconds": time.perf_counter() - t_start,
        "seed": s.seed,
        "tokenizer": kind,
        "settings": asdict(s),
    }
    for name, content in (("metrics.json", metrics), ("samples.json", samples)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(content, f, indent=2)
    summary = {**metrics, "samples": samples}
    _comparison_plot(summary, os.path.join(out, "results.png"))
    _report(out, summary)
    return summary


def _stage(common: dict, **flat) -> PretrainConfig:
    """One pretraining stage: the `--recipe bert` settings (80/10/10 masking, Adam beta2 0.999, clipping 1.0) under
    the demo's own (steps, learning rate, masking rate, sequence length)."""
    cfg = PretrainConfig.for_recipe("bert")
    cfg.out = flat.pop("out")
    steps = flat["max_steps"]
    cfg.update_flat({**common, **flat, "eval_every": max(20, steps // 4), "save_every": steps})
    return cfg


def _samples(model_dir: str, seed: int) -> dict:
    """Fill-mask and next-sentence verdicts on stories from another seed (never seen in training)."""
    rng = random.Random(seed + 99)
    stories = generate_stories(8, seed=seed + 12345)
    fill = []
    for story in stories[:4]:
        # the destination of the outing, and how the hero took what he found (the mood of the adjective before)
        for sent, pick in ((story[1], lambda w: w[-4]), (story[3], lambda w: w[-1])):
            words = sent.rstrip(".").split()
            target = pick(words)
            i = len(words) - 1 - words[::-1].index(target)
            fill.append((" ".join(words[:i] + ["[MASK]"] + words[i + 1 :]) + ".", target.strip(",").lower()))
    fm = pipeline("fill-mask", model_dir)([m for m, _ in fill], top_k=5)
    fill_rows = [{"text": m, "answer": a, "top5": [(c["token_str"], round(c["score"], 3)) for c in r]}  # one [MASK]
                 for (m, a), r in zip(fill, fm)]
    pairs = []
    for i, story in enumerate(stories[:6]):
        a = " ".join(story[:3])
        if i % 2 == 0:
            b, truth = " ".join(story[3:5]), "IsNext"
        else:  # as in pretraining: another story, from a random sentence on
            other = stories[6 + (i // 2) % 2]  # the negatives (odd i) alternate between stories 6 and 7
            j = rng.randrange(len(other) - 1)
            b, truth = " ".join(other[j : j + 2]), "NotNext"
        pairs.append((a, b, truth))
    ns = pipeline("next-sentence", model_dir)([p[0] for p in pairs], [p[1] for p in pairs])
    nsp_rows = [{"a": a, "b": b, "truth": t, "verdict": r["label"], "p_is_next": round(r["is_next"], 3)}
                for (a, b, t), r in zip(pairs, ns)]
    return {"fill_mask": fill_rows, "next_sentence": nsp_rows}


def _comparison_plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        ("MLM accuracy\n(held-out)", summary["mlm_accuracy"], summary["mlm_baseline"], "most frequent token"),
        ("NSP accuracy\n(held-out)", summary["nsp_accuracy"], summary["nsp_baseline"], "majority class"),
        ("sentiment accuracy\n(test, unseen adjectives)", summary["sentiment_accuracy"],
         summary["sentiment_accuracy_no_pretraining"], "same classifier, no pretraining"),
    ]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = range(len(groups))
    ax.bar([i - 0.2 for i in x], [g[1] for g in groups], 0.4, label="bertforge tiny BERT", color="#3b6ea8")
    ax.bar([i + 0.2 for i in x], [g[2] for g in groups], 0.4, label="baseline", color="#bbbbbb")
    for i, g in enumerate(groups):
        ax.text(i - 0.2, g[1] + 0.01, f"{g[1]:.0%}", ha="center", fontsize=9)
        ax.text(i + 0.2, g[2] + 0.01, f"{g[2]:.0%}\n{g[3]}", ha="center", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels([g[0] for g in groups], fontsize=9)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("bertforge demo: held-out results against their baselines")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_lines(s: dict, out: str) -> list[str]:
    lines = [
        "",
        "bertforge demo: results on held-out data",
        f"  MLM accuracy        {s['mlm_accuracy']:6.1%}   (most frequent token: {s['mlm_baseline']:.1%})",
        f"  NSP accuracy        {s['nsp_accuracy']:6.1%}   (majority class: {s['nsp_baseline']:.0%})",
        f"  sentiment accuracy  {s['sentiment_accuracy']:6.1%}   "
        f"(no pretraining: {s['sentiment_accuracy_no_pretraining']:.1%};"
        f" majority class: {s['sentiment_baseline']:.0%})",
        "",
        "fill-mask (top 5):",
    ]
    for r in s["samples"]["fill_mask"]:
        lines.append(f"  {r['text']}   [answer: {r['answer']}]")
        lines.append("     " + "  ".join(f"{t} {p:.2f}" for t, p in r["top5"]))
    lines.append("next sentence:")
    for r in s["samples"]["next_sentence"]:
        lines.append(f"  A: {r['a']}")
        lines.append(f"  B: {r['b']}")
        lines.append(f"     -> {r['verdict']} (P(IsNext) {r['p_is_next']:.2f}; truth: {r['truth']})")
    lines += [
        "",
        f"pretraining: {s['pretrain_steps'][0]} steps of masked LM, then {s['pretrain_steps'][1]} of masked LM "
        "and NSP, "
        f"in {s['pretrain_seconds']:.0f}s; whole demo {s['seconds']:.0f}s",
        f"report: {os.path.join(out, 'report.md')} (and report.html); plots in {out}/*/plots and {out}/results.png",
    ]
    return lines


def _report(out: str, s: dict) -> None:
    images = [
        ("Held-out results against baselines", "results.png"),
        ("Pretraining, stage 1 (masked LM): loss", "pretrained-mlm/plots/loss.png"),
        ("Pretraining, stage 1 (masked LM): accuracy (held-out)", "pretrained-mlm/plots/accuracy.png"),
        ("Pretraining, stage 2 (masked LM and NSP): loss", "pretrained/plots/loss.png"),
        ("Pretraining, stage 2 (masked LM and NSP): accuracy (held-out)", "pretrained/plots/accuracy.png"),
        ("Sentiment fine-tuning from the pretrained model", "sentiment-pretrained/plots/metrics.png"),
        ("Sentiment fine-tuning from random initialisation", "sentiment-scratch/plots/metrics.png"),
    ]
    body = "\n".join(summary_lines(s, out)[1:-1])
    md = [
        "# bertforge demo report",
        "",
        "A tiny BERT (2 layers, hidden 128, 4 heads, 64 tokens) pretrained with masked language modelling and",
        "next sentence prediction on generated stories, then fine-tuned for sentiment on 200 labelled sentences",
        "whose 12 adjectives differ from the 36 of the validation and test sentences: only pretraining tells the",
        "model which adjectives are happy and which are sad.  Pretraining runs in two stages: masked language",
        "modelling alone, then masked language modelling with next sentence prediction (next sentence prediction",
        "from the first step keeps a model this small from learning what words mean in this budget).  Both",
        "classifiers (from the pretrained model and from random initialisation) fine-tune every parameter.",
        "",
        "```",
        body,
        "```",
        "",
    ]
    page = ["<html><head><meta charset='utf-8'><title>bertforge demo report</title></head>"
            "<body style='font-family:sans-serif;max-width:900px'>",
            "<h1>bertforge demo report</h1>", f"<pre>{html.escape(body, quote=False)}</pre>"]
    for title, rel in images:
        path = os.path.join(out, rel)
        if not os.path.isfile(path):
            continue
        md += [f"## {title}", "", f"![{title}]({rel})", ""]
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode()
        page.append(f"<h2>{title}</h2><img src='data:image/png;base64,{data}' style='max-width:100%'>")
    page.append("</body></html>")
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md))
    with open(os.path.join(out, "report.html"), "w", encoding="utf-8") as f:
        f.write("\n".join(page))
