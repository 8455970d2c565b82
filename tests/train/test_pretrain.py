"""bertforge pretrain: outputs, exact resume after SIGKILL, DDP under torchrun, atomic saves, errors."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bertforge.checkpoint import list_checkpoints, load_checkpoint
from bertforge.cli import main
from bertforge.train.engine import LinearSchedule
from ..helpers import tiny_pretrain


def _args(corpus, tok, out, *extra, recipe="bert", length=64, batch=16):
    """BERT's recipe (NSP and dropout on) by default: the machinery under its heaviest load."""
    return tiny_pretrain(corpus, out, "--recipe", recipe, "--lr", "1e-3", "--log-every", "5",
                         "--max-eval-instances", "64", *extra, tokenizer=tok, length=length, batch=batch, steps=None)


def _weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


def _metric_rows(out):
    rows = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            for k in ("tokens_per_second", "elapsed"):
                r.pop(k, None)
            rows.append(r)
    return rows


def test_outputs_and_transformers_loading(small_text_corpus, story_tok_dir, tmp_path, capsys, plots_on):
    out = tmp_path / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "20", "--eval-every", "10")]) == 0
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "metrics.jsonl", "metrics.json", "pretrain_config.json", "train.log", "README.md"):
        assert (out / name).is_file(), name
    assert {p.name for p in (out / "plots").iterdir()} == {"loss.png", "accuracy.png", "lr.png"}
    m = json.loads((out / "metrics.json").read_text())
    for k in ("mlm_accuracy", "nsp_accuracy", "mlm_loss", "nsp_loss", "steps", "tokens_seen", "tokens_per_second", "wall_seconds"):
        assert k in m
    assert m["steps"] == 20 and m["tokens_seen"] > 0 and 0 <= m["mlm_accuracy"] <= 1
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["type"] == "train"] == [5, 10, 15, 20]
    assert [r["step"] for r in rows if r["type"] == "eval"] == [10, 20]
    assert "true=" in (out / "train.log").read_text()  # sample fill-mask predictions are logged
    card = (out / "README.md").read_text()
    assert "20 steps" in card and f"| mlm_accuracy | {m['mlm_accuracy']:.4g} |" in card and "--recipe bert" in card
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 20
    # the output directory is a transformers BERT directory with the same logits
    transformers = pytest.importorskip("transformers")
    from bertforge import BertForPreTraining

    ours = BertForPreTraining.from_pretrained(out).eval()
    theirs = transformers.BertForPreTraining.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["Tom went to the park.", "Anna saw a red kite at the beach today."], ["He smiled.", "The end."],
              padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = theirs(**enc)
    real = enc["attention_mask"].bool()
    assert (a.prediction_logits[real] - b.prediction_logits[real]).abs().max() < 1e-5
    assert (a.seq_relationship_logits - b.seq_relationship_logits).abs().max() < 1e-5


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(small_text_corpus, story_tok_dir, tmp_path):
    args = ["--max-steps", "30", "--save-every", "5", "--eval-every", "15"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, straight, *args)]) == 0
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "--quiet", *_args(small_text_corpus, story_tok_dir, killed, *args)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-00000010").exists():
        assert time.time() < deadline and proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    done = [s for s, _ in list_checkpoints(str(killed))]
    assert done and done[-1] < 30
    assert main(["--quiet", "pretrain", "--out", str(killed), "--resume", "--no-progress"]) == 0
    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _metric_rows(straight) == _metric_rows(killed)


FAULT_RUN = ["--max-steps", "6", "--save-every", "2", "--eval-every", "0", "--log-every", "1"]


@pytest.fixture(scope="module")
def straight_run(small_text_corpus, story_tok_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, *FAULT_RUN)]) == 0
    return out


