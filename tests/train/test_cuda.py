"""The CUDA paths on a real GPU: the engine's CUDA choices (TF32, bf16 autocast, fused AdamW), bf16 autocast
against fp32 and fp32 against the CPU, variable-length attention (nested jagged tensors) on SDPA's fused
kernels against padded attention, attention dropout on the flash kernel, ``torch.compile`` against eager, and
a checkpoint written on the GPU resumed on the CPU.

All marked ``cuda`` and skipped without a CUDA GPU; ``benchmarks/gpu_check.sh`` runs them (``pytest -m cuda``).
With ``BERTFORGE_CUDA_REPORT`` set, each test appends the figures it measured to that file (JSON lines), before
it asserts, so that a run tells how close the numbers came and not only whether they passed.

fp32 references run with TF32 off (an autouse fixture); tolerances:

* fp32 CUDA against fp32 CPU: loss to 1e-5 relative, all gradients together to 1e-4 relative (L2).
* bf16 autocast against fp32: loss to 1e-2 relative, gradients with cosine > 0.995 and a norm within 5%.
* variable-length against padded attention: fp32 to 1e-4 (hidden states, absolute) and 1e-3 (gradients,
  relative L2, tensor by tensor); bf16 to 2e-2 and 5e-2 relative L2.  Training is forced onto the flash
  kernel (bf16); the memory-efficient kernel takes nested tensors only without gradients on CUDA, so it is
  forced for inference, and fp32 training (flash has no fp32) runs on whatever SDPA picks.
* compiled against eager (bf16 autocast, as ``--compile`` runs): loss to 1e-2 relative, gradients with cosine
  > 0.995 and 0.1 relative L2.

Key biases are left out of tensor-by-tensor gradient checks: their exact gradient is zero (a softmax does not
see a constant added to all of a query's scores), so only rounding noise is left to compare.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertConfig, BertForPreTraining, BertModel
from bertforge.bench import pretraining_batch
from bertforge.cli import main
from bertforge.config import ImplConfig, TrainConfig
from bertforge.devices import autocast_context, resolve_device, setup_backend
from bertforge.train.engine import build_optimizer, param_groups
from bertforge.ops import layout as P
from bertforge.ops.layout import Layout
from bertforge.ops.rows import pretraining_losses
from ..helpers import tiny_pretrain

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU (torch.cuda.is_available() is false)"),
]

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 without TF32 (``setup_backend`` turns it on for runs); the flags are restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture
def report(request):
    """report(**figures): one JSON line in $BERTFORGE_CUDA_REPORT (when set) for this test."""

    def write(**figures):
        path = os.environ.get("BERTFORGE_CUDA_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"test": request.node.name, **figures}) + "\n")

    return write


def _bf16():
    return torch.autocast("cuda", dtype=torch.bfloat16)


def _ragged(batch: dict, seed: int = 1) -> dict:
    """Right padding after a random length (a quarter to all of T) in every row but the first."""
    B, T = batch["input_ids"].shape
    lengths = torch.randint(T // 4, T + 1, (B,), generator=torch.Generator().manual_seed(seed))
    lengths[0] = T
    keep = torch.arange(T)[None, :] < lengths[:, None]
    return {**batch, "attention_mask": keep.long(), "input_ids": batch["input_ids"].masked_fill(~keep, 0),
            "token_type_ids": batch["token_type_ids"].masked_fill(~keep, 0),
            "labels": batch["labels"].masked_fill(~keep, -100)}


def _grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.detach().float().cpu() for k, p in model.named_parameters() if p.grad is not None}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm().clamp_min(1e-30))


def _compare_grads(got: dict, ref: dict) -> dict:
    """All gradients together (relative L2 error, cosine, norm ratio) and the worst tensor on its own."""
    assert got.keys() == ref.keys()
    names = [k for k in ref if not k.endswith("key.bias")]
    g = torch.cat([got[k].flatten() for k in names])
    r = torch.cat([ref[k].flatten() for k in names])
    worst = max(names, key=lambda k: _rel(got[k], ref[k]) if ref[k].norm() > 0 else 0.0)
    return {"grad_rel_err": _rel(g, r), "grad_cosine": float(F.cosine_similarity(g.double(), r.double(), dim=0)),
            "grad_norm_ratio": float(g.norm() / r.norm()), "worst_tensor": worst,
            "worst_tensor_rel_err": _rel(got[worst], ref[worst])}


def _objective_run(model, batch: dict, device, autocast=None) -> tuple[float, dict]:
    """The training engine's loss (summed MLM / masked tokens + summed NSP / sequences) and its gradients."""
    model.zero_grad(set_to_none=True)
    b = {k: v.to(device) for k, v in batch.items()}
    n_mask = float((b["labels"] != -100).sum())
    with autocast or contextlib.nullcontext():
        mlm, nsp = pretraining_losses(model, b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"],
                                      b["next_sentence_label"])
        loss = mlm.float() / n_mask + nsp.float() / len(b["input_ids"])
    loss.backward()
    return float(loss.detach()), _grads(model)


