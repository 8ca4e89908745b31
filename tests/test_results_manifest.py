"""benchmarks/results/ holds the latest result of each benchmark, each traceable to a run: every JSON records
the command that made it and a clean commit (a bare hash: no "+uncommitted changes", no "dirty"), and
manifest.json lists every file of the directory, no more and no less. Reads files only: no git, no torch."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trtllm_dasc.evals.result_file import load_result

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
# the directory's own description, not results
NOT_RESULTS = {"README.md", "manifest.json"}
SHA = re.compile(r"[0-9a-f]{7,40}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def load(path: Path):
    """A result document: NAME.json, or NAME.json.gz (gzip-compressed: the quality protocol's large results)."""
    return load_result(str(path))


def values(obj, key: str) -> list:
    """Every value of ``key`` anywhere in a JSON document (every list item, not a sample)."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                found.append(v)
            found += values(v, key)
    elif isinstance(obj, list):
        for v in obj:
            found += values(v, key)
    return found


def provenance_problems(doc) -> list[str]:
    """Why a result document does not say where it came from ([] when it does)."""
    problems = []
    if not [c for c in values(doc, "command") if isinstance(c, str) and c.strip()]:
        problems.append("no command")
    commits = [c for c in values(doc, "commit") if c]
    if not commits:
        problems.append("no commit")
    problems += [f"commit {c!r} is not a clean commit hash" for c in commits
                 if not (isinstance(c, str) and SHA.fullmatch(c))]
    return problems


def listed(manifest: dict) -> list[str]:
    return [p for e in manifest["benchmarks"].values() for p in [e["file"], *e.get("companions", [])]]


def manifest_problems(root: Path) -> list[str]:
    """Where manifest.json and the directory under ``root`` disagree ([] when they agree)."""
    manifest = json.loads((root / "manifest.json").read_text())
    problems = []
    names = listed(manifest)
    problems += [f"{p} listed twice" for p in sorted({p for p in names if names.count(p) > 1})]
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - NOT_RESULTS
    problems += [f"{p} is in the directory but not in the manifest" for p in sorted(present - set(names))]
    problems += [f"{p} is in the manifest but not in the directory" for p in sorted(set(names) - present)]
    for name, e in manifest["benchmarks"].items():
        if not (root / e["file"]).is_file() or not e["file"].endswith((".json", ".json.gz")):
            problems.append(f"{name}: its file {e['file']} is not a JSON result here")
            continue
        doc = load(root / e["file"])
        commits = [c for c in values(doc, "commit") if isinstance(c, str)]
        for c in ([e["commit"]] if isinstance(e["commit"], str) else e["commit"]):
            if not SHA.fullmatch(c) or not any(c.startswith(r) or r.startswith(c) for r in commits if r):
                problems.append(f"{name}: commit {c} is not one {e['file']} records")
        commands = values(doc, "command")
        for c in ([e["command"]] if isinstance(e["command"], str) else e["command"]):
            if c not in commands:
                problems.append(f"{name}: command {c!r} is not one {e['file']} records")
        if not DATE.fullmatch(e.get("date", "")) or not e.get("measures", "").strip():
            problems.append(f"{name}: needs a date (YYYY-MM-DD) and what it measures")
    return problems


def result_jsons():
    return sorted(p for pattern in ("*.json", "*.json.gz") for p in RESULTS.rglob(pattern) if p.name not in NOT_RESULTS)


@pytest.mark.parametrize("path", result_jsons(), ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_every_result_records_its_command_and_a_clean_commit(path):
    assert provenance_problems(load(path)) == []


def test_the_manifest_and_the_directory_agree():
    assert manifest_problems(RESULTS) == []


def test_the_results_readme_names_every_file_of_the_manifest():
    readme = (RESULTS / "README.md").read_text()
    manifest = json.loads((RESULTS / "manifest.json").read_text())
    # quality/'s own README describes the files under it
    missing = [p for p in listed(manifest) if not p.startswith("quality/") and p not in readme]
    assert missing == []


# a script a row cites by path (scripts/gpu/tp2.sh, benchmarks/x.py) or runs as a module (python -m benchmarks x,
# python -m clients.matched_hbm)
SCRIPT = re.compile(r"\b((?:scripts|benchmarks|clients|trtllm_dasc|build_scripts)/[\w./-]+\.(?:sh|py))\b")
MODULE = re.compile(r"python -m ([\w.]+)(?: (\w+))?")


def missing_scripts(readme: str, root: Path) -> list[str]:
    """The scripts cited in the table rows (lines starting with '|') of a README that do not exist under root."""
    missing = []
    for row in (line for line in readme.splitlines() if line.startswith("|")):
        paths = SCRIPT.findall(row)
        for module, name in MODULE.findall(row):
            if module == "benchmarks":
                paths += [f"benchmarks/{name}.py"] if name else []
            else:
                base = module.replace(".", "/")
                paths.append(f"{base}.py" if not (root / base / "__main__.py").exists() else f"{base}/__main__.py")
        missing += [p for p in paths if not (root / p).exists() and p not in missing]
    return missing


@pytest.mark.parametrize("readme", ["README.md", "quality/README.md"])
def test_every_script_a_results_row_cites_exists(readme):
    assert missing_scripts((RESULTS / readme).read_text(), RESULTS.parent.parent) == []


def test_a_row_citing_a_moved_script_is_caught():
    root = RESULTS.parent.parent
    rows = ("| a.json | x | `bash scripts/gpu_tp2.sh` (`python -m benchmarks no_such_bench --commit 1`) | H200 |\n"
            "| b.json | y | `python -m clients.no_such_module` | CPU |\nnot a row: scripts/gpu_old.sh\n")
    assert missing_scripts(rows, root) == ["scripts/gpu_tp2.sh", "benchmarks/no_such_bench.py",
                                           "clients/no_such_module.py"]
    assert missing_scripts("| c | `bash scripts/gpu/tp2.sh` (`python -m benchmarks tp_storage`, "
                           "`python -m clients.matched_hbm`) |", root) == []


# the checks themselves, on documents and directories built to be wrong in one way each
@pytest.mark.parametrize("doc, problem", [
    ({"commit": "abc1234"}, "no command"),
    ({"command": "python x.py"}, "no commit"),
    ({"command": "python x.py", "commit": None}, "no commit"),
    ({"command": "python x.py", "runs": [{"commit": "abc1234"}, {"commit": "abc1234+uncommitted changes"}]},
     "not a clean commit"),
    ({"command": "python x.py", "commit": "abc1234-dirty"}, "not a clean commit"),
    ({"runs": [{}] * 60 + [{"command": "python x.py", "commit": "abc1234 dirty"}]}, "not a clean commit"),
])
def test_a_result_without_its_provenance_is_caught(doc, problem):
    assert any(problem in p for p in provenance_problems(doc))
    assert provenance_problems({"command": "python x.py", "runs": [{"commit": "abc1234"}]}) == []


def _directory(tmp_path, manifest_entries, files):
    for name, doc in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps(doc) if name.endswith(".json") else "log")
    (tmp_path / "manifest.json").write_text(json.dumps({"benchmarks": manifest_entries}))
    return tmp_path


GOOD = {"file": "a.json", "command": "python a.py", "commit": "abc1234", "date": "2026-12-01",
        "measures": "a", "companions": ["a.log"]}


@pytest.mark.parametrize("entries, files, problem", [
    ({"a": GOOD}, {"a.json": {"command": "python a.py", "commit": "abc1234"}, "a.log": 0, "old.json": {}},
     "old.json is in the directory but not in the manifest"),
    ({"a": GOOD}, {"a.json": {"command": "python a.py", "commit": "abc1234"}},
     "a.log is in the manifest but not in the directory"),
    ({"a": {**GOOD, "commit": "def5678"}}, {"a.json": {"command": "python a.py", "commit": "abc1234"}, "a.log": 0},
     "commit def5678 is not one"),
    ({"a": {**GOOD, "command": "python b.py"}}, {"a.json": {"command": "python a.py", "commit": "abc1234"},
                                                 "a.log": 0}, "command 'python b.py' is not one"),
    ({"a": GOOD, "b": {**GOOD, "companions": []}}, {"a.json": {"command": "python a.py", "commit": "abc1234"},
                                                    "a.log": 0}, "a.json listed twice"),
])
def test_a_manifest_that_disagrees_with_its_directory_is_caught(tmp_path, entries, files, problem):
    assert manifest_problems(_directory(tmp_path / "bad", entries, files)) != []
    assert any(problem in p for p in manifest_problems(tmp_path / "bad"))
    good = _directory(tmp_path / "good", {"a": GOOD}, {"a.json": {"command": "python a.py", "commit": "abc1234"},
                                                        "a.log": 0})
    assert manifest_problems(good) == []
