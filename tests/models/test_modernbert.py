"""ModernBERT (bertforge.models.modernbert): parity with transformers both ways, config dialects, heads.

Both of transformers' attention paths (eager and sdpa) are compared.
"""

import json
from pathlib import Path

import pytest
import torch

from bertforge.models.modernbert import (
    GLOBAL,
    LOCAL,
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


def tiny(**overrides) -> ModernBertConfig:
    """3 layers (0 global, 1 and 2 local), a window of 8 (4 either side), so that 20 tokens cross it."""
    kw = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3,
              pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
    kw.update(overrides)
    return ModernBertConfig(**kw)


def batch(lengths=(20, 13, 3), T=20, vocab=100, seed=0):
    """[CLS] tokens [SEP], right-padded with 0.  The 3-token sequence leaves pad queries whose whole local
    window is padding (fully masked rows): a NaN there must not reach the real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), T, dtype=torch.long)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, vocab, (n,), generator=g)
        ids[i, 0], ids[i, n - 1] = 1, 2
        mask[i, :n] = 1
    return ids, mask


def perturb(model: torch.nn.Module, seed=1) -> None:
    """Move every parameter off its start value (norms at 1, biases at 0 would hide a swapped name)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # a tied weight is one parameter, visited once
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def save_ours(model, folder, architecture: str) -> None:
    model.save_pretrained(str(folder))
    assert json.loads((folder / "config.json").read_text())["architectures"] == [architecture]


def load_ours(cls, folder):
    return cls.from_pretrained(str(folder)).eval()


def theirs_from(folder, name: str, attn: str):
    return getattr(transformers, name).from_pretrained(str(folder), attn_implementation=attn,
                                                       dtype=torch.float32).eval()


# ------------------------------------------------------------------------------------------------ config
def test_defaults_are_modernbert_base():
    c = ModernBertConfig()
    t = transformers.ModernBertConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "pad_token_id", "cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id", "local_attention",
                 "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias",
                 "classifier_pooling", "hidden_activation", "classifier_activation", "max_position_embeddings"):
        assert getattr(c, name) == getattr(t, name), name
    assert c.layer_types == t.layer_types
    assert c.layer_types[:4] == [GLOBAL, LOCAL, LOCAL, GLOBAL]
    assert c.sliding_window == t.sliding_window == 64
    assert t.rope_parameters[GLOBAL]["rope_theta"] == c.global_rope_theta == 160_000.0
    assert t.rope_parameters[LOCAL]["rope_theta"] == c.local_rope_theta == 10_000.0


def test_config_reads_both_dialects_and_writes_what_transformers_reads():
    v4 = {"model_type": "modernbert", "num_hidden_layers": 4, "global_attn_every_n_layers": 2,
          "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0, "local_attention": 16,
          "reference_compile": None, "transformers_version": "4.48.0"}
    v5 = {"model_type": "modernbert", "num_hidden_layers": 4, "layer_types": [GLOBAL, LOCAL, GLOBAL, LOCAL],
          "rope_parameters": {GLOBAL: {"rope_type": "default", "rope_theta": 80_000.0},
                              LOCAL: {"rope_type": "default", "rope_theta": 5_000.0}},
          "local_attention": 16}
    a, b = ModernBertConfig.from_dict(v4), ModernBertConfig.from_dict(v5)
    for c in (a, b):
        assert c.layer_types == [GLOBAL, LOCAL, GLOBAL, LOCAL]
        assert (c.global_rope_theta, c.local_rope_theta, c.local_attention, c.sliding_window) == (
            80_000.0, 5_000.0, 16, 8)
    # 5.x's sliding_window is half the window
    assert ModernBertConfig.from_dict({"sliding_window": 32}).local_attention == 64
    # what we write, transformers reads to the same model; what transformers writes, we read
    for ours in (a, b, tiny()):
        t = transformers.ModernBertConfig.from_dict(ours.to_dict())
        assert t.layer_types == ours.layer_types
        assert t.sliding_window == ours.sliding_window
        assert t.rope_parameters[GLOBAL]["rope_theta"] == ours.global_rope_theta
        assert t.rope_parameters[LOCAL]["rope_theta"] == ours.local_rope_theta
        back = ModernBertConfig.from_dict(t.to_dict())
        assert back.layer_types == ours.layer_types
        assert (back.global_rope_theta, back.local_rope_theta, back.local_attention) == (
            ours.global_rope_theta, ours.local_rope_theta, ours.local_attention)
    # transformers 4.x's config read by transformers 5.x: the same as by us (its BC path)
    t4 = transformers.ModernBertConfig.from_dict(v4)
    assert t4.layer_types == a.layer_types and t4.sliding_window == a.sliding_window
    assert t4.rope_parameters[LOCAL]["rope_theta"] == a.local_rope_theta


