"""Triton kernels == naive.py, bit for bit, on NaN-poisoned outputs (interpreter on CPU, native on GPU)."""
import pytest
import torch

pytest.importorskip("triton")

import numpy as np  # noqa: E402
from state_helpers import assert_close, make_layout, new_slots, numpy_eq10  # noqa: E402
from trtllm_dasc.state import naive  # noqa: E402
from trtllm_dasc.state import triton_ops as tri  # noqa: E402

# arch, B, L, n (units per layer), R (rows per unit: gdn K, kda 1), V, tile (elements per program)
CASES = [
    ("gdn", 3, 5, 4, 6, 24, None),
    ("gdn", 1, 3, 3, 3, 17, 64),
    ("kda", 3, 5, 10, 1, 24, None),
    ("kda", 6, 3, 21, 1, 33, 128),
]


def _case_id(c):
    arch, B, L, n, R, V, tile = c
    U = make_layout(L, n, R, V, keep=0.5, seed=L + n).num_retained
    return f"{arch}-B{B}-L{L}-U{U}-V{V}" + (f"-tile{tile}" if tile else "")


@pytest.fixture(params=CASES, ids=[_case_id(c) for c in CASES])
def case(request, monkeypatch):
    arch, B, L, n, R, V, tile = request.param
    if tile:
        # small tiles: many programs per request and partial row blocks
        monkeypatch.setattr(tri, "TILE_ELEMS", tile)
    return request.param


def _inputs(case, device, layout_kind, codec, conv_dtype=torch.float32):
    arch, B, L, n, R, V, _ = case
    lay = make_layout(L, n, R, V, keep=0.5, seed=L + n, codec=codec, layout=layout_kind)
    g = torch.Generator().manual_seed(B * 100 + L)
    N = B + 2
    # active state as a slice of a bigger buffer: strides along N and L are not the dense ones
    big = torch.randn(L, N + 3, n * R, V, generator=g).to(device) * 2
    temporal = big[:, 2:2 + N].view(L, N, n, R, V)
    conv = torch.randn(L, N, 6, 3, generator=g).to(device=device, dtype=conv_dtype)
    rows = torch.randperm(N, generator=g)[:B].to(device)
    slots = (torch.randperm(B + 3, generator=g)[:B] + 1).to(device=device, dtype=torch.int32)
    return lay, temporal, conv, rows, slots


def _run_both(fn_name, make_args, check):
    outs = []
    for impl in (naive, tri):
        args = make_args()
        getattr(impl, fn_name)(*args)
        outs.append(args)
    check(*outs)


@pytest.mark.parametrize("codec", ["native", "int8"])
@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
def test_store_matches_naive(case, device, layout_kind, codec):
    lay, temporal, conv, rows, slots = _inputs(case, device, layout_kind, codec)
    S = case[1] + 4

    def args():
        return [temporal, conv, rows, *new_slots(lay, S, device), slots, lay]

    def check(a, b):
        for name, i in (("payload", 3), ("scales", 4), ("conv", 5)):
            if a[i] is not None:
                assert_close(name, a[i], b[i])
    _run_both("store", args, check)


@pytest.mark.parametrize("zero_fill", [True, False], ids=["nr", "keep"])
@pytest.mark.parametrize("codec", ["native", "int8"])
@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
def test_load_matches_naive(case, device, layout_kind, codec, zero_fill):
    lay, temporal, conv, rows, slots = _inputs(case, device, layout_kind, codec, torch.bfloat16)
    S = case[1] + 4
    payload, scales, cstore = new_slots(lay, S, device, poison=False)
    naive.store(temporal, conv, rows, payload, scales, cstore, slots, lay)
    start = temporal.clone() if not zero_fill else torch.full_like(temporal, float("nan"))

    def args():
        return [payload, scales, cstore, slots, start.clone(), torch.full_like(conv, float("nan")), rows, lay,
                zero_fill]

    def check(a, b):
        assert_close("temporal", a[4], b[4])
        assert_close("conv", a[5], b[5])
        if zero_fill:
            # every element of a loaded row written; the other rows keep their poison
            assert not b[4][:, rows.long()].isnan().any()
    _run_both("load", args, check)


@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
def test_pack_unpack_merge_match_naive(case, device, layout_kind):
    lay, temporal, conv, rows, slots = _inputs(case, device, layout_kind, "native")
    S = case[1] + 4

    def pack_args():
        return [temporal, rows, new_slots(lay, S, device)[0], slots, lay]
    _run_both("pack", pack_args, lambda a, b: assert_close("payload", a[2], b[2]))

    payload = torch.randn(S, lay.width, lay.unit_elements, device=device)

    def unpack_args():
        return [payload, slots, torch.full_like(temporal, float("nan")), rows, lay]
    _run_both("unpack", unpack_args, lambda a, b: assert_close("temporal", a[2], b[2]))

    scratch = torch.randn_like(temporal)
    srows = torch.flip(rows, [0])

    def merge_args():
        return [scratch, srows, temporal.clone(), rows, lay]
    _run_both("replay_merge", merge_args, lambda a, b: assert_close("temporal", a[2], b[2]))


