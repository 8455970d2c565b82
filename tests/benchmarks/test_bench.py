"""bertforge bench: a real training step of both tools on the same model and batches (fine-tuning tasks, and the
ModernBERT pretraining step)."""

import json

import pytest

from bertforge.cli import main

from ..conftest import data_path

pytest.importorskip("transformers")


@pytest.mark.parametrize("task,arch", [("classify", "bert"), ("squad", "bert"), ("embed", "bert"), ("ner", "bert"),
                                       ("rerank", "bert"), ("classify", "modernbert")])
def test_finetune_bench_times_the_same_model_on_the_same_batches(task, arch, tmp_path, capsys):
    extra = ["--arch", arch]
    if task in ("squad", "embed", "rerank"):  # a slice of SQuAD, shorter windows (embed, rerank: its questions and
        # paragraphs)
        squad = json.loads(data_path("squad", "dev-v1.1.json").read_text(encoding="utf-8"))
        (tmp_path / "s.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": squad["data"][0]["paragraphs"][:6]}]}))
        extra += ["--train", str(tmp_path / "s.json"), "--seq-len", "256"]
    elif task == "ner":
        extra += ["--train", str(data_path("wnut16", "train.conll"))]
    bf16 = task == "classify" and arch == "bert"  # under bf16 on the CPU, both tools are timed in fp32 as well
    if bf16:
        extra += ["--precision", "bf16"]
    assert main(["bench", "--task", task, "--preset", "tiny", "--rounds", "2", "--steps", "1", "--batch-size", "4", *extra]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-2])
    assert bf16 == ("bertforge fp32" in lines[-3]) == (res.get("fp32_finetune_tokens_per_second", 0) > 0)
    assert bf16 == (res.get("finetune_bf16_speedup_vs_fp32", 0) > 0)
    assert f"({'ModernBert' if arch == 'modernbert' else 'Bert'}" in "\n".join(lines)  # the family asked for
    assert res["task"] == task and res["batches"] >= 2 and res["max_logit_difference"] < 1e-4
    assert res["finetune_tokens_per_second"] > 0 and res["transformers_finetune_tokens_per_second"] > 0
    assert lines[-1] == f"finetune_speedup_vs_transformers={res['finetune_speedup_vs_transformers']:.2f}"


def test_modernbert_bench_times_the_same_weights_on_the_same_batch(capsys):
    assert main(["bench", "--arch", "modernbert", "--preset", "tiny", "--rounds", "1", "--steps", "1",
                 "--batch-size", "4", "--seq-len", "32", "--vocab-size", "500", "--precision", "bf16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    res = json.loads(lines[-2])
    assert res["matmul_peak_dtype"] == "bf16" and res["train_bf16_speedup_vs_fp32"] > 0
    assert res["fp32_train_tokens_per_second"] > 0 and res["transformers_fp32_train_tokens_per_second"] > 0
    assert res["arch"] == "modernbert" and res["loss_difference"] < 1e-4 and res["parameters"] > 0
    assert res["train_tokens_per_second"] > 0 and res["transformers_train_tokens_per_second"] > 0
    assert lines[-1] == f"train_speedup_vs_transformers={res['train_speedup_vs_transformers']:.2f}"


@pytest.mark.parametrize("task,wanted", [("ner", "wnut16/train.conll"), ("squad", "squad/train-8k-v1.1.json")])
def test_finetune_bench_takes_only_its_own_tasks_files(task, wanted, tmp_path):
    """A data folder holding another task's files is refused, never read as this task's."""
    from bertforge.bench.finetuning import _finetune_data
    from bertforge.errors import UserError

    other = "squad/train-8k-v1.1.json" if task == "ner" else "wnut16/train.conll"
    (tmp_path / other).parent.mkdir(parents=True)
    (tmp_path / other).write_text("{}")
    with pytest.raises(UserError, match=wanted):
        _finetune_data(task, str(tmp_path), None, str(tmp_path))
    (tmp_path / wanted).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / wanted).write_text("{}")
    assert _finetune_data(task, str(tmp_path), None, str(tmp_path))[0] == str(tmp_path / wanted)


@pytest.mark.slow
def test_onnx_bench_times_torch_and_both_graphs_on_the_same_texts():
    pytest.importorskip("onnxruntime")
    from bertforge.bench import run_onnx_bench

    lines = []
    res = run_onnx_bench(preset="tiny", rounds=1, out=lines.append, texts=(3, 40))
    for key in ("sentences_batch1", "sentences_batch32", "pairs_batch1", "pairs_batch32"):
        row = res[key]
        assert row["texts"] == (3 if key.endswith("1") else 40) and row["mean_tokens"] > 0
        assert all(row[f"{b}_tokens_per_second"] > 0 for b in ("torch", "onnx", "onnx-int8"))
        assert row["onnx-int8_vs_torch"] == pytest.approx(row["onnx-int8_tokens_per_second"]
                                                         / row["torch_tokens_per_second"], rel=0.02)
    assert json.loads(lines[-1]) == res and lines[0].startswith("serving BertForSequenceClassification")
