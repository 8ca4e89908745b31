"""The MoE layers against transformers' own blocks (Qwen3NextSparseMoeBlock, KimiLinearMoE) on tiny configs
with many experts: routing to the bit (expert ids and weights), outputs on the per-expert loop and on the
fused Triton kernels (Triton's interpreter on the CPU). Then the fused experts (model/moe) against the loop
(naive.py) at awkward shapes: empty experts, T=1, T not a multiple of BLOCK_M, top_k=1, TP-split channels,
with the kernels' buffers NaN-poisoned; and align.py's buffers against a brute-force recount."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from moe_helpers import assert_close, hf_block, ours, random_experts, random_routing  # noqa: E402

from trtllm_dasc.model import moe  # noqa: E402
from trtllm_dasc.model.moe import align, kernel, small  # noqa: E402

# these fp32 comparisons run the kernels on CPU tensors in Triton's interpreter: on a GPU machine without
# it, triton's launcher refuses CPU tensors, and on the GPU the grouped path's fp32 tl.dot would take tf32
# (rounding far above these tolerances). The fused paths on the GPU: tests/model/test_moe_gpu.py (bf16)
ON_GPU_LAUNCHER = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
interpreter_only = pytest.mark.skipif(ON_GPU_LAUNCHER, reason="fp32 kernel checks on CPU tensors in Triton's "
                                      "interpreter; on a GPU: tests/model/test_moe_gpu.py")


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer the fused kernels allocate starts as NaN: a row they fail to write shows."""
    for mod in (kernel, small):
        monkeypatch.setattr(mod, "_buffer", lambda shape, dtype, device: torch.full(shape, float("nan"),
                                                                                    dtype=dtype, device=device))


# ---- routing and the layer against transformers --------------------------------------------------------
@pytest.mark.parametrize("arch, groups", [("gdn", (1, 1)), ("kda", (4, 2)), ("kda", (8, 3))],
                         ids=["qwen-E64-K8", "kimi-E64-K8-G4-TG2", "kimi-E64-K8-G8-TG3"])
