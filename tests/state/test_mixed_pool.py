"""Mixed-precision checkpoints (issue 35): a horizon-precision plan's pool stores every kept unit in its
band's codec and loads it back. The reference is independent of the code under test: horizons from the
decay tensors by the paper's formula in numpy, bands by counting thresholds, and a numpy fake-quant per
codec (tests/state/test_codecs_fp8_int4.py's fp8 / int4 tables, int8 by Eq. 10); omitted units zero.
Loads are compared bit for bit (dequantization is one fp32 multiply in both). TP2 with storage balancing
runs its per-segment all-to-all between two threads."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from fake_quant import fake_quant, horizons_from_arrays
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.plan import PlanOptions
from trtllm_dasc.plan.horizons import DecayParams
from trtllm_dasc.plan.plan import plan_from_params
from trtllm_dasc.state.mixed import MixedPool

# a small Kimi-shaped config: 3 KDA layers, 4 heads of 16 (units are (head, key) channels, rows of V = 16)
TINY_KIMI = {"model_type": "kimi_linear", "num_hidden_layers": 4,
             "linear_attn_config": {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                    "kda_layers": [1, 2, 3], "full_attn_layers": [4]}}
WMAX = 8
SPEC = "horizon:32,128,512:int4,fp8,int8,native"


def decay_params(cfg: HybridConfig, seed: int = 0) -> list[DecayParams]:
    rng = np.random.default_rng(seed)
    H, n = cfg.num_value_heads, cfg.units_per_layer
    return [DecayParams(layer=l, A_log=rng.uniform(np.log(0.3), np.log(3.0), H),
                        dt_bias=rng.uniform(-8.0, 0.5, n)) for l in cfg.linear_layers]


def horizons(params) -> list[np.ndarray]:
    return [horizons_from_arrays(p.A_log, p.dt_bias) for p in params]


def expected_load(temporal: torch.Tensor, rank_units: list[np.ndarray], codec_of: list[dict]) -> np.ndarray:
    """temporal [L, B, H, K, V] of one rank -> the loaded rows: unit (l, u) (u = local (h, k)) in its codec,
    zero when not kept. rank_units[l]: global unit id of each local unit."""
    x = temporal.numpy()
    L, B, V = x.shape[0], x.shape[1], x.shape[-1]
    units = x.reshape(L, B, -1, V)
    out = np.zeros_like(units)
    for l in range(L):
        for u, g in enumerate(rank_units[l]):
            if g in codec_of[l]:
                out[l, :, u] = fake_quant(units[l, :, u], codec_of[l][g])
    return out.reshape(x.shape)


@pytest.fixture(scope="module")
def setup():
    cfg = HybridConfig.from_dict(TINY_KIMI)
    params = decay_params(cfg)
    hs = horizons(params)
    ths, codecs = (32, 128, 512), ("int4", "fp8", "int8", "native")
    # the reference's bands: kept iff H > W_max; band = thresholds at or below H
    codec_of = [{int(u): codecs[int(np.sum(np.array(ths) <= h[u]))] for u in np.nonzero(h > WMAX)[0]} for h in hs]
    assert {c for d in codec_of for c in d.values()} == set(codecs), "every band must hold units"
    return cfg, params, codec_of


def plan_of(cfg, params, tp, placement):
    plan, _ = plan_from_params(cfg, params, PlanOptions(wmax=WMAX, tp=tp, placement=placement, precision=SPEC))
    return plan


def states(cfg, tp, rows, seed):
    g = torch.Generator().manual_seed(seed)
    sh = cfg.shard(tp)
    t = torch.randn(cfg.num_linear_layers, rows, sh.value_heads, cfg.key_head_dim, cfg.value_head_dim, generator=g)
    # rows of very different magnitudes: the per-row scales matter
    t *= torch.logspace(-3, 2, cfg.key_head_dim)[:, None]
    c = torch.randn(cfg.num_linear_layers, rows, sh.conv_dim, cfg.conv_kernel - 1, generator=g).to(torch.bfloat16)
    return t, c


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_mixed_round_trip_equals_fake_quant(setup, backend, device):
    cfg, params, codec_of = setup
    plan = plan_of(cfg, params, 1, "off")
    assert [[codec_of[l][u] for u in kept] for l, kept in enumerate(plan.retained)] == plan.unit_codecs()
    pool = MixedPool.from_plan(plan, 12 * plan.bottleneck_slot_bytes(), device=device)
    pool.sanity_check()
    assert pool.slot_bytes == plan.slot_bytes_per_rank()[0] and pool.num_slots == 11
    assert [c for c, _ in pool.segments] == ["int4", "fp8", "int8", "native"]
    temporal, conv = states(cfg, 1, 5, seed=1)
    # garbage where the rows land: a reused row; omitted units must come back zero, kept ones decoded
    t_out, c_out = torch.full_like(temporal, 5.0).to(device), torch.full_like(conv, 5.0).to(device)
    pool.store(temporal.to(device), conv.to(device), [0, 2, 4], [7, 3, 11], backend=backend)
    pool.load([11, 7, 3], t_out, c_out, [1, 3, 0], backend=backend)
    t_out, c_out = t_out.cpu(), c_out.cpu()
    want = expected_load(temporal[:, [4, 0, 2]], [np.arange(cfg.units_per_layer)] * 3, codec_of)
    assert np.array_equal(t_out[:, [1, 3, 0]].numpy(), want)
    assert torch.equal(c_out[:, [1, 3, 0]], conv[:, [4, 0, 2]])
    assert bool((t_out[:, [2, 4]] == 5.0).all())                    # rows not loaded are untouched


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_one_segment_leaves_other_segments_units_alone(setup, backend, device):
    """A segment's load writes its own units and zeroes the omitted ones; the units another codec group
    stores (foreign) keep whatever the row held."""
    cfg, params, codec_of = setup
    plan = plan_of(cfg, params, 1, "off")
    pool = MixedPool.from_plan(plan, 12 * plan.bottleneck_slot_bytes(), device=device)
    temporal, conv = states(cfg, 1, 2, seed=2)
    pool.store(temporal.to(device), conv.to(device), [0, 1], [1, 2], backend=backend)
    n = cfg.units_per_layer
    for codec, seg in pool.segments:
        out = torch.full_like(temporal, 5.0).to(device)
        seg.load([1], out, conv.clone().to(device) if seg.layout.conv_dim else None, [0], zero_fill=True, backend=backend)
        units = out.cpu()[:, 0].reshape(3, n, -1)
        for l in range(3):
            for u in range(n):
                got = units[l, u]
                if u not in codec_of[l]:
                    assert bool((got == 0).all()), (codec, l, u)
                elif codec_of[l][u] != codec:
                    assert bool((got == 5.0).all()), (codec, l, u)
                else:
                    want = fake_quant(temporal[l, 0].reshape(n, -1)[u].numpy()[None], codec)[0]
                    assert np.array_equal(got.numpy(), want), (codec, l, u)


def thread_all_to_all(tp: int):
    """all_to_all(recv, send, recv_sizes, send_sizes) for tp ranks that are threads of this process."""
    # a timeout: a rank that fails breaks the barrier instead of leaving the other waiting for ever
    box, barrier = {}, threading.Barrier(tp, timeout=30)

    def make(rank):
        def a2a(recv, send, recv_sizes, send_sizes):
            at = np.concatenate([[0], np.cumsum(send_sizes)])
            box[rank] = [send[at[p]:at[p + 1]].clone() for p in range(tp)]
            barrier.wait()
            got = [box[p][rank] for p in range(tp)]
            assert [g.numel() for g in got] == list(recv_sizes)
            recv.copy_(torch.cat(got))
            barrier.wait()
        return a2a
    make.abort = barrier.abort
    return make


def test_tp2_storage_balanced_mixed_round_trip(setup):
    """TP2, placement storage: each codec segment balances on its own (units of the fuller rank are sent
    to the other and come home on load); every rank's loaded rows equal the fake-quant reference."""
    from trtllm_dasc.engine.pools import checkpoint_pool
    cfg, params, codec_of = setup
    tp = 2
    plan = plan_of(cfg, params, tp, "storage")
    assert plan.moved_units > 0 and len({t.segment for t in plan.storage.transfers}) >= 2
    make, results, errors = thread_all_to_all(tp), {}, []
    a2a_abort = make.abort
    per_rank = cfg.shard(tp).units

    def rank_job(rank):
        try:
            pool = checkpoint_pool(plan, 12 * plan.bottleneck_slot_bytes(), rank, make(rank))
            temporal, conv = states(cfg, tp, 4, seed=10 + rank)
            pool.store(temporal, conv, [0, 2], [5, 9])
            t_out, c_out = torch.full_like(temporal, 5.0), torch.full_like(conv, 5.0)
            pool.load([9, 5], t_out, c_out, [1, 3])
            # placement storage keeps the identity bundle order: local unit u of rank r is r * per_rank + u
            want = expected_load(temporal[:, [2, 0]], [np.arange(per_rank) + rank * per_rank] * 3, codec_of)
            results[rank] = (np.array_equal(t_out[:, [1, 3]].numpy(), want),
                             torch.equal(c_out[:, [1, 3]], conv[:, [2, 0]]), pool.slot_bytes,
                             sum(len(p.sends) for _, p in pool.segments if hasattr(p, "sends")))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            a2a_abort()
    threads = [threading.Thread(target=rank_job, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert [results[r][:2] for r in range(tp)] == [(True, True)] * tp
    assert [results[r][2] for r in range(tp)] == plan.slot_bytes_per_rank()
    assert sum(results[r][3] for r in range(tp)) > 0
