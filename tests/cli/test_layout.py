"""The package's layout keeps its promises: the model file holds no kernels, no module imports another that
imports it back (function-level imports counted), a family is named only in the models wing and a task only in
the tasks wing (and by the API that exports it), and the sizes the wings were built to stay under."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import bertforge
from bertforge.tasks import TASKS

SRC = pathlib.Path(bertforge.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = ["bertforge", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the bertforge modules it imports anywhere in its code}."""
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:  # `from . import checkpoint` imports a module
                    if f"{target}.{alias.name}" in files:
                        deps.add(f"{target}.{alias.name}")
                if target in files:
                    deps.add(target)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
        deps.discard(name)
        graph[name] = {d for d in deps if d != "bertforge" and not name.startswith(d + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_no_import_cycle():
    graph = import_graph()
    assert "bertforge.models.base" in graph and "bertforge.checkpoint" in graph["bertforge.models.base"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_finds_a_planted_cycle():
    graph = import_graph()
    graph["bertforge.checkpoint"] = graph["bertforge.checkpoint"] | {"bertforge.models.base"}
    assert find_cycle(graph) is not None


def test_model_file_holds_no_kernels_and_inference_no_training():
    tree = ast.parse((SRC / "models" / "bert.py").read_text(encoding="utf-8"))
    bases = [ast.unparse(b) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for b in c.bases]
    assert not [b for b in bases if b.endswith("Function")], bases
    graph = import_graph()
    assert "bertforge.models.bert" not in graph["bertforge.checkpoint"]
    reached, todo = set(), ["bertforge.predict"]  # everything inference imports, directly or not
    while todo:
        for m in graph[todo.pop()] - reached:
            reached.add(m)
            todo.append(m)
    assert "bertforge.tasks.squad" in reached  # the walk does follow function-level imports
    for training in ("bertforge.train.engine", "bertforge.train.finetune", "bertforge.train.pretrain"):
        assert training not in reached, training


# ------------------------------------------------------------------------------------------------ the two wings
def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


def test_only_the_models_wing_names_a_family():
    """Which family a model is, the registry answers: no other module names one or asks by a string."""
    asks = re.compile(r'arch [!=]= "|== "modernbert"|hasattr\(.*layer_types|isinstance\(config, BertConfig\)'
                      r'|modern_class|in_family\(')
    outside = {path: text for path, text in _sources().items() if not path.startswith("models/")}
    assert [p for p, text in outside.items() if "modernbert" in text.lower()] == []
    assert [p for p, text in outside.items() if asks.search(text)] == []


# The demo fine-tunes a classifier as a user of the task would; `bench serve` reads SQuAD's folder of the data.
TASK_CLIENTS = {"api.py", "__init__.py", "demo/run.py", "bench/serving.py"}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_only_the_tasks_wing_names_a_task(name):
    task = TASKS[name]
    words = [task.__name__, task.settings_class.__name__]
    if task.evaluate_name:
        words.append(task.evaluation().__name__)
    named = re.compile("|".join([*map(re.escape, words), f"[\"']{re.escape(name)}[\"']"]))  # (either quote)
    hits = {p for p, text in _sources().items() if not p.startswith("tasks/") and named.search(text)}
    assert hits <= TASK_CLIENTS, hits - TASK_CLIENTS


def test_the_shared_base_and_the_sizes_hold():
    sources = _sources()
    for member in ("get_input_embeddings", "from_pretrained"):
        assert [p for p, t in sources.items() if f"def {member}(" in t] == ["models/base.py"], member
    lines = {p: t.splitlines() for p, t in sources.items()}
    limits = {"cli.py": 450, "config.py": 520, "predict.py": 200, "models/bert.py": 600}
    assert {p: len(lines[p]) for p in limits if len(lines[p]) > limits[p]} == {}
    assert {p: len(ls) for p, ls in lines.items() if len(ls) > 700} == {}
    assert len([p for p in sources if "/" not in p]) <= 32  # modules directly in the package
    assert "class BertConfig(" in sources["models/bert.py"]  # the config beside its model
    assert [(p, i + 1) for p, ls in lines.items() for i, line in enumerate(ls) if len(line) > 120] == []
    long = [(p, f.name) for p, t in sources.items() for f in ast.walk(ast.parse(t))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno >= 80]
    assert long == []
