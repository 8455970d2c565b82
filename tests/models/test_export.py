"""Every family's every head exports to an ONNX graph that computes the torch model's outputs: over the models
registry, at lengths 1 to the model's maximum, padded, in one batch of mixed lengths.

The heads that the tasks contract trains (``tests/tasks/test_contract.py``: BERT's, one per task) are exported and
scored there, through each task's own evaluation; here, every other family-and-head pair."""

from __future__ import annotations

import pytest
import torch

from bertforge.export import TOLERANCE, export_onnx, max_difference
from bertforge.models import FAMILIES, OUTPUTS
from bertforge.ops import exporting, tracing
from bertforge.runtime import OnnxModel
from bertforge.tasks import TASKS
from bertforge.tokenizer import special_ids, train_vocabulary

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

CONTRACT = {("bert", t.model_class.role) for t in TASKS.values()}  # (the contract's tiny base is a BERT)
CASES = [(f.name, role) for f in FAMILIES.values() for role in f.heads
         if role != "pretraining" and (f.name, role) not in CONTRACT]
LONGEST = 512  # the test models' positions: the export's check runs lengths 1, 7, 128 and this maximum


@pytest.fixture(scope="module")
def tokenizer():
    return train_vocabulary(["the cat sat on the mat", "a dog ran in the park"] * 4, 60, min_frequency=1)


def head_folder(path, family, role: str, tok) -> str:
    fam = FAMILIES[family]
    torch.manual_seed(0)
    config = fam.config_class.preset(next(iter(fam.presets)), vocab_size=tok.get_vocab_size(),
                                     max_position_embeddings=LONGEST)
    config.adopt_special_ids(special_ids(tok))
    config.id2label = {0: "O", 1: "B-x"}  # (two: a span head has two outputs)
    fam.heads[role](config).save_pretrained(str(path), tokenizer=tok)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("family,role", CASES)
def test_every_head_of_every_family_exports_to_a_graph_with_the_torch_outputs(family, role, tokenizer, tmp_path):
    folder = head_folder(tmp_path / "model", family, role, tokenizer)
    report = export_onnx(folder, tmp_path / "out")
    graph = report["graphs"]["onnx"]
    assert graph["lengths"] == [1, 7, 128, LONGEST] and graph["max_abs_difference"] <= TOLERANCE

    fam = FAMILIES[family]
    model = fam.heads[role].from_pretrained(folder).eval()
    onnx = OnnxModel(str(tmp_path / "out" / graph["file"]), model.config)
    assert onnx.inputs == list(fam.inputs) and onnx.outputs == list(OUTPUTS[role])
    # the graph's axes are the ecosystem's: batch and sequence, both dynamic
    assert all(i.shape == ["batch", "sequence"] for i in onnx.session.get_inputs())
    # other lengths, in another order, than the export's own check
    assert max_difference(model, onnx, model.config, fam.inputs, OUTPUTS[role], [300, 2, 64], seed=1) <= TOLERANCE


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_under_export_the_fast_paths_step_aside(family, tokenizer, tmp_path):
    """Padding stays in (no data-dependent shapes), no dropout keys or per-sequence lists; the export itself fails
    on a fast path that does not step aside (the batch and sequence axes are dynamic)."""
    encoder = FAMILIES[family].heads["encoder"].from_pretrained(head_folder(tmp_path, family, "encoder", tokenizer))
    ids, mask = torch.tensor([[5, 6, 7], [5, 6, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert not tracing() and encoder.layout(ids, mask).indices is not None  # eager: padding removed
    with exporting():
        assert tracing()
        layout = encoder.layout(ids, mask)
        assert layout.indices is None and layout.keys is None and layout.lengths is None
        assert layout.counts == []
    assert not tracing()


def test_the_local_masks_trace_once_for_every_length():
    """Under export the local layers take the dense masks at any length, asked before the length is compared:
    a comparison of the symbolic length would bound it (to three half windows), and the exporter would then
    trace the whole model a second time without the bound."""
    from bertforge.ops.windowed import window_masks

    class Masks(torch.nn.Module):
        def forward(self, attention_mask):
            return window_masks(attention_mask, attention_mask.shape[1], 64, torch.float32, attention_mask.device)

    mask = torch.ones(2, 9, dtype=torch.long)
    T = torch.export.Dim("sequence", min=1, max=LONGEST)
    with torch.no_grad(), exporting():
        graph = torch.export.export(Masks(), (mask,), dynamic_shapes={"attention_mask": {0: torch.export.Dim("batch"),
                                                                                          1: T}}, strict=False)
    long = torch.ones(2, LONGEST, dtype=torch.long)
    long[1, 300:] = 0
    with exporting():
        dense = Masks()(long)  # (eager, this long, would attend by blocks)
    assert all(torch.equal(a, b) for a, b in zip(graph.module()(long), dense))