def test_engine_chooses_the_cuda_paths(report):
    """auto device -> cuda:0; TF32 on; bf16 autocast by default; fused AdamW, whose steps equal foreach
    AdamW's on the same gradients."""
    impl = ImplConfig()
    dev = resolve_device(impl)
    assert dev == torch.device("cuda:0")
    setup_backend(dev, impl)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    ac = autocast_context(dev, impl)
    assert isinstance(ac, torch.autocast) and ac.fast_dtype == torch.bfloat16

    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    models = [BertForPreTraining(cfg).to(dev) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    tc = TrainConfig(lr=1e-3)
    fused = build_optimizer(models[0], tc, dev)
    assert fused.defaults["fused"] is True
    foreach = torch.optim.AdamW(param_groups(models[1], tc.weight_decay), lr=tc.lr, foreach=True,
                                betas=(tc.adam_beta1, tc.adam_beta2), eps=tc.adam_eps)
    start = [p.detach().clone() for p in models[0].parameters()]
    batch = _ragged(pretraining_batch(8, 32, 300))
    for _ in range(3):
        _objective_run(models[0], batch, dev)
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            b.grad = None if a.grad is None else a.grad.clone()
        fused.step()
        foreach.step()
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(models[0].parameters(), models[1].parameters()))
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(models[0].parameters(), start))
    report(fused_vs_foreach_max_abs=diff)
    assert diff < 1e-6
    assert moved > 1e-4  # the steps did change the weights


def test_fp32_on_cuda_equals_the_cpu_and_bf16_autocast_stays_close(report):
    """The pretraining objective on a padded batch (CUDA: SDPA's kernels and variable-length attention; CPU:
    our attention and oneDNN projections): fp32 agrees across devices; bf16 autocast stays near fp32."""
    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=2000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg).train()
    batch = _ragged(pretraining_batch(32, 128, 2000))
    assert batch["attention_mask"].float().mean() < 0.9  # really padded
    loss_cpu, g_cpu = _objective_run(model, batch, torch.device("cpu"))
    model.to(CUDA)
    loss_32, g_32 = _objective_run(model, batch, CUDA)
    loss_16, g_16 = _objective_run(model, batch, CUDA, _bf16())
    fp32 = _compare_grads(g_32, g_cpu)
    bf16 = _compare_grads(g_16, g_32)
    report(loss_cpu=loss_cpu, loss_fp32=loss_32, loss_bf16=loss_16, fp32_vs_cpu=fp32, bf16_vs_fp32=bf16)
    assert abs(loss_32 / loss_cpu - 1) < 1e-5
    assert fp32["grad_rel_err"] < 1e-4, fp32
    assert abs(loss_16 / loss_32 - 1) < 1e-2
    assert bf16["grad_cosine"] > 0.995 and abs(bf16["grad_norm_ratio"] - 1) < 0.05, bf16


