"""Bad options of `python -m clients.matched_hbm`: one line on stderr naming the option, exit code 2, and
nothing built or started."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
MODEL = os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear")
GOOD = ["--model", MODEL, "--dense-slots", "4"]

CASES = {
    "unknown arm": (["--arms", "dense,xx16"], "--arms"),
    "arm twice": (["--arms", "dense,nr16,nr16"], "--arms"),
    "no arm": (["--arms", ","], "--arms"),
    "empty arms": (["--arms", ""], "--arms"),
    "no phase arm": (["--phase-arms", ","], "--phase-arms"),
    "dasc with W 0": (["--arms", "nr0"], "--arms"),
    "no budget": (["--model", MODEL], "--state-budget-bytes"),
    "two budgets": (["--state-budget-bytes", "100000"], "--state-budget-bytes"),
    "not a checkpoint": (["--model", ROOT], "--model"),
    "bad seeds": (["--seeds", "42,x"], "--seeds"),
    "repeated seeds": (["--seeds", "42,42"], "seeds"),
    # numpy's seeded generators take no negative seed: a request-order seed failed after the server was up
    "negative seed": (["--seeds", "42,-1"], "--seeds"),
    "negative workload seed": (["--workload-seed", "-1"], "--workload-seed"),
    "negative block seed": (["--blocks-per-phase", "1", "--block-seed", "-2"], "--block-seed"),
    "zero concurrency": (["--concurrency", "0"], "--concurrency"),
    # nan compares false with everything: "<= 0" let it through, and every request would have had no deadline
    "nan request timeout": (["--request-timeout", "nan"], "--request-timeout"),
    "nan ready timeout": (["--ready-timeout", "nan"], "--ready-timeout"),
    "zero dense slots": (["--dense-slots", "0"], "--dense-slots"),
    "zero scale": (["--scale", "0"], "scale"),
    "fill above 1": (["--target-fill", "1.5"], "target fill"),
    "in-process arm not run": (["--inprocess", "wr16"], "--inprocess"),
    "too few prompts": (["--prompts", "10"], "prompts"),
    "non-integer flag": (["--concurrency", "many"], "--concurrency"),
    "dummy weights over real ones": (["--load-format", "dummy"], "--load-format dummy"),
    "bare config without dummy": (["--model", os.path.join(MODEL, "config.json")], "--load-format dummy"),
    "weights seed without dummy": (["--seed", "3"], "--load-format dummy"),
    "bad load format": (["--load-format", "gguf"], "--load-format"),
    # clients/kv_sizing.py's check, shared with benchmarks serve_wr_fixed_slots (tests/clients/test_wr_fixed_slots.py)
    "memory limit not bytes": (["--memory-limit-bytes", "lots"], "--memory-limit-bytes must be a number of bytes"),
    "memory limit zero": (["--memory-limit-bytes", "0"], "--memory-limit-bytes must be >= 1"),
    "negative headroom": (["--memory-headroom-gib", "-1"], "--memory-headroom-gib must be >= 0"),
    # clients/runner.py's estimate flags, shared with benchmarks serve_wr_fixed_slots
    "zero request estimate": (["--request-estimate-s", "0"], "--request-estimate-s"),
    "ready estimate not seconds": (["--ready-estimate-s", "soon"], "--ready-estimate-s"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_option_is_one_line_and_exit_2(name, tmp_path):
    flags, needle = CASES[name]
    argv = flags if name in ("no budget",) else GOOD + flags
    if name == "not a checkpoint":
        argv = ["--dense-slots", "4", *flags]
    proc = subprocess.run([sys.executable, "-m", "clients.matched_hbm", *argv, "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("matched_hbm: error:") and needle in lines[0], proc.stderr
    assert proc.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--out", "--cells-dir", "--json"])
def test_unwritable_output_is_one_line_before_anything_runs(flag, tmp_path):
    # a path under a regular file cannot be created (root ignores permission bits; this holds for everyone)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    bad = str(blocker / ("r.json" if flag == "--json" else "d"))
    argv = [*GOOD, "--arms", "dense", "--scale", "0.03", "--blocks-per-phase", "1", "--seeds", "42",
            "--device", "cpu", "--out", bad if flag == "--out" else str(tmp_path / "out"), *([flag, bad] if flag != "--out" else [])]
    proc = subprocess.run([sys.executable, "-m", "clients.matched_hbm", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("matched_hbm: error:") and flag in lines[0], proc.stderr
    # refused before the engines: nothing built
    assert not (tmp_path / "out" / "engines").exists()