# The second save (step 4) writes its checkpoint, renames it into place, then saves the model folder in place
# (written beside it, then renamed file by file); the run folder saved it twice before (at the start, at step 2).
# A kill at each checkpoint file is the run shell's, tested once for every command on the toy run
# (test_lifecycle); here the instants that pretraining adds: the model folder's files written and renamed, and
# the checkpoint renamed whole then damaged.
DAMAGED = "rename:checkpoints/step-00000004"
FAULTS = ["write:killed:3", DAMAGED, "rename:killed/config.json:3"]


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_a_kill_at_any_instant_of_a_save_resumes_to_the_uninterrupted_run(fault, small_text_corpus, story_tok_dir,
                                                                           straight_run, tmp_path):
    killed = tmp_path / "killed"
    env = dict(os.environ, BERTFORGE_FAULT=fault)
    proc = subprocess.run([sys.executable, "-m", "bertforge", "--quiet", *_args(small_text_corpus, story_tok_dir, killed, *FAULT_RUN)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [s for s, _ in list_checkpoints(str(killed))][0] == 2
    if fault == DAMAGED:  # the newest checkpoint, complete at the kill, is then damaged; a torn metrics line too
        newest = list_checkpoints(str(killed))[-1][1]
        assert newest.endswith("step-00000004")
        with open(os.path.join(newest, "optimizer.pt"), "r+b") as f:
            f.truncate(100)
        with open(killed / "metrics.jsonl", "a") as f:
            f.write('{"type": "train", "st')
    assert main(["--quiet", "pretrain", "--out", str(killed), "--resume", "--no-progress"]) == 0
    a, b = _weights(straight_run), _weights(killed)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert _metric_rows(straight_run) == _metric_rows(killed)
    leftovers = [n for n in os.listdir(killed / "checkpoints") if n.startswith(".") and not n.startswith(".damaged-")]
    assert not leftovers and not [n for n in os.listdir(killed) if n.startswith((".tmp-", ".save-tmp-"))]
    if fault == DAMAGED:
        assert [n for n in os.listdir(killed / "checkpoints") if n.startswith(".damaged-step-00000004")]


def test_a_save_killed_midway_leaves_the_previous_checkpoint(small_text_corpus, story_tok_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "10", "--save-every", "5", "--eval-every", "0")]) == 0
    import bertforge.train.pretrain as pt

    real_save = torch.save

    def dying_save(obj, path, *a, **k):
        if str(getattr(path, "name", path)).endswith("trainer_state.pt"):  # (a file object, or its path)
            raise KeyboardInterrupt("power loss")  # dies in the middle of writing the checkpoint folder
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(pt.torch, "save", dying_save)
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "15", "--no-progress"]) != 0
    monkeypatch.setattr(pt.torch, "save", real_save)
    steps = [s for s, _ in list_checkpoints(str(out))]
    assert steps == [5, 10]
    assert not [n for n in os.listdir(out / "checkpoints") if n.startswith(".")]  # the half-written folder is gone
    from bertforge import BertConfig, BertForPreTraining
    from bertforge.config import TrainConfig
    from bertforge.train.engine import build_optimizer

    model = BertForPreTraining(BertConfig.load(str(out)))
    engine_state, state = load_checkpoint(list_checkpoints(str(out))[-1][1], model)
    build_optimizer(model, TrainConfig(), torch.device("cpu")).load_state_dict(engine_state["optimizer"])
    assert state["step"] == 10
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "15", "--no-progress"]) == 0
    assert [s for s, _ in list_checkpoints(str(out))][-1] == 15