@pytest.mark.parametrize("precision,backend,train", [
    ("bf16", "FLASH_ATTENTION", True),  # pretraining's default path
    ("fp32", None, True),  # whatever SDPA picks (the fused kernels train nested tensors only through flash)
    ("bf16", "EFFICIENT_ATTENTION", False),  # inference
    ("fp32", "EFFICIENT_ATTENTION", False),
])
def test_varlen_attention_on_cuda_kernels_equals_padded(monkeypatch, report, precision, backend, train):
    """A padded batch's attention over nested jagged tensors, forced onto one fused SDPA kernel (an error if
    that kernel cannot take it), against the padded (B, T) layout with a key mask: hidden states, and
    gradients when training, padding at either end."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertModel(cfg).to(CUDA).train(train)
    b = _ragged(pretraining_batch(16, 128, 1000))
    ids, am, tt = (b[k].to(CUDA) for k in ("input_ids", "attention_mask", "token_type_ids"))
    am[3], ids[3], tt[3] = am[3].flip(0), ids[3].flip(0), tt[3].flip(0)  # left padding too

    def run(varlen: bool):
        monkeypatch.setattr(P, "VARLEN_DEVICES", {"cuda"} if varlen else set())
        assert (Layout(am, *am.shape).offsets is not None) == varlen
        m.zero_grad(set_to_none=True)
        kernel = sdpa_kernel(getattr(SDPBackend, backend)) if varlen and backend else contextlib.nullcontext()
        with kernel, _bf16() if precision == "bf16" else contextlib.nullcontext(), torch.set_grad_enabled(train):
            out = m(ids, am, tt)
            h = out.last_hidden_state[am.bool()].float()  # (N, C) real tokens
            loss = h.square().mean() + out.pooler_output.float().square().mean()
        if train:
            loss.backward()
        return h.detach(), _grads(m)

    (h_var, g_var), (h_pad, g_pad) = run(True), run(False)
    h_abs, h_rel = float((h_var - h_pad).abs().max()), _rel(h_var, h_pad)
    g, worst = {}, 0.0
    if train:
        g = _compare_grads(g_var, g_pad)
        worst = max(_rel(g_var[k], g_pad[k]) for k in g_pad if not k.endswith("key.bias"))
    report(hidden_max_abs=h_abs, hidden_rel_err=h_rel, **g, worst_tensor_rel_err_all=worst)
    assert (h_abs < 1e-4) if precision == "fp32" else (h_rel < 2e-2)
    if train:
        assert g_var.keys() == g_pad.keys() and len(g_pad) > 0
        assert (worst < 1e-3) if precision == "fp32" else (g["grad_rel_err"] < 5e-2), g


def _dropout_figures(att, x, padding, draws: int = 128) -> dict:
    """Attention dropout on the flash kernel: the output of one draw against eval mode's, the mean of
    ``draws`` draws against it, and whether one seed gives one output."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(train: bool, seed: int = 0):
        att.train(train)
        torch.manual_seed(seed)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), _bf16(), torch.no_grad():
            return att(x, padding).float()

    ref = run(False)
    one, again = run(True, 1), run(True, 1)
    mean = sum(run(True, 100 + s) for s in range(draws)) / draws
    return {"one_draw_rel_err": _rel(one, ref), "mean_rel_err": _rel(mean, ref), "draws": draws,
            "same_seed_same_output": bool(torch.equal(one, again))}


