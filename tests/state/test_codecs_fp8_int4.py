"""FP8 / INT4 codecs (issue 35): the torch reference against an independent numpy fake-quant (brute-force
e4m3fn table, nibble packing by hand), and the Triton kernels against the torch reference, bit for bit,
on NaN-poisoned outputs (interpreter on CPU; on a GPU both run there, on the device fixture's tensors)."""
import numpy as np
import pytest
import torch

from state_helpers import make_layout  # noqa: E402
from trtllm_dasc.state import CheckpointPool, codec_naive, naive

CODECS = ["fp8", "int4"]


# ---- independent fake-quant reference (numpy, no torch fp8 cast, no bit tricks) ------------------------
def _e4m3_table() -> np.ndarray:
    """The 127 non-negative finite e4m3fn values, index = code (0x00 .. 0x7E)."""
    out = []
    for c in range(127):
        e, m = c >> 3, c & 7
        out.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out)


def fake_fp8(x: np.ndarray):
    """Rows [..., V] -> (codes uint8, s float32): nearest table entry to |x / s|, ties to the even code."""
    x = x.astype(np.float32)
    s = (np.maximum(np.abs(x).max(-1), np.float32(1e-8)) / np.float32(448)).astype(np.float32)
    y = np.clip(x / s[..., None], -448, 448).astype(np.float32)
    tab = _e4m3_table()
    a = np.abs(y).astype(np.float64).reshape(-1)
    d = np.abs(a[:, None] - tab[None, :])
    best = d.min(1, keepdims=True)
    cand = d == best
    # two candidates only at an exact midpoint: take the even code (round half to even)
    even = cand & (np.arange(127)[None, :] % 2 == 0)
    code = np.where(cand.sum(1) > 1, even.argmax(1), cand.argmax(1))
    code = code | (np.signbit(y.reshape(-1)).astype(np.int64) << 7)
    return code.astype(np.uint8).reshape(y.shape), s


def fake_fp8_decode(codes: np.ndarray, s: np.ndarray) -> np.ndarray:
    tab = _e4m3_table().astype(np.float32)
    v = tab[codes & 0x7F] * np.where(codes >= 128, np.float32(-1), np.float32(1))
    return (v * s[..., None]).astype(np.float32)


def fake_int4(x: np.ndarray):
    x = x.astype(np.float32)
    s = (np.maximum(np.abs(x).max(-1), np.float32(1e-8)) / np.float32(7)).astype(np.float32)
    q = np.clip(np.rint(x / s[..., None]), -7, 7).astype(np.int64)
    nib = q % 16
    return (nib[..., 0::2] + 16 * nib[..., 1::2]).astype(np.uint8), s, q


