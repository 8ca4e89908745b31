"""The package's import graph has no cycle between its top-level parts (subpackages such as engine/ and
parallel/, and modules such as config.py), and every import points down the layer order below, including
those of the thin folders beside the package (build_scripts/, clients/, plugins/, model_repo/,
benchmarks/): every import counts, at module level and inside functions, so a cycle or an upward import
cannot hide in a function body. The graph is read from the source with ast, nothing is imported."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtllm_dasc"
REPO = PACKAGE.parent
# the folders beside the package that import it; each is one unit of the layering
FOLDERS = ("build_scripts", "clients", "plugins", "model_repo", "benchmarks")

# the layers, lowest first: a unit (a part of the package or a folder above) imports only units of lower
# layers, never one of its own layer or above. derived from the imports as they are, and the order
# DESIGN.md draws (front ends -> engine -> model / state / cache / parallel -> plan -> config).
LAYERS = (
    # one-line user errors
    {"errors"},
    # the commit stamp of results (refuses, as a user error, a result without a clean commit in benchmarks/results)
    {"provenance"},
    # facts read without a model: the arm's allowed values, the families' config schemas, checkpoint files,
    # the engine directory's format; the `dasc` shell (one-line errors, names its subcommands by string)
    {"spec", "families", "checkpoint_files", "engine_dir", "cli"},
    # HybridConfig from a config.json
    {"config"},
    # the planner: horizons, selection, layouts, placement, accounting (from weights, no model code)
    {"plan"},
    # the checkpoint pool and codecs, the state ops (the model's replay merge calls them)
    {"state"},
    # what the engine is made of besides: the radix cache's bookkeeping, the layers
    {"cache", "model"},
    # tensor-parallel collectives and the storage all-to-all (moves state units); TensorRT codec networks
    {"parallel", "plugins"},
    # scheduler and runner
    {"engine"},
    # what Triton's python backend calls; the quality evaluations (drive the engine)
    {"serve", "evals"},
    # dasc-build (writes the engine's model repository), the load generators, the Triton model files
    {"build_scripts", "clients", "model_repo"},
    # the commands that tie them together: dasc serve (builds, then serves), dasc logits, make run
    {"cli_serve", "cli_logits", "demo"},
    # the lab notebook
    {"benchmarks"},
)


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


def _unit(module: str, root: Path, folders: tuple[str, ...]) -> str | None:
    """A part of the package, or one of the folders beside it."""
    first = module.split(".")[0]
    return _part(module, root) if first == root.name else (first if first in folders else None)


def import_edges(root: Path = PACKAGE, folders: tuple[str, ...] = ()) -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> the import sites ("module:line") behind that edge, between different units:
    the parts of the package, and with `folders` the named folders beside it (each one unit)."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for base_dir in (root, *(root.parent / f for f in folders)):
        for path in sorted(base_dir.rglob("*.py")):
            module = _module_name(path, base_dir)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            source = _unit(module, root, folders)
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
                for target in {_unit(t, root, folders) for t in targets} - {None, source}:
                    if source is not None:
                        edges[(source, target)].append(f"{module}:{node.lineno}")
    return edges


def upward_imports(edges, layers=LAYERS) -> list[str]:
    """Every edge that does not point to a lower layer (same layer or above), with its sites; a unit that
    has no layer is reported too."""
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    found = []
    for (a, b), sites in sorted(edges.items()):
        missing = [u for u in (a, b) if u not in rank]
        if missing:
            found.append(f"{a} -> {b}: {', '.join(missing)} in no layer (add it to LAYERS)")
        elif rank[b] >= rank[a]:
            kind = "same layer" if rank[b] == rank[a] else "upward"
            found.append(f"{a} -> {b} ({kind}): {', '.join(sites)}")
    return found


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


def _package(tmp_path, folders):
    """An empty trtllm_dasc package under tmp_path with these subpackages: the checks' own test input."""
    root = tmp_path / "trtllm_dasc"
    for folder in folders:
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    return root


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    root = _package(tmp_path, ("engine", "parallel"))
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


def test_every_import_points_down_the_layers():
    edges = import_edges(folders=FOLDERS)
    # the graph is the real one: the folders beside the package are in it
    assert ("build_scripts", "engine") in edges and ("clients", "serve") in edges
    # every part of the package and every folder has a layer
    units = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    units |= {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))} | set(FOLDERS)
    assert units <= set().union(*LAYERS), f"units without a layer: {sorted(units - set().union(*LAYERS))}"
    found = upward_imports(edges)
    assert not found, "imports against the layer order (tests/test_structure.py LAYERS):\n" + "\n".join(found)


def test_an_upward_import_in_a_function_is_found(tmp_path):
    root = _package(tmp_path, ("plan", "engine"))
    (root / "engine" / "runner.py").write_text("from trtllm_dasc.plan import horizons\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "load.py").write_text("import trtllm_dasc.engine.runner\n")
    layers = ({"plan"}, {"engine"}, {"clients"})
    edges = import_edges(root, folders=("clients",))
    assert set(edges) == {("engine", "plan"), ("clients", "engine")}
    assert upward_imports(edges, layers) == []
    # one import inside a function, up from the planner to the engine
    (root / "plan" / "horizons.py").write_text("def f():\n    from trtllm_dasc.engine.runner import X\n")
    assert upward_imports(import_edges(root, folders=("clients",)), layers) == [
        "plan -> engine (upward): trtllm_dasc.plan.horizons:2"]
    # a unit with no layer is named
    assert upward_imports({("plan", "cache"): ["trtllm_dasc.plan.x:1"]}, layers) == [
        "plan -> cache: cache in no layer (add it to LAYERS)"]
