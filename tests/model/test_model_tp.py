"""TP bundle slicing: permuted TP=1 is exact reindexing; the ranks' row-parallel partials of a linear layer
sum to transformers' layer output; per-rank shapes and states line up with the bundle positions."""
from __future__ import annotations

import random

import pytest
import torch
from hybrid_tiny import VOCAB, assert_logits_close

from trtllm_dasc.model import HybridModel
from trtllm_dasc.model.direct import DirectRunner


def _orders(model_cfg, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(model_cfg.num_linear_layers):
        row = list(range(model_cfg.num_bundles))
        while row == sorted(row) and len(row) > 1:
            rng.shuffle(row)
        out.append(row)
    return out


def _hf_mixer(hf, layer):
    block = hf.model.layers[layer]
    return block.linear_attn if hasattr(block, "linear_attn") else block.self_attn


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_permuted_tp1_equals_identity(tiny, arch):
    path, _ = tiny(arch)
    base = HybridModel.from_pretrained(path)
    order = _orders(base.cfg, 1)
    perm = HybridModel.from_pretrained(path, bundle_order=order)
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(0))
    states = []
    for m in (base, perm):
        r = DirectRunner(m, rows=1, max_tokens=64, block_size=8)
        states.append(r.state)
        assert_logits_close(r.run(ids).logits, base.prefill(ids), rel=1e-5)
    # state rows of the permuted model are the identity model's value heads in bundle-position order
    r = base.cfg.num_value_heads // base.cfg.num_key_heads
    for l, row in enumerate(order):
        heads = [b * r + j for b in row for j in range(r)]
        torch.testing.assert_close(states[1].temporal[l, 0], states[0].temporal[l, 0, heads], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("arch, tp", [("gdn", 2), ("kda", 3)])
def test_rank_partials_sum_to_transformers_layer(tiny, arch, tp):
    path, hf = tiny(arch)
    full = HybridModel.from_pretrained(path)
    cfg = full.cfg
    order = _orders(cfg, 2)
    ranks = [HybridModel.from_pretrained(path, tp_rank=r, tp_size=tp, bundle_order=order) for r in range(tp)]
    T, D = 23, full.spec.hidden_size
    x = torch.randn(T, D, generator=torch.Generator().manual_seed(3))
    shard = cfg.shard(tp)
    for l, layer in enumerate(cfg.linear_layers):
        with torch.no_grad():
            ref = _hf_mixer(hf, layer)(hidden_states=x[None])[0]
        total, hts = 0, []
        for rank in ranks:
            mixer = rank.layers[layer][0]
            st = rank.new_state(1)
            assert st.temporal.shape == (cfg.num_linear_layers, 1, shard.value_heads, cfg.key_head_dim,
                                         cfg.value_head_dim)
            assert st.conv.shape == (cfg.num_linear_layers, 1, shard.conv_dim, cfg.conv_kernel - 1)
            res = mixer.forward(x, [0, T], st.temporal[l], st.conv[l], rank.backend)
            assert res.conv.shape == st.conv[l].shape and res.ht.shape == st.temporal[l].shape
            total = total + res.out
            hts.append(res.ht[0])
        torch.testing.assert_close(total, ref, rtol=1e-4, atol=1e-5)
        # the ranks' states, concatenated in rank order, are the full state in bundle-position order
        fs = full.new_state(1)
        full_ht = full.layers[layer][0].forward(x, [0, T], fs.temporal[l], fs.conv[l], full.backend).ht[0]
        r = cfg.num_value_heads // cfg.num_key_heads
        heads = [b * r + j for b in order[l] for j in range(r)]
        torch.testing.assert_close(torch.cat(hts), full_ht[heads], rtol=1e-5, atol=1e-6)


def test_gdn_slice_shapes(tiny):
    path, _ = tiny("gdn")
    m = HybridModel.from_pretrained(path, tp_rank=1, tp_size=2)
    c = m.cfg
    H, HV, K, V, D = 1, 3, c.key_head_dim, c.value_head_dim, m.spec.hidden_size
    w = m.layers[0][0].w
    # in_proj_qkvz / in_proj_ba regrouped at load into one projection: q, k, v (the conv's channels), z, b, a
    assert w["in_proj"].shape == (2 * H * K + 2 * HV * V + 2 * HV, D)
    assert w["conv"].shape == (2 * H * K + HV * V, c.conv_kernel)
    assert w["A_log"].shape == w["dt_bias"].shape == (HV,)
    assert w["out"].shape == (D, HV * V)


def test_tp_forward_needs_all_reduce(tiny):
    m = HybridModel.from_pretrained(tiny("kda")[0], tp_rank=0, tp_size=3)
    with pytest.raises(RuntimeError, match="all_reduce"):
        m.prefill([1, 2, 3])
