"""``bertforge pretrain --resume`` keeps the run as it was started: a changed corpus (by content, under the same
names) or a setting that changes what is trained is refused before anything is loaded, naming both values; the
schedule may change, and is said; a run killed before its first checkpoint starts again from step 0; a damaged
checkpoint that the resumed run writes again leaves nothing behind."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from bertforge.checkpoint import list_checkpoints
from bertforge.cli import main
from ..helpers import DOCUMENTS, tiny_pretrain

OTHER = ["the mat sat on the cat. it was cold there.", "a park ran in the dog. the sun was down.",
         "the song sang a bird. it sang all night long.", "a pond swam in the fish. the water was warm."] * 7


def _corpus(path: pathlib.Path, texts: list[str]) -> pathlib.Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    w = tmp_path_factory.mktemp("inputs")
    _corpus(w / "corpus.jsonl", DOCUMENTS)
    assert main(["--quiet", "tokenizer", "train", "--input", str(w / "corpus.jsonl"), "--vocab-size", "60",
                 "--model", "wordlevel", "--min-frequency", "1", "--out", str(w / "tok")]) == 0
    return w


def _args(inputs: pathlib.Path, out, *extra: str, data=None, steps=2, preset="tiny") -> list[str]:
    return ["--quiet", *tiny_pretrain(data or inputs / "corpus.jsonl", out, "--save-every", "1", "--eval-every", "0",
                                      "--max-eval-instances", "4", "--log-every", "1", *extra, tokenizer=inputs / "tok",
                                      batch=4, steps=steps, preset=preset)]


@pytest.fixture(scope="module")
def run(inputs, tmp_path_factory) -> pathlib.Path:
    """A finished run of 2 steps, checkpointed at both (refused resumes must leave it as it is)."""
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(_args(inputs, out)) == 0
    assert [s for s, _ in list_checkpoints(str(out))] == [1, 2]
    return out


def _snapshot(root: pathlib.Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else "folder"
            for p in sorted(root.rglob("*"))}


def _weights(out) -> dict[str, torch.Tensor]:
    return load_file(os.path.join(out, "model.safetensors"))


def _same_weights(a, b) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _refused(argv: list[str], capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err)
    return err[0]


def test_a_corpus_changed_under_the_same_name_is_refused_naming_both(inputs, tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.jsonl", DOCUMENTS)
    out = tmp_path / "run"
    assert main(_args(inputs, out, data=corpus, steps=1)) == 0
    saved = json.loads((out / "pretrain_config.json").read_text())["corpus"]
    _corpus(corpus, OTHER)  # the same file name, another text
    before = _snapshot(out)
    err = _refused(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "2", "--no-progress"], capsys)
    assert "on the corpus it was started on" in err and f"digest {saved['digest'][:12]} ->" in err, err
    assert f"{saved['documents']} documents, {saved['tokens']} tokens" in err, err
    assert _snapshot(out) == before
    _corpus(corpus, DOCUMENTS)  # the text it was started on: it continues
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "2", "--no-progress"]) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 2


@pytest.mark.parametrize("extra,said", [
    (["--preset", "mini"], "--preset tiny -> mini"),
    (["--max-seq-length", "64"], "--max-seq-length 32 -> 64"),
    (["--mask-prob", "0.15"], "--mask-prob 0.3 -> 0.15"),
    (["--whole-word-mask"], "--whole-word-mask False -> True"),
    (["--objective", "electra"], "--objective mlm -> electra"),
    (["--recipe", "bert"], "--recipe budget -> bert"),
    (["--batch-size", "8"], "--batch-size 4 -> 8"),
    (["--seed", "1"], "--seed 0 -> 1"),
    (["--preset", "mini", "--max-seq-length", "64", "--nsp"],
     "--preset tiny -> mini, .*--max-seq-length 32 -> 64, .*--nsp False -> True"),
], ids=["preset", "seq-length", "masking", "whole-word", "objective", "recipe", "batch", "seed", "several"])
def test_a_setting_that_changes_what_is_trained_is_refused_naming_both(extra, said, run, tmp_path, capsys):
    import re

    before = _snapshot(run)
    err = _refused(["--quiet", "pretrain", "--out", str(run), "--resume", "--no-progress", *extra], capsys)
    assert re.search(said, err) and "as it was started" in err, err
    assert _snapshot(run) == before
    config = tmp_path / "mini.yaml"  # from a config file alike
    config.write_text("preset: mini\nmax_steps: 2\n")
    err = _refused(["--quiet", "pretrain", "--out", str(run), "--resume", "--config", str(config)], capsys)
    assert "--preset tiny -> mini" in err, err
    assert _snapshot(run) == before


def test_a_new_schedule_is_allowed_said_and_recorded(run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    argv = ["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "3", "--lr", "5e-4",
            "--warmup-steps", "1", "--eval-every", "0", "--log-every", "3", "--grad-accum", "2", "--device", "cpu",
            "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "--lr 0.001 -> 0.0005" in err and "--max-steps 2 -> 3" in err and "--warmup-steps None -> 1" in err, err
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert (saved["train"]["max_steps"], saved["train"]["lr"], saved["train"]["grad_accum"]) == (3, 5e-4, 2)
    assert saved["corpus"] == json.loads((run / "pretrain_config.json").read_text())["corpus"]
    assert json.loads((out / "metrics.json").read_text())["steps"] == 3


def test_the_saved_settings_name_no_preset_the_model_does_not_have(inputs, run, tmp_path, capsys):
    config = tmp_path / "mini.yaml"
    config.write_text("preset: mini\n")
    for flags in (["--init", str(run)], ["--model-config", str(run / "config.json")], ["--preset", "tiny"]):
        out = tmp_path / flags[0].strip("-")
        argv = _args(inputs, out, "--config", str(config), *flags, steps=1, preset=None)  # the file's, and these
        assert main(argv) == 0, capsys.readouterr().err
        saved = json.loads((out / "pretrain_config.json").read_text())
        assert json.loads((out / "config.json").read_text())["hidden_size"] == 128  # a tiny model
        assert saved["model"]["preset"] == ("tiny" if flags[0] == "--preset" else None), (flags, saved["model"])
        assert "mini" not in json.dumps({k: v for k, v in saved.items() if k != "command"}), flags  # (a file name)
    # resumed with the config file again: the same run, whatever the file's preset says
    out = tmp_path / "init"
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--config", str(config), "--max-steps", "2",
                 "--no-progress"]) == 0


KILLED_AT_FIRST_SAVE = ("import os, signal, sys\n"
                        "import bertforge.checkpoint as c\n"
                        "c.save_checkpoint = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
                        "from bertforge.cli import main\n"
                        "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_again_from_step_0(inputs, run, tmp_path, capsys):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_FIRST_SAVE, *_args(inputs, out)[1:]],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert (out / "pretrain_config.json").is_file() and not list_checkpoints(str(out))
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "starts again from step 0" in err, err
    assert _same_weights(out, run)  # exactly the uninterrupted run
    card = (out / "README.md").read_text()  # the command that made it: the first one, not --resume's
    assert "--resume" not in card and "pretrain --data" in card and "--max-seq-length 32" in card, card
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["type"] == "train"] == [1, 2]


@pytest.mark.parametrize("damage", ["file", "dangling-link"])
def test_a_damaged_checkpoint_written_again_on_resume_leaves_nothing_behind(damage, run, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    newest = out / "checkpoints" / "step-00000002"
    shutil.rmtree(newest)
    if damage == "file":
        newest.write_bytes(b"\0" * 100)
    else:
        newest.symlink_to(tmp_path / "gone")
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 0, capsys.readouterr().err
    names = os.listdir(out / "checkpoints")
    assert not [n for n in names if ".old-" in n or ".tmp-" in n], names
    assert [s for s, _ in list_checkpoints(str(out))] == [1, 2] and newest.is_dir() and not newest.is_symlink()
    assert [n for n in names if n.startswith(".damaged-step-00000002")]  # kept aside, for inspection
    assert _same_weights(out, run)


@pytest.mark.slow
def test_a_restarted_run_keeps_the_vocabulary_it_had_trained(inputs, tmp_path, capsys, monkeypatch):
    """A run that trained its own vocabulary and was killed before its first checkpoint starts again with that
    vocabulary (read from its folder), not with one trained again."""
    import bertforge.train.plan as plan_mod

    out = tmp_path / "run"
    args = [a for a in _args(inputs, out)[1:] if a != str(inputs / "tok")]
    args.remove("--tokenizer")
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_FIRST_SAVE, *args, "--vocab-size", "50"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    vocab = (out / "vocab.txt").read_text()

    def trained_again(*a, **k):
        raise AssertionError("the vocabulary was trained again")

    monkeypatch.setattr(plan_mod, "train_vocabulary", trained_again)
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 0, capsys.readouterr().err
    assert (out / "vocab.txt").read_text() == vocab


def _interrupted_fine_tune(tmp_path) -> tuple[list[str], pathlib.Path]:
    """(the command, its output) of a fine-tuning run stopped at its end, after its checkpoints."""
    import bertforge.train.finetune as finetune_mod

    from ..helpers import tiny_model_dir

    rows = [{"text": t, "label": "pos" if i % 2 else "neg"} for i, t in enumerate(DOCUMENTS[:8])]
    data = tmp_path / "cls.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, out = tiny_model_dir(tmp_path / "model", DOCUMENTS, vocab_size=60, kind="wordlevel"), tmp_path / "ft"
    argv = ["--quiet", "finetune", "classify", "--model", model, "--train", str(data), "--validation", str(data),
            "--out", str(out), "--max-seq-length", "32", "--batch-size", "4", "--epochs", "1", "--save-every", "1",
            "--no-progress"]

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the run stops at its end, after its checkpoints

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finetune_mod, "finish", stopped)
        assert main(argv) == 130  # (Ctrl-C outside the training loop)
    assert list_checkpoints(str(out))
    return argv, out


def test_a_fine_tuning_resume_without_a_checkpoint_that_loads_is_refused(tmp_path, capsys):
    """Fine-tuning builds its model from the checkpoint: with none that loads whole (its only one a link, set
    aside), it is refused, never trained on from random weights."""
    argv, out = _interrupted_fine_tune(tmp_path)
    (step, path), = list_checkpoints(str(out))[-1:]
    shutil.move(path, tmp_path / "elsewhere")  # a link to a whole checkpoint: listed, but not the run's own
    os.symlink(tmp_path / "elsewhere", path)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "nothing to resume" in err[-1], err  # (after the set-aside's warning)


def test_a_fine_tuning_resume_may_change_the_schedule_and_says_so(tmp_path, capsys):
    """As in pretraining: the schedule (epochs, learning rate...) may change on --resume, and the log says so;
    another setting is refused, naming both values."""
    argv, out = _interrupted_fine_tune(tmp_path)
    capsys.readouterr()
    assert main([*argv, "--resume", "--weight-decay", "0.5"]) == 2
    assert "this changes what it trains: --weight-decay 0.01 -> 0.5" in capsys.readouterr().err
    assert main([*argv, "--resume", "--epochs", "2", "--lr", "1e-3"]) == 0
    err = capsys.readouterr().err
    assert "resuming with --lr 0.0003 -> 0.001, --epochs 1 -> 2: the learning-rate schedule is recomputed" in err, err
    assert json.loads((out / "metrics.json").read_text())["epochs"][-1]["epoch"] == 2


@pytest.mark.parametrize("grown", [[], ["--add-vocab", "8"]])
def test_a_run_from_init_resumes_without_its_base_model(grown, tmp_path, capsys):
    """A checkpoint holds all that a resumed run needs: the --init folder may have moved since (also when the run
    grew its vocabulary, issue 66 class 1)."""
    from ..helpers import tiny_model_dir

    base = tiny_model_dir(tmp_path / "base", DOCUMENTS, vocab_size=60)
    texts = DOCUMENTS + [f"the zebra number {i} ate quinoa near the lighthouse." for i in range(12)] * 2
    data, out = _corpus(tmp_path / "c.jsonl", texts), tmp_path / "run"
    assert main(["--quiet", "pretrain", "--init", base, *grown, "--data", str(data), "--out", str(out),
                 "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "2", "--save-every", "1",
                 "--eval-every", "0", "--max-eval-instances", "4", "--no-progress"]) == 0
    shutil.move(base, tmp_path / "moved")
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--max-steps", "3", "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text())["steps"] == 3
    # and the command given again whole, naming the folder that is gone
    assert main(["--quiet", "pretrain", "--init", base, *grown, "--data", str(data), "--out", str(out),
                 "--max-seq-length", "32", "--batch-size", "4", "--max-steps", "4", "--save-every", "1",
                 "--eval-every", "0", "--max-eval-instances", "4", "--no-progress", "--resume"]) == 0, \
        capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text())["steps"] == 4


def test_a_run_killed_after_its_final_checkpoint_is_finished_by_resume(inputs, tmp_path, capsys):
    """Killed after its last checkpoint but before metrics.json and the card: --resume writes them (and evaluates
    its last step once more, logging that evaluation once); a finished run is refused as before."""
    out = tmp_path / "run"
    assert main(_args(inputs, out, "--eval-every", "1")) == 0
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((out / "metrics.json").read_text())
    for name in ("metrics.json", "README.md"):
        (out / name).unlink()
    last = (out / "model.safetensors").read_bytes()  # killed before the model folder was refreshed, too:
    shutil.copy(list_checkpoints(str(out))[0][1] + "/model.safetensors", out / "model.safetensors")
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 0, capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == last
    again = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    untimed = [{k: v for k, v in r.items() if k != "elapsed"} for r in rows]
    assert [{k: v for k, v in r.items() if k != "elapsed"} for r in again] == untimed
    assert json.loads((out / "metrics.json").read_text())["mlm_accuracy"] == final["mlm_accuracy"]
    assert (out / "README.md").is_file() and [s for s, _ in list_checkpoints(str(out))] == [1, 2]
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert "is at step 2 already" in capsys.readouterr().err


def test_ctrl_c_during_the_final_evaluation_lets_the_run_finish(inputs, tmp_path, capsys, monkeypatch):
    """The stop handler holds through the end: a run without a checkpoint yet (--save-every 0) that gets Ctrl-C
    while it evaluates its last step finishes and keeps its output, instead of being removed."""
    import bertforge.train.pretrain as pretrain

    evaluate = pretrain.Pretraining.evaluate

    def interrupted(self):
        if self.engine.state.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return evaluate(self)

    monkeypatch.setattr(pretrain.Pretraining, "evaluate", interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(_args(inputs, tmp_path / "run", "--save-every", "0")) == 0, capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "run" / "metrics.json").is_file() and (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.slow
def test_an_overwrite_killed_before_its_first_checkpoint_gives_the_earlier_output_back(inputs, tmp_path, capsys):
    """Found by hostile testing: --overwrite moves the earlier output aside until the new run's first checkpoint;
    killed before it (kill -9), the earlier output stayed hidden in a dot-folder, and the next start removed it.
    Now the next start puts it back (the new run had nothing to resume), whatever that command is."""
    out = tmp_path / "run"
    assert main(_args(inputs, out)) == 0
    before = (out / "model.safetensors").read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_FIRST_SAVE, *_args(inputs, out, "--overwrite", "--seed",
                                                                              "5")[1:]],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".run.replaced-")]  # hidden, as the kill left it
    assert main(["--quiet", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert "is at step 2 already" in capsys.readouterr().err  # the earlier run, finished, is what --resume finds
    assert (out / "model.safetensors").read_bytes() == before and (out / "metrics.json").is_file()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".run.")]


def test_resume_compares_files_by_content_and_runs_from_any_working_folder(inputs, tmp_path, capsys, monkeypatch):
    """Found by hostile testing: --resume compared paths as strings, so the same corpus and tokenizer under
    other names were refused as changes, and a run started with relative paths could not be resumed from another
    working folder. Saved paths are absolute now, and files are compared by what they hold."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("corpus.jsonl", "tok"):
        (shutil.copytree if (inputs / name).is_dir() else shutil.copy)(inputs / name, work / name)
    monkeypatch.chdir(work)
    args = _args(inputs, "run", data="corpus.jsonl")
    args[args.index("--tokenizer") + 1] = "tok"
    assert main(args) == 0
    saved = json.loads((work / "run" / "pretrain_config.json").read_text())
    assert saved["data"]["data"] == [str(work / "corpus.jsonl")] and saved["data"]["tokenizer"] == str(work / "tok")
    monkeypatch.chdir(tmp_path)
    (work / "corpus.jsonl").rename(work / "renamed.jsonl")  # the same bytes under another name
    shutil.copytree(work / "tok", tmp_path / "tok-copy")
    assert main(["--quiet", "pretrain", "--out", str(work / "run"), "--resume", "--max-steps", "3", "--data",
                 str(work / "renamed.jsonl"), "--tokenizer", str(tmp_path / "tok-copy"), "--no-progress"]) == 0, \
        capsys.readouterr().err
    assert json.loads((work / "run" / "metrics.json").read_text())["steps"] == 3