def test_config_file_flags_override_and_no_nsp(small_text_corpus, story_tok_dir, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("preset: mini\nbatch_size: 8\nmax_steps: 4\nlr: 0.001\nnsp: false\neval_every: 0\n")
    out = tmp_path / "run"
    assert main(["--quiet", "pretrain", "--config", str(cfg), "--data", str(small_text_corpus), "--tokenizer", story_tok_dir,
                 "--out", str(out), "--preset", "tiny", "--max-seq-length", "64", "--no-progress"]) == 0
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["model"]["preset"] == "tiny" and saved["train"]["batch_size"] == 8 and saved["data"]["nsp"] is False
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    m = json.loads((out / "metrics.json").read_text())
    assert "nsp_accuracy" not in m and m["steps"] == 4


def test_max_time_schedule_ends_on_time_at_zero_lr(small_text_corpus, story_tok_dir, tmp_path):
    s = LinearSchedule(1.0, None, 100.0, None, 0.1)
    assert s.lr(0, 0.05) == pytest.approx(0.5) and s.lr(10, 0.1) == pytest.approx(1.0)
    assert s.lr(99, 0.99) == pytest.approx(0.01 / 0.9) and s.done(99, 1.0) and not s.done(99, 0.99)
    out = tmp_path / "timed"
    t0 = time.time()
    # small steps, so that a slow host makes many: the last step's learning rate is about its share of the time;
    # a budget well over the set-up, which it includes, however loaded the host
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-time", "5s", "--eval-every", "0",
                                   "--log-every", "1", length=32, batch=4)]) == 0
    took = time.time() - t0
    wall = json.loads((out / "metrics.json").read_text())["wall_seconds"]
    assert wall <= 5 * 1.2  # final evaluation and save in (to a step: test_lifecycle's timed run)
    assert took - wall < 15  # (besides: the model card, and the plots where they are drawn)
    rows = [r for r in _metric_rows(out) if r["type"] == "train"]
    assert len(rows) > 20 and rows[-1]["lr"] < 0.1 * 1e-3


def test_init_from_a_transformers_checkpoint(small_text_corpus, minilm_dir, tmp_path):
    out = tmp_path / "cont"
    assert main(["--quiet", "pretrain", "--data", str(small_text_corpus), "--init", minilm_dir, "--out", str(out),
                 "--max-steps", "2", "--batch-size", "4", "--max-seq-length", "32", "--eval-every", "0",
                 "--max-eval-instances", "8", "--no-progress"]) == 0
    assert (out / "vocab.txt").read_text() == open(os.path.join(minilm_dir, "vocab.txt")).read()
    before, after = load_file(os.path.join(minilm_dir, "model.safetensors")), _weights(out)
    w = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(before[w], after["bert." + w]) and (before[w] - after["bert." + w]).abs().max() < 0.01


def test_non_finite_loss_stops_with_the_step(small_text_corpus, story_tok_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "nan"
    import bertforge.models.bert as model_mod

    real = model_mod.BertEmbeddings.forward
    calls = {"n": 0}

    def poisoned(self, *a, **k):
        calls["n"] += 1
        x = real(self, *a, **k)
        return x * float("nan") if calls["n"] == 7 and self.training else x

    monkeypatch.setattr(model_mod.BertEmbeddings, "forward", poisoned)
    rc = main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "10", "--save-every", "5", "--eval-every", "0")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "error: the loss is not finite at step 7" in err and "step-00000005" in err
    assert [s for s, _ in list_checkpoints(str(out))] == [5]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--data", "MISSING.txt"], "data path not found"),
        (["--preset", "gigantic"], "unknown preset"),
        (["--tokenizer", "EMPTYDIR"], "no tokenizer in"),
        (["--resume"], "nothing to resume"),
        (["--config", "BADCONFIG"], "unknown key\\(s\\) in config file .*: batch_sise"),
        (["--max-time", "soon"], "cannot read duration"),
        (["--position-init", "normal"], "--attention-init local .* with --position-init normal, pass --attention-init normal"),
    ],
)
def test_bad_input_is_one_error_line(extra, message, small_text_corpus, story_tok_dir, tmp_path, capsys):
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "bad.yaml").write_text("batch_sise: 3\n")
    subst = {"MISSING.txt": str(tmp_path / "missing.txt"), "EMPTYDIR": str(tmp_path / "emptydir"), "BADCONFIG": str(tmp_path / "bad.yaml")}
    extra = [subst.get(x, x) for x in extra]
    out = tmp_path / "out"
    args = ["pretrain", "--data", str(small_text_corpus), "--tokenizer", story_tok_dir, "--out", str(out), "--max-steps", "2", "--no-progress"]
    for i in range(0, len(extra), 2):
        flag = extra[i]
        if flag in args:
            j = args.index(flag)
            args[j + 1] = extra[i + 1]
        elif flag == "--resume":
            args.insert(1, "--resume")
            continue
        else:
            args += extra[i : i + 2]
    if extra == ["--resume"]:
        args = ["pretrain", "--out", str(out), "--resume"]
    rc = main(["--quiet", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: ")
    import re

    assert re.search(message, err[0]), err[0]
    assert not out.exists()


def test_second_run_into_a_used_folder_is_refused(small_text_corpus, story_tok_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "2", "--eval-every", "0")]) == 0
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "2")]) == 2
    assert "already holds a training run" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="torch.compile needs a C++ compiler")
