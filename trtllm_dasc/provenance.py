"""What a result records about where it came from: the commit of the checkout that produced it, and the rule
that a result kept in the repository (benchmarks/results/) names a clean commit."""
from __future__ import annotations

import os
import re
import subprocess

# a bare hash: no "+uncommitted changes", no "dirty" (tests/test_results_manifest.py checks the same)
CLEAN = re.compile(r"[0-9a-f]{7,40}")
# the repository's results: a result written here must name a clean commit; anywhere else (/tmp, a device
# machine's $OUT, whose commit comes in with --commit) stays free
RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results")


def git_commit(path: str | None = None) -> str | None:
    """HEAD of the repository holding ``path`` (default: this package's), marked "+uncommitted changes"
    when tracked files differ from it; None outside a git checkout."""
    cwd = path or os.path.dirname(os.path.abspath(__file__))

    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd).stdout.strip()
        except OSError:           # no git on this machine
            return ""
    commit = git("rev-parse", "HEAD") or None
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+uncommitted changes"
    return commit


def is_clean(commit) -> bool:
    return isinstance(commit, str) and CLEAN.fullmatch(commit) is not None


def commits_of(doc) -> list:
    """Every non-empty value of a 'commit' key anywhere in a result (a merge's runs, a cells run's calls)."""
    if isinstance(doc, dict):
        return [v for k, v in doc.items() if k == "commit" and v] + [c for v in doc.values() for c in commits_of(v)]
    if isinstance(doc, list):
        return [c for v in doc for c in commits_of(v)]
    return []


def in_results(path: str) -> bool:
    root = os.path.realpath(RESULTS_DIR)
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def check_results_commit(path: str, result) -> None:
    """Refuse (UserError, one line) to write ``result`` (a result dict, or the commit it will record) to
    ``path`` inside the repository's benchmarks/results/ unless it names a commit and every commit it names
    is clean. Writers call it before they write; a long run calls it first too, so it is refused up front."""
    if not in_results(path):
        return
    commits = commits_of(result if isinstance(result, (dict, list)) else {"commit": result})
    bad = [c for c in commits if not is_clean(c)]
    if bad or not commits:
        from trtllm_dasc.errors import UserError
        raise UserError(f"refusing to write {path}: benchmarks/results/ keeps results of a clean commit, and this "
                        f"one records {', '.join(map(repr, bad)) if bad else 'no commit'}; commit first (or pass "
                        "--commit SHA of the clean tree it ran at), or write it outside benchmarks/results/")
