"""ELECTRA pretraining (--objective electra): outputs that load in transformers, fine-tuning from the
discriminator, fill-mask from the generator, exact resume after SIGKILL, and torchrun equal to one process."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from bertforge.checkpoint import list_checkpoints, load_checkpoint
from bertforge.cli import main
from bertforge.models import BertConfig
from bertforge.models.electra import ElectraPretraining, generator_config, load_generator, sample
from bertforge.ops.dropout import DropoutKeys

from ..helpers import tiny_pretrain


@pytest.fixture(scope="module")
def tok_dir(small_text_corpus, tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["--quiet", "tokenizer", "train", "--input", str(small_text_corpus), "--vocab-size", "400",
                 "--out", str(d)]) == 0
    return str(d)


def _args(corpus, tok, out, *extra):
    return tiny_pretrain(corpus, out, "--objective", "electra", "--log-every", "1", "--max-eval-instances", "32",
                         "--dropout", "0.1", "--mask-prob", "0.15", *extra, tokenizer=tok, length=64, steps=None)


@pytest.fixture(scope="module")
def electra_run(small_text_corpus, tok_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("electra") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTFORGE_PLOTS", "1")  # (the suite skips plots; this run's are tested)
        assert main(["--quiet", *_args(small_text_corpus, tok_dir, out, "--max-steps", "6", "--eval-every", "3",
                                       "--save-every", "3")]) == 0
    return out


def _weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


def test_generator_shape_follows_the_paper():
    g = generator_config(BertConfig.preset("base"), 0.25)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size, g.num_hidden_layers) == (192, 3, 768, 12)
    g = generator_config(BertConfig.preset("mini"), 0.25)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size) == (64, 1, 256)
    for preset, size in (("small", 0.375), ("mini", 0.75), ("tiny", 0.999)):  # widths whose heads do not divide
        m = ElectraPretraining(BertConfig.preset(preset, vocab_size=50), size)
        g = m.generator.config
        assert g.hidden_size % g.num_attention_heads == 0
        assert hasattr(m.generator.electra, "embeddings_project") == (g.hidden_size != m.config.hidden_size)


def test_sampling_follows_the_generator_and_each_sequence_draws_alone():
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    logits = p.log().expand(100_000, 5)
    draws = sample(logits, torch.zeros(100_000, dtype=torch.long), sampler=torch.Generator().manual_seed(1))
    freq = torch.bincount(draws, minlength=5) / 100_000
    assert freq[1] == 0 and freq[4] == 0  # never a token of probability 0
    assert torch.allclose(freq, p, atol=0.01)  # 4 standard deviations of a frequency near 0.5 is 0.006
    # keyed: the rows of sequence 7 draw the same tokens whichever sequences share its batch
    rows = torch.randn(3, 40)
    alone = sample(rows, torch.tensor([0, 0, 0]), DropoutKeys(3, 5, [7]))
    batch = torch.cat([torch.randn(2, 40), rows, torch.randn(4, 40)])
    batched = sample(batch, torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2]), DropoutKeys(3, 5, [2, 7, 9]))
    assert torch.equal(batched[2:5], alone)
    # and a sequence's draws change with the step
    later = [sample(rows, torch.tensor([0, 0, 0]), DropoutKeys(3, step, [7])) for step in range(6, 11)]
    assert any(not torch.equal(d, alone) for d in later)


def test_outputs_metrics_and_transformers_loading(electra_run, tok_dir):
    out = electra_run
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["model_type"] == "bert"
    gen_config = json.loads((out / "generator" / "config.json").read_text())
    assert gen_config["model_type"] == "electra" and gen_config["embedding_size"] == 128 and gen_config["hidden_size"] == 32
    m = json.loads((out / "metrics.json").read_text())
    for k in ("mlm_accuracy", "mlm_accuracy_masked", "disc_accuracy", "disc_accuracy_replaced", "disc_accuracy_original",
              "replaced_fraction", "disc_loss"):
        assert 0 <= m[k] <= (1 if k != "disc_loss" else 10), k
    assert 0 < m["replaced_fraction"] < 0.2  # at most the masked 15% (+ rounding), minus what the generator got right
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("disc_loss" in r and "replaced_fraction" in r for r in rows if r["type"] == "train")
    assert {"loss.png", "accuracy.png"} <= {p.name for p in (out / "plots").iterdir()}

    transformers = pytest.importorskip("transformers")
    from bertforge.models import BertModel

    ids = torch.tensor([[2, 40, 41, 42, 43, 3, 0, 0], [2, 50, 51, 3, 60, 61, 62, 3]])
    am = (ids != 0).long()
    ours = BertModel.from_pretrained(out).eval()
    theirs = transformers.BertModel.from_pretrained(out).eval()
    with torch.no_grad():
        a, b = ours(ids, am).last_hidden_state, theirs(input_ids=ids, attention_mask=am).last_hidden_state
    assert (a - b)[am.bool()].abs().max() < 1e-5

    # the generator directory: transformers' ElectraForMaskedLM equals the training-time generator
    step, path = list_checkpoints(str(out))[-1]
    objective = ElectraPretraining(BertConfig.load(out))
    load_checkpoint(path, objective)
    gen_theirs = transformers.ElectraForMaskedLM.from_pretrained(out / "generator").eval()
    gen_ours = load_generator(out / "generator").eval()
    with torch.no_grad():
        trained = objective.eval().generator(ids, am).logits
        for other in (gen_theirs(input_ids=ids, attention_mask=am).logits, gen_ours(ids, am).logits):
            assert (trained - other)[am.bool()].abs().max() < 1e-5
    # and the discriminator in the checkpoint is the model directory's
    saved = _weights(out)
    for k, v in objective.bert.state_dict().items():
        assert torch.equal(saved[k], v), k


def test_fill_mask_on_the_generator_and_finetuning_from_the_discriminator(electra_run, tmp_path, capsys):
    from bertforge import pipeline

    res = pipeline("fill-mask", model=str(electra_run / "generator"))("the little [MASK] went home.", top_k=3)
    assert len(res) == 3 and all(0 <= r["score"] <= 1 for r in res)  # one [MASK]: its top 3
    rows = ["sentence\tlabel"] + [f"{w} story number {i}\t{i % 2}" for i, w in enumerate(["a", "the", "one", "my"] * 8)]
    (tmp_path / "t.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert main(["--quiet", "finetune", "classify", "--model", str(electra_run), "--train", str(tmp_path / "t.tsv"),
                 "--validation", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "cls"), "--epochs", "1",
                 "--no-progress"]) == 0
    assert 0 <= json.loads((tmp_path / "cls" / "metrics.json").read_text())["accuracy"] <= 1
    from bertforge.models import BertForQuestionAnswering  # what finetune squad loads: only its head is new

    assert set(BertForQuestionAnswering.from_pretrained(electra_run).loading_info["newly_initialized"]) <= {
        "qa_outputs.weight", "qa_outputs.bias"}


def test_evaluate_mlm_scores_the_generator_as_transformers_does(electra_run, small_text_corpus):
    """`bertforge evaluate mlm` on an ELECTRA run's generator/: the accuracy transformers' ElectraForMaskedLM
    gives on the same masked blocks."""
    transformers = pytest.importorskip("transformers")
    from bertforge import evaluate_mlm
    from bertforge.corpus import iter_documents
    from bertforge.evaluation import mlm_blocks
    from bertforge.tokenizer import load_tokenizer

    gen = str(electra_run / "generator")
    ours = evaluate_mlm(gen, str(small_text_corpus), max_seq_length=32, max_blocks=40)
    ids, labels = mlm_blocks(load_tokenizer(gen), iter_documents([str(small_text_corpus)], "text", "file"), 32, 0,
                             max_blocks=40)
    with torch.no_grad():
        logits = transformers.ElectraForMaskedLM.from_pretrained(gen).eval()(input_ids=ids).logits
    sel = labels != -100
    assert ours["masked_tokens"] == int(sel.sum()) > 50
    assert ours["mlm_accuracy"] == pytest.approx(int((logits.argmax(-1)[sel] == labels[sel]).sum()) / int(sel.sum()), abs=1e-12)


@pytest.mark.slow
def test_sigkill_and_resume_reproduce_the_uninterrupted_run(small_text_corpus, tok_dir, tmp_path):
    args = ["--max-steps", "16", "--save-every", "4", "--eval-every", "8"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["--quiet", *_args(small_text_corpus, tok_dir, straight, *args)]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "--quiet", *_args(small_text_corpus, tok_dir, killed, *args)],
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (killed / "checkpoints" / "step-00000004").exists():  # (12 steps before the run ends: a window)
        assert time.time() < deadline and proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert [s for s, _ in list_checkpoints(str(killed))][-1] < 16
    assert main(["--quiet", "pretrain", "--out", str(killed), "--resume", "--no-progress"]) == 0
    for sub in ("", "generator"):
        a, b = _weights(straight / sub), _weights(killed / sub)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (sub, k)


@pytest.mark.slow
def test_accumulation_matches_one_batch(small_text_corpus, tok_dir, tmp_path):
    """Replacements are sampled per sequence from generators keyed like the dropout masks, so two accumulated
    micro-batches compute the one-batch run, as two processes do (the engine treats a process's micro-batches
    as another process's; torchrun itself is tested once per command, test_pretrain.py)."""
    args = ["--max-steps", "4", "--eval-every", "0", "--save-every", "0"]
    one, accum = tmp_path / "one", tmp_path / "accum"
    assert main(["--quiet", *_args(small_text_corpus, tok_dir, one, *args)]) == 0
    assert main(["--quiet", *_args(small_text_corpus, tok_dir, accum, *args, "--grad-accum", "2")]) == 0
    a, b = _weights(one), _weights(accum)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    rows = [[json.loads(x)["replaced_fraction"] for x in (d / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["type"] == "train"] for d in (one, accum)]
    assert rows[0] == pytest.approx(rows[1], abs=1e-9)  # the same tokens replaced


def test_electra_refuses_nsp_and_init(small_text_corpus, tok_dir, tmp_path, capsys):
    assert main(["--quiet", *_args(small_text_corpus, tok_dir, tmp_path / "a", "--max-steps", "1", "--nsp")]) == 2
    assert "without next sentence prediction" in capsys.readouterr().err
    assert main(["--quiet", *_args(small_text_corpus, tok_dir, tmp_path / "b", "--max-steps", "1", "--init", tok_dir)]) == 2
    assert "--init" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_replacements_trace_under_torch_compile():
    """``--compile``: the replacements drawn from the global generator (no keys: CUDA) trace with a symbolic
    number of masked rows in one graph and draw what eager draws (``torch.rand(M, generator=None)`` made
    the compiled ELECTRA objective fail there)."""
    logits = torch.randn(7, 50)
    seq_of_row = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    compiled = torch.compile(sample, dynamic=True, backend="aot_eager", fullgraph=True)
    torch.manual_seed(3)
    eager = sample(logits, seq_of_row)
    torch.manual_seed(3)
    assert torch.equal(compiled(logits, seq_of_row), eager)
    torch.manual_seed(4)
    eager = sample(logits[:5], seq_of_row[:5])
    torch.manual_seed(4)
    assert torch.equal(compiled(logits[:5], seq_of_row[:5]), eager)  # another number of rows
