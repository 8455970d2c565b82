"""Token classification: the readers and schemes, windows and first-sub-token labels, fine-tuning whose figures
equal seqeval's on its own predictions, a folder that transformers loads, and the errors of bad input."""

import json
import os

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining
from bertforge.cli import main
from bertforge.tasks.ner import NerConfig
from bertforge.errors import UserError
from bertforge.tasks.ner import Sentence, best_windows, read_ner, scheme_of, training_features, windows
from bertforge.tokenizer import train_vocabulary

from ..conftest import data_path

PEOPLE, PLACES = ["anna", "boris", "carla", "dmitri", "elena"], ["paris", "oslo", "lima", "rome"]


def _sentences(n: int) -> list[tuple[list[str], list[str]]]:
    out = []
    for i in range(n):
        p, q = PEOPLE[i % 5], PLACES[i % 4]
        if i % 3 == 0:
            out.append(([p, "smith", "went", "to", q, "today"], ["B-per", "I-per", "O", "O", "B-loc", "O"]))
        else:
            out.append((["we", "met", p, "in", q], ["O", "O", "B-per", "O", "B-loc"]))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("ner")
    rows = _sentences(24)
    (d / "train.conll").write_text("-DOCSTART-\tO\n\n" + "\n\n".join(
        "\n".join(f"{t}\t{g}" for t, g in zip(*r)) for r in rows) + "\n")
    words = [" ".join(r[0]) for r in rows]
    tok = train_vocabulary(words, 100, kind="wordpiece", min_frequency=1)
    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=512)
    BertForPreTraining(cfg).save_pretrained(str(d / "model"), tokenizer=tok)
    return d


def _args(d, out, *extra) -> list[str]:
    return ["--quiet", "finetune", "ner", "--model", str(d / "model"), "--train", str(d / "train.conll"), "--out",
            str(out), "--lr", "1e-3", "--no-progress", "--seed", "1", "--max-seq-length", "32", *extra]