@pytest.mark.parametrize("shape", [(1, 1), (7, 24), (3, 5, 33), (130, 128)], ids=lambda s: "x".join(map(str, s)))
def test_quantize_dequantize_match_naive(device, shape, monkeypatch):
    monkeypatch.setattr(tri, "TILE_ELEMS", 256)
    g = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(shape, generator=g) * torch.rand(shape[:-1] + (1,), generator=g) * 10).to(device)
    x.view(-1, shape[-1])[0] = 0.0
    qa, sa = naive.quantize_int8(x)
    qb, sb = tri.quantize_int8(x)
    assert_close("q", qa, qb)
    assert_close("s", sa, sb)
    # and against the independent numpy Eq. 10, on whatever device the kernel ran
    qn, sn = numpy_eq10(x.cpu().numpy())
    np.testing.assert_array_equal(qb.cpu().numpy(), qn)
    np.testing.assert_array_equal(sb.cpu().numpy(), sn)
    assert_close("x_hat", naive.dequantize_int8(qa, sa), tri.dequantize_int8(qb, sb))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fma quotient (kernels._quantize_rows FAST_DIV) "
                    "runs on a GPU only; the interpreter takes div_rn")
def test_fma_quotients_equal_ieee_division_near_every_rounding_boundary():
    # 4M quotients against numpy's Eq. 10: rows of random magnitudes (1e-9 .. 1e3), and elements put on,
    # and one float step either side of, the half-integer multiples of the row's scale, where a quotient
    # one ulp off would round the other way
    g = torch.Generator().manual_seed(11)
    rows, V = 32768, 128
    mag = 10.0 ** (torch.rand(rows, 1, generator=g) * 12 - 9)
    x = (torch.rand(rows, V, generator=g) * 2 - 1) * mag
    x[:, 0] = mag[:, 0]                                         # amax known: s = mag / 127
    s = (torch.clamp(mag, min=1e-8) / 127).float()
    half = (torch.randint(-126, 126, (rows, V - 1), generator=g) + 0.5) * s
    step = torch.randint(-1, 2, (rows, V - 1), generator=g).float()
    x[:, 1:] = torch.where(torch.rand(rows, V - 1, generator=g) < 0.5, torch.nextafter(
        half, half + step * torch.inf).where(step != 0, half), x[:, 1:])
    q, sc = tri.quantize_int8(x.cuda())
    qn, sn = numpy_eq10(x.numpy())
    np.testing.assert_array_equal(sc.cpu().numpy(), sn)
    np.testing.assert_array_equal(q.cpu().numpy(), qn)


def test_quantize_ties_and_floor(device):
    # amax 127 -> s == 1 exactly: the .5 quotients test round half to even in the kernel
    x = torch.tensor([[127.0, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 126.5], [0.0] * 8, [1e-9] * 8], device=device)
    q, s = tri.quantize_int8(x)
    assert q[0].tolist() == [127, 2, -2, 4, -4, 0, 0, 126] and (q[1] == 0).all()
    assert_close("s", naive.quantize_int8(x)[1], s)


@pytest.mark.parametrize("keep", [0.0, 1.0], ids=["none-kept", "dense"])
@pytest.mark.parametrize("codec", ["native", "int8"])
def test_edge_layouts_match_naive(device, keep, codec):
    L, n, R, V = 2, 3, 2, 8
    lay = make_layout(L, n, R, V, keep=keep, codec=codec)
    assert lay.num_retained == (0 if keep == 0.0 else L * n)
    temporal = torch.randn(L, 3, n, R * V, device=device)
    conv = torch.randn(L, 3, 6, 3, device=device)
    rows, slots = torch.tensor([2, 0], device=device), torch.tensor([1, 3], device=device)
    outs = []
    for impl in (naive, tri):
        payload, scales, cstore = new_slots(lay, 4, device)
        impl.store(temporal, conv, rows, payload, scales, cstore, slots, lay)
        out = torch.full_like(temporal, float("nan"))
        impl.load(payload, scales, cstore, slots, out, conv.clone(), rows, lay)
        merged = temporal.clone()
        impl.replay_merge(temporal.flip(1), rows, merged, rows, lay)
        outs.append((payload, scales, out, merged))
    for name, a, b in zip(("payload", "scales", "temporal", "merged"), *outs):
        if a is not None:
            assert_close(name, a, b)
    if keep == 0.0:
        assert (outs[1][2][:, rows] == 0).all()


@pytest.mark.parametrize("codec", ["native", "int8"])
def test_wide_conv_store_load_match_naive(device, codec, monkeypatch):
    # conv_dim * width = 60 elements per layer over 16-element blocks: four blocks per layer, the last
    # one partial, so a block never reads into the next layer (which sits at another stride)
    monkeypatch.setattr(tri, "TILE_ELEMS", 16)
    L, n, V, B = 3, 5, 8, 2
    lay = make_layout(L, n, 1, V, keep=0.6, seed=7, codec=codec, conv=(20, 3))
    g = torch.Generator().manual_seed(7)
    temporal = torch.randn(L, B + 2, n, 1, V, generator=g).to(device)
    conv = torch.randn(L, B + 2, 20, 3, generator=g).to(device=device, dtype=torch.bfloat16)
    rows = torch.tensor([3, 0], device=device)
    slots = torch.tensor([2, 1], device=device, dtype=torch.int32)

    def store_args():
        return [temporal, conv, rows, *new_slots(lay, 4, device), slots, lay]
    _run_both("store", store_args, lambda a, b: [assert_close(k, a[i], b[i]) for k, i in
                                                (("payload", 3), ("scales", 4), ("conv", 5)) if a[i] is not None])
    payload, scales, cstore = new_slots(lay, 4, device, poison=False)
    naive.store(temporal, conv, rows, payload, scales, cstore, slots, lay)

    def load_args():
        return [payload, scales, cstore, slots, torch.full_like(temporal, float("nan")),
                torch.full_like(conv, float("nan")), rows, lay, True]
    _run_both("load", load_args, lambda a, b: (assert_close("temporal", a[4], b[4]), assert_close("conv", a[5], b[5])))
