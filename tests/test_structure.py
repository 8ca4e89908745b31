"""The package's import graph has no cycle between its top-level parts (subpackages such as engine/ and
parallel/, and modules such as config.py): every import counts, at module level and inside functions, so a
cycle cannot hide in a function body. The graph is read from the source with ast, nothing is imported."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtllm_dasc"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str, root: Path) -> str | None:
    """The top-level part of the package a dotted name lies in (None: outside the package, or the package
    root itself)."""
    parts = module.split(".")
    if parts[0] != root.name or len(parts) < 2:
        return None
    return parts[1] if (root / parts[1]).is_dir() or (root / f"{parts[1]}.py").is_file() else None


def import_edges(root: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(from part, to part) -> the import sites ("module:line") behind that edge, between different parts."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        source = _part(module, root)
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    node_module = ".".join(base + ([node.module] if node.module else []))
                else:
                    node_module = node.module or ""
                # `from trtllm_dasc import engine` names a part; `from trtllm_dasc.engine import X` its module
                targets = [node_module, *(f"{node_module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in {_part(t, root) for t in targets} - {None, source}:
                if source is not None:
                    edges[(source, target)].append(f"{module}:{node.lineno}")
    return edges


def find_cycle(edges) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def describe(cycle: list[str], edges) -> str:
    hops = [f"{a} -> {b} ({', '.join(edges[(a, b)][:3])})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle between parts of trtllm_dasc: " + "; ".join(hops)


def test_no_import_cycle_between_the_package_parts():
    edges = import_edges()
    # the graph is the real one: the engine uses the model, serving uses the engine
    assert ("engine", "model") in edges and ("serve", "engine") in edges
    cycle = find_cycle(edges)
    assert cycle is None, describe(cycle, edges)


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    root = tmp_path / "trtllm_dasc"
    for folder in ("engine", "parallel"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "config.py").write_text("X = 1\n")
    (root / "engine" / "runner.py").write_text("from trtllm_dasc.parallel.group import TPGroup\n"
                                              "from ..config import X\n")
    (root / "parallel" / "group.py").write_text("def f():\n    from trtllm_dasc.engine import runner\n")
    edges = import_edges(root)
    assert set(edges) == {("engine", "parallel"), ("engine", "config"), ("parallel", "engine")}
    assert edges[("parallel", "engine")] == ["trtllm_dasc.parallel.group:2"]
    cycle = find_cycle(edges)
    assert cycle in (["engine", "parallel", "engine"], ["parallel", "engine", "parallel"])
    assert "trtllm_dasc.parallel.group:2" in describe(cycle, edges)
    # without the function's import there is none
    (root / "parallel" / "group.py").write_text("def f():\n    import torch\n")
    assert find_cycle(import_edges(root)) is None