def test_conll_and_jsonl_read_alike(tmp_path):
    (tmp_path / "a.conll").write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    s = read_ner(str(tmp_path / "a.conll"), NerConfig())  # CoNLL-2003's four columns: the tag is the last
    assert [(x.tokens, x.tags) for x in s] == [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter"], ["B-PER"])]
    (tmp_path / "l.txt").write_text("O\nB-PER\nI-PER\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"tokens": ["Peter", "Pan"], "ner_tags": [1, 2]}) + "\n")
    s = read_ner(str(tmp_path / "b.jsonl"), NerConfig(labels_file=str(tmp_path / "l.txt")))
    assert s == [Sentence(["Peter", "Pan"], ["B-PER", "I-PER"])]
    with pytest.raises(UserError, match="need their names"):
        read_ner(str(tmp_path / "b.jsonl"), NerConfig())


def test_schemes_are_told_apart_and_mixing_them_is_refused():
    assert scheme_of([Sentence(["a", "b"], ["B-x", "I-x"])], "f") == "BIO"
    assert scheme_of([Sentence(["a", "b"], ["I-x", "I-x"])], "f") == "IOB1"
    assert scheme_of([Sentence(["a", "b"], ["B-x", "E-x"]), Sentence(["c"], ["S-y"])], "f") == "BIOES"
    with pytest.raises(UserError, match="mix schemes"):
        scheme_of([Sentence(["a"], ["S-x"]), Sentence(["b", "c"], ["O", "I-y"])], "f")


def test_long_sentences_are_windows_and_every_word_is_predicted_once(setup):
    from bertforge.tokenizer import load_tokenizer

    tok = load_tokenizer(str(setup / "model"))
    long = Sentence(["anna", "went", "to", "paris"] * 30, ["B-per", "O", "O", "B-loc"] * 30)
    feats, firsts, split = windows(tok, [long], 24)
    assert split == 1 and len(feats) > 2 and all(len(f["input_ids"]) <= 24 for f in feats)
    chosen = best_windows(feats, firsts)[0]
    assert all(k >= 0 for k, _ in chosen)  # every word has a window
    for w, (k, q) in enumerate(chosen):  # and it is the word's own first piece there
        assert feats[k]["words"][q - 1] == w and firsts[0][w] == feats[k]["start"] + q - 1
    # labels on first pieces only; with label_all_tokens the later pieces take the I- form
    label2id = {"B-per": 0, "I-per": 1, "O": 2, "B-loc": 3, "I-loc": 4}
    s = Sentence(["annasmithson"], ["B-per"])
    (f,), _ = training_features(tok, [s], label2id, 24, all_tokens=False)
    pieces = len(f["input_ids"]) - 2
    assert pieces > 1 and f["labels"] == [-100, 0, *[-100] * (pieces - 1), -100]
    (f,), _ = training_features(tok, [s], label2id, 24, all_tokens=True)
    assert f["labels"] == [-100, 0, *[1] * (pieces - 1), -100]


def test_finetune_ner_figures_equal_seqeval_on_its_predictions(setup, tmp_path, capsys):
    from seqeval.metrics import classification_report, f1_score
    from seqeval.scheme import IOB2

    out = tmp_path / "o"
    assert main(_args(setup, out, "--validation", str(setup / "train.conll"), "--epochs", "4", "--batch-size", "4")) == 0
    m = json.loads((out / "metrics.json").read_text())
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    true, pred = [r["tags"] for r in rows], [r["predicted"] for r in rows]
    assert m["f1"] == pytest.approx(f1_score(true, pred)) and len(rows) == 24
    report = classification_report(true, pred, output_dict=True)
    assert m["per_type"]["per"]["f1"] == pytest.approx(report["per"]["f1-score"])
    assert m["per_type"]["loc"]["number"] == report["loc"]["support"] == 24
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "B-loc", "1": "B-per", "2": "I-per", "3": "O"}  # sorted, as run_ner
    capsys.readouterr()
    # evaluate ner on the same file: the best epoch's figures; --strict: seqeval's strict mode with IOB2
    assert main(["evaluate", "ner", "--model", str(out), "--data", str(setup / "train.conll")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["f1"] == pytest.approx(m["f1"]) and res["per_type"] == m["per_type"]
    assert main(["evaluate", "ner", "--model", str(out), "--data", str(setup / "train.conll"), "--strict"]) == 0
    strict = json.loads(capsys.readouterr().out)
    assert strict["f1"] == pytest.approx(f1_score(true, pred, mode="strict", scheme=IOB2))


def test_transformers_loads_the_token_classifier(setup, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "o"
    assert main(_args(setup, out, "--epochs", "1", "--batch-size", "8")) == 0
    from bertforge.models import BertForTokenClassification

    ours = BertForTokenClassification.from_pretrained(str(out)).eval()
    theirs = transformers.BertForTokenClassification.from_pretrained(str(out)).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 13, 14, 15, 16, 3]])
    mask = (torch.arange(6) < torch.tensor([[5], [6]])).long()
    with torch.no_grad():
        a, b = ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(a[mask.bool()], b[mask.bool()], atol=1e-5)
    capsys.readouterr()


@pytest.mark.parametrize("text,message", [
    ("", "is empty"),
    ("anna\n", "has no tag"),
    ("anna\tO\nwent\tO\n", "only one tag"),
    ("anna\tPERSON\n", "is neither O nor"),
])
def test_bad_files_are_one_error_line_and_nothing_written(setup, tmp_path, capsys, text, message):
    (tmp_path / "bad.conll").write_text(text)
    args = _args(setup, tmp_path / "out")
    args[args.index("--train") + 1] = str(tmp_path / "bad.conll")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_validation_tag_unseen_in_training_is_refused(setup, tmp_path, capsys):
    (tmp_path / "v.conll").write_text("anna\tB-org\n")
    assert main(_args(setup, tmp_path / "out", "--validation", str(tmp_path / "v.conll"))) == 2
    assert "B-org never seen in training" in capsys.readouterr().err



def test_a_validation_set_without_entities_is_warned_about(setup, tmp_path, capsys):
    (tmp_path / "v.conll").write_text("anna\tO\nwent\tO\n")
    assert main(_args(setup, tmp_path / "out", "--validation", str(tmp_path / "v.conll"), "--max-steps", "1")) == 0
    assert "the validation sentences hold no entity, so entity F1 is 0 whatever the model tags" in \
        capsys.readouterr().err

@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_predict_ner_equals_transformers_pipeline(setup, tmp_path_factory, capsys, strategy):
    """predict ner --json gives transformers' token-classification pipeline's entities on the same folder, for
    every aggregation strategy (raw text: words as the pipeline forms them from pieces, character offsets)."""
    transformers = pytest.importorskip("transformers")
    out = setup / "trained"
    if not out.exists():
        assert main(_args(setup, out, "--epochs", "3", "--batch-size", "4")) == 0
    texts = ["Anna Smith went to Paris today!", "we met boris in lima , then annasmithson in Oslo.", "nothing here"]
    if os.environ.get("BERTFORGE_DATA"):  # and WNUT-16's dev tweets as raw text (unknown pieces, URLs, emoji)
        tweets = data_path("wnut16", "dev.conll").read_text(encoding="utf-8").split("\n\n")[:40]
        texts += [" ".join(line.split("\t")[0] for line in t.splitlines() if line.strip()) for t in tweets]
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(out), "--json", "--aggregation", strategy, *texts]) == 0
    ours = json.loads(capsys.readouterr().out)
    theirs = transformers.pipeline("token-classification", model=str(out), aggregation_strategy=strategy,
                                   device="cpu")(texts)
    assert any(ours), "the model finds entities"
    for a, b in zip(ours, theirs):
        assert [{k: v for k, v in x.items() if k != "score"} for x in a] == \
               [{k: (int(v) if k in ("index", "start", "end") else v) for k, v in x.items() if k != "score"} for x in b]
        assert [x["score"] for x in a] == pytest.approx([float(x["score"]) for x in b], abs=1e-5)


