"""--paper runs the server at a batch of 96 (its concurrency) and checkpoints prompt ends only (the paper's SGLang keeps a recurrent state only where a prefill ends),
--branch-checkpoints opts out, the setting reaches dasc-build and the manifest (so cells of the two never
merge) and the result says which it was."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.matched_hbm import add_arguments, check, engine_flags, main, result_of
from trtllm_dasc.cli import _Parser

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "trtllm_dasc" / "assets" / "tiny-kimi-linear")
PLAN = ["--model", MODEL, "--arms", "dense,nr16", "--scale", "0.03", "--prompts", "600", "--device", "cpu",
        "--dtype", "float32", "--max-batch-size", "4", "--plan-only"]


def _args(*flags):
    p = _Parser(prog="matched_hbm")
    add_arguments(p)
    args = p.parse_args(["--model", MODEL, *flags])
    check(args)
    return args


@pytest.mark.parametrize("flags,prompt_only", [(["--paper"], True), (["--paper", "--branch-checkpoints"], False),
                                               (["--dense-slots", "3"], False),
                                               (["--dense-slots", "3", "--prompt-only"], True)])
def test_paper_implies_prompt_only_and_a_given_flag_wins(flags, prompt_only):
    args = _args(*flags)
    assert args.prompt_only is prompt_only
    assert ("--prompt-only" in engine_flags(args, _Work(), [_Phase()], 1)) is prompt_only


@pytest.mark.parametrize("flags,batch", [(["--paper"], 96), (["--paper", "--max-batch-size", "32"], 32),
                                         (["--dense-slots", "3"], 8), (["--dense-slots", "3", "--max-batch-size", "4"], 4)])
def test_paper_serves_its_96_concurrent_requests_in_one_batch_and_a_given_flag_wins(flags, batch):
    # a server batch below the concurrency would queue the paper's requests inside the server, timed as TTFT
    args = _args(*flags)
    assert args.max_batch_size == batch
    built = [str(f) for f in engine_flags(args, _Work(), [_Phase()], 1)]
    assert built[built.index("--max-batch-size") + 1] == str(batch)


class _Work:
    max_prompt_tokens = 100


class _Phase:
    q, arms = 10, ["dense"]


def test_both_settings_at_once_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main([*PLAN, "--paper", "--prompt-only", "--branch-checkpoints"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--branch-checkpoints" in err[0]


def test_the_two_settings_are_two_manifests(capsys):
    ids = []
    for extra in ([], ["--branch-checkpoints"]):
        assert main([*PLAN, "--paper", *extra]) == 0
        ids.append(json.loads(capsys.readouterr().out)["manifest_id"])
    assert ids[0] != ids[1]


@pytest.mark.parametrize("flags,said", [(["--prompt-only"], "prompt ends"), ([], "prompt ends and branch points")])
def test_the_result_says_which(flags, said):
    manifest = {"id": "x", "units": [], "arms": [], "block_selection": "all", "phases": [], "protocol": "p",
                "config": {"build_flags": ["--kv-blocks", "9", *flags]}}
    assert result_of(manifest, [], [], {"command": "c", "commit": "abc"})["checkpoints"] == said