def test_a_fine_tuning_run_resumes_from_itself_alone(tmp_path, capsys):
    """Issue 66, class 1: the run keeps a copy of what it read of its base model (config, tokenizer), so it
    resumes once the base folder moved, and a base folder given again is compared by content: the same model
    under another path resumes, another model under the same path (a tokenizer of the same size) is refused."""
    from ..helpers import tiny_model_dir

    argv, out = _interrupted_fine_tune(tmp_path)
    model = argv[argv.index("--model") + 1]
    tokenizer = (pathlib.Path(model) / "tokenizer.json").read_bytes()
    shutil.move(model, tmp_path / "moved")
    other = [" ".join(reversed(d.split())) + " again" for d in DOCUMENTS]  # other words, another vocabulary
    tiny_model_dir(model, other, vocab_size=60, kind="wordlevel", seed=1)
    assert (pathlib.Path(model) / "tokenizer.json").read_bytes() != tokenizer
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--model {model} now holds another" in err and err.count("\n") == 1, err
    moved = [*argv[:argv.index("--model") + 1], str(tmp_path / "moved"), *argv[argv.index("--model") + 2:]]
    assert main([*moved, "--resume"]) == 0, capsys.readouterr().err  # the same model, moved: by content
    assert (out / "tokenizer.json").read_bytes() == tokenizer and not (out / "checkpoints").exists()


def test_a_fine_tuning_run_resumes_once_its_base_model_is_gone(tmp_path, capsys):
    argv, out = _interrupted_fine_tune(tmp_path)
    model = pathlib.Path(argv[argv.index("--model") + 1])
    tokenizer = (model / "tokenizer.json").read_bytes()
    shutil.rmtree(model)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0, capsys.readouterr().err
    assert (out / "tokenizer.json").read_bytes() == tokenizer and (out / "model.safetensors").is_file()
    record = json.loads((out / "finetune_config.json").read_text())
    assert record["corpus"]["model"]  # (the base's digest, kept for the record)