def _cases(V: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, V, generator=g) * torch.logspace(-10, 4, 24)[:, None]
    x[0] = 0.0
    x[1, :] = -3.0
    # int4 ties: amax 7 gives s = 1, so x / s sits on .5 and round half to even decides
    x[2] = torch.tensor([7.0, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5] * (V // 8))
    # fp8 subnormals and midpoints: amax 448 gives s = 1; 2^-9 steps below 2^-6, 1.0625 between 1 and 1.125
    x[3] = torch.tensor([448.0, 2 ** -9, 1.5 * 2 ** -9, 2.5 * 2 ** -9, 1.0625, -1.1875, 2 ** -10, 0.0] * (V // 8))
    # heavy outlier: most of the row falls into fp8's subnormal range
    x[4] = torch.randn(V, generator=g) * 1e-3
    x[4, 5] = 100.0
    return x


def test_fp8_reference_matches_fake_quant():
    x = _cases()
    q, s = codec_naive.quantize_fp8(x)
    qn, sn = fake_fp8(x.numpy())
    np.testing.assert_array_equal(s.numpy().view(np.int32), sn.view(np.int32))
    np.testing.assert_array_equal(q.numpy(), qn)
    assert q[3, :8].tolist() == [0x7E, 0x01, 0x02, 0x02, 0x38, 0xBA, 0x00, 0x00]
    np.testing.assert_array_equal(codec_naive.dequantize_fp8(q, s).numpy(), fake_fp8_decode(qn, sn))


def test_int4_reference_matches_fake_quant():
    x = _cases()
    p, s = codec_naive.quantize_int4(x)
    pn, sn, qn = fake_int4(x.numpy())
    np.testing.assert_array_equal(s.numpy().view(np.int32), sn.view(np.int32))
    np.testing.assert_array_equal(p.numpy(), pn)
    assert qn[2, :8].tolist() == [7, 2, -2, 4, -4, 0, 0, 2]
    np.testing.assert_array_equal(codec_naive.dequantize_int4(p, s).numpy(), qn.astype(np.float32) * sn[:, None])


# ---- Triton kernels == torch reference ---------------------------------------------------------------
@pytest.mark.parametrize("codec", CODECS)
def test_quantize_rows_kernel_bit_exact(codec, device, monkeypatch):
    pytest.importorskip("triton")
    from trtllm_dasc.state import codec_ops, triton_ops
    monkeypatch.setattr(triton_ops, "TILE_ELEMS", 64)
    # the reference on the kernel's device: its quotients are IEEE and its casts round to nearest even there too
    x = _cases().to(device)
    qa, sa = codec_naive.QUANTIZE[codec](x)
    qb, sb = codec_ops.quantize(x, codec)
    assert torch.equal(qa, qb) and torch.equal(sa.view(torch.int32), sb.view(torch.int32))
    da, db = codec_naive.DEQUANTIZE[codec](qa, sa), codec_ops.dequantize(qb, sb, codec)
    assert torch.equal(da.view(torch.int32), db.view(torch.int32))


# arch, L, n units per layer, R rows per unit, V (even), tile
SHAPES = [("gdn", 4, 3, 4, 16, None), ("kda", 3, 10, 1, 24, 128)]


def _same(a, b) -> bool:
    """Bit-exact, NaN (the poison) equal to NaN."""
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def _slots(lay, S, device):
    w, R, P = lay.width, lay.rows_per_unit, lay.payload_unit_elements
    payload = torch.full((S, w, P), 0xAB, dtype=torch.uint8, device=device)
    scales = torch.full((S, w, R), float("nan"), device=device)
    conv = torch.full((S, lay.num_layers, lay.conv_dim, lay.conv_width), float("nan"), dtype=lay.conv_dtype,
                      device=device)
    return payload, scales, conv


@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}-L{s[1]}-n{s[2]}-R{s[3]}-V{s[4]}")
@pytest.mark.parametrize("codec", CODECS)
def test_store_load_kernels_match_reference(codec, shape, layout_kind, device, monkeypatch):
    pytest.importorskip("triton")
    from trtllm_dasc.state import triton_ops as tri
    arch, L, n, R, V, tile = shape
    if tile:
        monkeypatch.setattr(tri, "TILE_ELEMS", tile)
    lay = make_layout(L, n, R, V, keep=0.5, seed=3, codec=codec, layout=layout_kind)
    g = torch.Generator().manual_seed(7)
    big = torch.randn(L, 8, n * R, V, generator=g).to(device) * 3
    t = big[:, 1:6].view(L, 5, n, R, V)
    conv = torch.randn(L, 5, 6, 3, generator=g).to(device)
    rows, slots = torch.tensor([3, 0, 4], device=device), torch.tensor([2, 5, 1], dtype=torch.int32, device=device)
    outs = []
    for impl in (naive, tri):
        payload, scales, cstore = _slots(lay, 6, device)
        impl.store(t, conv, rows, payload, scales, cstore, slots, lay)
        outs.append((payload, scales, cstore))
    (pa, sa, ca), (pb, sb, cb) = outs
    assert torch.equal(pa, pb) and torch.equal(ca.view(torch.int16), cb.view(torch.int16))
    assert _same(sa, sb)
    # stored units against the independent fake-quant, one request
    ix = lay.index("cpu")
    x = t.cpu().reshape(L, 5, n, R * V)[ix.unit_layer, 3, ix.unit_local].reshape(-1, R, V).numpy()
    ref = fake_fp8(x)[0] if codec == "fp8" else fake_int4(x)[0]
    np.testing.assert_array_equal(pa.cpu()[2, ix.slot_pos].reshape(ref.shape).numpy(), ref)
    for zero_fill in (True, False):
        res = []
        for impl in (naive, tri):
            out = torch.full((L, 4, n, R, V), float("nan"), device=device)
            cout = torch.full((L, 4, 6, 3), float("nan"), device=device)
            impl.load(pa, sa, ca, torch.tensor([5, 2], device=device), out, cout, torch.tensor([1, 3], device=device),
                      lay, zero_fill=zero_fill)
            res.append((out, cout))
        (oa, coa), (ob, cob) = res
        assert _same(oa, ob) and _same(coa, cob)
        kept = ix.pos_of_unit.view(L, n).to(device) >= 0
        omitted = oa[:, 1][~kept]
        assert bool((omitted == 0).all()) if zero_fill else bool(omitted.isnan().all())
        assert not oa[:, 1][kept].isnan().any() and oa[:, 0].isnan().all()


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_group_load_leaves_other_groups_alone(backend, device):
    """pos -2 (a unit another codec group owns) is neither decoded nor zeroed: the mixed layout's contract."""
    if backend == "triton":
        pytest.importorskip("triton")
        from trtllm_dasc.state import codec_ops as impl
    else:
        impl = codec_naive
    L, n, R, V = 2, 3, 2, 8
    payload = torch.zeros(2, 2, R * V, dtype=torch.uint8, device=device)
    scales = torch.ones(2, 2, R, device=device)
    payload[1, 0] = 0x38     # fp8 1.0 everywhere
    pos = torch.tensor([0, -1, -2, -2, -1, -2], dtype=torch.int64, device=device)
    t = torch.full((L, 1, n, R * V), 5.0, device=device)
    impl.load_units(payload, scales, torch.tensor([1], device=device), t, torch.tensor([0], device=device), pos, R, V,
                    "fp8", True)
    t = t.cpu()
    assert (t[0, 0, 0] == 1.0).all() and (t[0, 0, 1] == 0).all() and (t[1, 0, 1] == 0).all()
    assert (t[0, 0, 2] == 5.0).all() and (t[1, 0, 0] == 5.0).all() and (t[1, 0, 2] == 5.0).all()


@pytest.mark.parametrize("codec,unit_bytes", [("fp8", 8 * 16 + 8 * 4), ("int4", 8 * 8 + 8 * 4)])
def test_pool_bytes_and_round_trip(codec, unit_bytes):
    """Allocated bytes follow the codec's accounting (payload + one fp32 scale per row), and a stored
    checkpoint loads back within the codec's step (|x - x_hat| <= s / 2 for int4, fp8's relative step)."""
    lay = make_layout(3, 4, 8, 16, keep=0.6, seed=1, codec=codec)
    assert lay.unit_bytes() == unit_bytes
    pool = CheckpointPool(lay, budget_bytes=5 * lay.slot_bytes() + 3)
    pool.sanity_check()
    assert pool.allocated_bytes() == 5 * lay.slot_bytes()
    t = torch.randn(3, 2, 4, 8, 16)
    conv = torch.randn(3, 2, 6, 3)
    pool.store(t, conv, [1], [2])
    out = torch.zeros_like(t)
    pool.load([2], out, torch.zeros_like(conv), [0])
    kept = lay.index("cpu").pos_of_unit.view(3, 4) >= 0
    x, xh = t[:, 1][kept], out[:, 0][kept]
    amax = x.abs().amax(-1, keepdim=True)
    # int4: half a step of s = amax / 7; fp8: half an ulp (x / 16) or half a subnormal step (s * 2^-10)
    bound = amax / 14 if codec == "int4" else x.abs() / 16 + amax / 448 * 2 ** -10
    assert bool(((x - xh).abs() <= bound * (1 + 1e-6)).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="int4's fma quotient (codec_ops._fast_div) runs on a GPU only")
def test_int4_fma_quotient_equals_reference_near_every_boundary():
    # rows of random magnitudes with elements on, and one float step either side of, (k + 1/2) s
    g = torch.Generator().manual_seed(12)
    rows, V = 32768, 128
    mag = 10.0 ** (torch.rand(rows, 1, generator=g) * 12 - 9)
    x = (torch.rand(rows, V, generator=g) * 2 - 1) * mag
    x[:, 0] = mag[:, 0]
    s = torch.clamp(mag, min=1e-8).float() / torch.full_like(mag, 7.0).float()
    half = (torch.randint(-7, 7, (rows, V - 1), generator=g) + 0.5) * s
    step = torch.randint(-1, 2, (rows, V - 1), generator=g).float()
    near = torch.nextafter(half, half + step * torch.inf).where(step != 0, half)
    x[:, 1:] = torch.where(torch.rand(rows, V - 1, generator=g) < 0.5, near, x[:, 1:])
    from trtllm_dasc.state import codec_ops
    q, sc = codec_ops.quantize(x.cuda(), "int4")
    qr, sr = codec_naive.quantize_int4(x)
    assert torch.equal(sc.cpu(), sr) and torch.equal(q.cpu(), qr)


def _fp8_boundary_rows(rows: int, V: int, seed: int) -> torch.Tensor:
    """Rows of random magnitudes (the amax at element 0) whose other elements sit on, or 1 to 3 float steps
    either side of, RN(s b) for an e4m3fn midpoint b (both signs), with random elements and signed zeros mixed in."""
    g = torch.Generator().manual_seed(seed)
    mag = 10.0 ** (torch.rand(rows, 1, generator=g) * 12 - 9)
    x = (torch.rand(rows, V, generator=g) * 2 - 1) * mag
    x[:, 0] = mag[:, 0]
    s = torch.clamp(mag, min=1e-8).float() / torch.full_like(mag, 448.0).float()
    tab = _e4m3_table()
    mids = torch.from_numpy((tab[:-1] + tab[1:]) / 2).float()
    b = mids[torch.randint(0, len(mids), (rows, V - 1), generator=g)]
    b = b * (torch.randint(0, 2, b.shape, generator=g) * 2 - 1)
    near = b * s
    for _ in range(3):          # 0 to 3 steps, each toward a random side
        step = torch.randint(-1, 2, near.shape, generator=g).float()
        near = torch.nextafter(near, near + step * torch.inf).where(step != 0, near)
    x[:, 1:] = torch.where(torch.rand(rows, V - 1, generator=g) < 0.7, near, x[:, 1:])
    zero = torch.rand(rows, V - 1, generator=g)
    x[:, 1:] = torch.where(zero < 0.01, -0.0, torch.where(zero < 0.02, 0.0, x[:, 1:]))
    return x


def _fp8_store_matches_reference(device: str, rows: int) -> None:
    from trtllm_dasc.state import codec_ops
    V = 128
    x = _fp8_boundary_rows(rows, V, 13)
    assert bool((x == 0).any()) and bool(torch.signbit(x[x == 0]).any())
    qr, sr = codec_naive.quantize_fp8(x)
    q, sc = codec_ops.quantize(x.to(device), "fp8")
    assert torch.equal(sc.cpu(), sr) and torch.equal(q.cpu(), qr)
    # the store launch (codec_ops.store_units, FAST_DIV by codec_ops._fast_div): each row one unit of one layer
    t = x.to(device).view(1, 1, rows, V)
    payload = torch.full((1, rows, V), 0xAB, dtype=torch.uint8, device=device)
    scales = torch.full((1, rows, 1), float("nan"), device=device)
    units = torch.arange(rows, device=device)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    codec_ops.store_units(t, zero, payload, scales, zero, units * 0, units, units, 1, V, "fp8")
    assert torch.equal(payload[0].cpu(), qr) and torch.equal(scales[0, :, 0].cpu(), sr)


def test_fp8_boundary_rows_interpreter(device):
    # the same rows through the interpreter's div_rn path (few rows: it is slow); keeps the GPU test's harness honest
    pytest.importorskip("triton")
    if device != "cpu":
        pytest.skip("the GPU runs test_fp8_fma_quotient_equals_reference_near_every_boundary")
    _fp8_store_matches_reference("cpu", 128)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp8's fma quotient (codec_ops._fast_div) runs on a GPU only")
def test_fp8_fma_quotient_equals_reference_near_every_boundary():
    # quantize and the store, both through codec_kernels._encode_rows with the fma quotient, against torch's
    # ieee division and cast, bit for bit: codes (signed zeros too) and scales
    _fp8_store_matches_reference("cuda", 32768)
