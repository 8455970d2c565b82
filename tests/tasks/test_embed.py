"""Sentence embeddings: the pairs readers, the in-batch-negatives loss, the retrieval figures against a hand
computation, fine-tuning to a folder that sentence-transformers loads with the same vectors, and the errors of bad input
(torchrun: tests/train/test_lifecycle.py)."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertforge import BertConfig, BertForPreTraining, embed
from bertforge.cli import main
from bertforge.embeddings import EmbeddingSettings, read_settings, write_settings
from bertforge.errors import UserError
from bertforge.tasks.contrastive import _picking, _same
from bertforge.tasks.retrieval import evaluate, metrics, pairs_set, read_pairs, read_retrieval_set, search
from bertforge.tokenizer import train_vocabulary

TOPICS = {"cat": "the cat sat on the warm mat all day", "dog": "a dog ran after the red ball in the park",
          "sea": "waves of the sea broke on the rocks", "tree": "an old tree grew tall beside the river",
          "bread": "fresh bread came out of the hot oven", "train": "the night train left the station late",
          "snow": "snow fell on the quiet town all night"}
QUESTIONS = [("where did the cat sit", "cat"), ("what did the dog chase", "dog"), ("what broke on the rocks", "sea"),
             ("where did the tree grow", "tree"), ("what came out of the oven", "bread"), ("when did the train leave",
             "train"), ("what fell on the town", "snow"), ("how long did the cat sit", "cat"),
             ("where did the dog run", "dog"), ("what did the sea do", "sea"), ("how tall was the tree", "tree"),
             ("was the bread fresh", "bread"), ("was the town quiet", "snow")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return write_setup(tmp_path_factory.mktemp("embed"))


def write_setup(d):
    """Question-passage pairs with repeated passages and a tiny model on their words, in ``d``."""
    rows = [{"query": q, "positive": TOPICS[t]} for q, t in QUESTIONS]
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    words = [*TOPICS.values(), *(q for q, _ in QUESTIONS)]
    tok = train_vocabulary(words, 200, kind="wordlevel", min_frequency=1)
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    BertForPreTraining(cfg).save_pretrained(str(d / "model"), tokenizer=tok)
    return d


def _args(d, out, *extra) -> list[str]:
    return ["--quiet", "finetune", "embed", "--model", str(d / "model"), "--train", str(d / "pairs.jsonl"), "--out",
            str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "16", *extra]


# ------------------------------------------------------------------------------------------------ figures
def test_figures_equal_a_hand_computation():
    ranked = np.array([[2, 0, 1], [1, 2, 0], [4, 0, 3], [0, 1, 2]])
    relevant = [{0: 1}, {1: 1}, {3: 2, 4: 1}, {5: 1}]  # the last query's passage is not in its top three
    m = metrics(ranked, relevant)
    ideal2 = 2 + 1 / math.log2(3)  # grades 2 then 1
    assert m["mrr@10"] == pytest.approx((1 / 2 + 1 + 1 + 0) / 4)
    assert m["recall@1"] == pytest.approx((0 + 1 + 1 / 2 + 0) / 4)
    assert m["recall@10"] == pytest.approx((1 + 1 + 1 + 0) / 4)
    assert m["ndcg@10"] == pytest.approx((1 / math.log2(3) + 1 + (1 + 2 / math.log2(4)) / ideal2 + 0) / 4)


def test_search_is_exact_cosine_ranking():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=(30, 5)).astype(np.float32)
    sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    assert (search(q, d, k=10, chunk=3) == np.argsort(-sims, axis=1)[:, :10]).all()
    assert search(q, d[:4]).shape == (7, 4)  # fewer passages than k


def test_loss_leaves_equal_passages_out_of_the_softmax():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(5, 4)  # 3 queries; 3 positives then 2 negatives
    keys_a, keys_b = torch.tensor([0, 1, 0]), torch.tensor([0, 1, 0, 2, 1])
    s = 20 * torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T
    expected = []
    for i in range(3):  # by hand: the passages of other rows with this row's key take no part
        cols = [j for j in range(5) if j == i or keys_b[j] != keys_a[i]]
        expected.append(-(s[i, i] - torch.logsumexp(s[i, cols], 0)))
    taken = _same(keys_a, keys_b)
    assert float(_picking(a, b, taken, 20.0)) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-6)


# ------------------------------------------------------------------------------------------------ reading
def test_pairs_from_jsonl_tsv_and_squad(tmp_path):
    (tmp_path / "p.tsv").write_text("query\tpositive\tnegative\nq1\tp1\tn1\nq2\tp1\tn2\n")
    pairs, corpus = read_pairs(str(tmp_path / "p.tsv"))
    assert [(p.query, p.positive, p.negative) for p in pairs] == [("q1", "p1", "n1"), ("q2", "p1", "n2")]
    rs = pairs_set(pairs, corpus)
    assert rs.corpus == ["p1", "n1", "n2"] and rs.relevant == [{0: 1}, {0: 1}]  # (the negatives are passages too)
    squad = {"data": [{"title": "t", "paragraphs": [
        {"context": "c one", "qas": [{"id": "a", "question": "q a", "answers": []}]},
        {"context": "c two", "qas": []},
        {"context": "c three", "qas": [{"id": "b", "question": "q b", "answers": []}]}]}]}
    (tmp_path / "s.json").write_text(json.dumps(squad))
    rs = read_retrieval_set(str(tmp_path / "s.json"))  # every paragraph, a question's own relevant
    assert rs.queries == ["q a", "q b"] and rs.corpus == ["c one", "c two", "c three"]
    assert rs.relevant == [{0: 1}, {2: 1}]


def test_a_query_on_several_rows_is_one_query_with_each_positive_relevant(tmp_path):
    rows = [("q1", "p1"), ("q2", "p2"), ("q1", "p3")]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"query": q, "positive": p}) + "\n" for q, p in rows))
    rs = read_retrieval_set(str(tmp_path / "p.jsonl"))
    assert rs.queries == ["q1", "q2"] and rs.corpus == ["p1", "p2", "p3"] and rs.relevant == [{0: 1, 2: 1}, {1: 1}]


def test_twin_queries_leave_each_others_positives_out_of_the_softmax():
    torch.manual_seed(1)
    a, b = torch.randn(3, 4), torch.randn(3, 4)  # rows 0 and 2 ask the same question of other passages
    q_keys, p_keys = torch.tensor([0, 1, 0]), torch.tensor([0, 1, 2])
    s = 20 * torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T
    expected = [-(s[0, 0] - torch.logsumexp(s[0, [0, 1]], 0)), -(s[1, 1] - torch.logsumexp(s[1], 0)),
                -(s[2, 2] - torch.logsumexp(s[2, [1, 2]], 0))]
    taken = _same(p_keys, p_keys) | _same(q_keys, q_keys)
    assert float(_picking(a, b, taken, 20.0)) == pytest.approx(float(torch.stack(expected).mean()), rel=1e-6)


def test_beir_folder(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "one"}\n{"_id": "d2", "text": "two"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "first"}\n{"_id": "q2", "text": "unjudged"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td2\t2\nq1\td1\t0\n")
    rs = read_retrieval_set(str(tmp_path))
    assert rs.queries == ["first"] and rs.corpus == ["T one", "two"] and rs.relevant == [{1: 2}]
    # a passage with the query's own id is never retrieved for it (BEIR's ignore_identical_ids)
    (tmp_path / "corpus.jsonl").write_text('{"_id": "q1", "text": "first"}\n{"_id": "d1", "text": "one"}\n'
                                           '{"_id": "d2", "text": "two"}\n')
    rs = read_retrieval_set(str(tmp_path))
    assert rs.itself == [0]
    vectors = {"first": [1.0, 0.0], "one": [0.0, 1.0], "two": [0.6, 0.8]}
    res = evaluate(rs, lambda texts: np.array([vectors[t] for t in texts], dtype=np.float32))
    assert res["recall@1"] == 1.0
    # an _id twice (issue 66, class 6: counted twice, or a traceback inside BM25's ranking) names its line
    for name, rows in (("corpus.jsonl", '{"_id": "d1", "text": "one"}\n{"_id": "d1", "text": "one"}\n'),
                       ("queries.jsonl", '{"_id": "q1", "text": "first"}\n{"_id": "q1", "text": "again"}\n')):
        good = (tmp_path / name).read_text()
        (tmp_path / name).write_text(rows)
        with pytest.raises(UserError, match=rf"{name}:2: _id 'd?q?1' again \(first at line 1\)"):
            read_retrieval_set(str(tmp_path))
        (tmp_path / name).write_text(good)



def test_bm25_ranks_a_beir_folder_whose_queries_find_few_passages(tmp_path):
    """Queries that are no passages (the usual BEIR set) and that share words with 2 and 4 passages: every row
    as wide, the slots without a hit -1; and a query's own passage is no hit in a corpus smaller than k."""
    pytest.importorskip("bm25s")
    from bertforge.tasks.retrieval import bm25_ranked

    (tmp_path / "qrels").mkdir()
    texts = ["apple pie", "apple tree", "sky boat", "train boat", "sky train", "boat sky"] + [f"stone {w}" for w in
                                                                                           "abcdef"]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                                   for i, t in enumerate(texts)))
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "apple"}\n{"_id": "q2", "text": "sky train boat"}\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td4\t1\n")
    rs = read_retrieval_set(str(tmp_path))
    assert rs.itself == [-1, -1]
    ranked = bm25_ranked(rs)
    assert ranked.shape == (2, 10) and sorted(ranked[0][:2]) == [0, 1] and (ranked[0][2:] == -1).all()
    assert sorted(ranked[1][:4]) == [2, 3, 4, 5] and (ranked[1][4:] == -1).all()
    assert metrics(ranked, rs.relevant)["recall@10"] == 1.0
    q, d = np.eye(3, dtype=np.float32)[:1], np.eye(3, dtype=np.float32)
    assert search(q, d, itself=[2]).tolist() == [[0, 1, -1]]