def test_written_config_has_the_5x_names_only(tmp_path):
    tiny().save(str(tmp_path / "config.json"))
    d = json.loads((tmp_path / "config.json").read_text())
    assert "layer_types" in d and "rope_parameters" in d
    assert not {"global_attn_every_n_layers", "global_rope_theta", "local_rope_theta", "extra"} & set(d)
    t = transformers.ModernBertConfig.from_dict(d).to_dict()
    assert {k: d[k] for k in d if k in t} == {k: t[k] for k in d if k in t}  # every key we write, as they read it


# ------------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("ours_cls,theirs_name", [
    (ModernBertModel, "ModernBertModel"),
    (ModernBertForMaskedLM, "ModernBertForMaskedLM"),
    (ModernBertForSequenceClassification, "ModernBertForSequenceClassification"),
    (ModernBertForTokenClassification, "ModernBertForTokenClassification"),
    (ModernBertForQuestionAnswering, "ModernBertForQuestionAnswering"),
])
def test_parameter_names_are_transformers_names(ours_cls, theirs_name):
    ours = ours_cls(tiny())
    theirs = getattr(transformers, theirs_name)(transformers.ModernBertConfig.from_dict(tiny().to_dict()))
    a, b = ours.state_dict(), theirs.state_dict()
    assert set(a) == set(b)  # (rotary frequencies are no state)
    for k in a:
        assert a[k].shape == b[k].shape, k
    assert not any(k.endswith("layers.0.attn_norm.weight") for k in a)  # the first layer's is an Identity
    assert not any(k.endswith("norm.bias") for k in a)  # norm_bias False