def test_compiled_objective_equals_eager(monkeypatch):
    """``--compile``: the compiled objective gives the eager losses and gradients (the CPU fast paths that
    inductor cannot lower step aside while compiling).  Through AOTAutograd's eager backend: tracing, the graph
    breaks and the decompositions are ours to keep right; inductor's C++ code generation (most of a minute of
    the suite's CPU time) is torch's, and the GPU check (benchmarks/gpu_check.sh) runs the real one."""
    from bertforge.bench import pretraining_batch
    from bertforge.config import ImplConfig, PretrainConfig
    from bertforge.models import BertConfig
    from bertforge.train.engine import maybe_compile
    from bertforge.models import BertForPreTraining
    from bertforge.objectives import MaskedLM

    torch.manual_seed(0)
    # one layer: the last layer is the one the CPU fast path treats apart; compile time grows with the layers
    cfg = BertConfig.preset("tiny", vocab_size=300, num_hidden_layers=1, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg).train()
    objective = MaskedLM(model, PretrainConfig())
    batch = pretraining_batch(8, 32, 300)
    batch["attention_mask"][1, 20:] = 0  # some padding
    batch["input_ids"][1, 20:], batch["labels"][1, 20:] = 0, -100
    totals = MaskedLM.counts(batch)

    def run(fn):
        model.zero_grad()
        loss, parts = objective.loss(fn(batch, 0), totals)
        loss.backward()
        return [float(parts["mlm"]), float(parts["nsp"])], [p.grad.clone() for p in model.parameters()]

    eager = run(objective)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend="aot_eager", **kw))
    compiled = maybe_compile(objective, ImplConfig(compile=True))
    assert compiled is not objective
    from torch._dynamo.utils import counters

    counters.clear()
    got = run(compiled)
    # while compiling, the padded layout and the whole last layer: one graph up to the masked positions (a
    # data-dependent shape), one after; the CPU fast paths (unpadding, the rows-only last layer) made 18
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["graph_break"])
    assert got[0] == pytest.approx(eager[0], rel=1e-5)
    for a, b in zip(got[1], eager[1]):
        assert (a - b).abs().max() < 1e-5
    # with dropout the CPU's fast masks step aside while tracing (their 64-bit view does not trace)
    from bertforge.models.initialization import set_dropout

    set_dropout(model, 0.1)
    with_dropout = run(maybe_compile(objective, ImplConfig(compile=True)))
    assert all(math.isfinite(v) for v in with_dropout[0]) and with_dropout[0] != got[0]


