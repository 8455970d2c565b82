"""A task is a plug-in: one registered outside the package gets `finetune`, `evaluate` and `predict` sub-commands,
`bertforge.evaluate` and `bertforge.pipeline`, with no change to cli.py or api.py (issue 61)."""

import json
from dataclasses import dataclass

import torch

from bertforge import evaluate, pipeline
from bertforge.batching import pad_batch
from bertforge.cli import main
from bertforge.config import setting
from bertforge.inference import Pipeline
from bertforge.models import BertForSequenceClassification
from bertforge.tasks import TASKS, FinetuneTask, register
from bertforge.tasks.base import use_labels
from bertforge.tokenizer import special_ids

from ..helpers import tiny_model_dir


# ------------------------------------------------------------------------------------------------ the toy task
@dataclass
class LengthSettings:
    threshold: int = setting(4, "a text of more words than this is long", check="positive")


def label(text: str, threshold: int) -> str:
    return "long" if len(text.split()) > threshold else "short"


def read_lines(path: str) -> list[str]:
    return [t for t in open(path, encoding="utf-8").read().splitlines() if t.strip()]


class LengthPipeline(Pipeline):
    task = "longshort"
    model_class = BertForSequenceClassification
    head = ("classification head (classifier)", "fine-tune it with bertforge finetune longshort")

    def __call__(self, texts: list[str]) -> list[str]:
        names = self.config.id2label
        return self._run(self._encode(texts), lambda out, b: [names[int(i)] for i in out.logits.argmax(-1)])


def evaluate_length(model: str, data: str, device: str = "auto", threshold: int = 4) -> dict:
    texts = read_lines(data)
    said = LengthPipeline(model, device=device)(texts)
    return {"accuracy": sum(s == label(t, threshold) for t, s in zip(texts, said)) / len(texts)}


class LengthTask(FinetuneTask):
    name = evaluate_name = predict_name = "longshort"
    help = evaluate_help = predict_help = "long or short texts (a plug-in's task)"
    model_class = BertForSequenceClassification
    settings_class = evaluate_settings = LengthSettings
    select, printed = "accuracy", ("accuracy",)

    def read(self, cfg) -> None:
        self.train, self.val = read_lines(cfg.data.train_file), read_lines(cfg.data.validation_file)

    def texts(self) -> list[str]:
        return self.train

    def configure(self, config) -> bool:
        return use_labels(config, ["long", "short"])

    def encode(self, tok, cfg):
        def features(texts):
            return [{"input_ids": e.ids, "token_type_ids": e.type_ids,
                     "labels": int(label(t, self.settings.threshold) == "short")}
                    for t, e in zip(texts, tok.encode_batch(texts))]

        self.pad, self.f_val = special_ids(tok).pad, features(self.val)
        return features(self.train), lambda fs: pad_batch(fs, self.pad, ("labels",))

    def evaluate(self, model, device):
        b = pad_batch(self.f_val, self.pad, ("labels",))
        with torch.no_grad():
            logits = model(**{k: v.to(device) for k, v in b.items() if k != "labels"}).logits
        return {"accuracy": float((logits.argmax(-1).cpu() == b["labels"]).float().mean())}, None

    @classmethod
    def evaluation(cls):
        return evaluate_length

    @classmethod
    def pipeline_class(cls) -> type:
        return LengthPipeline

    @classmethod
    def predict_arguments(cls, p) -> None:
        p.add_argument("text", nargs="+")

    @classmethod
    def predict(cls, a) -> None:
        print(json.dumps(LengthPipeline(a.model, device=a.device)(a.text)))


# ------------------------------------------------------------------------------------------------ the test
def test_a_task_registered_outside_the_package_gets_every_command(tmp_path, capsys, monkeypatch):
    import pathlib

    import bertforge

    src = pathlib.Path(bertforge.__file__).parent
    assert "longshort" not in (src / "cli.py").read_text() + (src / "api.py").read_text()
    monkeypatch.setitem(TASKS, "longshort", None)  # (the test's own entry: gone at its end)
    assert register(LengthTask) is LengthTask and TASKS["longshort"] is LengthTask
    texts = [" ".join(["the cat sat"] * k) for k in range(1, 5)] * 4
    model = tiny_model_dir(tmp_path / "m", texts, vocab_size=60)
    for name, part in (("train", texts), ("dev", texts[:8])):
        (tmp_path / f"{name}.txt").write_text("\n".join(part) + "\n")
    out = tmp_path / "out"
    assert main(["--quiet", "finetune", "longshort", "--model", model, "--train", str(tmp_path / "train.txt"),
                 "--validation", str(tmp_path / "dev.txt"), "--out", str(out), "--max-steps", "2", "--batch-size",
                 "4", "--threshold", "5", "--no-progress"]) == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= printed["accuracy"] <= 1 and json.loads((out / "metrics.json").read_text())["best_step"] == 2
    assert json.loads((out / "finetune_config.json").read_text())["task"] == {"threshold": 5}
    assert main(["--quiet", "evaluate", "longshort", "--model", str(out), "--data", str(tmp_path / "dev.txt")]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures == evaluate("longshort", model=str(out), data=str(tmp_path / "dev.txt"))
    assert main(["--quiet", "predict", "longshort", "--model", str(out), "the cat", "the cat sat on the mat"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said == pipeline("longshort", model=str(out))(["the cat", "the cat sat on the mat"])
    assert set(said) <= {"long", "short"} and len(said) == 2