@pytest.mark.parametrize("name,text,message", [
    ("p.jsonl", '{"query": "q", "positive": ""}\n', "p.jsonl:1: the positive is empty"),
    ("p.jsonl", '{"query": "q"}\n', "p.jsonl:1: no 'positive' field"),
    ("p.jsonl", '{"query": 3, "positive": "x"}\n', "p.jsonl:1: 'query' must be text"),
    ("p.tsv", "a\tb\tc\td\n", "p.tsv:1: 4 fields"),
    ("p.csv", "a,b\n", "unknown format"),
    ("p.jsonl", "\n", "holds no pairs"),
])
def test_bad_pairs_are_one_error_line_and_nothing_written(setup, tmp_path, capsys, name, text, message):
    (tmp_path / name).write_text(text)
    args = _args(setup, tmp_path / "out")
    args[args.index("--train") + 1] = str(tmp_path / name)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_mixed_negatives_are_refused(setup, tmp_path, capsys):
    (tmp_path / "m.jsonl").write_text('{"query": "a", "positive": "b", "negative": "c"}\n{"query": "d", "positive": "e"}\n')
    args = _args(setup, tmp_path / "o")
    args[args.index("--train") + 1] = str(tmp_path / "m.jsonl")
    assert main(args) == 2
    assert "1 of 2 pairs have a negative" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_run_that_cannot_see_a_negative_is_refused(setup, tmp_path, capsys):
    """Issue 66, class 7: a batch of one pair, or pairs that all share one passage, trained at loss 0.0000 and
    gradient norm 0 with status 0."""
    (tmp_path / "one.jsonl").write_text("".join(f'{{"query": "q{i}", "positive": "the same"}}\n' for i in range(6)))
    for train, extra, said in ((None, ["--batch-size", "1"], "--batch-size 1 puts one pair in a batch"),
                               (tmp_path / "one.jsonl", [], "has the same passage")):
        args = _args(setup, tmp_path / "o")
        if train:
            args[args.index("--train") + 1] = str(train)
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0] and "nothing is learnt" in err[0], err
        assert not (tmp_path / "o").exists()