# ------------------------------------------------------------------------------------------------ recipes
def test_the_budget_recipe_is_the_default_and_bert_is_one_flag_away(small_text_corpus, story_tok_dir, tmp_path):
    """Budget defaults (MLM only, no dropout in training, lr 1e-3, ...), explicit flags winning over either
    recipe, the resolved recipe saved and kept on --resume, and config.json keeping BERT's dropout for
    fine-tuning."""
    from bertforge.config import RECIPES, PretrainConfig

    assert PretrainConfig().recipe == "budget" and PretrainConfig().train.lr == RECIPES["budget"]["lr"]
    assert PretrainConfig.for_recipe("bert").data.nsp is True and PretrainConfig.for_recipe("bert").train.lr == 1e-4

    def run(out, *extra):
        return main(["--quiet", *tiny_pretrain(small_text_corpus, out, "--max-eval-instances", "64", "--eval-every", "0",
                                               "--save-every", "2", *extra, tokenizer=story_tok_dir, length=64, batch=16)])

    budget, bert = tmp_path / "budget", tmp_path / "bert"
    assert run(budget) == 0
    saved = json.loads((budget / "pretrain_config.json").read_text())
    assert saved["recipe"] == "budget" and saved["data"]["nsp"] is False and saved["model"]["dropout"] == 0.0
    assert saved["train"]["lr"] == 1e-3 and saved["train"]["adam_beta2"] == 0.98 and saved["train"]["max_grad_norm"] == 0.5
    config = json.loads((budget / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    assert config["hidden_dropout_prob"] == 0.1 and config["attention_probs_dropout_prob"] == 0.1  # for fine-tuning
    m = json.loads((budget / "metrics.json").read_text())
    assert 0 <= m["mlm_accuracy_masked"] <= 1 and "nsp_accuracy" not in m

    assert run(bert, "--recipe", "bert", "--lr", "3e-4") == 0
    saved = json.loads((bert / "pretrain_config.json").read_text())
    assert saved["recipe"] == "bert" and saved["data"]["nsp"] is True and saved["model"]["dropout"] is None
    assert saved["train"]["lr"] == 3e-4 and saved["train"]["adam_beta2"] == 0.999  # the flag wins, the rest is BERT's
    assert "nsp_accuracy" in json.loads((bert / "metrics.json").read_text())

    # resume keeps the run's recipe (dropout 0 again in training, though config.json says 0.1)
    assert main(["--quiet", "pretrain", "--out", str(budget), "--resume", "--recipe", "bert", "--no-progress"]) == 2
    assert main(["--quiet", "pretrain", "--out", str(budget), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    saved = json.loads((budget / "pretrain_config.json").read_text())
    assert saved["recipe"] == "budget" and saved["model"]["dropout"] == 0.0 and saved["train"]["lr"] == 1e-3
    assert json.loads((budget / "metrics.json").read_text())["steps"] == 4


def test_budget_training_runs_without_dropout_and_saves_the_models_own(monkeypatch, small_text_corpus, story_tok_dir, tmp_path):
    """``--dropout`` is pretraining's: the model trains with it and config.json keeps the model's dropout."""
    from bertforge.train import pretrain
    from bertforge.ops import Dropout

    seen = []
    real = pretrain.Pretraining.train

    def spy(self, resume):
        model = self.objective.model
        seen.extend(m.p for m in model.modules() if isinstance(m, Dropout))
        seen.extend(m.dropout_p for m in model.modules() if hasattr(m, "dropout_p"))
        return real(self, resume)

    monkeypatch.setattr(pretrain.Pretraining, "train", spy)
    out = tmp_path / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "1", "--dropout", "0.25",
                                   recipe="budget")]) == 0
    assert seen and set(seen) == {0.25}
    assert json.loads((out / "config.json").read_text())["hidden_dropout_prob"] == 0.1


def test_mask_only_accuracy_counts_the_mask_positions_only():
    """``mlm_accuracy_masked`` is the accuracy over the selected positions whose input is [MASK]."""
    from bertforge.models import BertConfig
    from bertforge.evaluation import evaluate_pretraining
    from bertforge.models import BertForMaskedLM

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig.preset("tiny", vocab_size=50))
    ids = torch.randint(5, 50, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3:9] = ids[:, 3:9]
    ids[:, 3:6] = 4  # [MASK] at three of the six selected positions; the others kept (copyable)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids), "labels": labels}
    res = evaluate_pretraining(model, [batch], "cpu", mask_id=4)
    with torch.no_grad():
        pred = model.eval()(ids, torch.ones_like(ids)).logits.argmax(-1)
    at_mask = (pred == labels)[:, 3:6].float().mean().item()
    assert res["mlm_accuracy_masked"] == pytest.approx(at_mask)
    assert res["mlm_accuracy"] == pytest.approx((pred == labels)[:, 3:9].float().mean().item())
    assert "mlm_accuracy_masked" not in evaluate_pretraining(model, [batch], "cpu")


