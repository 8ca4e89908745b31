"""Dummy weights at TP over real MPI ranks (dasc-build --load-format dummy, issue 32 item 2): every rank makes
its own shard of the weights at load time from the engine's seed, and those shards must be the slices of
the one model the seed defines. Checked end to end: a TP2 engine over two mpirun ranks gives the in-process
TP1 engine's tokens, context logits and cache hits on the same dummy engine (a tiny MoE Kimi-Linear: the
routed experts' channels split across the ranks, the MLA heads too)."""
from __future__ import annotations

import json

import pytest
import torch

from engine_helpers import one_torch_thread
from tp_helpers import have_mpi, run_job

import tp_job

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=f"no MPI here: {have_mpi()}")

_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)


@pytest.fixture(scope="module")
def dummy_model(tmp_path_factory):
    from build_scripts.dasc_build import main as dasc_build
    from trtllm_dasc.plan.synthetic import tiny_moe_config
    root = tmp_path_factory.mktemp("tp-dummy")
    (root / "cfg").mkdir()
    (root / "cfg" / "config.json").write_text(json.dumps(tiny_moe_config("kda")))
    assert dasc_build(["--model", str(root / "cfg"), "--output", str(root / "engine"), "--load-format", "dummy",
                       "--device", "cpu", "--dtype", "float32", "--seed", "3"]) == 0
    # the engine's model directory: a config and the dummy record (seed), no weights
    return str(root / "engine" / "model")


def test_tp2_dummy_shards_are_slices_of_the_tp1_dummy_model(dummy_model, tmp_path):
    from trtllm_dasc.engine.engine import Engine
    args = tp_job.parser().parse_args(["--model", dummy_model, "--out", "-"])
    want = tp_job.job(Engine(tp_job.engine_config(args)))
    got = run_job(2, ["--model", dummy_model, "--tp", "2"], tmp_path / "tp2.json")
    for phase in ("cold", "hot", "sampled"):
        for i, (g, w) in enumerate(zip(got[phase], want[phase])):
            assert g["tokens"] == w["tokens"] and g["error"] is None, (phase, i)
            assert g["cached"] == w["cached"], (phase, i)
    for i, (g, w) in enumerate(zip(got["cold"], want["cold"])):
        a, b = torch.tensor(g["logits"]), torch.tensor(w["logits"])
        # the ranks' partial sums are all-reduced in another order than TP1's one matmul
        assert (a - b).abs().max().item() <= 1e-4 * b.abs().max().item(), f"prompt {i}"
    # the hot prompts hit the checkpoints the cold ones stored, on every rank's share
    assert all(h["cached"] > 0 for h in got["hot"])