def test_routing_equals_transformers(arch, groups):
    block, cfg = hf_block(arch, seed=1, n_group=groups[0], topk_group=groups[1])
    layer = ours(arch, block, cfg)
    x = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, ref_w, ref_idx = block.gate(x)
        w, idx = layer.route(x)
    # the same ops in the same order: ids in the same slots, weights to the bit
    assert_close("expert ids", ref_idx, idx)
    assert_close("routing weights", ref_w, w)
    if arch == "kda":
        # the grouped top-k really restricts: every token's experts lie in at most topk_group groups
        per_group = cfg.num_local_experts // groups[0]
        assert max(len(set((r // per_group).tolist())) for r in idx) <= groups[1]


@pytest.mark.parametrize("arch", ["gdn", "kda"], ids=["qwen", "kimi"])
@pytest.mark.parametrize("backend, T", [("loop", 40), ("triton", 7)], ids=["loop-T40", "triton-T7"])
def test_layer_equals_transformers(arch, backend, T, poisoned, wide_small_tiles):
    if backend == "triton" and ON_GPU_LAUNCHER:
        pytest.skip("fp32 kernel checks on CPU tensors in Triton's interpreter; on a GPU: test_moe_gpu.py")
    block, cfg = hf_block(arch, seed=3)
    layer = ours(arch, block, cfg)
    layer.backend = backend
    x = torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = block(x[None])[0]
        got = layer.forward(x)
    assert_close(f"{arch} {backend}", ref, got, ratio=1e-5)


def test_layer_bf16_loop_follows_transformers_bf16():
    # the CPU path in bf16 rounds where transformers' block does (Triton's interpreter has no bf16 dot:
    # the fused kernels' bf16 runs are the GPU tests')
    block, cfg = hf_block("gdn", seed=5)
    layer = ours("gdn", block, cfg, torch.bfloat16)
    x = torch.randn(30, cfg.hidden_size, generator=torch.Generator().manual_seed(6)).bfloat16()
    with torch.no_grad():
        ref = block.to(torch.bfloat16)(x[None])[0]
        got = layer.forward(x)
    assert_close("qwen bf16", ref, got, ratio=1e-2)



# ---- the fused router (moe/route_kernel.py) against the layers' torch route() -----------------------------
@pytest.mark.parametrize("arch, groups", [("gdn", (1, 1)), ("kda", (4, 2)), ("kda", (8, 3))],
                         ids=["qwen-E64-K8", "kimi-E64-K8-G4-TG2", "kimi-E64-K8-G8-TG3"])
@interpreter_only
def test_route_kernel_equals_route(arch, groups):
    from trtllm_dasc.model.moe import route_kernel as rk
    from trtllm_dasc.model.ops import linear
    block, cfg = hf_block(arch, seed=1, n_group=groups[0], topk_group=groups[1])
    layer = ours(arch, block, cfg)
    s, E = layer.spec, layer.spec.num_experts
    T = 12
    x = torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref_w, ref_idx = layer.route(x)
        if arch == "kda":
            idx, w = rk.route(linear(x.float(), layer.w["router"]), rk.KIMI, s.top_k, s.n_group, s.topk_group,
                              s.norm_topk_prob, s.routed_scaling_factor, layer.w["bias"], shared=1)
            gate = torch.ones(T, 1)
        else:
            idx, w = rk.route(linear(x, layer.router_all), rk.QWEN, s.top_k, norm=s.norm_topk_prob, shared=2,
                              weight_dtype=x.dtype)
            gate = torch.sigmoid(linear(x, layer.w["shared_gate"]))
    k = s.top_k
    # the same experts (the kernel lists them best first, Kimi's reference unsorted), their weights within
    # a few ulps (Triton's exp and the renormalising sum's order), the shared expert last as expert E
    ref_sorted, ref_pos = ref_idx.sort(1)
    got_sorted, got_pos = idx[:, :k].long().sort(1)
    assert torch.equal(ref_sorted, got_sorted), "expert ids"
    assert_close("routing weights", ref_w.gather(1, ref_pos), w[:, :k].gather(1, got_pos), ratio=1e-6)
    assert torch.equal(idx[:, k], torch.full((T,), E, dtype=torch.int32))
    assert_close("shared weight", gate[:, 0], w[:, k], ratio=1e-6)


@interpreter_only
@pytest.mark.parametrize("arch", ["gdn", "kda"], ids=["qwen", "kimi"])
@pytest.mark.parametrize("T", [1, 7, 9], ids=["one-token-T1", "small-T7", "grouped-T9"])
def test_fused_layer_with_the_shared_expert_folded(arch, T, poisoned, wide_small_tiles):
    # a shared expert as wide as the routed ones is stored as expert E: on the small path (T * top_k <= 64)
    # the kernels run it with the routed ones; on the grouped path it runs beside them
    block, cfg = hf_block(arch, seed=3, qwen_shared=1)
    layer = ours(arch, block, cfg)
    assert layer.gate_up_all is not None and layer.gate_up_all.shape[0] == layer.spec.num_experts + 1
    assert layer.w["shared"].gate_up.data_ptr() == layer.gate_up_all[-1].data_ptr()
    layer.backend = "triton"
    x = torch.randn(T, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = block(x[None])[0]
        got = layer.forward(x)
    assert_close(f"{arch} T{T}", ref, got, ratio=1e-5)


@pytest.fixture
def wide_small_tiles(monkeypatch):
    """small.py's GEMVs with 16-channel tiles: the interpreter's time grows with the programs, and the
    default 2- and 4-channel tiles make many (the default tiles run in the T=1 and top_k=1 cases)."""
    monkeypatch.setattr(small, "config", lambda T, k, inter, D: {"gate_up": (16, 16, 4), "down": (16, 32, 4)})


# ---- the fused experts against the loop ----------------------------------------------------------------
CASES = {  # T, top_k, E, D, I, experts in use
    "T13-K3-E8-D40-I24": (13, 3, 8, 40, 24, 8),
    "T1-K4-E8-D40-I24": (1, 4, 8, 40, 24, 8),
    "T20-K2-E8-D24-I40-used3": (20, 2, 8, 24, 40, 3),       # 5 empty experts, 13 rows per block of 16
    "T9-K1-E6-D32-I16": (9, 1, 6, 32, 16, 6),
    "T37-K2-E4-D16-I72": (37, 2, 4, 16, 72, 4),             # several blocks per expert, I over BLOCK_N
}


@interpreter_only
@pytest.mark.parametrize("path", ["triton_grouped", "triton_small"], ids=["grouped", "small"])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_experts_equal_loop(case, path, poisoned, request):
    # both fused paths at every shape, whatever moe.experts would pick for it
    T, k, E, D, inter, used = CASES[case]
    if path == "triton_small" and T * k > small.SMALL_PAIRS:
        pytest.skip("past the small path's pairs (moe.experts takes the grouped one)")
    if path == "triton_small" and T * k > 16:
        request.getfixturevalue("wide_small_tiles")
    idx, w = random_routing(T, k, E, seed=T, used=used)
    gate_up, down = random_experts(E, D, inter, seed=T + 1)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(T + 2))
    ref = moe.experts(x, idx, w, gate_up, down, backend="loop")
    assert_close(case, ref, moe.experts(x, idx, w, gate_up, down, backend=path), ratio=1e-5)


@interpreter_only
def test_small_path_other_tiles_and_int32_ids(poisoned):
    # tiles that divide neither I nor D (clamped columns, masked tails of K), more warps; int32 expert ids
    # and routing weights in a non-contiguous view (the kernels read their own flat copies)
    T, k, E, D, inter = 3, 5, 7, 40, 24
    idx, w = random_routing(T, k, E, seed=21)
    gate_up, down = random_experts(E, D, inter, seed=22)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(23))
    wt = torch.stack([w, w], dim=-1)[..., 0]
    assert torch.equal(wt, w) and not wt.is_contiguous()
    cfg = {"gate_up": (16, 16, 2), "down": (16, 16, 8)}
    assert_close("small tiles", moe.experts(x, idx, w, gate_up, down, backend="loop"),
                 small.experts_small(x, idx.int(), wt, gate_up, down, cfg), ratio=1e-5)


@interpreter_only
@pytest.mark.parametrize("k", [1, 8])
def test_dispatch_by_pairs(k, monkeypatch, wide_small_tiles):
    # backend "triton" takes the GEMV path up to SMALL_PAIRS (token, slot) pairs and the grouped GEMMs past
    # it; both produce the loop's result at the boundary
    calls = []
    for mod, name in ((small, "experts_small"), (kernel, "experts_triton")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _n=name, **kw: calls.append(_n) or _real(*a, **kw))
    E, D, inter = 16, 16, 8
    gate_up, down = random_experts(E, D, inter, seed=30)
    for T, want in ((1, "experts_small"), (small.SMALL_PAIRS // k, "experts_small"),
                    (small.SMALL_PAIRS // k + 1, "experts_triton")):
        idx, w = random_routing(T, k, E, seed=T)
        x = torch.randn(T, D, generator=torch.Generator().manual_seed(31))
        got = moe.experts(x, idx, w, gate_up, down, backend="triton")
        assert calls[-1] == want, (T, k, calls)
        assert_close(f"T{T} k{k}", moe.experts(x, idx, w, gate_up, down, backend="loop"), got, ratio=1e-5)


@interpreter_only
def test_triton_experts_other_tiles(poisoned):
    # a 32-row block and narrow K / N tiles: masks on every edge, more blocks past num_post_padded
    T, k, E, D, inter = 11, 2, 5, 40, 24
    idx, w = random_routing(T, k, E, seed=7)
    gate_up, down = random_experts(E, D, inter, seed=8)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(9))
    cfg = dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1)
    ref = moe.experts(x, idx, w, gate_up, down, backend="loop")
    assert_close("tiles", ref, kernel.experts_triton(x, idx, w, gate_up, down, cfg), ratio=1e-5)
    # the down GEMM on tiles of its own (the sweep's split configs)
    cfg["down"] = dict(BLOCK_N=32, BLOCK_K=8, num_warps=2)
    assert_close("down tiles", ref, kernel.experts_triton(x, idx, w, gate_up, down, cfg), ratio=1e-5)


@interpreter_only
@pytest.mark.parametrize("path", ["triton_grouped", "triton_small"], ids=["grouped", "small"])
def test_triton_experts_tp_split_channels_sum_to_whole(path, poisoned, wide_small_tiles):
    # TP2: each rank holds half of every expert's intermediate channels (gate and up rows, down columns, as
    # mlp._load_experts cuts them); the ranks' partial outputs add up to the whole layer's
    T, k, E, D, inter = 10, 2, 6, 24, 32
    idx, w = random_routing(T, k, E, seed=10)
    gate_up, down = random_experts(E, D, inter, seed=11)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(12))
    whole = moe.experts(x, idx, w, gate_up, down, backend="loop")
    parts = []
    for ch in (torch.arange(0, inter // 2), torch.arange(inter // 2, inter)):
        gu = torch.cat([gate_up[:, ch], gate_up[:, inter + ch]], dim=1)
        parts.append(moe.experts(x, idx, w, gu.contiguous(), down[:, :, ch].contiguous(), backend=path))
    assert_close("tp2 sum", whole, parts[0] + parts[1], ratio=1e-5)


@pytest.mark.parametrize("path", ["triton", "triton_grouped", "triton_small"])
def test_no_tokens(path):
    x = torch.zeros(0, 8)
    idx, w = random_routing(0, 2, 4, seed=0)
    out = moe.experts(x, idx, w, *random_experts(4, 8, 8, seed=0), backend=path)
    assert out.shape == (0, 8)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch without _grouped_mm")
def test_grouped_mm_arm_equals_loop():
    # torch's grouped GEMM on the CPU (its fallback; the GPU arm is sm90 CUTLASS), bf16 as on the GPU
    T, k, E, D, inter = 19, 3, 8, 32, 16
    idx, w = random_routing(T, k, E, seed=13, used=6)
    gate_up, down = random_experts(E, D, inter, seed=14)
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(15))
    ref = moe.experts(x, idx, w, gate_up, down, backend="loop")
    try:
        got = moe.experts(x.bfloat16(), idx, w, gate_up.bfloat16(), down.bfloat16(), backend="grouped_mm")
    except RuntimeError as e:                       # a torch whose _grouped_mm has no CPU path
        pytest.skip(f"torch._grouped_mm on the CPU: {e}")
    assert_close("grouped_mm", ref, got.float(), ratio=2e-2)


# ---- the alignment ------------------------------------------------------------------------------------
@pytest.mark.parametrize("T, k, E, bm, used", [(13, 3, 8, 16, 8), (1, 8, 64, 16, 64), (50, 2, 8, 4, 3)],
                         ids=["T13-K3-E8-BM16", "T1-K8-E64-BM16", "T50-K2-E8-BM4-used3"])
def test_align_against_recount(T, k, E, bm, used):
    idx, _ = random_routing(T, k, E, seed=T, used=used)
    sorted_ids, block_expert, num_post, counts = align.moe_align(idx, E, bm)
    nb = align.max_blocks(T, k, E, bm)
    assert sorted_ids.shape == (nb * bm,) and block_expert.shape == (nb,) and num_post.shape == (1,)
    # brute force: expert by expert, its row ids in order, padded with T*k to a multiple of bm
    flat, want, want_blocks = idx.reshape(-1).tolist(), [], []
    for e in range(E):
        rows = [r for r, ee in enumerate(flat) if ee == e]
        pad = -len(rows) % bm
        want += rows + [T * k] * pad
        want_blocks += [e] * ((len(rows) + pad) // bm)
    assert counts.tolist() == [flat.count(e) for e in range(E)]
    assert num_post.item() == len(want)
    assert sorted_ids[:len(want)].tolist() == want
    assert sorted_ids[len(want):].eq(T * k).all()
    assert block_expert.tolist() == want_blocks + [E] * (nb - len(want_blocks))


@pytest.mark.parametrize("top_k, E, max_tokens", [(8, 256, 8192), (10, 512, 8192), (8, 64, 100), (2, 8, 3000)])
def test_warm_token_counts_reach_every_tile_config(top_k, E, max_tokens):
    # brute force: every (tile config, parity of T * top_k / 8) a grouped-path step up to max_tokens can
    # take is taken by one of the warm-up's token counts (model.warm_moe runs them before ready)
    def kind(T):
        return tuple(sorted(kernel.config(T, top_k, E).items())), (T * top_k) % 16 == 0
    first = small.SMALL_PAIRS // top_k + 1
    reachable = {kind(T) for T in range(first, max_tokens + 1)}
    counts = kernel.warm_token_counts(top_k, E, max_tokens, small.SMALL_PAIRS)
    assert all(first <= T <= max_tokens for T in counts)
    assert {kind(T) for T in counts} == reachable