def test_local_attention_heads_are_applied_to_new_models_only(small_text_corpus, story_tok_dir, tmp_path):
    from bertforge.models import BertConfig
    from bertforge.models.electra import ElectraPretraining
    from bertforge.models.initialization import local_attention_heads_, sinusoidal_positions_

    torch.manual_seed(0)
    electra = ElectraPretraining(BertConfig.preset("mini", vocab_size=50)).eval()
    sinusoidal_positions_(electra)
    cols = local_attention_heads_(electra)  # both encoders' first layers; they share the embeddings
    assert (electra.generator.electra.embeddings.word_embeddings.weight[:, cols] == 0).all()
    ids = torch.randint(5, 50, (2, 64))

    def first_layer_attention(x, att):  # (B, T, C) -> (B, nh, T, T)
        nh, hs = att.n_head, x.shape[-1] // att.n_head
        q, k = (F.linear(x, m.weight, m.bias).view(2, 64, nh, hs).transpose(1, 2) for m in (att.query, att.key))
        return torch.softmax(q @ k.transpose(-1, -2) / hs**0.5, -1)

    with torch.no_grad():
        d = first_layer_attention(electra.bert.embeddings(ids), electra.bert.encoder.layer[0].attention.self)
        g = first_layer_attention(electra.generator.electra.embed(ids), electra.generator.electra.encoder.layer[0].attention.self)
    assert d.shape[1] == 4 and g.shape[1] == 1  # the generator: a quarter of the width, one head (looking back)
    for a, h, off in ((d, 0, -1), (d, 1, 1), (g, 0, -1)):
        assert a[:, h].diagonal(off, -2, -1).mean() > 0.5
    from bertforge.models import BertForMaskedLM

    cols = local_attention_heads_(BertForMaskedLM(BertConfig.preset("tiny", vocab_size=50)))  # the runs' columns
    out = tmp_path / "local"
    flags = ["--max-steps", "2", "--eval-every", "0", "--position-init", "sinusoidal", "--attention-init", "local"]
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, *flags)]) == 0
    w = _weights(out)
    q0 = w["bert.encoder.layer.0.attention.self.query.weight"][:64]  # head 0: reads the positions' columns only
    assert float(q0[:, cols].norm() / q0.norm()) > 0.99
    assert json.loads((out / "pretrain_config.json").read_text())["model"]["attention_init"] == "local"
    plain = tmp_path / "plain"  # BERT's random start, then continued under the budget recipe: nothing is reset
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, plain, "--max-steps", "1", "--eval-every", "0",
                                   "--save-every", "1")]) == 0
    more = tmp_path / "more"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, more, "--max-steps", "1", "--eval-every", "0",
                                   "--init", str(plain), recipe="budget")]) == 0
    assert json.loads((more / "pretrain_config.json").read_text())["model"]["attention_init"] == "local"
    q1 = _weights(more)["bert.encoder.layer.0.attention.self.query.weight"][:64]
    assert float(q1[:, cols].norm() / q1.norm()) < 0.5  # random: the columns' share of 128
    assert float((q1 - _weights(plain)["bert.encoder.layer.0.attention.self.query.weight"][:64]).abs().max()) < 0.05


def test_sinusoidal_positions_start_from_sines_and_stay_learned(small_text_corpus, story_tok_dir, tmp_path):
    from bertforge.models import BertConfig
    from bertforge.models.electra import ElectraPretraining
    from bertforge.models.initialization import sinusoidal_positions_

    model = ElectraPretraining(BertConfig.preset("tiny", vocab_size=50))
    sinusoidal_positions_(model)
    w = model.bert.embeddings.position_embeddings.weight.detach().double()  # (P, C)
    assert model.generator.electra.embeddings.position_embeddings.weight is model.bert.embeddings.position_embeddings.weight
    assert float(w.std()) == pytest.approx(0.02, rel=1e-3)
    # one linear map takes every position to the next (what random positions lack): least squares, no residual
    R = torch.linalg.lstsq(w[:-1], w[1:]).solution
    assert torch.allclose(w[:-1] @ R, w[1:], atol=1e-8)
    out = tmp_path / "sin"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "2", "--eval-every", "0",
                                   "--position-init", "sinusoidal")]) == 0
    saved = _weights(out)["bert.embeddings.position_embeddings.weight"].double()
    assert 0.9 < float(torch.nn.functional.cosine_similarity(saved.flatten(), w.flatten(), dim=0)) < 1  # moved, from sines
    assert json.loads((out / "pretrain_config.json").read_text())["model"]["position_init"] == "sinusoidal"


