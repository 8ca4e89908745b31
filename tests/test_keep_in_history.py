"""scripts/keep_in_history.sh: a kept file comes back byte for byte from the commit the index names, the tree
afterwards holds no kept/ at all, and bad input (a dirty tree, a missing file, a path out of kept/) is refused
before any commit. Runs the script in a scratch git repository."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "keep_in_history.sh"


def _git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True).stdout.decode()


def _repo(tmp_path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "README.md").write_text("x\n")
    _git(repo, "add", "README.md")
    _git(repo, "commit", "-qm", "start")
    return repo


def _keep(repo, *args):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)


def test_a_kept_file_comes_back_from_the_indexed_commit_and_leaves_the_tree(tmp_path):
    repo = _repo(tmp_path)
    data = os.urandom(3000)
    (tmp_path / "stage.pt").write_bytes(data)
    start = _git(repo, "rev-parse", "HEAD").strip()
    proc = _keep(repo, "kda stage", f"{tmp_path / 'stage.pt'}:stages/kda_stage.pt")
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in (repo / "docs" / "kept_in_history.md").read_text().splitlines()
            if "kept/stages/kda_stage.pt" in line]
    assert len(rows) == 1
    sha = rows[0].split("|")[1].strip()
    back = subprocess.run(["git", "show", f"{sha}:kept/stages/kda_stage.pt"], cwd=repo, capture_output=True).stdout
    assert back == data
    assert "kept/" not in _git(repo, "ls-tree", "-r", "--name-only", "HEAD")
    assert not (repo / "kept").exists()
    assert _git(repo, "rev-list", "--count", f"{start}..HEAD").strip() == "2"
    assert _git(repo, "status", "--porcelain") == ""


def test_bad_input_is_refused_before_any_commit_and_leaves_the_tree_clean(tmp_path):
    repo = _repo(tmp_path)
    ok = tmp_path / "f.bin"
    ok.write_bytes(b"1234")
    head = _git(repo, "rev-parse", "HEAD")
    for args in (["m"], ["m", "nocolon"], ["m", f"{tmp_path / 'missing'}:a"], ["m", f"{ok}:../a"],
                 ["m", f"{ok}:/abs"], ["m", f"{ok}:./a"], ["m", f"{ok}:d//a"], ["m", f"{ok}:d/"], ["m", f"{ok}:a*"],
                 ["a | b", f"{ok}:a"], ["two\nlines", f"{ok}:a"],
                 # a good pair before a bad one: nothing of the good one may be left staged
                 ["m", f"{ok}:good.bin", f"{tmp_path / 'missing'}:b"]):
        proc = _keep(repo, *args)
        assert proc.returncode == 2 and proc.stdout.strip(), (args, proc.stdout, proc.stderr)
        assert _git(repo, "status", "--porcelain") == "" and not (repo / "kept").exists(), args
    (repo / "README.md").write_text("changed\n")
    proc = _keep(repo, "m", f"{tmp_path / 'f.bin'}:a.bin")
    assert proc.returncode == 2 and "uncommitted" in proc.stdout
    assert _git(repo, "rev-parse", "HEAD") == head


def test_a_failure_between_the_two_commits_puts_the_branch_back(tmp_path):
    repo = _repo(tmp_path)
    (tmp_path / "f.bin").write_bytes(b"abcd")
    head = _git(repo, "rev-parse", "HEAD")
    hook = repo / ".git" / "hooks" / "pre-commit"     # refuses the second commit (the one with the index)
    hook.write_text("#!/bin/sh\ngit diff --cached --name-only | grep -q kept_in_history && exit 1\nexit 0\n")
    hook.chmod(0o755)
    proc = _keep(repo, "m", f"{tmp_path / 'f.bin'}:a.bin")
    assert proc.returncode != 0 and "failed" in proc.stdout
    assert "kept: git show" not in proc.stdout
    assert _git(repo, "rev-parse", "HEAD") == head
    assert _git(repo, "status", "--porcelain") == "" and not (repo / "kept").exists()
