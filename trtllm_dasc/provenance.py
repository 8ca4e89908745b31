"""What a result records about where it came from: the commit of the checkout that produced it."""
from __future__ import annotations

import os
import subprocess


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