# ------------------------------------------------------------------------------------------------ parity
def _real(x, mask):
    return x[mask.bool()]  # (N, ...) the real tokens' rows


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_we_save_transformers_loads(tmp_path, attn):
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(tiny())
    perturb(ours)
    ours.eval()
    save_ours(ours, tmp_path / "m", "ModernBertForMaskedLM")
    theirs = theirs_from(tmp_path / "m", "ModernBertForMaskedLM", attn)
    assert theirs.decoder.weight.data_ptr() == theirs.model.embeddings.tok_embeddings.weight.data_ptr()
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits  # (B, T, V)
        b = theirs(input_ids=ids, attention_mask=mask).logits
        a_full = ours(ids[:1]).logits  # no padding, no mask: the window alone
        b_full = theirs(input_ids=ids[:1]).logits
    assert torch.isfinite(_real(a, mask)).all()
    torch.testing.assert_close(_real(a, mask), _real(b, mask), atol=ATOL, rtol=0)
    torch.testing.assert_close(a_full, b_full, atol=ATOL, rtol=0)
    # the window matters: a layer-wide global attention would differ (guards against a mask that is a no-op)
    wide = ModernBertForMaskedLM(tiny(local_attention=64))
    wide.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (wide.eval()(ids[:1]).logits - a_full).abs().max() > 1e-3


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_transformers_saves_we_load(tmp_path, attn):
    torch.manual_seed(0)
    theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig.from_dict(tiny().to_dict()))
    theirs.set_attn_implementation(attn)
    perturb(theirs)
    theirs.eval()
    theirs.save_pretrained(tmp_path / "t")
    ours = load_ours(ModernBertForMaskedLM, tmp_path / "t")
    assert ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(_real(a, mask), _real(b, mask), atol=ATOL, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_sequence_classification_both_ways(tmp_path, pooling, attn):
    cfg = tiny(classifier_pooling=pooling, id2label={0: "neg", 1: "neu", 2: "pos"})
    torch.manual_seed(0)
    ours = ModernBertForSequenceClassification(cfg)
    perturb(ours)
    ours.eval()
    save_ours(ours, tmp_path / "m", "ModernBertForSequenceClassification")
    theirs = theirs_from(tmp_path / "m", "ModernBertForSequenceClassification", attn)
    assert theirs.config.num_labels == 3
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits  # (B, 3)
        b = theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    # and back: transformers saves, we load
    theirs.save_pretrained(tmp_path / "t")
    again = load_ours(ModernBertForSequenceClassification, tmp_path / "t")
    assert again.config.classifier_pooling == pooling and again.num_labels == 3
    with torch.no_grad():
        torch.testing.assert_close(again(ids, attention_mask=mask).logits, b, atol=ATOL, rtol=0)


def test_token_classification_we_save_transformers_loads(tmp_path):
    torch.manual_seed(0)
    ours = ModernBertForTokenClassification(tiny(id2label={0: "O", 1: "B", 2: "I"}))
    perturb(ours)
    ours.eval()
    save_ours(ours, tmp_path / "m", "ModernBertForTokenClassification")
    theirs = theirs_from(tmp_path / "m", "ModernBertForTokenClassification", "eager")
    ids, mask = batch()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(_real(a, mask), _real(b, mask), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ heads
def test_heads_return_a_loss_only_with_labels():
    ids, mask = batch()
    mlm = ModernBertForMaskedLM(tiny()).eval()
    out = mlm(ids, attention_mask=mask)
    assert out.loss is None and out.logits.shape == (3, 20, 100)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    assert mlm(ids, attention_mask=mask, labels=labels).loss.ndim == 0
    sparse = ModernBertForMaskedLM(tiny(sparse_prediction=True)).eval()
    sparse.load_state_dict(mlm.state_dict())
    s = sparse(ids, attention_mask=mask, labels=labels)
    assert s.logits.shape == (3, 100)
    torch.testing.assert_close(s.logits, out.logits[:, 1])
    seq = ModernBertForSequenceClassification(tiny()).eval()
    assert seq(ids, attention_mask=mask).loss is None
    assert seq(ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss.ndim == 0
    tok = ModernBertForTokenClassification(tiny()).eval()
    assert tok(ids, attention_mask=mask).logits.shape == (3, 20, 2)
    assert tok(ids, attention_mask=mask, labels=torch.where(mask.bool(), 1, -100)).loss.ndim == 0


def test_padding_does_not_change_the_real_tokens():
    model = ModernBertForMaskedLM(tiny()).eval()
    perturb(model)
    ids, mask = batch()
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        for i, n in enumerate(mask.sum(1).tolist()):
            alone = model(ids[i:i + 1, :n]).logits[0]  # (n, V)
            torch.testing.assert_close(padded[i, :n], alone, atol=1e-5, rtol=0)
        states = model.model(ids, attention_mask=mask).last_hidden_state  # (B, T, C)
    assert (states[~mask.bool()] == 0).all() and (states[mask.bool()] != 0).any(dim=-1).all()  # padding: zeros


def test_training_on_the_real_tokens_gives_the_padded_batchs_gradients():
    """The unpadded layout (token-wise layers over the real tokens only) changes no gradient: each weight's equals
    the sum over the sequences run alone, through both heads pretraining and fine-tuning use."""
    torch.manual_seed(0)
    model = ModernBertForSequenceClassification(tiny(classifier_pooling="mean", id2label={0: "a", 1: "b"}))
    perturb(model)
    ids, mask = batch()
    labels = torch.tensor([0, 1, 1])[: len(ids)]

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    together = grads(model(ids, attention_mask=mask, labels=labels).loss * len(ids))
    alone = [grads(model(ids[i:i + 1, :n], labels=labels[i:i + 1]).loss) for i, n in enumerate(mask.sum(1).tolist())]
    for k, g in together.items():
        torch.testing.assert_close(g, sum(a[k] for a in alone), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", ["mlm", "sequence", "token", "span"])
def test_keyed_dropout_gives_each_sequence_its_masks_in_any_batch(head):
    """In training with dropout keys, a sequence's masks (embeddings, attention probabilities, attention output,
    feed-forward, head) do not depend on the others in its batch nor on the batch's padded length: each
    sequence's output and loss, and every gradient, equal those of the sequences run alone (20 tokens by blocks
    of the local window, 13 and 3 densely before keyed dropout banded them all)."""
    from bertforge.models.initialization import set_dropout
    from bertforge.ops.dropout import DropoutKeys

    cls = {"mlm": ModernBertForMaskedLM, "sequence": ModernBertForSequenceClassification,
           "token": ModernBertForTokenClassification, "span": ModernBertForQuestionAnswering}[head]
    torch.manual_seed(0)
    model = cls(tiny(id2label={0: "a", 1: "b"}))
    perturb(model)
    set_dropout(model, 0.1)  # as pretraining's --dropout does (the config keeps its 0)
    model.train()
    ids, mask = batch()
    lengths = mask.sum(1).tolist()
    labels = torch.where(mask.bool() & (torch.arange(20) % 3 == 1), ids, -100)  # masked-LM targets, 8 of 36

    def output(rows, T):
        keys = DropoutKeys(7, 2, [10 + i for i in rows])
        x, m = ids[rows, :T], mask[rows, :T]
        if head == "mlm":
            return model.masked_lm_loss(x, m, labels[rows, :T], keys)
        out = model(x, attention_mask=m, dropout_keys=keys)
        return out.logits if head != "span" else torch.stack([out.start_logits, out.end_logits], -1)

    def run(rows, T):
        out = output(rows, T)
        model.zero_grad()
        (out if head == "mlm" else out.pow(2).sum()).backward()
        return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    rng = torch.get_rng_state()
    together, grads = run([0, 1, 2], 20)
    assert torch.equal(torch.get_rng_state(), rng)  # no mask came from torch's generator
    alone = [run([i], n) for i, n in enumerate(lengths)]
    if head == "mlm":  # (the rows-only last layer: masked rows as its queries)
        torch.testing.assert_close(together, sum(a for a, _ in alone), atol=1e-4, rtol=1e-5)
    else:
        for i, n in enumerate(lengths):
            got = together[i] if head == "sequence" else together[i, :n]
            torch.testing.assert_close(got, alone[i][0][0] if head == "sequence" else alone[i][0][0, :n],
                                       atol=1e-5, rtol=0)
    if head in ("mlm", "sequence"):  # (the token heads' squares of the padding's logits add their own gradients)
        for k, g in grads.items():
            torch.testing.assert_close(g, sum(a[1][k] for a in alone), atol=1e-4, rtol=1e-4)
    model.eval()
    with torch.no_grad():  # and the masks did drop: training differs from evaluation
        assert not torch.allclose(output([0, 1, 2], 20), together)


def test_masked_lm_matches_transformers_at_2048_tokens(tmp_path):
    """ModernBERT's own window (128) at the length it is used at: 2,048 tokens, one sequence padded after 1,500."""
    cfg = tiny(max_position_embeddings=2048, local_attention=128)
    torch.manual_seed(0)
    ours = ModernBertForMaskedLM(cfg)
    perturb(ours)
    ours.eval()
    save_ours(ours, tmp_path / "m", "ModernBertForMaskedLM")
    theirs = theirs_from(tmp_path / "m", "ModernBertForMaskedLM", "sdpa")
    ids, mask = batch(lengths=(2048, 1500), T=2048)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(_real(a, mask), _real(b, mask), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ pipelines
def _folder_with_tokenizer(model, folder, tokenizer_dir):
    """A ModernBERT folder as transformers writes one, with a tokenizer (all-MiniLM-L6-v2's WordPiece)."""
    import shutil

    model.save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, folder / name)
    return str(folder)


def _vocab_config(**overrides) -> ModernBertConfig:
    # bert-base-uncased's ids: [PAD] 0, [CLS] 101, [SEP] 102
    return tiny(vocab_size=30522, pad_token_id=0, bos_token_id=101, cls_token_id=101, eos_token_id=102,
                sep_token_id=102, **overrides)


def test_fill_mask_and_classify_equal_transformers_pipelines(minilm_dir, tmp_path):
    """bertforge's pipelines on a ModernBERT folder (found by config.json's model_type) give transformers'
    scores; texts longer than the local window (8 tokens here) included."""
    import bertforge

    tok_dir = Path(minilm_dir)
    torch.manual_seed(0)
    mlm = ModernBertForMaskedLM(_vocab_config())
    perturb(mlm)
    folder = _folder_with_tokenizer(mlm, tmp_path / "mlm", tok_dir)
    texts = ["Tom went to the [MASK] with his dog.", "At the bakery, she saw a red [MASK]. Then [MASK] smiled."]
    ours = bertforge.pipeline("fill-mask", folder)(texts, top_k=5)
    hf = transformers.pipeline("fill-mask", model=folder, device="cpu", top_k=5)
    for mine, text in zip(ours, texts):
        ref = hf(text)
        mine = [mine] if isinstance(mine[0], dict) else mine  # one mask: a flat list
        ref = [ref] if isinstance(ref[0], dict) else ref
        assert len(mine) == len(ref)
        for a, b in zip(mine, ref):
            assert [c["token"] for c in a] == [c["token"] for c in b]
            assert [c["token_str"] for c in a] == [c["token_str"] for c in b]
            assert max(abs(c["score"] - t["score"]) for c, t in zip(a, b)) < 1e-4

    cls = ModernBertForSequenceClassification(_vocab_config(id2label={0: "neg", 1: "pos"},
                                                            label2id={"neg": 0, "pos": 1}))
    perturb(cls)
    folder = _folder_with_tokenizer(cls, tmp_path / "cls", tok_dir)
    texts = ["a good film, long and slow but good in the end", "bad"]
    ours = bertforge.pipeline("classify", folder)(texts)
    theirs = transformers.pipeline("text-classification", model=folder, device="cpu", top_k=None)(texts)
    for a, b in zip(ours, theirs):
        assert max(abs(a["probabilities"][r["label"]] - r["score"]) for r in b) < 1e-4


def test_a_bare_encoder_starts_a_classifier_and_a_ner_folder_is_no_classifier(minilm_dir, tmp_path):
    from bertforge.errors import UserError

    torch.manual_seed(0)
    enc = ModernBertModel(tiny())
    perturb(enc)
    enc.save_pretrained(str(tmp_path / "enc"))
    cls = ModernBertForSequenceClassification.from_pretrained(str(tmp_path / "enc"))
    assert sorted(cls.loading_info["newly_initialized"]) == ["classifier.bias", "classifier.weight",
                                                             "head.dense.weight", "head.norm.weight"]
    ids, mask = batch()
    with torch.no_grad():
        torch.testing.assert_close(cls.model(ids, mask).last_hidden_state, enc.eval()(ids, mask).last_hidden_state)
    import bertforge

    folder = _folder_with_tokenizer(ModernBertForTokenClassification(_vocab_config(id2label={0: "O", 1: "B-X"})),
                                    tmp_path / "ner", Path(minilm_dir))
    with pytest.raises(UserError, match="not a sentence classifier"):
        bertforge.pipeline("classify", folder)
    with pytest.raises(UserError, match="holds a ModernBertForTokenClassification .* not a question-answering"):
        bertforge.pipeline("qa", folder)


def test_fill_mask_with_a_byte_level_bpe_equals_transformers_pipeline(tmp_path):
    """The released ModernBERTs use a byte-level BPE (no ``##``): the candidates, their text and the filled
    sequences are transformers', one [MASK] or several."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    import bertforge

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Tom went to the park with his dog.", "At the bakery, she saw a red cake. Then he smiled."] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cls, sep, pad = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    folder = tmp_path / "bpe"
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(tiny(vocab_size=tok.get_vocab_size(), pad_token_id=pad, bos_token_id=cls,
                                       cls_token_id=cls, eos_token_id=sep, sep_token_id=sep))
    perturb(model)
    model.save_pretrained(str(folder))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "mask_token": "[MASK]", "unk_token": "[UNK]",
        "model_input_names": ["input_ids", "attention_mask"]}))
    texts = ["Tom went to the [MASK] with his dog.", "At the bakery, she saw a red [MASK]. Then [MASK] smiled."]
    ours = bertforge.pipeline("fill-mask", str(folder))(texts, top_k=8)
    hf = transformers.pipeline("fill-mask", model=str(folder), device="cpu", top_k=8)
    for mine, text in zip(ours, texts):
        ref = hf(text)
        mine = [mine] if isinstance(mine[0], dict) else mine
        ref = [ref] if isinstance(ref[0], dict) else ref
        for a, b in zip(mine, ref, strict=True):
            assert [(c["token"], c["token_str"], c["sequence"]) for c in a] == [
                (c["token"], c["token_str"], c["sequence"]) for c in b]
            assert max(abs(c["score"] - t["score"]) for c, t in zip(a, b)) < 1e-4


# ------------------------------------------------------------------------------------------------ pretrain --arch
def _modern_run(corpus, out, *extra, steps=20):
    from ..helpers import tiny_pretrain

    return tiny_pretrain(corpus, out, "--arch", "modernbert", "--log-every", "5", "--max-eval-instances", "32",
                         *extra, length=64, batch=16, steps=steps)


def test_pretrain_arch_modernbert_writes_a_masked_lm_transformers_loads(small_text_corpus, tmp_path, capsys):
    from bertforge.cli import main
    from bertforge.tokenizer import load_tokenizer, special_ids

    out = tmp_path / "modern"
    assert main(["--quiet", *_modern_run(small_text_corpus, out, "--eval-every", "10", "--vocab-size", "400")]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "modernbert" and cfg["architectures"] == ["ModernBertForMaskedLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (2, 128, 192)  # tiny
    sp = special_ids(load_tokenizer(str(out)))  # its own vocabulary's ids, not the released tokenizer's
    assert (cfg["pad_token_id"], cfg["cls_token_id"], cfg["sep_token_id"]) == (sp.pad, sp.cls, sp.sep)
    saved = json.loads((out / "pretrain_config.json").read_text())
    assert saved["model"]["arch"] == "modernbert" and saved["data"]["nsp"] is False
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r["mlm_loss"] for r in rows if r["type"] == "train"]
    assert len(train) == 4 and train[-1] < train[0]  # it learns
    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["mlm_accuracy"] <= 1 and m["steps"] == 20
    assert "ModernBERT of 2 layers" in (out / "README.md").read_text()
    capsys.readouterr()
    # transformers reads the folder as its ModernBertForMaskedLM, with our logits
    ours = ModernBertForMaskedLM.from_pretrained(str(out)).eval()
    theirs = transformers.ModernBertForMaskedLM.from_pretrained(str(out)).eval()
    ids, mask = batch(vocab=cfg["vocab_size"])
    with torch.no_grad():
        a, b = ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (a[real] - b[real]).abs().max() < ATOL
    # evaluate mlm and fill-mask take the folder as they take a BERT's
    assert main(["evaluate", "mlm", "--model", str(out), "--data", str(small_text_corpus), "--max-seq-length", "64",
                 "--max-blocks", "8"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["masked_tokens"] > 0 and 0 <= res["mlm_accuracy"] <= 1
    assert main(["predict", "fill-mask", "--model", str(out), "--json", "the cat sat on the [MASK]."]) == 0
    found = json.loads(capsys.readouterr().out)
    assert len(found) == 1 and len(found[0]["masks"]) == 1 and len(found[0]["masks"][0]) == 5


@pytest.mark.parametrize("extra,said", [
    (["--nsp"], "pass --no-nsp"),
    (["--objective", "electra"], "ModernBERT pretrains by masked LM"),
    (["--preset", "huge"], "unknown preset"),
])
def test_pretrain_arch_modernbert_refuses_what_it_does_not_train(small_text_corpus, tmp_path, capsys, extra, said):
    from bertforge.cli import main

    out = tmp_path / "no"
    assert main(_modern_run(small_text_corpus, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and said in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_family_comes_from_init_and_another_arch_is_refused(small_text_corpus, tmp_path, capsys):
    from bertforge.cli import main

    first = tmp_path / "first"
    assert main(["--quiet", *_modern_run(small_text_corpus, first, "--vocab-size", "400", "--eval-every", "0",
                                         steps=2)]) == 0
    cont = tmp_path / "cont"
    args = ["pretrain", "--data", str(small_text_corpus), "--init", str(first), "--out", str(cont), "--max-steps", "2",
            "--batch-size", "8", "--max-seq-length", "64", "--eval-every", "0", "--no-progress"]
    assert main([*args, "--arch", "bert"]) == 2
    assert "holds a modernbert model" in capsys.readouterr().err
    assert main(["--quiet", *args]) == 0  # no --arch: the folder's family
    saved = json.loads((cont / "pretrain_config.json").read_text())
    assert saved["model"]["arch"] == "modernbert" and saved["recipe"] == "continue"
    assert json.loads((cont / "config.json").read_text())["model_type"] == "modernbert"


def test_the_modernbert_base_preset_names_its_family():
    from bertforge.config import PretrainConfig
    from bertforge.train.plan import resolve_arch

    cfg = PretrainConfig()
    cfg.model.preset = "modernbert-base"
    resolve_arch(cfg, None)
    assert cfg.model.arch == "modernbert"
    c = ModernBertConfig.preset("modernbert-base", vocab_size=50368)
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads) == (22, 768, 1152, 12)
    cfg = PretrainConfig()
    resolve_arch(cfg, {"model": {}})  # a run saved before the choice existed is a BERT
    assert cfg.model.arch == "bert"


@pytest.fixture(scope="module")
def story_tok(small_text_corpus, tmp_path_factory):
    """One vocabulary for runs compared bit for bit (one trained in each run may break its ties another way)."""
    from bertforge.cli import main

    d = tmp_path_factory.mktemp("tok") / "tok"
    assert main(["--quiet", "tokenizer", "train", "--input", str(small_text_corpus), "--vocab-size", "400", "--out",
                 str(d)]) == 0
    return str(d)


@pytest.mark.slow
def test_modernbert_accumulation_computes_the_one_batch_run(small_text_corpus, story_tok, tmp_path):
    """With dropout (keyed by sequence), two accumulated micro-batches train as one batch, as two processes do
    (the engine treats a process's micro-batches as another process's; torchrun itself is tested once per
    command, test_pretrain.py)."""
    from bertforge.cli import main

    runs = {name: tmp_path / name for name in ("one", "accum")}

    def argv(name, *extra):
        return _modern_run(small_text_corpus, runs[name], "--tokenizer", str(story_tok), "--eval-every", "0",
                           "--log-every", "1", "--dropout", "0.1", *extra, steps=6)

    assert main(["--quiet", *argv("one")]) == 0
    assert main(["--quiet", *argv("accum", "--grad-accum", "2")]) == 0
    _same_pretraining(runs["one"], runs["accum"], atol=1e-5)


def _same_pretraining(a, b, atol=0.0) -> None:
    """Two pretraining folders end alike: weights bit for bit and every metrics row but the clocks; with
    ``atol`` (another number of processes: sums in another order), weights and training losses within it."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= atol
    clocks = ("elapsed", "tokens_per_second")
    rows = [[{k: v for k, v in json.loads(x).items() if k not in clocks} for x in (o / "metrics.jsonl").read_text()
             .splitlines()] for o in (a, b)]
    if not atol:
        assert rows[0] == rows[1]
        return
    losses = [[r["mlm_loss"] for r in rs if r["type"] == "train"] for rs in rows]
    assert len(losses[0]) == len(losses[1]) > 0
    assert max(abs(x - y) for x, y in zip(*losses)) < atol


# ------------------------------------------------------------------------------------------------ finetune
@pytest.fixture(scope="module")
def modern_dir(tmp_path_factory):
    """A random tiny ModernBERT masked LM with a WordPiece vocabulary of the NER and classification rows."""
    from bertforge.tokenizer import special_ids, train_vocabulary

    from ..helpers import SENTENCES

    d = tmp_path_factory.mktemp("modern") / "model"
    tok = train_vocabulary([*SENTENCES, *(" ".join(w) for w, _ in NER_ROWS)], 200, kind="wordpiece", min_frequency=1)
    sp = special_ids(tok)
    torch.manual_seed(0)
    cfg = tiny(vocab_size=tok.get_vocab_size(), pad_token_id=sp.pad, cls_token_id=sp.cls, bos_token_id=sp.cls,
               sep_token_id=sp.sep, eos_token_id=sp.sep)
    ModernBertForMaskedLM(cfg).save_pretrained(str(d), tokenizer=tok)
    return d


NER_ROWS = [(["anna", "went", "to", "paris"], ["B-per", "O", "O", "B-loc"]),
            (["we", "met", "boris", "in", "oslo"], ["O", "O", "B-per", "O", "B-loc"])] * 8


def test_finetune_classify_and_ner_on_a_modernbert_write_what_transformers_loads(modern_dir, tmp_path, capsys):
    from bertforge.cli import main

    from ..helpers import SENTENCES

    rows = [(s, "pos" if i % 2 else "neg") for i, s in enumerate(SENTENCES)]
    (tmp_path / "cls.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    (tmp_path / "ner.conll").write_text("\n\n".join("\n".join(f"{w}\t{t}" for w, t in zip(*r)) for r in NER_ROWS)
                                        + "\n")
    vocab = json.loads((modern_dir / "config.json").read_text())["vocab_size"]
    ids, mask = batch(lengths=(9, 5), T=9, vocab=vocab)
    for task, data, theirs_cls in (("classify", "cls.tsv", "ModernBertForSequenceClassification"),
                                   ("ner", "ner.conll", "ModernBertForTokenClassification")):
        out = tmp_path / task
        assert main(["--quiet", "finetune", task, "--model", str(modern_dir), "--train", str(tmp_path / data),
                     "--validation", str(tmp_path / data), "--out", str(out), "--epochs", "2", "--batch-size", "8",
                     "--max-seq-length", "16", "--no-progress"]) == 0
        assert json.loads((out / "config.json").read_text())["architectures"] == [theirs_cls]
        assert f"{theirs_cls}.from_pretrained" in (out / "README.md").read_text()
        ours_cls = ModernBertForSequenceClassification if task == "classify" else ModernBertForTokenClassification
        ours = ours_cls.from_pretrained(str(out)).eval()
        theirs = getattr(transformers, theirs_cls).from_pretrained(str(out)).eval()
        with torch.no_grad():
            a, b = ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
        if task == "ner":
            a, b = a[mask.bool()], b[mask.bool()]
        assert (a - b).abs().max() < ATOL
        capsys.readouterr()
        assert main(["evaluate", task, "--model", str(out), "--data", str(tmp_path / data)]) == 0
        res = json.loads(capsys.readouterr().out)
        assert 0 <= res["accuracy"] <= 1


def test_finetune_squad_on_a_modernbert_writes_what_transformers_loads(modern_dir, tmp_path, capsys):
    from bertforge.cli import main

    qas = [{"id": str(i), "question": f"where did {w} go?", "answers": [{"text": p, "answer_start": len(w) + 9}]}
           for i, (w, p) in enumerate([("anna", "paris"), ("boris", "oslo")] * 4)]
    squad = {"data": [{"title": "t", "paragraphs": [{"context": f"{q['question'].split()[2]} went to "
                                                                f"{q['answers'][0]['text']}.", "qas": [q]}
                                                    for q in qas]}]}
    (tmp_path / "s.json").write_text(json.dumps(squad))
    out = tmp_path / "q"
    assert main(["--quiet", "finetune", "squad", "--model", str(modern_dir), "--train", str(tmp_path / "s.json"),
                 "--out", str(out), "--epochs", "2", "--batch-size", "4", "--max-seq-length", "32", "--doc-stride", "8",
                 "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertForQuestionAnswering"]
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    ids, mask = batch(lengths=(9, 5), T=9, vocab=vocab)
    ours = ModernBertForQuestionAnswering.from_pretrained(str(out)).eval()
    theirs = transformers.ModernBertForQuestionAnswering.from_pretrained(str(out)).eval()
    with torch.no_grad():
        a, b = ours(ids, mask), theirs(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    assert (a.start_logits - b.start_logits)[real].abs().max() < ATOL
    assert (a.end_logits - b.end_logits)[real].abs().max() < ATOL
    capsys.readouterr()
    assert main(["evaluate", "squad", "--model", str(out), "--data", str(tmp_path / "s.json"), "--max-seq-length",
                 "32", "--doc-stride", "8"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["f1"] <= 100


@pytest.mark.parametrize("layers,decoder_bias", [(1, True), (3, True), (3, False)])
def test_the_masked_rows_fast_path_gives_the_dense_loss_and_gradients(layers, decoder_bias):
    """The last layer (local with 3 layers: 2 % 3 != 0; global with 1) for the masked rows only, across the
    window, with padding and a sequence without masked tokens; the decoder fused with the loss (with a bias) or
    not; a batch with nothing to score still backpropagates."""
    cfg = tiny(num_hidden_layers=layers, decoder_bias=decoder_bias)
    torch.manual_seed(0)
    fast = ModernBertForMaskedLM(cfg).train()
    perturb(fast)
    dense = ModernBertForMaskedLM(cfg).train()
    dense.load_state_dict(fast.state_dict())
    ids, mask = batch(lengths=(20, 13, 3, 9), T=20)
    g = torch.Generator().manual_seed(2)
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.3) & mask.bool(), ids, torch.full_like(ids, -100))
    labels[3] = -100  # a sequence with nothing to score
    labels[2, 1], labels[1, 12] = ids[2, 1], ids[1, 12]  # the others at least one each, one of them far along
    a = fast.masked_lm_loss(ids, mask, labels)
    keep = labels != -100
    b = torch.nn.functional.cross_entropy(dense(ids, mask).logits[keep], labels[keep], reduction="sum")
    assert abs(a.detach().item() - b.detach().item()) < 1e-4 * max(1.0, abs(b.detach().item()))
    a.backward()
    b.backward()
    grads = dict(dense.named_parameters())
    for name, p in fast.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, atol=1e-5), name
    none = fast.masked_lm_loss(ids, mask, torch.full_like(ids, -100))
    none.backward()
    assert none.detach().item() == 0.0


@pytest.mark.parametrize("T,w", [(13, 4), (16, 4), (40, 5)])
def test_banded_attention_equals_the_dense_masked_attention(T, w):
    """Blocks of w queries over their 3w keys give what the dense (T, T) masked attention gives at every real
    query, T a multiple of w or not, with padding."""
    import torch.nn.functional as F

    from bertforge.ops.windowed import Band, additive, banded_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, T, 8, generator=g) for _ in range(3))
    real = torch.ones(3, T, dtype=torch.bool)
    real[1, T - 5:] = False
    real[2, 3:] = False
    pos = torch.arange(T)
    near = (pos[:, None] - pos[None, :]).abs() <= w
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=additive(near & real[:, None, None, :], q.dtype))
    for r in (real, None):
        band = banded_attention(q, k, v, Band(r, w), 0.0)
        ref = dense if r is not None else F.scaled_dot_product_attention(q, k, v, attn_mask=additive(near, q.dtype))
        at = (r if r is not None else torch.ones(3, T, dtype=torch.bool))[:, None, :, None].expand_as(band)
        assert band.shape == ref.shape and (band - ref)[at].abs().max() < 1e-5


def test_finetune_embed_on_a_modernbert_writes_a_model_transformers_loads(modern_dir, tmp_path):
    from bertforge.cli import main

    from ..helpers import SENTENCES

    pairs = sorted(set(SENTENCES))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"query": s.split()[1], "positive": s}) + "\n"
                                                  for s in pairs))
    out = tmp_path / "embed"
    assert main(["--quiet", "finetune", "embed", "--model", str(modern_dir), "--train", str(tmp_path / "pairs.jsonl"),
                 "--out", str(out), "--epochs", "1", "--batch-size", "4", "--max-seq-length", "16", "--lr", "1e-3",
                 "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    ids, mask = batch(lengths=(9, 5), T=9, vocab=vocab)
    ours = ModernBertModel.from_pretrained(str(out)).eval()
    theirs = transformers.ModernBertModel.from_pretrained(str(out)).eval()
    with torch.no_grad():
        a = ours(ids, mask).last_hidden_state
        b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (a - b)[mask.bool()].abs().max() < ATOL