def test_a_config_file_in_sections_with_its_out_and_a_runs_own_settings_repeat_it(small_text_corpus, story_tok_dir,
                                                                                   tmp_path):
    """A pretraining --config file may hold sections as pretrain_config.json does, and ``out``; the saved
    pretrain_config.json of a run, given as --config with another --out, repeats it bit for bit."""
    cfg, out = tmp_path / "run.yaml", tmp_path / "first"
    cfg.write_text(f"out: {out}\nmodel: {{preset: tiny}}\ndata: {{max_seq_length: 64, tokenizer: {story_tok_dir}}}\n"
                   "train: {batch_size: 8, max_steps: 3, eval_every: 0}\n")
    assert main(["--quiet", "pretrain", "--config", str(cfg), "--data", str(small_text_corpus), "--no-progress"]) == 0
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["train"]["max_steps"] == 3 and saved["model"]["preset"] == "tiny"
    again = tmp_path / "again"
    assert main(["--quiet", "pretrain", "--config", str(out / "pretrain_config.json"), "--out", str(again),
                 "--no-progress"]) == 0
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_elapsed_moves_on_every_log_line_of_a_run_by_steps(small_text_corpus, story_tok_dir, tmp_path, capsys):
    """A run without --max-time printed `elapsed 0:00:00` until its first evaluation (issue 67, item 3): the
    clock moves at every log line, in train.log and metrics.jsonl alike."""
    out = tmp_path / "run"
    assert main(["--quiet", *_args(small_text_corpus, story_tok_dir, out, "--max-steps", "6", "--log-every", "1",
                                   "--eval-every", "0", length=32, batch=4)]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed"] for r in rows if r["type"] == "train"]
    assert len(elapsed) == 6 and elapsed[0] > 0 and all(b > a for a, b in zip(elapsed, elapsed[1:])), elapsed
    capsys.readouterr()


def test_each_set_up_phase_says_so_as_it_starts(small_text_corpus, story_tok_dir, tmp_path, capsys):
    """Issue 67, item 7: a run sat silent for over a minute before its first line; each set-up phase (tokenizing
    the corpus, building the model) now says so as it starts, before the run's first figures."""
    assert main(_args(small_text_corpus, story_tok_dir, tmp_path / "run", "--max-steps", "1", "--eval-every", "0",
                      "--log-every", "1")) == 0
    err = capsys.readouterr().err
    said = [err.find(x) for x in ("tokenizing ", "building the model (2 layers of width 128, new weights)",
                                  "pretraining BertForPreTraining", "step 1/1")]
    assert -1 not in said and said == sorted(said), err


@pytest.mark.slow
def test_a_bf16_run_records_its_precision_and_resumes_exactly_in_it(small_text_corpus, story_tok_dir, tmp_path,
                                                                    monkeypatch):
    """``--precision auto`` on a CPU with native bf16 (mocked) runs bf16 and says so in its settings and card; a
    resumed run keeps it on a machine that would choose fp32, and ends as the uninterrupted run, bit for bit."""
    def args(out, steps):
        return ["--quiet", *tiny_pretrain(small_text_corpus, out, "--recipe", "bert", "--eval-every", "0",  # dropout
                                          "--save-every", "2", "--max-eval-instances", "8", tokenizer=story_tok_dir,
                                          steps=steps)]

    monkeypatch.setenv("BERTFORGE_CPU_BF16", "1")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(args(straight, 4)) == 0
    assert json.loads((straight / "pretrain_config.json").read_text())["impl"]["precision"] == "bf16"
    assert "| precision | bf16 |" in (straight / "README.md").read_text()
    env = dict(os.environ, BERTFORGE_FAULT="write:step-00000004/optimizer.pt")  # the second checkpoint
    proc = subprocess.run([sys.executable, "-m", "bertforge", *args(killed, 4)], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    monkeypatch.setenv("BERTFORGE_CPU_BF16", "0")  # resumed where auto would choose fp32
    assert main(["--quiet", "pretrain", "--out", str(killed), "--resume", "--no-progress"]) == 0
    assert json.loads((killed / "pretrain_config.json").read_text())["impl"]["precision"] == "bf16"
    a, b = (load_file(o / "model.safetensors") for o in (straight, killed))
    assert all(torch.equal(a[k], b[k]) for k in a)
