"""The fine-tuning runner (finetune.py): steps, accumulation, evaluation every N steps, the few-updates warning."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertforge.checkpoint import list_checkpoints
from bertforge.cli import main
from bertforge.tokenizer import train_vocabulary


ROWS = [("good fun day", "pos"), ("bad sad mess", "neg"), ("a fine good show", "pos"), ("a dull bad show", "neg"),
        ("fun and good", "pos"), ("sad and dull", "neg"), ("very good", "pos"), ("very bad mess", "neg")] * 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_setup(tmp_path_factory.mktemp("ft"))


def write_setup(d):
    """Labelled rows in ``d``, and two tiny models on their words: without dropout, and with it."""
    (d / "t.jsonl").write_text("".join(json.dumps({"text": a, "label": b}) + "\n" for a, b in ROWS))
    tok = train_vocabulary([r[0] for r in ROWS], 40, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)  # no dropout: split and whole batches then make the same update
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    BertForPreTraining(cfg).save_pretrained(str(d / "model"), tokenizer=tok)
    torch.manual_seed(1)  # and one with dropout, whose masks a resumed run must draw as the uninterrupted one
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    BertForPreTraining(cfg).save_pretrained(str(d / "dropout-model"), tokenizer=tok)
    return d


def _args(d, out, *extra, model="model") -> list[str]:
    return ["--quiet", "finetune", "classify", "--model", str(d / model), "--train", str(d / "t.jsonl"), "--validation",
            str(d / "t.jsonl"), "--out", str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", *extra]


def _run(d, out, *extra) -> dict:
    args = ["--quiet", "finetune", "classify", "--model", str(d / "model"), "--train", str(d / "t.jsonl"), "--validation",
            str(d / "t.jsonl"), "--out", str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", *extra]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


def _weights(out) -> dict:
    return load_file(out / "model.safetensors")


def test_gradient_accumulation_makes_the_update_of_the_whole_batch(setup, tmp_path, capsys):
    # 16 examples in batches of 6: the last batch of each epoch holds 4, split in micro-batches too
    whole = _run(setup, tmp_path / "a1", "--batch-size", "6", "--epochs", "2")
    split = _run(setup, tmp_path / "a4", "--batch-size", "6", "--epochs", "2", "--grad-accum", "3")
    smaller = _run(setup, tmp_path / "b2", "--batch-size", "2", "--epochs", "2")  # what accumulation must not be
    a, b, c = _weights(tmp_path / "a1"), _weights(tmp_path / "a4"), _weights(tmp_path / "b2")
    assert all(torch.allclose(a[k], b[k], atol=2e-5, rtol=1e-4) for k in a)
    assert not all(torch.allclose(a[k], c[k], atol=2e-5, rtol=1e-4) for k in a)
    assert whole["epochs"][-1]["step"] == split["epochs"][-1]["step"] == 6 and smaller["epochs"][-1]["step"] == 16
    capsys.readouterr()


def test_max_steps_and_evaluation_every_n_steps(setup, tmp_path, capsys):
    m = _run(setup, tmp_path / "o", "--batch-size", "4", "--max-steps", "7", "--eval-every", "3")
    # 4 steps per epoch: evaluations at step 3, the end of epoch 1 (4), step 6 and the last step (7)
    assert [(e["epoch"], e["step"]) for e in m["epochs"]] == [(1, 3), (1, 4), (2, 6), (2, 7)]
    best = max(m["epochs"], key=lambda e: e["accuracy"])
    assert (m["best_step"], m["accuracy"]) == (best["step"], best["accuracy"])
    rows = [json.loads(x) for x in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in rows if r["type"] == "train") == 7
    card = (tmp_path / "o" / "README.md").read_text()
    assert "7 steps" in card and f"step {m['best_step']}" in card
    # the kept weights are the best evaluation's: evaluating them again gives its accuracy
    assert main(["evaluate", "classify", "--model", str(tmp_path / "o"), "--data", str(setup / "t.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["accuracy"] == pytest.approx(best["accuracy"])


def test_few_updates_are_warned_and_a_batch_that_accumulation_cannot_split_refused(setup, tmp_path, capsys):
    m = _run(setup, tmp_path / "o", "--batch-size", "8", "--epochs", "1")
    assert "only 2 optimizer updates" in capsys.readouterr().err
    assert [w for w in m["warnings"] if "only 2 optimizer updates" in w and w.endswith("raise --epochs")]
    assert m["warnings"][0] in (tmp_path / "o" / "README.md").read_text()  # the card says it too
    args = ["finetune", "classify", "--model", str(setup / "model"), "--train", str(setup / "t.jsonl"), "--validation",
            str(setup / "t.jsonl"), "--out", str(tmp_path / "p"), "--batch-size", "4", "--grad-accum", "8", "--no-progress"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == "error: --batch-size 4 must be a positive multiple of --grad-accum 8"
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_a_run_whose_model_learnt_nothing_says_so(setup, tmp_path, capsys):
    # a learning rate that leaves the new head as it starts: one class for every validation example
    m = _run(setup, tmp_path / "o", "--batch-size", "8", "--epochs", "1", "--lr", "1e-9")
    said = [w for w in m.get("warnings", []) if w.startswith("the model learnt nothing")]
    assert len(said) == 1 and "validation examples 'pos'" in said[0] and "smaller --batch-size" in said[0]
    assert said[0] in capsys.readouterr().err.replace("\n", " ")
    assert said[0] in (tmp_path / "o" / "README.md").read_text()
    learnt = _run(setup, tmp_path / "p", "--batch-size", "2", "--epochs", "3", "--lr", "1e-3")
    assert learnt["accuracy"] > 0.5 and not any("learnt nothing" in w for w in learnt.get("warnings", []))


def test_what_shows_that_a_model_learnt_nothing(tmp_path):
    """A classifier no better than the training data's most frequent label, a tagger that gives every token one
    tag (not only O), a reranker no better than a random order of its first stage's passages, a reader no better
    than the first words of each context, embeddings no better than a random order of the passages, and a run whose every evaluation after its first shows it (the first, kept, scored a little
    by near-random predictions) are warned; the advice of a run counted in steps is more steps."""
    from types import SimpleNamespace

    import numpy as np

    from bertforge.tasks import ClassificationTask, NerTask
    from bertforge.train.finetune import EpochResult, FineTuning

    c = object.__new__(ClassificationTask)
    c.labels, c.y_train, c.y_val = ["neg", "pos"], np.array([0, 0, 0, 1]), np.array([0, 0, 0, 0, 1, 1])
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.1, 0.9], [0.1, 0.9], [0.9, 0.1], [0.9, 0.1]])  # 2 of 6 right
    said = c.unlearnt({}, probs)
    assert said.startswith("its accuracy 0.333 and macro-F1 0.250 are no better than the 0.667 and 0.400 of giving "
                           "every validation example the training data's most frequent label, 'neg'"), said
    # less accurate than the majority, but it finds the rare class: it learnt
    c.y_val = np.array([0] * 18 + [1] * 2)
    guess = np.array([0] * 16 + [1] * 2 + [1] * 2)  # 18 of 20 right, as the majority; both rare ones found
    assert c.unlearnt({}, np.eye(2)[guess]) is None
    assert c.unlearnt({}, np.eye(2)[np.array([0] * 15 + [1] * 3 + [0] * 2)]) is not None  # 15 right, none rare
    n = object.__new__(NerTask)
    n.val = [SimpleNamespace(tags=["O", "B-loc"]), SimpleNamespace(tags=["O"])]
    assert n.unlearnt({}, [["B-loc", "B-loc"], ["B-loc"]]) == "it tags every token of the 2 validation sentences B-loc"
    assert "no entity" in n.unlearnt({}, [["O", "O"], ["O"]])
    assert n.unlearnt({"f1": 0.5}, [["O", "B-loc"], ["O"]]) is None
    # a stray tag, not one entity found
    assert n.unlearnt({"f1": 0.0}, [["B-loc", "O"], ["O"]]) == ("it finds none of the entities of the 2 validation "
                                                                "sentences (entity F1 0)")
    n.val = [SimpleNamespace(tags=["O", "O"]), SimpleNamespace(tags=["O"])]  # no entity to find: it cannot tell
    assert n.unlearnt({"f1": 0.0}, [["O", "O"], ["O"]]) is None

    task = SimpleNamespace(select="f1", unlearnt=lambda metrics, artifacts: artifacts)
    first = EpochResult(1, 4, {"f1": 0.019}, None, None)
    later = [EpochResult(e, 4 * e, {"f1": 0.0}, "it tags no entity", "it tags no entity") for e in (2, 3)]
    run = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(max_steps=None, max_time=None, batch_size=8)),
                          task=task, best=first, history=[first, *later], total=12,
                          engine=SimpleNamespace(state=SimpleNamespace(step=12)))
    said = FineTuning.unlearnt(run)
    assert said.startswith("after its first evaluation the model learnt nothing more: it tags no entity (evaluations "
                           "2-3); the model kept is the first's (f1 0.019)") and "smaller --batch-size" in said
    run.history[1] = EpochResult(2, 8, {"f1": 0.4}, None, None)  # it learnt, then lost it: not this warning
    assert FineTuning.unlearnt(run) is None
    run.best, run.cfg.train.max_steps = later[0], 12
    assert "try more --max-steps or another --lr" in FineTuning.unlearnt(run)
    # stopped by the clock after 5 of its 12 updates: it counts the updates made and asks for more time
    run.cfg.train.max_time, run.engine.state.step = 60.0, 5
    assert "(the best of 3 evaluation(s), 5 updates of batch 8); try a longer --max-time (it made 5 of its 12 " \
        "updates) or another --lr" in FineTuning.unlearnt(run)
    # a tie: the same figure from a model that learnt beats a best that learnt nothing; not the other way round
    run.best, run.history = later[0], [later[0]]
    assert FineTuning.better(run, EpochResult(3, 12, {"f1": 0.0}, None, None))
    assert not FineTuning.better(run, EpochResult(3, 12, {"f1": 0.0}, None, "it tags no entity"))
    run.best = first
    assert not FineTuning.better(run, EpochResult(3, 12, {"f1": 0.019}, None, None))
    assert FineTuning.better(run, EpochResult(3, 12, {"f1": 0.02}, None, None))
    # a model that learnt beats one that learnt nothing whatever their figures: every example given the
    # validation set's most frequent label can be the more accurate
    assert not FineTuning.better(run, EpochResult(3, 12, {"f1": 0.02}, None, "it tags no entity"))
    run.best = EpochResult(2, 8, {"f1": 0.70}, None, "it gives every one of the 100 validation examples 'pos'")
    assert FineTuning.better(run, EpochResult(3, 12, {"f1": 0.68}, None, None))
    # resumed, the best is its evaluation of record, verdict and all: a tie is judged as without the resumption
    batches = SimpleNamespace(state_dict=lambda: {}, load_state_dict=lambda state: None)
    saved = SimpleNamespace(batches=batches, best=later[0], history=[first, *later], best_weights={"w": torch.zeros(1)})
    state, weights = FineTuning.run_state(saved)
    save_file(weights["best"], str(tmp_path / "best.safetensors"))
    resumed = SimpleNamespace(batches=batches, task=task, best=None)
    FineTuning.load_run_state(resumed, json.loads(json.dumps(state)), str(tmp_path))
    assert resumed.best.restored and resumed.best.step == 8 and resumed.best.unlearnt == "it tags no entity"
    assert FineTuning.better(resumed, EpochResult(4, 16, {"f1": 0.0}, None, None))

    from bertforge.tasks import RerankTask

    r = object.__new__(RerankTask)  # a reranker no better than a random order of the passages it was given
    r.settings, r.val, r.chance = SimpleNamespace(top_k=20), SimpleNamespace(queries=["q"] * 5), 0.15
    assert r.unlearnt({"mrr@10": 0.11, "first_stage_mrr@10": 0.88}, ()) == (
        "its MRR@10 on the 5 validation queries, 0.110, is no better than the 0.150 of the first stage's top 20 in "
        "a random order (the first stage's own order: 0.880)")
    assert r.unlearnt({"mrr@10": 0.39, "first_stage_mrr@10": 0.88}, ()) is None  # (it learnt: worse than BM25 yet)
    r.settings.top_k = 1  # one passage a query: any order is the first stage's, no order shows anything
    assert r.unlearnt({"mrr@10": 0.15, "first_stage_mrr@10": 0.15}, ()) is None

    from bertforge.tasks import SquadTask
    from bertforge.tasks.squad import Example, squad_from_rows

    q = object.__new__(SquadTask)  # a reader no better than the first words of each context
    ctx = "Paris is the capital of France and its largest city"
    q.train_ex = [Example("t", "?", ctx, [{"text": "Paris", "answer_start": 0}])]
    q.val_ex = [Example("a", "What is the capital?", ctx, [{"text": "Paris", "answer_start": 0}]),
                Example("b", "Of what?", ctx, [{"text": "France", "answer_start": 24}])]
    q.val_data = squad_from_rows([vars(e) for e in q.val_ex], "v")["data"]
    assert q.unlearnt({"f1": 0.0}, {}) == ("its F1 on the 2 validation questions, 0.0, is no better than the 50.0 of "
                                          "answering each with the first 1 word(s) of its context")
    assert q.unlearnt({"f1": 100.0}, {}) is None

    from bertforge.tasks import EmbedTask
    from bertforge.tasks.retrieval import RetrievalSet

    e = object.__new__(EmbedTask)  # embeddings no better than the passages in a random order
    e.val = RetrievalSet([f"q{i}" for i in range(40)], [f"p{j}" for j in range(40)], [{i: 1} for i in range(40)])
    same = np.tile(np.arange(10), (40, 1))  # vectors that no longer tell texts apart
    assert e.unlearnt({"mrr@10": 0.07}, same) == ("it ranks the same 10 passages first for every one of the 40 "
                                                   "validation queries")
    shifted = (np.arange(40)[:, None] + np.arange(1, 11)) % 40  # never the query's own passage
    said = e.unlearnt({"mrr@10": 0.0}, shifted)
    assert said.startswith("its MRR@10 on the 40 validation queries, 0.000, is no better than the ") and \
        said.endswith(" of the 40 passages in a random order") and 0.0 < e.chance < 0.3, said
    assert e.unlearnt({"mrr@10": 1.0}, np.arange(40)[:, None] + np.zeros((1, 10), int)) is None


def test_positions_beyond_the_pretraining_length_are_warned(setup, tmp_path, capsys):
    # a model bertforge pretrained from scratch on 4-token sequences, fine-tuned on sentences of 5-6 tokens
    model = tmp_path / "short"
    shutil.copytree(setup / "model", model)
    saved = {"data": {"max_seq_length": 4}, "model": {"init": None}}
    (model / "pretrain_config.json").write_text(json.dumps(saved))
    _run_model = ["--batch-size", "8", "--epochs", "1"]
    assert main(_args(setup, tmp_path / "a", *_run_model, model=str(model))) == 0
    assert "pretrained on sequences of at most 4 tokens and these reach 6: positions 4-5 start untrained" in capsys.readouterr().err
    saved["data"]["max_seq_length"] = 6  # long enough: no warning
    (model / "pretrain_config.json").write_text(json.dumps(saved))
    assert main(_args(setup, tmp_path / "b", *_run_model, model=str(model))) == 0
    assert "untrained" not in capsys.readouterr().err
    saved["data"]["max_seq_length"], saved["model"]["init"] = 4, "elsewhere"  # pretrained on from other weights: unknown
    (model / "pretrain_config.json").write_text(json.dumps(saved))
    assert main(_args(setup, tmp_path / "c", *_run_model, model=str(model))) == 0
    assert "untrained" not in capsys.readouterr().err


RESUMABLE = ["--batch-size", "4", "--epochs", "3", "--save-every", "3", "--eval-every", "5", "--log-every", "1"]


def _rows(out) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "elapsed"} for r in rows]


@pytest.mark.slow
def test_sigkill_and_resume_end_with_the_weights_of_the_uninterrupted_run(setup, tmp_path, capsys):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(_args(setup, straight, *RESUMABLE, model="dropout-model")) == 0
    assert not (straight / "checkpoints").exists()  # a finished run keeps no checkpoints
    # killed (SIGKILL, as a power loss) in the middle of its third checkpoint (step 9)
    env = dict(os.environ, BERTFORGE_FAULT="write:step-00000009/optimizer.pt", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "bertforge", *_args(setup, killed, *RESUMABLE, model="dropout-model")],
                          env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [s for s, _ in list_checkpoints(str(killed))] == [6]  # fine-tuning keeps the newest alone
    assert main(_args(setup, killed, *RESUMABLE, model="dropout-model")) == 2  # a new run there: refused
    assert "holds an interrupted run (step 6): add --resume to continue it" in capsys.readouterr().err
    assert main(_args(setup, killed, *RESUMABLE, "--weight-decay", "0.5", "--resume", model="dropout-model")) == 2
    assert "--resume continues the run" in capsys.readouterr().err  # other settings than the checkpoint's: refused
    for other in (["--freeze-embeddings"], []):  # ... before anything is loaded: the checkpoints stay as they are
        other_model = "model" if not other else "dropout-model"
        assert main(_args(setup, killed, *RESUMABLE, "--resume", *other, model=other_model)) == 2
        assert "--resume continues the run" in capsys.readouterr().err
        assert [s for s, _ in list_checkpoints(str(killed))] == [6]
    assert main(_args(setup, killed, *RESUMABLE, "--resume", model="dropout-model")) == 0
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _rows(straight) == _rows(killed)
    m1, m2 = (json.loads((o / "metrics.json").read_text()) for o in (straight, killed))
    assert (m1["best_step"], m1["accuracy"]) == (m2["best_step"], m2["accuracy"])
    assert (straight / "predictions.jsonl").read_text() == (killed / "predictions.jsonl").read_text()
    assert not (killed / "checkpoints").exists()


@pytest.mark.slow
def test_resume_refuses_data_that_changed_since_the_run_started(setup, tmp_path, capsys):
    """Found by hostile testing (2): a resumed run read its files again and trained on whatever they now held (a
    label flipped in --train, a row edited in --validation) without a word; the checkpoint records their content."""
    data = tmp_path / "t.jsonl"
    shutil.copy(setup / "t.jsonl", data)
    out = tmp_path / "killed"
    args = ["--quiet", "finetune", "classify", "--model", str(setup / "model"), "--train", str(data), "--validation",
            str(data), "--out", str(out), "--lr", "1e-3", "--no-progress", "--max-seq-length", "16", *RESUMABLE]
    env = dict(os.environ, BERTFORGE_FAULT="write:step-00000006/optimizer.pt", PYTHONUNBUFFERED="1")  # the second
    proc = subprocess.run([sys.executable, "-m", "bertforge", *args], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [s for s, _ in list_checkpoints(str(out))] == [3]
    original = data.read_text()
    flipped = original.replace('"pos"', '"tmp"', 1).replace('"neg"', '"pos"', 1).replace('"tmp"', '"neg"', 1)
    for changed in (flipped, original.replace("good fun day", "good fun night")):
        data.write_text(changed)
        assert main([*args, "--resume"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("error: ") and "on the data it was started on, and --train" in err, err
        assert "now holds other examples" in err and "Traceback" not in err
        assert [s for s, _ in list_checkpoints(str(out))] == [3]
    data.write_text(original)
    # the run's own task, named (issue 66): not another task's settings read as unknown keys
    as_ner = [*args[:2], "ner", *args[3:], "--resume"]
    assert main(as_ner) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: the run in {out} is a finetune classify run; resume it with bertforge finetune classify")
    assert main([*args, "--resume"]) == 0


def test_resume_needs_a_checkpoint(setup, tmp_path, capsys):
    assert main(_args(setup, tmp_path / "none", "--resume")) == 2
    assert "nothing to resume" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_again_on_resume(setup, tmp_path, capsys):
    """Issue 66, class 9: one resume rule with pretraining. A fine-tuning run killed before its first checkpoint
    could not be resumed ("nothing to resume"), and the same command again said to pass --overwrite."""
    out = tmp_path / "killed"
    args = _args(setup, out, *RESUMABLE)
    env = dict(os.environ, BERTFORGE_FAULT="write:step-00000003/model.safetensors", PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "bertforge", *args], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL and not list_checkpoints(str(out)), proc.stderr.decode()[-2000:]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {out} holds an interrupted run (before its first checkpoint): add --resume to continue it, or "
        "--overwrite to start again")
    assert main([*args, "--resume"]) == 0
    assert "starts again from step 0" in capsys.readouterr().err
    assert main(_args(setup, tmp_path / "whole", *RESUMABLE)) == 0
    a, b = _weights(out), _weights(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the uninterrupted run's weights, bit for bit


@pytest.mark.slow
def test_an_interrupted_checkpointed_run_can_be_overwritten(setup, tmp_path, capsys):
    out = tmp_path / "o"
    env = dict(os.environ, BERTFORGE_FAULT="write:step-00000006/optimizer.pt")
    proc = subprocess.run([sys.executable, "-m", "bertforge", *_args(setup, out, *RESUMABLE)], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL and list_checkpoints(str(out))
    (out / "checkpoints" / ".step-00000009.tmp-x").mkdir()  # what a killed save leaves
    assert main(_args(setup, out, *RESUMABLE, "--overwrite")) == 0
    assert (out / "model.safetensors").is_file() and not (out / "checkpoints").exists()
    capsys.readouterr()


def test_config_file_replays_a_run_and_flags_override_it(setup, tmp_path, capsys):
    first = _run(setup, tmp_path / "first", "--batch-size", "4", "--epochs", "2")
    # the run's own finetune_config.json as --config (another --out): the same run
    saved = tmp_path / "first" / "finetune_config.json"
    assert main(["--quiet", "finetune", "classify", "--config", str(saved), "--out", str(tmp_path / "again")]) == 0
    a, b = _weights(tmp_path / "first"), _weights(tmp_path / "again")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "again" / "metrics.json").read_text())["accuracy"] == first["accuracy"]
    # a YAML file of the flags' names, a flag over it
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: {setup / 'model'}\ntrain: {setup / 't.jsonl'}\nvalidation_file: {setup / 't.jsonl'}\n"
                   "batch-size: 4\nepochs: 2\nlr: 5e-1\nseed: 1\ndata: {max_seq_length: 16}\nlabel_column: label\n")
    assert main(["--quiet", "finetune", "classify", "--config", str(cfg), "--lr", "1e-3", "--out", str(tmp_path / "yaml"),
                 "--no-progress"]) == 0
    saved = json.loads((tmp_path / "yaml" / "finetune_config.json").read_text())["finetune"]
    assert saved["train"]["lr"] == 1e-3 and saved["train"]["batch_size"] == 4 and saved["data"]["max_seq_length"] == 16
    c = _weights(tmp_path / "yaml")
    assert all(torch.equal(a[k], c[k]) for k in a)  # the same settings as the first run
    capsys.readouterr()
    for text, message in (("lrr: 1\n", "unknown key(s) for finetune classify: lrr"), ("compile: true\n", "compile cannot be set"),
                          ("[1, 2]\n", "must hold a mapping"), ("doc_stride: 64\n", "for finetune classify: doc_stride"),
                          ("1: 2\n", "1 is not a setting's name"), ("lr: [\n", "cannot parse config file")):
        cfg.write_text(f"model: {setup / 'model'}\n" + text if not text.startswith("[") else text)
        args = ["finetune", "classify", "--config", str(cfg), "--train", str(setup / "t.jsonl"), "--validation",
                str(setup / "t.jsonl"), "--out", str(tmp_path / "bad")]
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
        assert not (tmp_path / "bad").exists()


def test_group_by_length_batches_similar_lengths_in_a_random_order(setup, tmp_path, capsys):
    from bertforge.batching import GROUP_BATCHES, group_by_length

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 200, (1000,), generator=gen).tolist()
    order = torch.randperm(1000, generator=gen).numpy()
    grouped = group_by_length(order, lengths, 4)
    assert sorted(grouped.tolist()) == list(range(1000))  # every example once
    size = GROUP_BATCHES * 4
    for i in range(0, 1000, size):  # each run of 50 batches: the same examples as the random order's, longest first
        run = grouped[i : i + size].tolist()
        assert set(run) == set(order[i : i + size].tolist()) and [lengths[j] for j in run] == sorted((lengths[j] for j in run), reverse=True)
    padding = lambda o: sum(4 * max(lengths[j] for j in o[k : k + 4]) - sum(lengths[j] for j in o[k : k + 4])  # noqa: E731
                            for k in range(0, 1000, 4))
    assert padding(grouped) < padding(order) / 10
    m = _run(setup, tmp_path / "g", "--batch-size", "4", "--epochs", "2", "--group-by-length")
    saved = json.loads((tmp_path / "g" / "finetune_config.json").read_text())["finetune"]
    assert saved["data"]["group_by_length"] is True and m["epochs"][-1]["step"] == 8
    capsys.readouterr()


def test_default_learning_rate_follows_the_models_width(setup, tmp_path):
    """Without --lr a run takes the rate for its model's width (tiny: hidden 128), saved with the run so that
    its finetune_config.json repeats it; --lr wins; the rule itself by width."""
    from bertforge.config import FINETUNE_LR_BY_WIDTH, finetune_lr

    assert finetune_lr(128) == finetune_lr(256) == FINETUNE_LR_BY_WIDTH[0][1]
    assert finetune_lr(384) == finetune_lr(768) == FINETUNE_LR_BY_WIDTH[-1][1] < finetune_lr(256)
    base = ["--quiet", "finetune", "classify", "--model", str(setup / "model"), "--train", str(setup / "t.jsonl"),
            "--validation", str(setup / "t.jsonl"), "--no-progress", "--max-seq-length", "16", "--max-steps", "2"]
    assert main([*base, "--out", str(tmp_path / "auto")]) == 0
    saved = json.loads((tmp_path / "auto" / "finetune_config.json").read_text())["finetune"]["train"]
    assert saved["lr"] == finetune_lr(128)
    assert main([*base, "--out", str(tmp_path / "given"), "--lr", "3e-5"]) == 0
    assert json.loads((tmp_path / "given" / "finetune_config.json").read_text())["finetune"]["train"]["lr"] == 3e-5
    assert main([*base, "--out", str(tmp_path / "missing"), "--model", str(tmp_path / "nowhere")]) == 2


SLOW_STEPS = """import sys, time
from bertforge.train.engine import Engine
step = Engine.step
Engine.step = lambda self, *args, **kw: (time.sleep(0.3), step(self, *args, **kw))[1]  # time to signal it mid-run
from bertforge.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_fine_tuning_saves_a_checkpoint_and_the_run_resumes(setup, tmp_path, capsys, sig):
    """Ctrl-C, or the SIGTERM that torchrun and job schedulers send: the run stops after its current step with a
    checkpoint of it (without --save-every), one error line saying how to continue, exit status 1; --resume
    finishes it without reporting the restored head as new, and the card's command has no --resume."""
    out = tmp_path / "o"
    args = _args(setup, out, "--batch-size", "4", "--epochs", "3", "--log-every", "1")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_STEPS, *args[1:]], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = []
    for line in proc.stderr:  # the first step's log line: training has begun
        seen.append(line)
        if line.startswith("step 1/"):
            proc.send_signal(sig)
            break
    err = "".join(seen) + proc.stderr.read()
    assert proc.wait(timeout=120) == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: interrupted at step ") and "resume with" in last and "--resume" in last, err
    assert "Traceback" not in err
    step = int(last.split()[4])
    assert 1 <= step < 12 and [s for s, _ in list_checkpoints(str(out))] == [step]
    assert "newly initialised" in err  # the first run's new classifier ...
    saved = list_checkpoints(str(out))[0][1]
    assert main([*args[1:], "--resume"]) == 0
    resumed = capsys.readouterr().err  # ... comes from the checkpoint on resume
    assert "newly initialised" not in resumed and f"resumed from {saved}" in resumed
    m = json.loads((out / "metrics.json").read_text())
    assert m["epochs"][-1]["step"] == 12 and not (out / "checkpoints").exists()
    card = (out / "README.md").read_text()
    assert "finetune classify" in card and "--resume" not in card


