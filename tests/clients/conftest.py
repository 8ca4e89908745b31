"""Setup shared by the client tests: each distinct engine is built once per session.

The protocol tests run the benchmark drivers several times (an unsplit run, the calls of a split one, another
transport, another test module with the same arms), and every call runs dasc-build for each of its arms: up
to 13 builds of 4 distinct engines, ~8 s each on a 2-core CPU. dasc-build's output is a function of its
command (model, arm, budget, flags), so the first build of a command runs the real dasc-build (a subprocess,
as in a user's call) and later calls with the same command get a copy of that engine directory. Servers,
requests and everything measured still run for real in every call.
"""
from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session", autouse=True)
def engines_built_once(tmp_path_factory):
    from clients import arms
    real = arms.build_engine
    root = tmp_path_factory.mktemp("engines")
    built: dict[tuple, str] = {}

    def build_engine(model, arm, out, budget, flags):
        key = (os.path.abspath(model), arm.spec, tuple(arm.build_flags()), int(budget), tuple(map(str, flags)))
        if key not in built:
            built[key] = real(model, arm, str(root / str(len(built))), budget, flags)
        # dasc-build --force: the output directory is replaced; a copy, so no call sees another's changes
        # (share_kernels turns the copy's kernels directory into a link to the call's cache)
        if os.path.lexists(out):
            shutil.rmtree(out)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        shutil.copytree(built[key], out, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(arms, "build_engine", build_engine)
    yield built
    mp.undo()
