"""The package's layout keeps its promises: the model file holds no kernels, and no module imports
another that imports it back (function-level imports counted)."""

from __future__ import annotations

import ast
import pathlib

import bertforge

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
