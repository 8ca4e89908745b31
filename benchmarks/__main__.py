"""``python -m benchmarks NAME [ARGS]``: run one benchmark (``python -m benchmarks --help`` lists them)."""
from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, str]:
    """name -> the first line of its docstring, for every module here that runs as a script. read with
    ast, not imported: listing must not load torch or touch a device."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        runs = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)
        if runs:
            found[path.stem] = summary(ast.get_docstring(tree) or "")
    return found


def summary(doc: str, width: int = 100) -> str:
    """The docstring's first paragraph on one line (cut at ``width``)."""
    text = " ".join(doc.split("\n\n")[0].split())
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def usage(names: dict[str, str]) -> str:
    width = max(map(len, names))
    lines = [f"  {name:<{width}}  {doc}" for name, doc in names.items()]
    return "\n".join(["usage: python -m benchmarks NAME [ARGS]   (NAME --help: its own flags)", "",
                      "benchmarks:", *lines])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    names = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(names))
        return 0
    name = argv[0]
    if name not in names:
        print(f"python -m benchmarks: error: no benchmark {name!r} (python -m benchmarks --help lists them)",
              file=sys.stderr)
        return 2
    # the benchmark sees its own name and flags, as if it were run on its own
    sys.argv = [f"benchmarks/{name}.py", *argv[1:]]
    from trtllm_dasc.errors import UserError
    try:
        runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=True)
    except UserError as e:
        # a benchmark that lets a user's error through (a refused write, benchmarks/results_io.py) says it in
        # one line, as its own flags' errors do
        print(f"python -m benchmarks {name}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
