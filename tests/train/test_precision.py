"""bf16 on the CPU: autocast with fp32 weights and optimizer state, every fast path of ops/ in bf16 (not a fallback),
the run's precision decided by the machine (kept by --resume: test_pretrain.py), and bf16 inference
(``--backend torch-bf16``).

The rest of the suite pins fp32 (``BERTFORGE_CPU_BF16=0`` in conftest.py): its figures are fp32 numerics."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from bertforge.cli import main
from bertforge.config import ImplConfig, PretrainConfig
from bertforge.devices import resolve_precision
from bertforge.models import FAMILIES
from bertforge.objectives import MaskedLM
from bertforge.ops import cross_entropy
from bertforge.tokenizer import SpecialIds

from ..helpers import padded_batch


@pytest.mark.parametrize("avx512_bf16,amx,expected", [(True, False, "bf16"), (False, True, "bf16"),
                                                      (False, False, "fp32")])
def test_auto_is_bf16_on_a_cpu_with_native_bf16_and_fp32_elsewhere(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.delenv("BERTFORGE_CPU_BF16")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    cpu = torch.device("cpu")
    assert resolve_precision(cpu, ImplConfig()) == expected
    assert resolve_precision(cpu, ImplConfig(precision="fp32")) == "fp32"  # asked for: kept
    assert resolve_precision(cpu, ImplConfig(precision="bf16")) == "bf16"
    for forced, said in (("0", "fp32"), ("1", "bf16")):  # the detection overridden
        monkeypatch.setenv("BERTFORGE_CPU_BF16", forced)
        assert resolve_precision(cpu, ImplConfig()) == said


def _step(objective, batch, totals, autocast) -> tuple[float, torch.Tensor]:
    objective.zero_grad()
    with autocast:
        loss, _ = objective.loss(objective(batch, 0), totals)
    loss.backward()
    grads = [p.grad.flatten() for p in objective.parameters() if p.grad is not None]
    return float(loss.detach()), torch.cat(grads).double()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_bf16_step_computes_the_fp32_step_through_the_fused_kernels(family, monkeypatch):
    """Same weights, same padded batch, dropout on (the per-sequence attention kernel): the loss within 1% and the
    gradient's cosine to fp32's at least 0.99; the fused masked-LM loss runs its matmuls in bf16."""
    fam = FAMILIES[family]
    torch.manual_seed(0)
    cfg = fam.config_class.preset("tiny", vocab_size=500, max_position_embeddings=128)
    cfg.adopt_special_ids(SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4))
    model = fam.head("pretraining" if fam.next_sentence else "masked_lm")(cfg).train()
    from bertforge.models.initialization import set_dropout

    set_dropout(model, 0.1)
    run = PretrainConfig()
    run.model.arch, run.data.nsp = family, fam.next_sentence
    objective = MaskedLM(model, run)
    ids, mask, types = padded_batch(500, B=4, T=96)
    labels = torch.where((torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.15) & (mask > 0),
                         ids, torch.full_like(ids, -100))
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "sequence_ids": torch.arange(4)}
    if fam.next_sentence:
        batch.update(token_type_ids=types, next_sentence_label=torch.tensor([0, 1, 0, 1]))
    totals = MaskedLM.counts(batch)

    used = []
    fused = cross_entropy._LinearCrossEntropy.apply
    monkeypatch.setattr(cross_entropy._LinearCrossEntropy, "apply", lambda *a: used.append(a[-1]) or fused(*a))
    fp32_loss, fp32_grad = _step(objective, batch, totals, contextlib.nullcontext())
    bf16_loss, bf16_grad = _step(objective, batch, totals, torch.autocast("cpu", dtype=torch.bfloat16))
    assert used == [None, torch.bfloat16]  # fused both times, the second in bf16
    assert abs(bf16_loss - fp32_loss) <= 0.01 * abs(fp32_loss)
    assert float(torch.nn.functional.cosine_similarity(fp32_grad, bf16_grad, dim=0)) >= 0.99
    assert bf16_grad.ne(fp32_grad).any()  # (bf16 did compute: the gradients are not the fp32 ones)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights


def test_bf16_inference_gives_the_fp32_predictions(tmp_path, capsys):
    """``--backend torch-bf16``: the torch model under bf16 autocast, its outputs back in fp32 for the tasks'
    post-processing; evaluate and predict give the fp32 figures to bf16's rounding."""
    from bertforge import pipeline
    from bertforge.models import BertConfig, BertForPreTraining, BertForSequenceClassification
    from bertforge.tokenizer import train_vocabulary

    texts = ["the cat sat on the mat", "a dog ran in the park", "rain falls on the town at night"]
    tok = train_vocabulary(texts * 4, 80, min_frequency=1)
    folders = {}
    for name, cls, extra in (("clf", BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
                             ("mlm", BertForPreTraining, {})):
        torch.manual_seed(0)
        cls(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), **extra)).save_pretrained(
            str(tmp_path / name), tokenizer=tok)
        folders[name] = str(tmp_path / name)
    data = tmp_path / "dev.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": "pos" if i % 2 else "neg"}) + "\n"
                            for i, t in enumerate(texts * 2)))
    figures = {}
    for backend in ("torch", "torch-bf16"):
        assert main(["evaluate", "classify", "--model", folders["clf"], "--data", str(data), "--backend", backend]) == 0
        figures[backend] = json.loads(capsys.readouterr().out)
        assert main(["predict", "classify", "--model", folders["clf"], "--json", "--backend", backend, texts[0]]) == 0
        figures[backend]["score"] = json.loads(capsys.readouterr().out)[0]["score"]
        figures[backend]["tokens"] = [c["token"] for c in pipeline("fill-mask", model=folders["mlm"], backend=backend)(
            "the [MASK] sat on the mat")]
    fp32, bf16 = figures["torch"], figures["torch-bf16"]
    assert bf16["loss"] == pytest.approx(fp32["loss"], abs=2e-2)
    assert bf16["score"] == pytest.approx(fp32["score"], abs=2e-2)
    assert bf16["loss"] != fp32["loss"]  # (computed in bf16)
    assert bf16["tokens"][0] == fp32["tokens"][0]


