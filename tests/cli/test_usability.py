"""What a transformers user expects on day one: training lines without a terminal, any text file as a
corpus, outputs that follow the umask, familiar flag names, a Python API equal to the commands, fp16 with
loss scaling, and warnings where a run would silently differ from what was asked."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

import bertforge
from bertforge.cli import main
from bertforge.demo.corpus import generate_stories

from ..helpers import tiny_model_dir, tiny_pretrain


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """One plain, hard-wrapped .txt file: a single document as the reader sees it."""
    d = tmp_path_factory.mktemp("book")
    import textwrap

    paragraphs = [" ".join(s) for s in generate_stories(60, seed=1)]
    (d / "book.txt").write_text("\n\n".join(textwrap.fill(p, 70) for p in paragraphs) + "\n")  # hard-wrapped prose
    return d / "book.txt"


@pytest.fixture(scope="module")
def tok(book, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["--quiet", "tokenizer", "train", "--input", str(book), "--vocab-size", "300", "--out", str(out)]) == 0
    return str(out)


def _pretrain(book, tok, out, *extra, **kw):
    """The book with its tokenizer and 16 held-out instances (as the Python API's run below)."""
    return tiny_pretrain(book, out, "--max-eval-instances", "16", *extra, tokenizer=tok, **kw)


def test_a_single_text_file_pretrains_and_log_lines_need_no_terminal(book, tok, tmp_path, capsys):
    out = tmp_path / "pt"
    assert main(_pretrain(book, tok, out, "--log-every", "2", "--eval-every", "0", "--nsp", steps=6)) == 0
    err = capsys.readouterr().err
    assert "cut into" in err and "held-out evaluation text" in err  # said, not refused
    lines = [x for x in err.splitlines() if x.startswith("step ")]
    assert [x.split()[1] for x in lines] == ["2/6", "4/6", "6/6"]
    for word in ("loss", "mlm", "nsp", "lr", "grad-norm", "tokens/s", "elapsed", "eta"):
        assert word in lines[0], word
    log = (out / "train.log").read_text()
    assert sum("step 4/6" in x for x in log.splitlines()) == 1
    # with a progress bar the terminal shows the bar, and train.log still gets every line
    out2 = tmp_path / "pt2"
    assert main(_pretrain(book, tok, out2, "--log-every", "2", "--eval-every", "0", steps=4, progress=True)) == 0
    assert not [x for x in capsys.readouterr().err.splitlines() if x.startswith("step ")]
    assert "step 4/4" in (out2 / "train.log").read_text()


def test_one_example_per_line(tmp_path, capsys):
    from bertforge.corpus import iter_documents

    f = tmp_path / "lines.txt"
    f.write_text("The first example is here. It has two sentences.\n\nA second example.\nA third one!\n")
    assert list(iter_documents([str(f)], doc_separator="line")) == [
        ["The first example is here.", "It has two sentences."], ["A second example."], ["A third one!"]]
    assert len(list(iter_documents([str(f)]))) == 1  # the default: one file, one document
    many = tmp_path / "many.txt"
    many.write_text("".join(" ".join(s) + "\n" for s in generate_stories(80, seed=2)))
    assert main(["--quiet", *tiny_pretrain(many, tmp_path / "pt", "--doc-separator", "line", "--vocab-size", "200",
                                           "--eval-every", "0", "--max-eval-instances", "8")]) == 0
    assert "cut into" not in capsys.readouterr().err  # 80 documents: nothing to cut


def test_too_little_text_is_one_message(tmp_path, tok, capsys):
    f = tmp_path / "tiny.txt"
    f.write_text("Only one sentence here.")
    assert main(["--quiet", "pretrain", "--data", str(f), "--tokenizer", tok, "--out", str(tmp_path / "o"), "--max-steps", "2",
                 "--preset", "tiny", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 sentence(s)" in err[0] and "--no-nsp" in err[0] and "--eval-data" in err[0]


def test_outputs_follow_the_umask(book, tok, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "pt"
        assert main(["--quiet", *_pretrain(book, tok, out, "--eval-every", "0")]) == 0
        model = tiny_model_dir(tmp_path / "m", ["good fun", "bad mess"] * 4, vocab_size=20, kind="wordlevel")
        (tmp_path / "t.jsonl").write_text('{"text": "good fun", "label": "pos"}\n{"text": "bad mess", "label": "neg"}\n')
        ft = tmp_path / "ft"
        assert main(["--quiet", "finetune", "classify", "--model", model, "--train", str(tmp_path / "t.jsonl"),
                     "--validation", str(tmp_path / "t.jsonl"), "--out", str(ft), "--epochs", "1", "--no-progress"]) == 0
    finally:
        os.umask(old)
    for folder in (out, ft, out / "checkpoints" / "step-00000002"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    for f in (out / "model.safetensors", out / "metrics.json", out / "pretrain_config.json", ft / "model.safetensors",
              ft / "metrics.json", out / "checkpoints" / "step-00000002" / "optimizer.pt"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    capsys.readouterr()


def test_transformers_names_underscores_and_version(book, tok, tmp_path, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"bertforge {bertforge.__version__}"
    out = tmp_path / "pt"
    assert main(["--quiet", "pretrain", "--data", str(book), "--tokenizer", tok, "--output_dir", str(out), "--preset", "tiny",
                 "--max_seq_length", "32", "--batch_size", "8",
                 "--max_steps", "2", "--learning_rate", "1e-3", "--eval_steps", "0", "--no-progress"]) == 0
    capsys.readouterr()
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["train"]["lr"] == 1e-3 and saved["train"]["max_steps"] == 2 and saved["data"]["max_seq_length"] == 32
    assert main(["pretrain", "--data", str(book), "--out", str(tmp_path / "x"), "--per_device_train_batch_size", "8",
                 "--max-steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size (the global batch" in err[0]
    assert main(["pretrain", "--data", str(book), "--out", str(tmp_path / "x"), "--max-stepz", "3"]) == 2
    assert "did you mean --max-steps?" in capsys.readouterr().err


def test_the_python_api_equals_the_commands(book, tok, tmp_path, capsys):
    assert main(["--quiet", *_pretrain(book, tok, tmp_path / "cli", "--eval-every", "0", "--seed", "3", steps=3)]) == 0
    m = bertforge.run_pretraining(str(tmp_path / "api"), data=str(book), tokenizer=tok, preset="tiny", max_seq_length=32,
                                  batch_size=8, max_eval_instances=16, max_steps=3, eval_every=0, seed=3, progress=False)
    cli_m = json.loads((tmp_path / "cli" / "metrics.json").read_text())
    assert m["mlm_loss"] == cli_m["mlm_loss"] and m["steps"] == 3
    a, b = load_file(tmp_path / "cli" / "model.safetensors"), load_file(tmp_path / "api" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [{"text": t, "label": lab} for t, lab in [("a fine day", "pos"), ("a grim day", "neg")] * 4]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ft = ["--epochs", "1", "--lr", "1e-3", "--max-seq-length", "16"]
    assert main(["--quiet", "finetune", "classify", "--model", str(tmp_path / "cli"), "--train", str(tmp_path / "c.jsonl"),
                 "--validation", str(tmp_path / "c.jsonl"), "--out", str(tmp_path / "ft-cli"), *ft, "--no-progress"]) == 0
    cli_ft = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    api_ft = bertforge.run_finetuning("classify", str(tmp_path / "cli"), str(tmp_path / "c.jsonl"), str(tmp_path / "c.jsonl"),
                                      str(tmp_path / "ft-api"), epochs=1, lr=1e-3, max_seq_length=16, progress=False)
    assert api_ft["accuracy"] == cli_ft["accuracy"] and api_ft["loss"] == cli_ft["loss"]
    ev = bertforge.evaluate_classifier(str(tmp_path / "ft-api"), str(tmp_path / "c.jsonl"), max_seq_length=16)
    assert ev["accuracy"] == api_ft["accuracy"]
    # word level: reproducible run to run (WordPiece merges may differ where counts tie, see the README)
    info = bertforge.train_tokenizer(str(book), str(tmp_path / "tok-api"), 300, model="wordlevel")
    assert main(["--quiet", "tokenizer", "train", "--input", str(book), "--vocab-size", "300", "--model", "wordlevel",
                 "--out", str(tmp_path / "tok-cli")]) == 0
    vocab = (tmp_path / "tok-cli" / "vocab.txt").read_text()
    assert (tmp_path / "tok-api" / "vocab.txt").read_text() == vocab and info["vocab_size"] == len(vocab.split())
    # transformers' pipeline names
    assert bertforge.pipeline("text-classification", model=str(tmp_path / "ft-api"))("a fine day")["label"] in ("pos", "neg")


def test_fp16_with_loss_scaling_trains_and_resumes(book, tok, tmp_path, capsys):
    """The GPU-without-bf16 path, forced on the CPU: fp16 autocast with a gradient scaler whose state is
    checkpointed and restored."""
    out = tmp_path / "fp16"
    args = _pretrain(book, tok, out, "--precision", "fp16", "--device", "cpu", "--eval-every", "0", "--save-every", "2")
    assert main(["--quiet", *args]) == 0
    state = torch.load(out / "checkpoints" / "step-00000002" / "trainer_state.pt", weights_only=True)
    assert state["scaler"]["scale"] > 0
    assert main(["pretrain", "--out", str(out), "--resume", "--max-steps", "4", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "--max-steps 2 -> 4" in err and "schedule is recomputed" in err  # a changed schedule is said
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 4 and m["mlm_loss"] == m["mlm_loss"]  # finite


def test_report_to_tensorboard_and_small_vocabularies_are_said(book, tmp_path, capsys):
    out = tmp_path / "pt"
    assert main(tiny_pretrain(book, out, "--vocab-size", "5000", "--eval-every", "0", "--max-eval-instances", "8",
                              "--report-to", "tensorboard", steps=1)) == 0
    err = capsys.readouterr().err
    assert "asked for a vocabulary of 5000 tokens; the corpus gave" in err
    try:
        import torch.utils.tensorboard  # noqa: F401

        assert (out / "tensorboard").is_dir()
    except Exception:
        assert "--report-to tensorboard: TensorBoard cannot be used" in err


def _loader_position(out) -> tuple[int, int, int]:
    """(steps, the data loader's epoch, its step in that epoch) of a finished pretraining run."""
    steps = json.loads((out / "metrics.json").read_text())["steps"]
    state = torch.load(out / "checkpoints" / f"step-{steps:08d}" / "trainer_state.pt", weights_only=True)
    return steps, state["loader"]["epoch"], state["loader"]["step"]


def test_pretraining_stops_after_its_epochs_and_takes_transformers_names(book, tok, tmp_path, capsys):
    one, two = tmp_path / "one", tmp_path / "two"

    def epochs(out, *flags):  # as long as ``flags`` say
        return tiny_pretrain(book, out, *flags, "--max-eval-instances", "8", "--eval-every", "0", tokenizer=tok, batch=16,
                             steps=None)

    assert main(epochs(one, "--epochs", "1")) == 0
    # the log says what the README says: the text cut into 20 parts, some of them held out, with their tokens
    import re

    said = re.search(r"on (\d+) documents \((\d+) tokens\), (\d+) held out for evaluation \((\d+) tokens\)",
                     capsys.readouterr().err)
    assert said and int(said[1]) + int(said[3]) == 20 and int(said[3]) >= 1
    assert 0.04 < int(said[4]) / (int(said[2]) + int(said[4])) < 0.2  # about 5% of the text
    assert main(["--quiet", *epochs(two, "--num_train_epochs", "2")]) == 0
    steps1, epoch1, at1 = _loader_position(one)
    steps2, epoch2, at2 = _loader_position(two)
    assert (epoch1, at1) == (0, steps1)  # the whole first epoch and no more ...
    assert epoch2 == 1 and steps2 == steps1 + at2  # ... and the second run went on into its second epoch there
    # --model_name_or_path: pretraining continues from that model (--init)
    model = tiny_model_dir(tmp_path / "m", ["good fun", "bad mess"] * 4, vocab_size=20, kind="wordlevel")
    assert main(["--quiet", "pretrain", "--data", str(book), "--model_name_or_path", model, "--out", str(tmp_path / "c"),
                 "--max-seq-length", "32", "--batch-size", "8", "--max-steps", "1", "--eval-every", "0",
                 "--max-eval-instances", "8", "--no-progress"]) == 0
    assert json.loads((tmp_path / "c" / "pretrain_config.json").read_text())["model"]["init"] == model
    capsys.readouterr()


def test_the_python_api_shows_no_progress_bar_without_a_terminal(book, tok, tmp_path, capsys):
    bertforge.run_pretraining(str(tmp_path / "pt"), data=str(book), tokenizer=tok, preset="tiny", max_seq_length=32,
                              batch_size=8, max_eval_instances=8, max_steps=2, eval_every=0)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t, "label": t[0]}) + "\n" for t in ["a b", "b a"] * 4))
    bertforge.run_finetuning("classify", str(tmp_path / "pt"), str(tmp_path / "c.jsonl"), str(tmp_path / "c.jsonl"),
                             str(tmp_path / "ft"), epochs=1, max_seq_length=16)
    err = capsys.readouterr().err
    assert "%|" not in err and "step/s" not in err and "s/step" not in err, err  # (stderr is no terminal here)
    assert (tmp_path / "ft" / "metrics.json").is_file()


@pytest.mark.slow
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """`bertforge predict ... --json | head`: the pipe's reader goes away, and the command ends without a
    traceback (issue 67), with the status a shell reports for a tool a pipe's end stopped."""
    import subprocess
    import sys

    from ..helpers import tiny_model_dir

    texts = [" ".join(s) for s in generate_stories(40, seed=1)]
    model = tiny_model_dir(tmp_path / "m", texts, vocab_size=300)
    # (120 texts: some 600 KB of JSON, several times a pipe's buffer)
    (tmp_path / "in.txt").write_text("\n".join(f"{t} [MASK] ." for t in texts * 3) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "predict", "fill-mask", "--model", model, "--input",
                             str(tmp_path / "in.txt"), "--json", "--top-k", "50"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout.read(100)
    proc.stdout.close()  # as `head -c 100` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]


@pytest.mark.parametrize("argv,status", [(["--version"], 0), (["--help"], 0), (["-h"], 0), ([], 2)])
def test_the_top_level_answers_without_importing_torch(argv, status):
    """Issue 67, item 7: `bertforge --version` and `--help` imported torch (1.8 s of CPU, 11 s on a loaded
    machine); they answer from bertforge.usage, as does `bertforge` alone (its error)."""
    import subprocess
    import sys

    code = (f"import sys; sys.argv = ['bertforge', *{argv!r}]; import bertforge.__main__ as m\n"
            "try:\n    m.console_main()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('torch' in sys.modules, code, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stderr.splitlines()[-1] == f"False {status}", r
    if argv == ["--version"]:
        assert r.stdout == f"bertforge {__import__('bertforge').__version__}\n"
    elif argv:
        assert r.stdout.startswith("usage: bertforge") and "finetune" in r.stdout


def test_the_top_level_help_is_the_whole_parsers():
    """One parser, one line per command: what `bertforge --help` prints without torch is what the whole command
    line prints."""
    from bertforge.cli import build_parser
    from bertforge.usage import parser

    assert parser().format_help() == build_parser().format_help()
