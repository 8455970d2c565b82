"""bertforge predict and bertforge.pipeline: parity with transformers and with fine-tuning, clear refusals."""

import json

import numpy as np
import pytest
import torch

import bertforge
from bertforge.cli import main
from ..helpers import tiny_pretrain

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pretrained_tiny(small_text_corpus, tmp_path_factory):
    """A tiny BERT pretrained for a few dozen steps on the story corpus (MLM + NSP heads)."""
    d = tmp_path_factory.mktemp("pt")
    out = d / "model"
    assert main(["--quiet", *tiny_pretrain(small_text_corpus, out, "--recipe", "bert", "--vocab-size", "400",
                                           "--tokenizer-model", "wordlevel", "--lr", "2e-3", "--eval-every", "0",
                                           "--cache-dir", str(d / "c"), length=64, batch=32, steps=60)]) == 0
    return str(out)


def test_fill_mask_json_equals_transformers_pipeline(pretrained_tiny, capsys):
    texts = ["Tom went to the [MASK] with his dog.", "At the bakery, she saw a red [MASK]. Then [MASK] smiled."]
    assert main(["predict", "fill-mask", "--model", pretrained_tiny, "--json", "--top-k", "5", *texts]) == 0
    ours = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    hf = transformers.pipeline("fill-mask", model=pretrained_tiny, tokenizer=pretrained_tiny, device="cpu", top_k=5)
    for row, text in zip(ours, texts):
        ref = hf(text)
        ref = [ref] if isinstance(ref[0], dict) else ref  # one mask: a flat list
        assert len(row["masks"]) == len(ref)
        for mine, theirs in zip(row["masks"], ref):
            assert [c["token"] for c in mine] == [c["token"] for c in theirs]
            assert [c["token_str"] for c in mine] == [c["token_str"] for c in theirs]
            assert max(abs(c["score"] - t["score"]) for c, t in zip(mine, theirs)) < 1e-5


def test_python_pipeline_objects(pretrained_tiny):
    fm = bertforge.pipeline("fill-mask", model=pretrained_tiny)
    one = fm("the dog sat on the [MASK].", top_k=3)  # one [MASK]: its candidates, a flat list (as transformers)
    assert isinstance(one, list) and len(one) == 3
    assert set(one[0]) == {"score", "token", "token_str", "sequence", "token_id"} and 0 < one[0]["score"] <= 1
    ns = bertforge.pipeline("next-sentence", model=pretrained_tiny)
    r = ns("Tom went to the park.", "He saw a dog.")
    assert set(r) == {"is_next", "label"} and 0 <= r["is_next"] <= 1
    # the same as transformers on the same weights (index 0 = IsNext)
    tok = transformers.AutoTokenizer.from_pretrained(pretrained_tiny)
    m = transformers.BertForPreTraining.from_pretrained(pretrained_tiny).eval()
    with torch.no_grad():
        p = m(**tok("Tom went to the park.", "He saw a dog.", return_tensors="pt")).seq_relationship_logits.softmax(-1)
    assert abs(float(p[0, 0]) - r["is_next"]) < 1e-5


def test_classify_pipeline_equals_transformers(tmp_path):
    from bertforge import BertConfig, BertForSequenceClassification
    from bertforge.tokenizer import train_vocabulary

    texts = ["a fine film", "a dull film", "great fun", "awful mess"] * 3
    tok = train_vocabulary(texts, 60, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), id2label={0: "neg", 1: "pos"})) \
        .save_pretrained(str(tmp_path / "c"), tokenizer=tok)
    res = bertforge.pipeline("classify", model=str(tmp_path / "c"))(texts[:4])
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "c")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "c").eval()
    with torch.no_grad():
        p = hf(**hf_tok(texts[:4], padding=True, return_tensors="pt")).logits.softmax(-1)
    for r, q in zip(res, p):
        assert r["label"] in ("neg", "pos") and abs(r["probabilities"]["pos"] - float(q[1])) < 1e-5
    # top_k as transformers' pipeline takes it: every label (None) or the k best, the most probable first
    theirs = transformers.pipeline("text-classification", model=str(tmp_path / "c"), top_k=None)(texts[:4])
    ours = bertforge.pipeline("text-classification", model=str(tmp_path / "c"))(texts[:4], top_k=None)
    for o, t in zip(ours, theirs):
        assert [x["label"] for x in o] == [x["label"] for x in t]
        assert max(abs(x["score"] - y["score"]) for x, y in zip(o, t)) < 1e-5
    assert bertforge.pipeline("classify", model=str(tmp_path / "c"))(texts[0], top_k=1)["label"] == ours[0][0]["label"]
    # one label: a score, through a sigmoid, and a regression's as it is (not a softmax over one label: 1.0)
    for problem in (None, "regression"):
        one = tmp_path / f"one-{problem}"
        config = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), id2label={0: "LABEL_0"})
        config.extra["problem_type"] = problem
        BertForSequenceClassification(config).save_pretrained(str(one), tokenizer=tok)
        theirs = transformers.pipeline("text-classification", model=str(one))(texts[:4])
        ours = bertforge.pipeline("classify", model=str(one))(texts[:4])
        assert max(abs(o["score"] - t["score"]) for o, t in zip(ours, theirs)) < 1e-5, problem