def test_sentence_transformers_settings_classic_and_6x(tmp_path):
    write_settings(str(tmp_path), EmbeddingSettings("cls", False, 77, True), 8)
    assert read_settings(str(tmp_path)) == EmbeddingSettings("cls", False, 77, True)
    # 6.x: the classes moved, the pooling is one string, the length is the tokenizer's
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling" / "config.json").write_text('{"embedding_dimension": 8, "pooling_mode": "mean"}')
    (tmp_path / "sentence_bert_config.json").write_text('{"transformer_task": "feature-extraction"}')
    (tmp_path / "tokenizer_config.json").write_text('{"model_max_length": 99}')
    assert read_settings(str(tmp_path)) == EmbeddingSettings("mean", False, 99, False)
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode": ["cls"]}')
    assert read_settings(str(tmp_path)).pooling == "cls"
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": false}')  # none set: mean
    assert read_settings(str(tmp_path)).pooling == "mean"
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_max_tokens": true}')
    with pytest.raises(UserError, match="bertforge embeds by the mean or the"):
        read_settings(str(tmp_path))
    assert read_settings(str(tmp_path / "1_Pooling")) is None  # no modules.json: a plain BERT directory
    # what sentence-transformers would read otherwise: a file it cannot read, a length, a prompt before every text
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode": "mean"}')
    for text, message in (("{bad", "malformed JSON"), ('{"max_seq_length": -5}', "-5 is not a positive integer"),
                          ('{"max_seq_length": "64"}', "'64' is not a positive integer")):
        (tmp_path / "sentence_bert_config.json").write_text(text)
        with pytest.raises(UserError, match=message):
            read_settings(str(tmp_path))
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    (tmp_path / "config_sentence_transformers.json").write_text('{"prompts": {"query": "query: "}, '
                                                                '"default_prompt_name": null}')
    assert read_settings(str(tmp_path)).max_seq_length == 64
    (tmp_path / "config_sentence_transformers.json").write_text('{"prompts": {"query": "query: "}, '
                                                                '"default_prompt_name": "query"}')
    with pytest.raises(UserError, match="a default prompt"):
        read_settings(str(tmp_path))