def test_cuda_pretraining_computes_on_real_tokens_only(monkeypatch, report):
    """The GPU pretraining step (bf16 autocast, variable-length attention on SDPA's fused kernels) on a padded
    batch: every layer's attention, projections and feed-forward see the real tokens only, the rows-only last
    layer's query grid excepted; the model's forward (fine-tuning, inference) in every layer.  Counted as
    tests/ops/test_padding.py counts on the CPU: a padded key mask reaching the kernel would show as B x T."""
    from .ops.test_padding import TokenCounter, assert_real_tokens_only, pretraining_step_counts, ragged

    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertForPreTraining(cfg).to(CUDA).train()
    lengths = torch.randint(32, 129, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    lengths[0] = 128
    batch = ragged(pretraining_batch(16, 128, 1000, mask_prob=0.3), lengths)
    with monkeypatch.context() as mp:
        counter, real, selected = pretraining_step_counts(m, batch, mp, _bf16())
    b = {k: v.to(CUDA) for k, v in batch.items()}
    m2 = BertForPreTraining(cfg).to(CUDA).eval()
    full = TokenCounter(m2, monkeypatch)
    with _bf16(), torch.no_grad():
        m2.bert(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    report(real_tokens=real, padded_tokens=16 * 128, selected_rows=selected,
           step_attention={str(k): v for k, v in counter.attention.items()},
           forward_attention={str(k): v for k, v in full.attention.items()})
    assert real == sum(lengths) < 16 * 128
    assert_real_tokens_only(counter, real, selected, cfg.num_hidden_layers, "varlen")
    for i in range(cfg.num_hidden_layers):
        assert full.attention[i] == [("varlen", real, real)] and full.ffn[i] == [real], i


@pytest.mark.parametrize("padded", [False, True])
def test_attention_dropout_on_the_flash_kernel(report, padded):
    """Training-mode attention dropout inside SDPA's flash kernel (dense, or variable-length over a padded
    batch): it drops (one draw differs from eval mode), it is unbiased (the mean of many draws comes close to
    eval mode), one seed gives one output (what exact resume relies on), and its backward pass runs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bertforge.models.bert import BertSelfAttention

    torch.manual_seed(0)
    cfg = BertConfig.preset("mini", vocab_size=100, attention_probs_dropout_prob=0.1)
    att = BertSelfAttention(cfg).to(CUDA)
    B, T = 16, 64
    am = torch.ones(B, T, dtype=torch.long, device=CUDA)
    if padded:
        am[::2, T // 2 :] = 0
    padding = Layout(am, B, T)
    assert (padding.offsets is not None) == padded
    x = padding.unpad(torch.randn(B, T, cfg.hidden_size, device=CUDA))
    fig = _dropout_figures(att, x, padding)
    att.train()
    xg = x.clone().requires_grad_()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), _bf16():
        att(xg, padding).float().square().mean().backward()
    fig["grads_finite"] = bool(torch.isfinite(xg.grad).all()) and all(torch.isfinite(p.grad).all() for p in att.parameters())
    report(**fig)
    assert fig["same_seed_same_output"]
    assert fig["one_draw_rel_err"] > 0.05  # it drops
    # unbiased: ~1/sqrt(128) of one draw's error (0.30 and 0.026 in a CPU simulation; a missing 1/(1-p) gives 0.10)
    assert fig["mean_rel_err"] < fig["one_draw_rel_err"] / 6
    assert fig["grads_finite"] and float(xg.grad.abs().sum()) > 0


def test_checkpoint_written_on_cuda_resumes_on_the_cpu(small_text_corpus, story_tokenizer, tmp_path, report):
    """``bertforge pretrain --device cuda`` (bf16, fused AdamW) checkpoints at step 4; ``--resume --device cpu``
    goes on from there to step 8 and finishes, with finite losses and weights."""
    from safetensors.torch import load_file

    from bertforge.checkpoint import list_checkpoints
    from bertforge.tokenizer import save_tokenizer

    tok, out = tmp_path / "tok", tmp_path / "run"
    save_tokenizer(story_tokenizer, str(tok))
    def run(steps, *extra):
        return main(["--quiet", *tiny_pretrain(small_text_corpus, out, "--lr", "1e-3", "--log-every", "2",
                                               "--max-eval-instances", "32", "--eval-every", "0", *extra, tokenizer=tok,
                                               length=64, batch=16, steps=steps)])

    assert run(4, "--device", "cuda", "--save-every", "4") == 0
    gpu = json.loads((out / "metrics.json").read_text())
    assert gpu["device"].startswith("cuda") and gpu["steps"] == 4
    w4 = load_file(str(out / "model.safetensors"))
    assert run(8, "--resume", "--device", "cpu") == 0
    cpu = json.loads((out / "metrics.json").read_text())
    w8 = load_file(str(out / "model.safetensors"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["type"] == "train"]
    report(gpu_mlm_loss=gpu["mlm_loss"], cpu_mlm_loss=cpu["mlm_loss"], train_losses=[r["loss"] for r in train])
    assert cpu["device"] == "cpu" and cpu["steps"] == 8
    assert [r["step"] for r in train] == [2, 4, 6, 8]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train)
    assert [s for s, _ in list_checkpoints(str(out))] == [4, 8]
    assert all(torch.isfinite(v).all() for v in w8.values())
    assert max(float((w8[k] - w4[k]).abs().max()) for k in w4) > 0  # the CPU steps moved the weights


# last: the slowest (compilation), so that a time-out there costs no other test
@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")),
                    reason="torch.compile needs a C compiler (triton builds its kernel launcher)")
def test_compiled_objective_equals_eager_on_cuda(report):
    """``--compile`` on CUDA as ``bertforge pretrain --compile`` runs it (bf16 autocast around the compiled
    objective; a padded batch, so variable-length attention): the eager loss and gradients, to bf16's
    precision (inductor keeps some intermediates in fp32 that eager rounds to bf16)."""
    import time

    from bertforge.config import PretrainConfig
    from bertforge.train.engine import maybe_compile
    from bertforge.objectives import MaskedLM

    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg).to(CUDA).train()
    objective = MaskedLM(model, PretrainConfig())
    b = {k: v.to(CUDA) for k, v in _ragged(pretraining_batch(8, 64, 300)).items()}
    totals = MaskedLM.counts(b)

    def run(fn):
        model.zero_grad(set_to_none=True)
        with _bf16():
            loss, _ = objective.loss(fn(b, 0), totals)
        loss.backward()
        return float(loss.detach()), _grads(model)

    eager = run(objective)
    compiled = maybe_compile(objective, ImplConfig(compile=True))
    assert compiled is not objective
    t0 = time.perf_counter()
    got = run(compiled)
    seconds = time.perf_counter() - t0
    g = _compare_grads(got[1], eager[1])
    report(loss_eager=eager[0], loss_compiled=got[0], compile_and_run_seconds=seconds, **g)
    assert abs(got[0] / eager[0] - 1) < 1e-2
    assert g["grad_cosine"] > 0.995 and g["grad_rel_err"] < 0.1, g