def test_qa_equals_finetuning_postprocessing_on_real_minilm(minilm_dir, tmp_path, capsys):
    from bertforge import BertForQuestionAnswering
    from bertforge.tasks.squad import SquadConfig
    from bertforge.tasks.squad import Example, predict_answers
    from bertforge.tokenizer import load_tokenizer

    torch.manual_seed(0)
    qa = BertForQuestionAnswering.from_pretrained(minilm_dir)  # real encoder, fresh head: a valid QA directory
    qa.save_pretrained(str(tmp_path / "qa"), tokenizer=load_tokenizer(minilm_dir))
    context = ("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region "
               "in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway. ") * 8
    question = "In what country is Normandy located?"
    assert main(["predict", "qa", "--model", str(tmp_path / "qa"), "--question", question, "--context", context, "--json",
                 "--max-seq-length", "128", "--doc-stride", "32"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ref, _ = predict_answers(qa.eval(), load_tokenizer(minilm_dir), [Example("q", question, context, [])],
                             SquadConfig(doc_stride=32), 128, torch.device("cpu"))
    # the same span as fine-tuning's post-processing, widened to whole words
    a, b = got["start"], got["end"]
    assert ref["q"] in got["answer"] and context[a:b] == got["answer"]
    assert (a == 0 or not context[a - 1].isalnum()) and (b == len(context) or not context[b].isalnum())
    # --top-k: the k best different spans, the best one first
    assert main(["predict", "qa", "--model", str(tmp_path / "qa"), "--question", question, "--context", context, "--json",
                 "--max-seq-length", "128", "--doc-stride", "32", "--top-k", "3"]) == 0
    three = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(three) == 3 and three[0] == got and len({(x["start"], x["end"]) for x in three}) == 3



def test_predict_qa_input_writes_the_predictions_evaluation_scores(minilm_dir, tmp_path, capsys, monkeypatch):
    """``predict qa --input`` writes what evaluation would: windows overlapping by the run's --doc-stride and the
    raw spans, where a question asked on the command line gets its answer widened to whole words."""
    from bertforge import BertForQuestionAnswering
    from bertforge.tasks import squad
    from bertforge.tokenizer import load_tokenizer

    torch.manual_seed(0)
    tok = load_tokenizer(minilm_dir)
    BertForQuestionAnswering.from_pretrained(minilm_dir).save_pretrained(str(tmp_path / "qa"), tokenizer=tok)
    context = "the choir sang. " * 150 + "the zorblaxing choir sang."  # several windows at 384 tokens
    at = context.index("xing")  # the last piece of a word cut in four: z ##or ##bla ##xing

    def logits(model, feats, pad, device, batch_size):  # every window points at that piece
        out = [np.where([o is not None and o[0] == at for o in f["offsets"]], 10.0, -10.0) for f in feats]
        return out, out

    strides, build = [], squad.build_features
    monkeypatch.setattr(squad, "qa_logits", logits)
    monkeypatch.setattr(squad, "build_features", lambda *a, **k: strides.append(a[3]) or build(*a, **k))
    question = "Who sang?"
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q", "question": question, "answers": [{"text": "choir", "answer_start": 4}]}]}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(data))
    assert main(["predict", "qa", "--model", str(tmp_path / "qa"), "--input", str(tmp_path / "dev.json"),
                 "--json"]) == 0
    ref, _ = squad.predict_answers(None, tok, [squad.Example("q", question, context, [])], squad.SquadConfig(), 384,
                                   torch.device("cpu"))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == ref == {"q": "xing"}
    assert strides == [squad.SquadConfig().doc_stride] * 2
    assert main(["predict", "qa", "--model", str(tmp_path / "qa"), "--question", question, "--context", context,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["answer"] == "zorblaxing"

def test_refusals(minilm_dir, pretrained_tiny, tmp_path, capsys):
    def err_of(args):
        rc = main(args)
        e = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(e) == 1 and e[0].startswith("error: "), e
        return e[0]

    assert "no masked-LM head" in err_of(["predict", "fill-mask", "--model", minilm_dir, "the [MASK] is blue"])
    assert "no question-answering head" in err_of(["predict", "qa", "--model", pretrained_tiny, "--question", "q", "--context", "c"])
    assert "no classification head" in err_of(["predict", "classify", "--model", pretrained_tiny, "text"])
    assert "no [MASK]" in err_of(["predict", "fill-mask", "--model", pretrained_tiny, "nothing masked here"])
    long_text = "the dog ran . " * 200 + "[MASK]"
    assert "beyond the model's" in err_of(["predict", "fill-mask", "--model", pretrained_tiny, long_text])
    # a long input that keeps its [MASK] is truncated with a warning, not refused
    assert main(["predict", "fill-mask", "--model", pretrained_tiny, "the [MASK] ran . " + "the dog ran . " * 200]) == 0
    assert "truncated" in capsys.readouterr().err
    assert "not found" in err_of(["predict", "classify", "--model", str(tmp_path / "none"), "x"])


def test_qa_answers_are_whole_words():
    from bertforge.tasks.squad import whole_words

    c = "The singers were singing loudly, near St. Paul's."
    assert whole_words(c, c.index("ing"), c.index("ing") + 3) == (c.index("singers"), c.index("singers") + 7)
    assert whole_words(c, c.index("singing"), c.index("singing") + 4) == (c.index("singing"), c.index("singing") + 7)
    assert whole_words(c, c.index("loudly"), c.index("loudly") + 6) == (c.index("loudly"), c.index("loudly") + 6)
    assert whole_words(c, c.index("Paul"), c.index("Paul") + 4) == (c.index("Paul"), c.index("Paul") + 4)  # stops at "'"
    assert whole_words(c, -1, -1) == (-1, -1)


def test_what_a_new_user_met_in_predict(minilm_dir, tmp_path, capsys):
    """Found in a new user's trial: predict classify read 512 tokens where fine-tuning and evaluate classify read
    128 (so one review could get another label) and took no --max-seq-length; the table printed whole
    multi-paragraph reviews; next-sentence on a model of the default recipe (no NSP) did not name --nsp."""
    from bertforge import BertConfig, BertForSequenceClassification
    from bertforge.tokenizer import train_vocabulary

    texts = ["a fine film", "a dull film", "great fun", "awful mess"] * 3
    tok = train_vocabulary(texts, 60, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), id2label={0: "neg", 1: "pos"})) \
        .save_pretrained(str(tmp_path / "c"), tokenizer=tok)
    assert bertforge.pipeline("classify", model=str(tmp_path / "c")).max_length == 128
    assert bertforge.pipeline("classify", model=str(tmp_path / "c"), max_seq_length=16).max_length == 16
    review = "a fine film\n\n" + "great fun " * 100 + "\n\nawful mess"
    assert main(["predict", "classify", "--model", str(tmp_path / "c"), "--max-seq-length", "8", review]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and len(out[0]) < 130 and out[0].endswith("...")
    assert main(["predict", "classify", "--model", str(tmp_path / "c"), "--max-seq-length", "9999", "x"]) == 2
    assert "exceeds the 512 positions" in capsys.readouterr().err
    assert main(["predict", "next-sentence", "--model", minilm_dir, "A.", "B."]) == 2
    assert "--nsp" in capsys.readouterr().err


def test_inference_runs_the_longest_batch_first_and_keeps_the_order(monkeypatch, caplog):
    """Every evaluate and predict scores its rows in batches of similar length, longest first (in ascending order
    each batch asked for a little more memory than any the batch before freed, and the heap grew with every batch
    of a long evaluation), and gives the results back in the rows' order.  Within evaluate and predict it says how
    far it is: without a terminal, in a log line every so often."""
    import logging

    import bertforge.evaluation as evaluation
    from bertforge.batching import length_sorted_batches
    from bertforge.evaluation import by_length

    lengths = [3, 9, 1, 7, 7, 2, 5]
    batches = length_sorted_batches(lengths, 2)
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True) and sorted(i for b in batches for i in b) == list(range(7))

    class Echo(torch.nn.Module):
        def forward(self, input_ids, attention_mask, **_):
            return attention_mask.sum(-1)

    rows = by_length(Echo(), [{"input_ids": [1] * n, "token_type_ids": [0] * n} for n in lengths], 0, torch.device("cpu"), 2,
                     lambda o, b: o.tolist())
    assert rows == lengths
    monkeypatch.setattr(evaluation, "PROGRESS_LOG_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="bertforge")
    by_length(Echo(), [{"input_ids": [1] * n, "token_type_ids": [0] * n} for n in lengths], 0, torch.device("cpu"), 2,
              lambda o, b: o.tolist())
    assert not caplog.records  # (outside evaluate and predict: a fine-tuning run's evaluation has its own bar)
    with evaluation.inference_progress():
        by_length(Echo(), [{"input_ids": [1] * n, "token_type_ids": [0] * n} for n in lengths], 0,
                  torch.device("cpu"), 2, lambda o, b: o.tolist())
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("scoring: 2 of 7 rows (28%)") and said[-1].startswith("scoring: 6 of 7 rows"), said