def _plain(d, out, *extra) -> list[str]:
    """A fine-tuning command without --validation."""
    return ["finetune", "classify", "--model", str(d / "model"), "--train", str(d / "t.jsonl"), "--out", str(out),
            "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", "--batch-size", "4", *extra]


def test_validation_is_optional_a_split_of_the_training_file_or_a_slice(setup, tmp_path, capsys):
    # no validation data: trained, not evaluated, and said; the last weights are the model
    assert main(_plain(setup, tmp_path / "none", "--epochs", "1")) == 0
    cap = capsys.readouterr()
    assert "not evaluated" in cap.err and json.loads(cap.out.strip().splitlines()[-1])["step"] == 4
    assert "validating on" not in cap.err  # (issue 67, item 9: it said "validating on 0" beside "not evaluated")
    m = json.loads((tmp_path / "none" / "metrics.json").read_text())
    assert m["epochs"] == [] and m["step"] == 4 and (tmp_path / "none" / "model.safetensors").is_file()
    assert "not evaluated" in (tmp_path / "none" / "README.md").read_text()
    # a part of the training file held out (at random, by --seed): 4 of 16 examples
    assert main(_plain(setup, tmp_path / "split", "--epochs", "1", "--validation-split", "0.25")) == 0
    assert "on 12 examples (2 labels: neg, pos), validating on 4 examples" in capsys.readouterr().err
    m = json.loads((tmp_path / "split" / "metrics.json").read_text())
    assert (m["train_examples"], m["validation_examples"], m["epochs"][-1]["step"]) == (12, 4, 3)
    # the first N validation examples (transformers' name too)
    assert main(_plain(setup, tmp_path / "slice", "--epochs", "1", "--validation", str(setup / "t.jsonl"),
                       "--max_eval_samples", "3")) == 0
    assert json.loads((tmp_path / "slice" / "metrics.json").read_text())["validation_examples"] == 3
    assert len((tmp_path / "slice" / "predictions.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    assert main(_plain(setup, tmp_path / "both", "--validation", str(setup / "t.jsonl"), "--validation-split", "0.2")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not both" in err[0] and not (tmp_path / "both").exists()


def test_fine_tuning_checkpoints_by_time_without_save_every(setup, tmp_path, monkeypatch, capsys):
    import bertforge.checkpoint as ckpt
    import bertforge.train.lifecycle as lifecycle

    saved, save = [], ckpt.save_checkpoint
    monkeypatch.setattr(ckpt, "save_checkpoint", lambda out, step, *a, **kw: saved.append(step) or save(out, step, *a, **kw))
    monkeypatch.setattr(lifecycle, "SAVE_INTERVAL", 0)  # due after every step
    assert main(_args(setup, tmp_path / "o", "--batch-size", "4", "--epochs", "1")) == 0
    assert saved == [1, 2, 3] and not (tmp_path / "o" / "checkpoints").exists()  # (not at the end: it is the end)
    assert main(_args(setup, tmp_path / "p", "--batch-size", "4", "--epochs", "1", "--save-every", "0")) == 0
    assert saved == [1, 2, 3]  # --save-every 0: none
    capsys.readouterr()


def test_a_timed_run_that_barely_trained_says_so(tmp_path, capsys):
    """Issue 67, item 2: a --max-time too short for its run (set-up and evaluation ate it) ended with status 0 and
    no word; now a warning with the figures and what to do, in the log, metrics.json and the model card."""
    rows = [("a good film", "1"), ("a bad film", "0")] * 2500
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    tok = train_vocabulary([t for t, _ in rows[:4]], 40, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    model = tmp_path / "m"
    BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(),
                                                    max_position_embeddings=16)).save_pretrained(str(model), tok)
    out = tmp_path / "out"
    assert main(["finetune", "classify", "--model", str(model), "--train", str(tmp_path / "train.tsv"),
                 "--validation-split", "0.01", "--out", str(out), "--batch-size", "1", "--max-time", "1s",
                 "--max-seq-length", "8", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "of an epoch of" in err and "Give a longer --max-time" in err, err[-2000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert "barely trained" in metrics["warnings"][0]
    assert "**Warning:** --max-time 0:00:01 trained" in (out / "README.md").read_text()


@pytest.mark.slow
def test_a_timed_run_keeps_time_for_a_validation_set_of_long_texts(tmp_path, capsys):
    """Issue 66, class 8: with short training texts and long validation texts the end's reserve was estimated by
    sequences from the training steps, and a 20 s budget ran 71 s; now by the validation set's own tokens."""
    words = "the film was good and the acting was bad but the end was fine".split()
    train = [(" ".join(words[i % 7 : i % 7 + 3]), str(i % 2)) for i in range(4000)]
    long = [(" ".join(words[(i + j) % len(words)] for j in range(500)), str(i % 2)) for i in range(300)]
    for name, rows in (("train.tsv", train), ("dev.tsv", long)):
        (tmp_path / name).write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    tok = train_vocabulary(words, 40, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    model = tmp_path / "m"
    BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(),
                                                    max_position_embeddings=512, id2label={0: "0", 1: "1"})
                                  ).save_pretrained(str(model), tok)
    out, budget = tmp_path / "out", 6.0
    assert main(["--quiet", "finetune", "classify", "--model", str(model), "--train", str(tmp_path / "train.tsv"),
                 "--validation", str(tmp_path / "dev.tsv"), "--out", str(out), "--batch-size", "8",
                 "--max-seq-length", "512", "--max-time", f"{budget:g}s", "--epochs", "50", "--log-every", "1",
                 "--no-progress"]) == 0
    end = json.loads((out / "metrics.json").read_text())["train_seconds"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r["elapsed"] for r in rows if r["type"] == "train"][-1]  # training stopped here; then the evaluation
    # it kept at least half the final evaluation's time (the old estimate kept a tenth; a host so loaded that
    # set-up took the budget stops after one step, whatever the estimate)
    assert any(r["type"] == "eval" for r in rows) and (last <= budget - 0.5 * (end - last) or len(rows) <= 2), \
        (last, end)
    capsys.readouterr()


def test_each_set_up_phase_says_so_as_it_starts(setup, tmp_path, capsys):
    """Issue 67, item 7: tokenizing and building the model each say so as they start (a large file took a minute
    of silence before the first line; reading it says nothing first, so that a bad file is one error line)."""
    assert main(_args(setup, tmp_path / "run", "--max-steps", "1")[1:]) == 0
    err = capsys.readouterr().err
    said = [err.find(x) for x in ("tokenizing the examples", "building BertForSequenceClassification from",
                                  "step 1/1")]
    assert -1 not in said and said == sorted(said), err


def test_without_a_batch_size_a_run_of_few_updates_takes_a_smaller_batch(setup, tmp_path, capsys):
    """Issue 68: a run's batch is decided by its data when not given: the task's (32 for classify), halved while
    the epochs would make fewer than 600 updates, down to 8; said, and saved with the run. With --max-steps the
    updates do not depend on it: the task's batch."""
    from bertforge.tasks.base import finetune_batch

    assert [finetune_batch(32, n, 3) for n in (32_000, 6_369, 6_368, 3_185, 3_184, 16)] == [32, 32, 16, 16, 8, 8]
    assert finetune_batch(32, 16, None) == 32
    assert finetune_batch(16, 1_700, 3) == 8 and finetune_batch(16, 9_000, 2) == 16  # (SQuAD's 16: WNUT-16, train-8k)
    # halved only where it adds updates: 1 example makes 3 at any batch; 10 make 3 at 32 and 16, 6 at 8
    assert finetune_batch(32, 1, 3) == 32 and finetune_batch(32, 10, 3) == 8 and finetune_batch(32, 8, 3) == 32
    argv = [a for a in _args(setup, tmp_path / "run") if a not in ("--quiet", "--lr", "1e-3")]
    assert main(argv) == 0  # (16 rows, 3 epochs: 3 updates at 32)
    err = capsys.readouterr().err
    width = json.loads((setup / "model" / "config.json").read_text())["hidden_size"]
    for said in ("batch 8: 16 examples x 3 epoch(s) make 6 updates at 8, 3 at the task's 32",
                 f"fine-tuning at batch 8 (by the data), 3 epoch(s) (the task's), lr 0.0003 (by the model's width: "
                 f"hidden {width}), warmup 10% of the run, weight decay 0.01"):
        assert said in err and said in (tmp_path / "run" / "train.log").read_text(), err  # (the log has it too)
    saved = json.loads((tmp_path / "run" / "finetune_config.json").read_text())
    assert saved["finetune"]["train"]["batch_size"] == 8
    assert main(_args(setup, tmp_path / "acc", "--grad-accum", "3")[1:]) == 0  # the batch announced is the one used
    assert "batch 9: 8 rounded up to a multiple of 1 process(es) x --grad-accum 3" in capsys.readouterr().err
    assert main(_args(setup, tmp_path / "steps", "--max-steps", "2")) == 0
    assert json.loads((tmp_path / "steps" / "finetune_config.json").read_text())["finetune"]["train"]["batch_size"] == 32


def test_a_length_of_null_is_the_tasks_default(setup, tmp_path):
    """``max_seq_length: null`` in a --config file (or None by the API) is the task's default length, at most the
    model's positions, as for a task that takes its length from the base folder; it ended in a traceback."""
    (tmp_path / "c.json").write_text('{"max_seq_length": null}')
    argv = _args(setup, tmp_path / "o", "--max-steps", "1", "--config", str(tmp_path / "c.json"))
    at = argv.index("--max-seq-length")
    assert main([*argv[:at], *argv[at + 2:]]) == 0
    saved = json.loads((tmp_path / "o" / "finetune_config.json").read_text())["finetune"]["data"]["max_seq_length"]
    assert saved == min(128, json.loads((setup / "model" / "config.json").read_text())["max_position_embeddings"])


def test_a_run_parses_its_base_config_json_once(setup, tmp_path, monkeypatch):
    """The learning rate by the model's width, the length capped at its positions and the model itself come from
    one parse of config.json."""
    import bertforge.models.base as base

    reads = []
    real = base.read_json_object
    monkeypatch.setattr(base, "read_json_object", lambda *a: reads.append(a[0]) or real(*a))
    (tmp_path / "c.json").write_text('{"max_seq_length": null}')  # (the task's length, capped by the model)
    argv = _args(setup, tmp_path / "o", "--epochs", "1", "--config", str(tmp_path / "c.json"))
    given = ("--lr", "--max-seq-length")  # (both by the model)
    assert main([a for i, a in enumerate(argv) if not set(given) & set(argv[max(0, i - 1):i + 1])]) == 0
    assert [r for r in reads if str(r).endswith("config.json")] == [str(setup / "model" / "config.json")]


def test_epochs_of_null_are_refused_where_the_task_does_not_take_them_by_its_data(setup, tmp_path, capsys):
    """Only a task whose default epochs are None (NER) takes them by its data; ``epochs: null`` elsewhere is still
    the one error line it was."""
    (tmp_path / "c.json").write_text('{"epochs": null}')
    assert main(_args(setup, tmp_path / "o", "--config", str(tmp_path / "c.json"))) == 2
    assert capsys.readouterr().err.strip() == "error: --epochs needs a value"

