"""Every option of `dasc` (each subcommand) and `dasc-build` is described in its --help: argparse leaves
out an argument group made inside another group (dasc serve's build options were missing from its help),
and an option added without help= shows no text (the ports, the dtypes)."""
from __future__ import annotations

import argparse
import importlib

import pytest

from trtllm_dasc.cli import SUBCOMMANDS, _Parser


def _parser(name: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"dasc {name}")
    importlib.import_module(SUBCOMMANDS[name][0]).add_arguments(p)
    return p


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_option_is_in_help_with_text(name):
    p = _parser(name)
    text = p.format_help()
    body = text.split("\n\n", 1)[1]            # past the usage block, which names every option either way
    for action in p._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        flag = action.option_strings[-1]
        assert f"  {flag}" in body or f", {flag}" in body, f"dasc {name} --help does not describe {flag}"
        assert action.help, f"dasc {name}: {flag} has no help text"


def test_serve_help_describes_build_options():
    text = _parser("serve").format_help()
    for flag in ("--wmax", "--policy", "--codec", "--state-budget-bytes", "--device", "--max-batch-size"):
        assert f"\n  {flag}" in text, flag
    assert "(default 8000)" in text


@pytest.mark.parametrize("name", ["plan", "build", "logits", "serve"])
def test_precision_help_names_the_real_default(name):
    p = _parser(name)
    for action in p._actions:
        if "--precision" in action.option_strings:
            # the default is uniform; "default horizon = ..." read as if horizon were the default
            assert f"default {action.default}" in action.help, action.help


def test_matched_hbm_options_have_help():
    import clients.matched_hbm as mh
    p = argparse.ArgumentParser(prog="python -m clients.matched_hbm")
    mh.add_arguments(p)
    for action in p._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, f"clients.matched_hbm: {action.option_strings[-1]} has no help text"


def test_evals_run_options_have_help():
    from trtllm_dasc.evals.run import _parser as evals_parser
    for action in evals_parser()._actions:
        if action.option_strings and action.help != argparse.SUPPRESS:
            assert action.help, f"trtllm_dasc.evals.run: {action.option_strings[-1]} has no help text"
