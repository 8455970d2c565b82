"""Reranking: the readers, mining that drops the passages holding an answer, both losses against a hand
computation, a folder sentence-transformers' CrossEncoder loads with our scores (BERT and ModernBERT),
`evaluate rerank` and `predict rerank`, and the errors of bad input (one line, nothing written)."""

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bertforge import evaluate, pipeline
from bertforge.cli import main
from bertforge.models import family
from bertforge.tasks.rerank import Group, RerankConfig, RerankLoss, _ReferenceStep, mine, read_groups
from bertforge.tokenizer import special_ids, train_vocabulary

PLACES = {"anna": "oslo", "boris": "lima", "carla": "rome", "dmitri": "paris", "elena": "cairo", "femi": "lagos"}
PARAGRAPHS = [f"{p} lives in {q} near the old market and walks to work by the river" for p, q in PLACES.items()]
PARAGRAPHS += ["the weather in oslo near the old market is cold", "trains leave the station every hour"]


def _squad(path, names=PLACES) -> str:
    paragraphs = [{"context": c, "qas": []} for c in PARAGRAPHS]
    for i, p in enumerate(names):
        c = paragraphs[i]["context"]
        paragraphs[i]["qas"].append({"id": f"q{i}", "question": f"which city near the old market does {p} live in",
                                     "answers": [{"text": PLACES[p], "answer_start": c.index(PLACES[p])}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return str(path)


def _base(folder, arch="bert") -> str:
    texts = PARAGRAPHS + [f"which city near the old market does {p} live in" for p in PLACES]
    tok = train_vocabulary(texts, 150, kind="wordpiece", min_frequency=1)
    torch.manual_seed(0)
    fam = family(arch)
    config = fam.config_class.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=128)
    config.adopt_special_ids(special_ids(tok))
    fam.head("pretraining" if fam.next_sentence else "masked_lm")(config).save_pretrained(str(folder), tokenizer=tok)
    return str(folder)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A reranker fine-tuned from a tiny BERT on the SQuAD file, and its folders."""
    d = tmp_path_factory.mktemp("rerank")
    squad = _squad(d / "squad.json")
    out = d / "out"
    assert main(["--quiet", "finetune", "rerank", "--model", _base(d / "base"), "--train", squad, "--validation", squad,
                 "--out", str(out), "--epochs", "3", "--batch-size", "2", "--lr", "1e-3", "--num-negatives", "2",
                 "--top-k", "5", "--max-seq-length", "48", "--no-progress"]) == 0
    return d, squad, out


# ------------------------------------------------------------------------------------------------ reading, mining
def test_every_format_reads_as_groups(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"query": "q1", "positive": "a", "negatives": ["b", "c"]}) + "\n"
                                      + json.dumps({"query": "q2", "positive": "d", "negative": "a"}) + "\n")
    (tmp_path / "p.tsv").write_text("q1\ta\tb\tc\nq2\td\ta\n")
    (tmp_path / "l.tsv").write_text("query\tpassage\tlabel\nq1\ta\t1\nq1\tb\t0\nq2\td\t1\nq1\tc\t0\nq2\ta\t0\n")
    (tmp_path / "l.jsonl").write_text("".join(json.dumps({"query": q, "passage": p, "label": y}) + "\n" for q, p, y in
                                              [("q1", "a", 1), ("q1", "b", 0), ("q2", "d", 1), ("q1", "c", 0),
                                               ("q2", "a", 0)]))
    for name in ("p.jsonl", "p.tsv", "l.tsv", "l.jsonl"):
        groups, corpus = read_groups(str(tmp_path / name))
        by_query = {g.query: sorted(zip(g.passages, g.labels)) for g in groups}
        assert by_query == {"q1": [("a", 1), ("b", 0), ("c", 0)], "q2": [("a", 0), ("d", 1)]}, name
        assert sorted(corpus) == ["a", "b", "c", "d"]
    groups, corpus = read_groups(_squad(tmp_path / "s.json"))
    assert len(groups) == len(PLACES) and corpus == PARAGRAPHS and groups[0].answers == ("oslo",)


def test_mining_keeps_the_positives_out_and_drops_passages_that_hold_an_answer(tmp_path):
    groups, corpus = read_groups(_squad(tmp_path / "s.json"))
    s = RerankConfig(num_negatives=3, range_max=8)
    figures = mine(groups, corpus, s)
    anna = groups[0]
    assert anna.labels[0] == 1 and anna.passages[0] == PARAGRAPHS[0] and anna.labels[1:] == [0, 0, 0]
    assert PARAGRAPHS[0] not in anna.passages[1:] and PARAGRAPHS[6] not in anna.passages  # (it holds "oslo")
    assert all(PARAGRAPHS[6] in g.passages for g in groups[1:])  # (the others' answers are elsewhere)
    assert figures == {"mined_negatives": 3 * len(groups), "false_negatives_dropped": 1,
                       "false_negative_share": round(1 / (1 + 3 * len(groups)), 4), "queries_short_of_negatives": 0}
    # range_min skips the first stage's best
    skipped, _ = read_groups(_squad(tmp_path / "s.json"))
    mine(skipped, corpus, RerankConfig(num_negatives=1, range_min=1, range_max=8))
    firsts, _ = read_groups(_squad(tmp_path / "s.json"))
    mine(firsts, corpus, RerankConfig(num_negatives=2, range_max=8))
    assert [g.passages[1] for g in skipped[1:]] == [g.passages[2] for g in firsts[1:]]  # (anna's drops one first)


def test_mining_matches_answers_by_words_and_never_mines_a_querys_own_passage():
    """An answer is in a passage when its words are a run of the passage's ("2" is not in "2012"); a query on two
    rows of a pairs file gets neither row's positive as a negative."""
    corpus = ["the war ended in 2012 after 2 days", "the war ended in 2012", "it lasted 2 days", "a war of days"]
    groups = [Group("how many days did the war last", [corpus[3]], [1], ("2",))]
    assert mine(groups, corpus, RerankConfig(num_negatives=3, range_max=4))["false_negatives_dropped"] == 2
    assert groups[0].passages[1:] == [corpus[1]]  # (the two that hold "2" as a word dropped, not "2012")
    rows = [Group("the war days", [corpus[0]], [1]), Group("the war days", [corpus[1]], [1])]
    mine(rows, corpus, RerankConfig(num_negatives=2, range_max=4))
    assert [sorted(g.passages[1:]) for g in rows] == [sorted(corpus[2:])] * 2  # (neither has the other's positive)


def test_both_losses_equal_a_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(5)

    class Fixed(torch.nn.Module):
        def forward(self, *a, **k):
            import types

            return types.SimpleNamespace(logits=logits[:, None])

    b = {"input_ids": torch.zeros(5, 3, dtype=torch.long), "attention_mask": torch.ones(5, 3, dtype=torch.long),
         "token_type_ids": torch.zeros(5, 3, dtype=torch.long), "labels": torch.tensor([1.0, 0, 0, 1, 0]),
         "group": torch.tensor([0, 0, 0, 1, 1]), "slot": torch.tensor([0, 1, 2, 0, 1])}
    bce = RerankLoss(Fixed(), None, "bce")
    loss, _ = bce.loss(bce(b, 0), bce.counts(b))
    assert float(loss) == pytest.approx(float(F.binary_cross_entropy_with_logits(logits, b["labels"])), abs=1e-6)
    lw = RerankLoss(Fixed(), None, "listwise")
    loss, _ = lw.loss(lw(b, 0), lw.counts(b))
    hand = -(F.log_softmax(logits[:3], 0)[0] + F.log_softmax(logits[3:], 0)[0]) / 2
    assert float(loss) == pytest.approx(float(hand), abs=1e-6)
    # the bench's reference (sentence-transformers' model) trains the same loss
    for name, ours in (("bce", bce), ("listwise", lw)):
        theirs = _ReferenceStep(Fixed(), name, ours.pos_weight)(**b).loss
        assert float(theirs) == pytest.approx(float(ours.loss(ours(b, 0), ours.counts(b))[0]), abs=1e-6), name


# ------------------------------------------------------------------------------------------------ the folder
def test_cross_encoder_loads_the_folder_and_scores_and_ranks_as_we_do(trained):
    st = pytest.importorskip("sentence_transformers")
    _, _, out = trained
    config = json.loads((out / "config.json").read_text())
    assert config["sentence_transformers"]["activation_fn"] == "torch.nn.modules.linear.Identity"  # (listwise)
    assert config["id2label"] == {"0": "LABEL_0"}
    # the listwise loss leaves a shift of every score free: the bias stays where the new head put it
    assert load_file(str(out / "model.safetensors"))["classifier.bias"].abs().max() == 0
    ours = pipeline("rerank", model=str(out), device="cpu")
    theirs = st.CrossEncoder(str(out), device="cpu")
    query = "where does anna live"
    pairs = [(query, p) for p in PARAGRAPHS]
    assert np.abs(ours.predict(pairs) - theirs.predict(pairs)).max() < 1e-5
    mine_, their_rank = ours(query, PARAGRAPHS), theirs.rank(query, PARAGRAPHS)
    assert [r["corpus_id"] for r in mine_] == [r["corpus_id"] for r in their_rank]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(mine_, their_rank)) < 1e-5
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["first_stage_mrr@10"] == 1.0 and 0 < metrics["mrr@10"] <= 1  # (BM25 finds each name's paragraph)
    assert metrics["train_queries"] == len(PLACES) and metrics["false_negatives_dropped"] == 1


def test_a_modernbert_reranker_loads_in_cross_encoder_with_our_scores(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    squad, out = _squad(tmp_path / "s.json"), tmp_path / "out"
    assert main(["--quiet", "finetune", "rerank", "--model", _base(tmp_path / "base", "modernbert"), "--train", squad,
                 "--out", str(out), "--max-steps", "2", "--batch-size", "2", "--num-negatives", "2",
                 "--max-seq-length", "48", "--loss", "bce", "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())  # (BCE: the score is a probability)
    assert config["sentence_transformers"]["activation_fn"] == "torch.nn.modules.activation.Sigmoid"
    pairs = [("where does boris live", p) for p in PARAGRAPHS]
    theirs = st.CrossEncoder(str(out), device="cpu").predict(pairs)
    assert np.abs(pipeline("rerank", model=str(out), device="cpu").predict(pairs) - theirs).max() < 1e-5


def test_evaluate_and_predict_rerank(trained, capsys):
    d, squad, out = trained
    api = evaluate("rerank", model=str(out), data=squad, top_k=5)
    assert main(["--quiet", "evaluate", "rerank", "--model", str(out), "--data", squad, "--top-k", "5"]) == 0
    said = json.loads(capsys.readouterr().out)
    for key in ("mrr@10", "recall@1", "recall@10", "ndcg@10", "queries", "corpus", "first_stage", "top_k", "seconds"):
        assert key in said and key in api, key
    assert said["first_stage"]["model"] == "bm25" and said["top_k"] == 5 and said["queries"] == len(PLACES)
    assert said["mrr@10"] == pytest.approx(api["mrr@10"])
    bm25 = evaluate("retrieval", model="bm25", data=squad)
    figures = ("mrr@10", "recall@1", "recall@10", "ndcg@10")
    assert said["queries"] == bm25["queries"]
    assert said["recall@10"] <= said["first_stage"]["recall@10"] + 1e-9  # reranking reorders; it finds nothing new
    # the first stage's figures are evaluate retrieval's whatever --top-k, on the same corpus (a pairs file's
    # negatives in it); below the top k its order stays.  Queries on words every place's paragraph has: BM25 puts
    # some positives below the first, where a first stage cut at --top-k 1 would lose them
    (d / "pairs.tsv").write_text("".join(f"question {i} near the old market by the river\t{c}\t{PARAGRAPHS[-2]}\n"
                                         for i, c in enumerate(PARAGRAPHS[: len(PLACES)])))
    for data in (squad, str(d / "pairs.tsv")):
        one, bm25 = evaluate("rerank", model=str(out), data=data, top_k=1), evaluate("retrieval", model="bm25", data=data)
        assert {k: one["first_stage"][k] for k in figures} == pytest.approx({k: bm25[k] for k in figures}), data
        assert {k: one[k] for k in figures} == pytest.approx({k: bm25[k] for k in figures}), data  # (one reordered)
        assert (one["queries"], one["corpus"]) == (bm25["queries"], bm25["corpus"]), data
    assert bm25["recall@1"] < bm25["recall@10"] and bm25["corpus"] == len(PLACES) + 1
    assert main(["--quiet", "predict", "rerank", "--model", str(out), "--query", "where does anna live", "--json",
                 *PARAGRAPHS[:3]]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["corpus_id"] for r in rows) == [0, 1, 2]
    assert [r["score"] for r in rows] == sorted((r["score"] for r in rows), reverse=True)
    (d / "passages.txt").write_text("\n".join(PARAGRAPHS[:3]) + "\n")
    assert main(["--quiet", "predict", "rerank", "--model", str(out), "--query", "where does anna live", "--input",
                 str(d / "passages.txt")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3
    (d / "gap.txt").write_text(f"{PARAGRAPHS[1]}\n\n{PARAGRAPHS[0]}\n")  # a blank line is a passage: ids are lines
    assert main(["--quiet", "predict", "rerank", "--model", str(out), "--query", "where does anna live", "--json",
                 "--input", str(d / "gap.txt")]) == 0
    assert sorted((r["corpus_id"], r["text"]) for r in json.loads(capsys.readouterr().out)) == [
        (0, PARAGRAPHS[1]), (1, ""), (2, PARAGRAPHS[0])]


# ------------------------------------------------------------------------------------------------ bad input
def test_bad_input_is_one_error_line_and_writes_nothing(trained, tmp_path, capsys):
    d, squad, out = trained
    base = str(d / "base")
    (tmp_path / "pos.jsonl").write_text(json.dumps({"query": "q", "positive": "a passage"}) + "\n")
    (tmp_path / "label.tsv").write_text("query\tpassage\tlabel\nq\ta passage\t2\n")
    (tmp_path / "empty.jsonl").write_text(json.dumps({"query": " ", "positive": "a", "negative": "b"}) + "\n")
    (tmp_path / "score.tsv").write_text("query\tpassage\tscore\nq\ta passage\t1\nq\tanother\t0\n")
    (tmp_path / "nohead.tsv").write_text("q\ta passage\t1\nq\tanother\t2\n")
    cases = [
        (["--train", str(tmp_path / "pos.jsonl"), "--negatives", "none"], "no query has a negative passage"),
        (["--train", str(tmp_path / "label.tsv")], "label '2' is not 0 or 1"),
        (["--train", str(tmp_path / "empty.jsonl")], "the query is empty"),
        (["--train", str(tmp_path / "score.tsv")], "unknown header 'query\\tpassage\\tscore'"),
        (["--train", str(tmp_path / "nohead.tsv")], "every row's third field is a number"),
        (["--train", squad, "--negatives", str(out)], "not an embeddings model"),
        (["--train", squad, "--first-stage", str(tmp_path)], "not a model folder"),
        (["--train", squad, "--range-min", "5", "--range-max", "5"], "must be below --range-max"),
    ]
    mismatched = tmp_path / "mismatched"  # (found before mining, whose line came before the error's)
    shutil.copytree(base, mismatched)
    config = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    cases.append((["--train", squad, "--model", str(mismatched)], "do not belong together"))
    for flags, message in cases:
        target = tmp_path / "run"
        assert main(["finetune", "rerank", "--model", base, "--out", str(target), "--no-progress",
                     "--max-seq-length", "48", *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (flags, err)
        assert not target.exists()
    assert main(["evaluate", "rerank", "--model", str(out), "--data", squad, "--first-stage", str(out)]) == 2
    assert "not an embeddings model" in capsys.readouterr().err
    assert main(["predict", "rerank", "--model", base, "--query", "q", "a passage"]) == 2
    assert "no reranking head" in capsys.readouterr().err
    # a passage of bytes that are not UTF-8 (a shell passes them as surrogates) is read as the query's are
    assert main(["predict", "rerank", "--model", str(out), "--query", "q", "caf\udce9", "--json"]) == 0
    assert "U+FFFD" in capsys.readouterr().err


def test_an_older_cross_encoder_folders_activation_is_read_as_cross_encoder_reads_it(trained, tmp_path):
    _, _, out = trained
    legacy = tmp_path / "legacy"
    shutil.copytree(out, legacy)
    config = json.loads((legacy / "config.json").read_text())
    del config["sentence_transformers"]  # (sentence-transformers before v4 named it at the top level)
    config["sbert_ce_default_activation_function"] = "torch.nn.modules.linear.Identity"  # (without: a sigmoid)
    (legacy / "config.json").write_text(json.dumps(config))
    pairs = [("where does anna live", p) for p in PARAGRAPHS]
    logits = pipeline("rerank", model=str(out), device="cpu").predict(pairs)  # (listwise: no activation)
    assert np.array_equal(pipeline("rerank", model=str(legacy), device="cpu").predict(pairs), logits)


def test_passages_of_the_same_text_tie_and_keep_the_first_stages_order():
    from bertforge.tasks.rerank import rerank_figures
    from bertforge.tasks.retrieval import RetrievalSet

    rs = RetrievalSet(["q"], ["same", "other", "same"], [{2: 1}])
    noise = iter([0.5, 0.1, 0.5 + 1e-7])  # what scoring the same pair twice, in other batches, can give

    def score(queries, passages):
        return np.asarray([next(noise) for _ in passages])

    _, reranked = rerank_figures(rs, np.asarray([[0, 1, 2]]), score, 3)
    assert reranked["mrr@10"] == 0.5  # the twin ranked first by BM25 stays first; scored once, not twice


def test_bm25_keeps_every_hit_of_a_corpus_no_larger_than_the_depth(tmp_path):
    from bertforge.tasks.rerank import read_retrieval_data
    from bertforge.tasks.retrieval import bm25_ranked

    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    docs = ["museum market tower", "museum market castle", "museum market bridge", "museum garden"]
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n"
                                               for i, t in enumerate(docs)))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "museum market"}) + "\n")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td3\t1\n")
    rs = read_retrieval_data(str(beir))
    assert sorted(bm25_ranked(rs, 10)[0].tolist()) == [0, 1, 2, 3]
    assert evaluate("retrieval", model="bm25", data=str(beir))["recall@10"] == 1.0


def test_a_resumed_run_compares_its_mining_model_by_content(tmp_path, capsys):
    """Issue 66: --negatives and --first-stage name a model folder the run reads at its start, and --resume
    compares it by what it holds: another model under the same path is refused (it would mine other negatives),
    the same model under another path resumes."""

    from safetensors.torch import load_file, save_file

    import bertforge.train.finetune as finetune_mod

    squad, miner = _squad(tmp_path / "squad.json"), _base(tmp_path / "miner")
    shutil.copytree(miner, tmp_path / "moved")
    argv = ["--quiet", "finetune", "rerank", "--model", _base(tmp_path / "base"), "--train", squad, "--validation",
            squad, "--out", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "2", "--num-negatives", "2",
            "--top-k", "5", "--max-seq-length", "48", "--save-every", "1", "--no-progress", "--negatives", miner,
            "--first-stage", miner]

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the run stops at its end, after its checkpoints

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(finetune_mod, "finish", stopped)
        assert main(argv) == 130
    weights = load_file(f"{miner}/model.safetensors")
    save_file({k: v + 0.01 for k, v in weights.items()}, f"{miner}/model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--negatives {miner} and --first-stage {miner} changed since" in err and err.count("\n") == 1, err
    moved = [str(tmp_path / "moved") if a == miner else a for a in argv]
    assert main([*moved, "--resume"]) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_an_evaluation_is_counted_in_training_examples_for_the_clock():
    """The run's clock reserves time for the final evaluation by its size in training examples (a query with
    its passages); counted in pairs, a timed run reserved six times too much and trained a single step."""
    from bertforge.tasks.rerank import RerankTask
    from bertforge.tasks.retrieval import RetrievalSet

    t = RerankTask(RerankConfig(top_k=4))
    t.groups = [Group("q", ["p"] * 6, [1] + [0] * 5)] * 3
    t.val = RetrievalSet(["a", "b"], ["x"] * 9, [{0: 1}, {1: 1}])
    t.ranked = np.array([[0, 1, 2, 3, 4], [5, 6, -1, -1, -1]])
    assert t.eval_size() == round((4 + 2) / 6)


def test_a_squad_question_is_its_own_query_as_evaluate_retrieval_counts_it(tmp_path):
    """Two SQuAD questions of one text on two paragraphs are two queries (as `evaluate retrieval` counts them);
    two rows of a pairs file with one query text are one query with two relevant passages."""
    from bertforge.tasks.rerank import read_retrieval_data

    paragraphs = [{"context": c, "qas": [{"id": f"q{i}", "question": "who lives near the old market",
                                          "answers": [{"text": c.split()[0], "answer_start": 0}]}]}
                  for i, c in enumerate(PARAGRAPHS[:2])]
    (tmp_path / "s.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    rs = read_retrieval_data(str(tmp_path / "s.json"))
    assert rs.queries == ["who lives near the old market"] * 2 and rs.relevant == [{0: 1}, {1: 1}]
    rows = [{"query": "who lives near the old market", "positive": c} for c in PARAGRAPHS[:2]]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rs = read_retrieval_data(str(tmp_path / "p.jsonl"))
    assert rs.queries == ["who lives near the old market"] and rs.relevant == [{0: 1, 1: 1}]


def test_bce_weighs_positives_by_the_files_own_negatives_when_none_are_mined():
    from bertforge.tasks.rerank import RerankTask

    task = RerankTask(RerankConfig(negatives="none", loss="bce"))  # (--num-negatives 5 has nothing to do here)
    task.groups = [Group("q1", ["a", "b", "c"], [1, 0, 0]), Group("q2", ["d", "e", "f", "g"], [1, 1, 0, 0])]
    assert task.pos_weight == 4 / 3
    assert RerankTask(RerankConfig(loss="bce")).pos_weight == 5.0  # mined: --num-negatives per positive
    assert RerankTask(RerankConfig(negatives="none", loss="bce", pos_weight=2.0)).pos_weight == 2.0
