"""Reading and writing the quality protocol's result files, plain (NAME.json) or gzip-compressed (NAME.json.gz).

Why gzip: a result holds every replay's score, and the paper's protocol (30 arms x 13 subtasks x 30 instances x
three lengths, three rounds each) makes 5.5 MB of indented JSON a model; compressed it is under 100 kB. Every
device call carries the repository's tree within 64 MiB, so the committed results of such runs are .json.gz.
The name decides: a path ending in .gz is compressed on write and decompressed on read."""
from __future__ import annotations

import gzip
import json
import os


def _opener(path: str):
    return gzip.open if str(path).endswith(".gz") else open


def load_result(path: str):
    """The JSON document at ``path`` (NAME.json or NAME.json.gz)."""
    with _opener(path)(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def load_for_tables(path: str):
    """A protocol result for the tables (evals.tables, evals.paper_tables), refused (ValueError) when it is a
    --replay-window diagnostic: its wr arms replayed that many tokens, not W_max, so they are not dasc-wr at W."""
    result = load_result(path)
    if result.get("replay_window"):
        raise ValueError(f"{path} is a --replay-window {result['replay_window']} diagnostic, not the protocol's arms")
    return result


def write_result(path: str, result) -> None:
    """``result`` to ``path`` whole or not at all (a temporary file, then a rename): indented when plain,
    compact when compressed. gzip's header carries no time (mtime=0), so the same result gives the same bytes."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    if str(path).endswith(".gz"):
        data = json.dumps(result, separators=(",", ":"), default=str).encode("utf-8")
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(data)
    else:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
    os.replace(tmp, path)