def test_a_sentence_classifier_is_not_read_as_a_token_classifier(setup, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_args(setup, out, "--epochs", "1", "--batch-size", "8")) == 0
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["BertForSequenceClassification"]}))
    capsys.readouterr()
    assert main(["predict", "ner", "--model", str(out), "anna went to paris"]) == 2
    assert "not a token classifier" in capsys.readouterr().err


@pytest.mark.slow
def test_accumulation_matches_one_batch(setup, tmp_path, capsys):
    """The loss is the mean over the global batch's labelled tokens: two accumulated micro-batches train as one
    batch (batches of 6 from 22 sentences of different lengths).  The engine normalises a process's micro-batches
    as it does another process's, so this is the task's part of "torchrun x2 = one process"; torchrun itself is
    tested once per command (tests/train/test_lifecycle.py)."""
    args = ["--batch-size", "6", "--epochs", "2", "--log-every", "1", "--max-train-examples", "22"]
    one, accum = tmp_path / "one", tmp_path / "accum"
    assert main(_args(setup, one, *args)) == 0
    assert main(_args(setup, accum, *args, "--grad-accum", "2")) == 0
    from safetensors.torch import load_file

    a, b = load_file(one / "model.safetensors"), load_file(accum / "model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    capsys.readouterr()


def test_conll_files_as_people_export_them(tmp_path):
    """Issue 66, classes 3 and 4: a sentence break of tabs alone, a token with a no-break space ("10\u00a0000") in a
    space-separated file, and a token holding U+2028 (which str.splitlines took for a line end) read as written."""
    from bertforge.tasks.ner import NerConfig

    (tmp_path / "tabs.conll").write_text("Anna\tB-per\nran\tO\n\t\nParis\tB-geo\n")
    assert [s.tokens for s in read_ner(str(tmp_path / "tabs.conll"), NerConfig())] == [["Anna", "ran"], ["Paris"]]
    (tmp_path / "spaces.conll").write_text("10\u00a0000 O\nfans B-group\n\nwe\u2028go O\n")
    sentences = read_ner(str(tmp_path / "spaces.conll"), NerConfig())
    assert [s.tokens for s in sentences] == [["10\u00a0000", "fans"], ["we\u2028go"]]
    assert [s.tags for s in sentences] == [["O", "B-group"], ["O"]]


def test_evaluate_refuses_a_folder_of_the_other_classifier(tmp_path, capsys):
    """Issue 66, class 5: `evaluate ner` ran a sentence classifier's head per token (F1 0.0, status 0), and
    `evaluate classify` read a token classifier's tags as unknown labels; both now name what the folder holds."""
    from bertforge.models import BertForSequenceClassification, BertForTokenClassification

    tok = train_vocabulary(["anna lives in paris", "good fun"] * 4, 40, kind="wordlevel", min_frequency=1)
    cfg = BertConfig.preset("tiny", vocab_size=tok.get_vocab_size(), max_position_embeddings=32)
    cfg.id2label = {0: "B-per", 1: "O"}
    BertForSequenceClassification(cfg).save_pretrained(str(tmp_path / "sentences"), tokenizer=tok)
    BertForTokenClassification(cfg).save_pretrained(str(tmp_path / "tokens"), tokenizer=tok)
    (tmp_path / "dev.conll").write_text("anna\tB-per\nlives\tO\n")
    (tmp_path / "dev.jsonl").write_text(json.dumps({"text": "good fun", "label": "O"}) + "\n")
    for task, folder, data, said in (("ner", "sentences", "dev.conll", "not a token classifier"),
                                     ("classify", "tokens", "dev.jsonl", "not a sentence classifier")):
        assert main(["--quiet", "evaluate", task, "--model", str(tmp_path / folder), "--data",
                     str(tmp_path / data)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and said in err and "\n" not in err, err


def test_predict_input_reads_a_conll_files_sentences(setup, tmp_path, capsys):
    """Issue 66, class 4: `predict ner --input FILE.conll` read each token line as a text."""
    from bertforge.models import BertForTokenClassification
    from bertforge.tokenizer import load_tokenizer

    cfg = BertConfig.preset("tiny", vocab_size=load_tokenizer(str(setup / "model")).get_vocab_size(),
                            max_position_embeddings=64)
    cfg.id2label = {0: "B-per", 1: "O"}
    model = str(tmp_path / "tagger")
    BertForTokenClassification(cfg).save_pretrained(model, tokenizer=load_tokenizer(str(setup / "model")))
    (tmp_path / "dev.conll").write_text("anna\tB-per\nlives\tO\n\t\nin\tO\nparis\tB-loc\n")  # (a tab-only break)
    assert main(["--quiet", "predict", "ner", "--model", model, "--input", str(tmp_path / "dev.conll"), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2  # one result per sentence


def test_windows_cover_every_word_at_any_width_and_pick_as_before(setup):
    """Issue 66, class 4: at --max-seq-length 3 (one piece a window) the last word had no window; and the best
    window of each word was searched over every word of the sentence for every window (quadratic)."""
    from bertforge.tokenizer import load_tokenizer

    tok = load_tokenizer(str(setup / "model"))
    words = [w for r in _sentences(30) for w in r[0]]
    sentence = Sentence(words, ["O"] * len(words))
    for max_len in (3, 4, 7, 16):
        feats, firsts, _ = windows(tok, [sentence], max_len)
        found = best_windows(feats, firsts)[0]
        assert all(k >= 0 for k, _ in found), max_len
        # the search over every word of the sentence, as it was: the same windows and positions
        slow = [(-1.0, -1, -1)] * len(words)
        for k, f in enumerate(feats):
            n = len(f["words"])
            for w, p in enumerate(firsts[0]):
                q = p - f["start"]
                if p >= 0 and 0 <= q < n and min(q, n - 1 - q) + 0.01 * n > slow[w][0]:
                    slow[w] = (min(q, n - 1 - q) + 0.01 * n, k, q + 1)
        assert found == [(k, q) for _, k, q in slow], max_len


def test_an_annotation_slip_is_warned_about_not_taken_for_the_files_scheme(caplog):
    """Issue 66, class 4: one `O I-per` in a BIO file made the whole file IOB1 (strict scoring then counted only
    the slip); the majority decides, and the slip is named."""
    bio = [Sentence(["anna", "ran"], ["B-per", "O"]), Sentence(["bob", "sat"], ["B-per", "O"]),
           Sentence(["x", "carl"], ["O", "I-per"])]
    assert scheme_of(bio, "f.conll") == "BIO"
    assert "f.conll: 1 of 3 entities open with I-, as BIO does not: read as BIO (sentence 3)" in caplog.text
    iob1 = [Sentence(["anna", "ran"], ["I-per", "O"]), Sentence(["bob", "sat"], ["I-per", "O"]),
            Sentence(["a", "b"], ["I-per", "B-per"])]  # (B- between two of one type: IOB1's own use)
    caplog.clear()
    assert scheme_of(iob1, "g.conll") == "IOB1" and "open with" not in caplog.text


def test_a_sentence_of_thousands_of_tokens_is_warned_about(tmp_path, caplog):
    """Issue 66, class 4: a CoNLL file without blank lines reads as one sentence, silently."""
    (tmp_path / "flat.conll").write_text("".join(f"w{i}\tO\n" for i in range(1500)) + "anna\tB-per\n")
    read_ner(str(tmp_path / "flat.conll"), NerConfig())
    assert "flat.conll: sentence 1 has 1501 tokens: are the sentences apart (a blank line between two)?" in caplog.text


def test_a_resumed_run_compares_its_labels_file_by_content(setup, tmp_path, monkeypatch, capsys):
    """Issue 66, class 1: the --labels file of integer ner_tags is compared by what it holds: named by another
    path it resumes; edited (its ids would name other tags) it is refused."""
    import bertforge.train.finetune as finetune_mod

    names = ["O", "B-per", "I-per", "B-loc"]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"tokens": t, "ner_tags": [names.index(g) for g in tags]})
                                                  + "\n" for t, tags in _sentences(12)))
    (tmp_path / "labels.txt").write_text("\n".join(names) + "\n")
    monkeypatch.chdir(tmp_path)
    argv = ["--quiet", "finetune", "ner", "--model", str(setup / "model"), "--train", "train.jsonl", "--labels",
            "labels.txt", "--out", "run", "--max-seq-length", "32", "--batch-size", "4", "--epochs", "1",
            "--save-every", "1", "--no-progress"]

    def stopped(*a, **k):
        raise KeyboardInterrupt  # the run stops at its end, after its checkpoints

    with monkeypatch.context() as mp:
        mp.setattr(finetune_mod, "finish", stopped)
        assert main(argv) == 130
    at = argv.index("--labels") + 1
    absolute = [*argv[:at], str(tmp_path / "labels.txt"), *argv[at + 1:], "--resume"]
    (tmp_path / "labels.txt").write_text("\n".join(["O", "B-loc", "I-per", "B-per"]) + "\n")
    capsys.readouterr()
    assert main(absolute) == 2
    err = capsys.readouterr().err
    assert f"--labels {tmp_path / 'labels.txt'} changed since" in err, err
    (tmp_path / "labels.txt").write_text("\n".join(names) + "\n")
    assert main(absolute) == 0, capsys.readouterr().err
    assert sorted(json.loads((tmp_path / "run" / "config.json").read_text())["id2label"].values()) == sorted(names)


def test_without_epochs_a_small_file_takes_more_of_them(setup, tmp_path, capsys):
    """Issue 68: NER's epochs are its data's when not given: the recipe's 3, more while its batch would make fewer
    than 2,000 updates, up to 10 (WNUT-16's 1,694 sentences: 10 at batch 8); said, and saved with the run. Given
    epochs are kept, and a run counted in steps keeps the recipe's."""
    from bertforge.tasks.base import finetune_epochs

    assert [finetune_epochs(n, 8, 2000) for n in (1_694, 4_000, 5_336, 100_000)] == [10, 4, 3, 3]
    assert finetune_epochs(1_694, 16, 600) == 6 and finetune_epochs(6_400, 32, 600) == 3
    argv = [a for a in _args(setup, tmp_path / "o") if a != "--quiet"]
    assert main(argv) == 0  # (24 sentences: batch 8 by the data, 3 updates an epoch)
    err = capsys.readouterr().err
    assert "10 epochs: 24 examples make 3 updates an epoch at batch 8; ner fine-tunes to 2,000 updates" in err, err
    saved = json.loads((tmp_path / "o" / "finetune_config.json").read_text())["finetune"]["train"]
    assert (saved["epochs"], saved["batch_size"]) == (10, 8)
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["step"] == 30
    assert main(_args(setup, tmp_path / "e2", "--epochs", "2")) == 0
    assert json.loads((tmp_path / "e2" / "metrics.json").read_text())["step"] == 6
    assert main(_args(setup, tmp_path / "s", "--max-steps", "2")) == 0
    assert json.loads((tmp_path / "s" / "finetune_config.json").read_text())["finetune"]["train"]["epochs"] == 3
    assert main(_args(setup, tmp_path / "t", "--max-time", "1h")) == 0  # (a timed run ends at its epochs too)
    assert json.loads((tmp_path / "t" / "metrics.json").read_text())["step"] == 30


def test_a_run_without_epochs_resumes_with_the_epochs_it_chose(setup, tmp_path, monkeypatch, capsys):
    """Stopped by Ctrl-C at step 25 of the 30 its data chose (10 epochs), the run resumed without --epochs takes
    its own 10 again, says no schedule changed, and ends at step 30."""
    import os
    import signal

    from bertforge.train.engine import Engine

    step, calls = Engine.step, []

    def stepping(self, *a, **kw):
        calls.append(1)
        if len(calls) == 25:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, *a, **kw)

    monkeypatch.setattr(Engine, "step", stepping)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(_args(setup, tmp_path / "o")) == 1
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "interrupted at step 25" in capsys.readouterr().err
    monkeypatch.setattr(Engine, "step", step)
    assert main([*_args(setup, tmp_path / "o"), "--resume"]) == 0
    assert "changed" not in capsys.readouterr().err
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["step"] == 30