# ------------------------------------------------------------------------------------------------ fine-tuning
def test_finetune_embed_saves_a_folder_whose_figures_and_vectors_reproduce(setup, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_args(setup, out, "--validation", str(setup / "pairs.jsonl"), "--epochs", "3", "--batch-size", "4")) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert len(m["epochs"]) == 3 and m["train_pairs"] == len(QUESTIONS)
    modules = json.loads((out / "modules.json").read_text())
    assert [x["type"].rsplit(".", 1)[1] for x in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 16
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    assert "mean pooling" in (out / "README.md").read_text()
    capsys.readouterr()
    # the saved folder scores what the run's best evaluation scored
    assert main(["evaluate", "retrieval", "--model", str(out), "--data", str(setup / "pairs.jsonl")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert sorted(res) == sorted(["mrr@10", "recall@1", "recall@10", "ndcg@10", "queries", "corpus", "seconds"])
    assert res["mrr@10"] == pytest.approx(m["mrr@10"], abs=1e-9) and (res["queries"], res["corpus"]) == (13, 7)
    # predict embed --json: one normalised vector per text, the API's
    texts = ["where did the cat sit", "snow fell"]
    assert main(["predict", "embed", "--model", str(out), "--json", *texts]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in rows] == texts  # each vector with its text
    vecs = np.array([r["embedding"] for r in rows])
    assert vecs.shape == (2, 128) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    assert np.allclose(vecs, embed(str(out), texts, device="cpu"), atol=1e-6)
    # training moved the encoder; the pooler (unused) stayed as loaded
    a, b = load_file(setup / "model" / "model.safetensors"), load_file(out / "model.safetensors")
    assert torch.equal(a["bert.pooler.dense.weight"], b["pooler.dense.weight"])
    assert not torch.equal(a["bert.encoder.layer.0.output.dense.weight"], b["encoder.layer.0.output.dense.weight"])


def test_bm25_baseline(setup, capsys):
    assert main(["evaluate", "retrieval", "--model", "bm25", "--data", str(setup / "pairs.jsonl")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["queries"] == 13 and res["corpus"] == 7 and res["recall@10"] == 1.0 and res["mrr@10"] > 0.5


@pytest.mark.slow
def test_sentence_transformers_loads_the_folder_with_the_same_vectors(setup, tmp_path, minilm_dir, capsys):
    """SentenceTransformer(folder).encode equals predict embed --json within 1e-5, texts past max_seq_length
    included: for a folder finetune embed wrote, and for all-MiniLM-L6-v2 as shipped."""
    st = pytest.importorskip("sentence_transformers")
    out = tmp_path / "o"
    assert main(_args(setup, out, "--epochs", "1", "--batch-size", "4")) == 0
    for folder, long in ((out, "the cat sat " * 20), (minilm_dir, "a long review of a film " * 80)):
        texts = ["where did the cat sit", long, "Snow FELL!"]
        capsys.readouterr()
        assert main(["predict", "embed", "--model", str(folder), "--json", *texts]) == 0
        ours = np.array([r["embedding"] for r in json.loads(capsys.readouterr().out)])
        model = st.SentenceTransformer(str(folder), device="cpu")
        theirs = model.encode(texts)
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-5, folder
    model.save(str(tmp_path / "saved"))  # and the folder as this sentence-transformers version writes it
    assert np.abs(embed(str(tmp_path / "saved"), texts, device="cpu") - theirs).max() < 1e-5


def test_without_a_length_a_run_reads_as_far_as_its_base_folder_says(setup, tmp_path):
    """Issue 68: without --max-seq-length, the base folder's sentence-transformers max_seq_length (what
    sentence-transformers trains it with); a plain BERT folder: 128, or its positions when fewer. A resumed run
    keeps the length it recorded, and a run from a sentence-transformers folder resumes at all (its copy of the
    folder lacked the pooling's settings, 1_Pooling/config.json, which the resumed run reads)."""
    def args(model, out):
        return ["--quiet", "finetune", "embed", "--model", str(model), "--train", str(setup / "pairs.jsonl"), "--out",
                str(out), "--no-progress", "--epochs", "1", "--batch-size", "4"]

    def length(out):
        return json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"]

    plain, st_folder, from_st = tmp_path / "plain", tmp_path / "st", tmp_path / "from-st"
    assert main(args(setup / "model", plain)) == 0 and length(plain) == 32  # 128 > the tiny model's 32 positions
    assert main(_args(setup, st_folder, "--epochs", "1", "--batch-size", "4")) == 0 and length(st_folder) == 16
    assert main(args(st_folder, from_st)) == 0 and length(from_st) == 16
    assert json.loads((from_st / "finetune_config.json").read_text())["finetune"]["data"]["max_seq_length"] == 16

    # resumed, a run keeps the length it recorded, whatever its copy of the base folder says by then (a run
    # recorded before the default was the folder's: 128)
    import bertforge.train.finetune as finetune_mod

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the run stops at its end, after its checkpoints

    resumed = tmp_path / "resumed"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finetune_mod, "finish", stopped)
        assert main([*args(st_folder, resumed), "--save-every", "1"]) == 130
    (resumed / "checkpoints" / "started-from" / "sentence_bert_config.json").write_text(  # (what it reads again)
        '{"max_seq_length": 20, "do_lower_case": false}')
    assert main([*args(st_folder, resumed), "--save-every", "1", "--resume"]) == 0 and length(resumed) == 16


def test_accumulation_caches_gradients_and_makes_the_whole_batchs_update(setup, tmp_path, capsys):
    """--grad-accum runs as GradCache: the loss over the whole batch, in micro-batches (dropout on)."""
    args = ["--batch-size", "6", "--epochs", "2", "--log-every", "1", "--validation", str(setup / "pairs.jsonl")]
    one, accum, small = tmp_path / "one", tmp_path / "accum", tmp_path / "small"
    assert main(_args(setup, one, *args)) == 0
    assert main(_args(setup, accum, *args, "--grad-accum", "3")) == 0
    assert main(_args(setup, small, *args[2:], "--batch-size", "2")) == 0  # what accumulation must not be
    a, b, c = (load_file(o / "model.safetensors") for o in (one, accum, small))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 1e-3
    rows = [[json.loads(x)["loss"] for x in (o / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
            for o in (one, accum)]
    assert len(rows[0]) == 6 and max(abs(x - y) for x, y in zip(*rows)) < 1e-5
    capsys.readouterr()


@pytest.mark.slow
def test_bm25_credits_no_passage_that_shares_no_word(tmp_path, capsys):
    """Issue 66, class 6: with queries that share no word with any passage, BM25 scores every passage 0 and the
    first ten in index order counted as hits; passages of stop words alone ended in a traceback."""
    pytest.importorskip("bm25s")
    pairs = [{"query": f"zyx{i} qwv{i}", "positive": f"the cat number {i} sat on a mat"} for i in range(12)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    assert main(["--quiet", "evaluate", "retrieval", "--model", "bm25", "--data", str(tmp_path / "pairs.jsonl")]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["mrr@10"] == figures["recall@10"] == 0.0
    stop = [{"query": "the cat", "positive": "the of and"}, {"query": "a dog", "positive": "a an the"}]
    (tmp_path / "stop.jsonl").write_text("".join(json.dumps(p) + "\n" for p in stop))
    assert main(["--quiet", "evaluate", "retrieval", "--model", "bm25", "--data", str(tmp_path / "stop.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: BM25 has nothing to index"), err


def test_predict_input_gives_one_result_per_line(setup, tmp_path, capsys):
    """Issue 66, class 3: lines are split at line ends only (a U+2028 inside a text made two), and a blank line is
    a text of its own (dropping it shifted every later vector by one)."""
    (tmp_path / "in.txt").write_text("a\u2028b\nsecond line\n\nfourth line\n", encoding="utf-8")
    assert main(["--quiet", "predict", "embed", "--model", str(setup / "model"), "--input", str(tmp_path / "in.txt"),
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in rows] == ["a\u2028b", "second line", "", "fourth line"]
    assert main(["--quiet", "predict", "embed", "--model", str(setup / "model"), "--json", "fourth line"]) == 0
    again = json.loads(capsys.readouterr().out)[0]["embedding"]
    assert len(rows) == 4 and rows[3]["embedding"] == pytest.approx(again, abs=1e-6)
