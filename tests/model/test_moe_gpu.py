"""The fused MoE paths on a GPU at the released models' shapes (random bf16 weights): against the
per-expert loop, without a host synchronisation, and inside a CUDA graph."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from moe_helpers import assert_close  # noqa: E402


@pytest.fixture(scope="module")
def layers():
    from benchmarks import moe_layer
    return {k: moe_layer.build_layer(torch, v, torch.bfloat16, "cuda", seed=3) for k, v in moe_layer.MODELS.items()}


def _arms(T: int = 1):
    """"triton" (the path its dispatch picks), both of its paths forced (the small one where the benchmark
    times it), and torch's grouped GEMM where it runs."""
    from trtllm_dasc.model.moe import grouped_mm
    return (["triton", "triton_grouped"] + (["triton_small"] if T <= 64 else [])
            + (["grouped_mm"] if grouped_mm.available("cuda", torch.bfloat16) else []))


@pytest.mark.parametrize("key", ["kimi", "qwen"])
@pytest.mark.parametrize("T", [1, 64, 1000])
def test_fused_equals_loop_at_real_shapes(layers, key, T):
    layer = layers[key]
    x = torch.randn(T, layer.w["gate_up"].shape[2], device="cuda", generator=torch.Generator("cuda").manual_seed(T))
    x = x.bfloat16()
    with torch.no_grad():
        layer.backend = "loop"
        ref = layer.forward(x, True)
        for arm in _arms(T):
            layer.backend = arm
            assert_close(f"{key} T{T} {arm}", ref, layer.forward(x, True), ratio=1e-2)
        layer.backend = None


@pytest.mark.parametrize("key", ["kimi", "qwen"])
@pytest.mark.parametrize("T", [1, 37, 512])
def test_fused_forward_does_not_synchronise(layers, key, T):
    layer = layers[key]
    x = torch.randn(T, layer.w["gate_up"].shape[2], device="cuda").bfloat16()
    with torch.no_grad():
        for arm in _arms(T):
            layer.backend = arm
            layer.forward(x, True)                     # JIT outside the checked call
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                layer.forward(x, True)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        layer.backend = None
    assert layer.capturable


@pytest.mark.parametrize("path", ["triton", "triton_small", "triton_grouped"])
@pytest.mark.parametrize("key", ["kimi", "qwen"])
def test_fused_layer_replays_in_a_cuda_graph(layers, key, path):
    from benchmarks import moe_layer
    from benchmarks.copy_bandwidth import device_ms  # noqa: F401  (the benchmark's timer; imported as it imports it)
    layer = layers[key]
    layer.backend = path
    x = torch.randn(8, layer.w["gate_up"].shape[2], device="cuda").bfloat16()
    with torch.no_grad():
        got = moe_layer.graph_check(torch, layer, x, True, lambda fn: 0.0)
    layer.backend = None
    assert got["equal_to_eager"], got

