"""JSON as json.dump(obj, indent=1) writes it, except that a list of plain values (numbers, strings, booleans,
null) stays on one line. The per-request lists of the matched-HBM results and cells (TTFT, prompt lengths,
orders: thousands a cell) took one line a number, about half of each file; the files travel with every device
call, whose 64 MiB the tree shares with the carried wheels."""
from __future__ import annotations

import json
import os

_PLAIN = (str, int, float, bool, type(None))


def _key(k) -> str:
    # json's own rule for non-string keys: 1 -> "1", True -> "true", None -> "null"
    return json.dumps(k if isinstance(k, str) else json.dumps(k))


def dumps(obj, indent: int = 1, _level: int = 0) -> str:
    pad, inner = " " * (indent * _level), " " * (indent * (_level + 1))
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{_key(k)}: {dumps(v, indent, _level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(isinstance(x, _PLAIN) for x in obj):
            return json.dumps(list(obj))
        return "[\n" + ",\n".join(inner + dumps(x, indent, _level + 1) for x in obj) + "\n" + pad + "]"
    return json.dumps(obj)


def write(path: str, obj) -> None:
    """Whole or not at all: written beside ``path`` (a name of this process's own), then renamed over it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(dumps(obj))
    os.replace(tmp, path)
