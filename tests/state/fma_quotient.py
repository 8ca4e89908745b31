"""numpy twin of the fma quotient the GPU kernels use for x / s (kernels._div_fma): r = RN(1 / s), q0 = RN(x r),
y = RN(q0 + RN(x - s q0) r), both steps fused multiply-adds. numpy has no fma: RN32(a b + c) is computed
exactly in float64 with round-to-odd (a b of two fp32 is exact in float64; the sum's error from TwoSum; an
inexact sum moved to its odd neighbour), whose rounding to fp32 is then the correctly rounded result
(Boldo & Melquiond: round-to-odd at >= p + 2 bits, 53 >= 26, then round to nearest gives RN). The reference
is numpy's fp32 division (ieee, like torch's), rounded to the codes the way conv8_naive / naive / codec_naive
do (fp8: torch's own cast to float8_e4m3fn)."""
from __future__ import annotations

import numpy as np


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN_fp32(a * b + c) for fp32 arrays, one rounding."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    odd = (s.view(np.int64) & 1) == 1
    # toward err's sign (not s + err: an err below half an ulp of s rounds that back to s)
    s = np.where((err != 0) & ~odd, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def fast_quotient(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The GPU's x / s (fp32 x, s broadcastable): correctly rounded when the kernels' reasoning holds."""
    x, s = x.astype(np.float32), s.astype(np.float32)
    with np.errstate(all="ignore"):
        r = np.float32(1.0) / s
        q0 = x * r
        return fma32(fma32(-q0, s, x), r, q0)


def scale(amax: np.ndarray, qmax: float) -> np.ndarray:
    """Paper Eq. 10's scale as the references compute it: max(amax, 1e-8) / qmax, ieee fp32 division."""
    return np.maximum(amax.astype(np.float32), np.float32(1e-8)) / np.float32(qmax)


def int_codes(y: np.ndarray, qmax: float) -> np.ndarray:
    """round half to even of clip(y, -qmax, qmax) (int8 qmax 127, int4 7)."""
    return np.rint(np.clip(y, -qmax, qmax))


def bf16_values(lo_bits: int = 0, hi_bits: int = 0x7F80) -> np.ndarray:
    """Every positive bf16 with bit pattern in [lo_bits, hi_bits) as fp32 (0x7F80 is +inf)."""
    return (np.arange(lo_bits, hi_bits, dtype=np.uint32) << 16).view(np.float32)


def check_bf16(amax: np.ndarray, qmax: float, quotient=fast_quotient) -> tuple[int, int, int]:
    """Every bf16 x with |x| in [amax 2^-12, amax], both signs, for each bf16 amax (x below that has
    |x / s| < 127 2^-12 / 2, code 0 both ways): (pairs, quotients unequal where the residual is normal,
    codes unequal). s = max(amax, 1e-8) / qmax; int codes (round half to even of the clipped quotient)."""
    pairs = qdiff = cdiff = 0
    for chunk in np.array_split(amax, max(1, len(amax) // 512)):
        e = (chunk.view(np.uint32) >> 23).astype(np.int64)
        ex = np.clip(e[:, None] + np.arange(-12, 1)[None, :], 0, 254)
        xb = ((ex[:, :, None] << 7) + np.arange(128)[None, None, :]).reshape(len(chunk), -1)
        x = (xb.astype(np.uint32) << 16).view(np.float32)
        keep = x <= chunk[:, None]
        x = np.where(keep, x, np.float32(0))
        s = scale(chunk, qmax)[:, None]
        for sign in (1, -1):
            xs = (sign * x).astype(np.float32)
            ref, got = (xs / s).astype(np.float32), quotient(xs, s)
            # the residual x - s q0 ~ s ulp(x / s) underflows below |x / s| ~ 2^-126 / s 2^24
            normal = np.abs(ref) * s * np.float32(2.0 ** -25) >= np.float32(2.0 ** -126)
            qdiff += int(((ref != got) & keep & normal).sum())
            cdiff += int(((int_codes(ref, qmax) != int_codes(got, qmax)) & keep).sum())
            pairs += int(keep.sum())
    return pairs, qdiff, cdiff


def check_floor(qmax: float, quotient=fast_quotient) -> tuple[int, int]:
    """amax < 1e-8 (the scale floor): every bf16 x below 1e-8, subnormals too, both signs: (pairs, codes
    unequal)."""
    x = bf16_values()
    x = x[x < np.float32(1e-8)]
    x = np.concatenate([x, -x])
    s = scale(np.zeros(1, np.float32), qmax)
    return len(x), int((int_codes((x / s).astype(np.float32), qmax) != int_codes(quotient(x, s), qmax)).sum())


def int_boundaries(qmax: float) -> np.ndarray:
    """The int codes' rounding boundaries: k + 1/2 for 0 <= k < qmax (the clip decides above qmax)."""
    return np.arange(int(qmax), dtype=np.float32) + np.float32(0.5)


def fp8_values() -> np.ndarray:
    """The finite non-negative e4m3fn values, ascending, from the format: subnormals k 2^-9 (k < 8, zero
    included), normals (1 + m / 8) 2^e for e in [-6, 8], up to 448 (e = 8, m = 6; m = 7 is NaN)."""
    sub = [k * 2.0 ** -9 for k in range(8)]
    norm = [(1 + m / 8) * 2.0 ** e for e in range(-6, 9) for m in range(8) if (e, m) != (8, 7)]
    return np.array(sub + norm, dtype=np.float32)


def fp8_boundaries() -> np.ndarray:
    """Every rounding midpoint between consecutive finite e4m3fn values (2^-10 .. 432; above 448 the clip
    maps to 448, the code a y in [432, 448] rounds to): 126, exact in fp32 (5 significant bits)."""
    v = fp8_values().astype(np.float64)
    return ((v[:-1] + v[1:]) / 2).astype(np.float32)


def fp8_codes(y: np.ndarray) -> np.ndarray:
    """The fp8 codec's codes of quotients y, by torch's cast (round to nearest even), as codec_naive does."""
    import torch
    y = np.clip(np.asarray(y, np.float32), np.float32(-448), np.float32(448))
    return torch.from_numpy(np.ascontiguousarray(y)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def fp8_quotient(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The fp8 store's quotient on a GPU (codec_kernels._encode_rows): the fma quotient, and x itself where
    x is zero: for x = -0 the fma sequence gives +0 (fma(+0, s, -0) = +0), code 0x00, where ieee -0 / s = -0
    is torch's 0x80 (the int codes have no sign to lose)."""
    x = np.asarray(x, np.float32)
    return np.where(x == 0, x, fast_quotient(x, s))


def significands(boundaries) -> list[tuple[np.float32, np.ndarray]]:
    """Boundaries b = sigma 2^e grouped by significand: [(sigma in [1, 2), the powers 2^e of its boundaries)]."""
    m, e = np.frexp(np.asarray(boundaries, np.float64))
    out: dict = {}
    for sig, ex in zip(m * 2, e - 1):
        out.setdefault(float(sig), []).append(2.0 ** int(ex))
    return [(np.float32(sig), np.array(p, np.float32)) for sig, p in sorted(out.items())]


def check_fp32_boundaries(qmax: float, s_bits=None, window: int = 8, quotient=fast_quotient, boundaries=None,
                          codes=None) -> tuple[int, int, int]:
    """fp32 x: the quotient is RN(q0 + rho r) with q0 within 2 ulp of x / s and rho r = (x / s - q0)(1 + ~3
    2^-24), so it is within 1/2 ulp + 2^-21 ulp of x / s, one of x / s's two fp32 neighbours, as is the ieee
    quotient; their codes (monotone in the quotient) can differ only when a code boundary b lies within an
    ulp of x / s, that is x within s ulp(b) <= 2 ulp(x) of s b: 3 fp32 steps of RN(s b), 6 across a binade
    edge (window 8 covers it).
    boundaries: the codes' rounding boundaries (default int_boundaries(qmax), the half-integers k + 1/2 < qmax;
    fp8: fp8_boundaries(), every e4m3fn midpoint). codes: quotient -> code (default int_codes(y, qmax)).
    Everything scales by powers of two, the scale s and the boundary b alike, so s in [1, 2) and the distinct
    significands of the boundaries cover every scale and boundary, provided every step stays normal fp32: the
    scale floor s >= 1e-8 / 448 > 2^-36 (at most amax 2^128 / 448 < 2^120 above) keeps r = RN(1 / s) normal,
    the smallest boundary (fp8's 2^-10; int's 1/2) keeps q0 ~ x / s >= 2^-11, and the residual x - s q0 is
    0 or a multiple of ulp(s) ulp(q0) >= 2^(-36-23) 2^(-11-23) = 2^-93, far above fp32's smallest normal
    2^-126 (it is exact in fp32, Markstein), so nothing underflows; x <= 448 s <= 2^128 and y <= 448 do
    not overflow. For each s significand (s_bits: the low 23 bits, all by default) and boundary significand
    sigma, the x within `window` fp32 steps of RN(s sigma), positive (every step is odd in x; fp8's signed
    zero and tiny quotients: check_fp8_small): the quotients are compared once, the codes at every boundary
    sigma 2^e (both quotients times 2^e, exact; check_scaling tests the reduction itself).
    Returns (pairs (s, x) compared, quotients unequal, codes unequal over the boundaries).
    The full run (__main__ on this 2-core machine, niced): int4 998,244,352 pairs, quotient != ieee 0, codes != 0 (68 s); fp8
    2,281,701,376 pairs, quotient != ieee 0, 17,968,398,336 (s, x, midpoint) codes by torch's cast, != 0 (193 s,
    with check_fp8_small: 172,380 pairs, codes != 0)."""
    s_bits = np.arange(1 << 23, dtype=np.uint32) if s_bits is None else np.asarray(s_bits, np.uint32)
    groups = significands(int_boundaries(qmax) if boundaries is None else boundaries)
    codes = codes or (lambda y: int_codes(y, qmax))
    pairs = qdiff = cdiff = 0
    steps = np.arange(-window, window + 1, dtype=np.int32)
    for chunk in np.array_split(s_bits, max(1, len(s_bits) // (1 << 18))):
        s = ((np.uint32(127 << 23) | chunk).view(np.float32))[:, None]
        for sig, powers in groups:
            center = (s * sig).astype(np.float32)
            x = (center.view(np.int32) + steps[None, :]).view(np.float32)
            ref, got = (x / s).astype(np.float32), quotient(x, s)
            qdiff += int((ref != got).sum())
            for p in powers:
                cdiff += int((codes(ref * p) != codes(got * p)).sum())
            pairs += x.size
    return pairs, qdiff, cdiff


def check_scaling(s_bits, boundaries, s_exps, window: int = 8, quotient=fast_quotient) -> tuple[int, int]:
    """check_fp32_boundaries' reduction, checked: for s = sigma_s 2^E (E in s_exps) and each boundary
    b = sigma 2^e, the x near s b are the reduced ones times 2^(E + e) and the quotient must be the reduced
    quotient times 2^e, bit for bit. Pairs whose x would pass amax's largest 448 s or overflow are skipped
    (no row has them). Returns (pairs, quotients unequal)."""
    s1 = ((np.uint32(127 << 23) | np.asarray(s_bits, np.uint32)).view(np.float32))[:, None]
    steps = np.arange(-window, window + 1, dtype=np.int32)
    pairs = diff = 0
    for sig, powers in significands(boundaries):
        x1 = ((s1 * sig).astype(np.float32).view(np.int32) + steps[None, :]).view(np.float32)
        q1 = quotient(x1, s1)
        for E in s_exps:
            s = (s1.astype(np.float64) * 2.0 ** E).astype(np.float32)
            for p in powers:
                x64 = x1.astype(np.float64) * 2.0 ** E * float(p)
                keep = (x64 <= 448 * s.astype(np.float64)) & (x64 < np.finfo(np.float32).max)
                with np.errstate(over="ignore"):
                    got = quotient(x64.astype(np.float32), s)
                diff += int(((got != q1 * p) & keep).sum())
                pairs += int(keep.sum())
    return pairs, diff


def check_fp8_small(quotient=fp8_quotient) -> tuple[int, int]:
    """What the fp32 boundary check leaves out for fp8: the sign of zero and quotients far below its smallest
    boundary 2^-10 (code +-0, so only the sign can differ; also where the residual underflows). Every bf16
    x with |x| <= amax, both signs, zeros included, for amax at the floor (0: s = 1e-8 / 448), 1, 2^64 and
    the largest finite bf16: (pairs, codes unequal)."""
    x = bf16_values()
    pairs = cdiff = 0
    for amax in (0.0, 1.0, 2.0 ** 64, float(bf16_values(0x7F7F, 0x7F80)[0])):
        xs = x[x <= np.float32(max(amax, 1e-8))]
        xs = np.concatenate([xs, -xs])
        s = scale(np.array([amax], np.float32), 448.0)
        with np.errstate(all="ignore"):
            ref = (xs / s).astype(np.float32)
        cdiff += int((fp8_codes(ref) != fp8_codes(quotient(xs, s))).sum())
        pairs += len(xs)
    return pairs, cdiff


if __name__ == "__main__":
    # the exhaustive proof over bf16 (every finite positive amax; about 20 s a qmax on one core)
    import time
    for qmax in (127.0, 7.0):
        t0 = time.time()
        pairs, qdiff, cdiff = check_bf16(bf16_values(1, 0x7F80), qmax)
        fpairs, fdiff = check_floor(qmax)
        print(f"qmax {qmax:g}: {pairs} bf16 (x, amax) pairs: quotient != ieee {qdiff} (normal residual), "
              f"codes != {cdiff}; scale floor: {fpairs} x, codes != {fdiff} ({time.time() - t0:.0f} s)")
    # fp32 rows, int4 (the int4 store's quotients): every scale significand x every code boundary
    t0 = time.time()
    pairs, qdiff, cdiff = check_fp32_boundaries(7.0)
    print(f"qmax 7 fp32: {pairs} (s, x near k + 1/2) pairs: quotient != ieee {qdiff}, codes != {cdiff} "
          f"({time.time() - t0:.0f} s)")
    # fp32 rows, fp8 (the fp8 store's quotients): every scale significand x every e4m3fn midpoint's
    # significand (16), codes at each of the 126 midpoints; then the signed zeros and tiny quotients
    t0 = time.time()
    pairs, qdiff, cdiff = check_fp32_boundaries(448.0, boundaries=fp8_boundaries(), codes=fp8_codes)
    spairs, sdiff = check_fp8_small()
    print(f"fp8 fp32: {pairs} (s, x near a midpoint significand) pairs: quotient != ieee {qdiff}; "
          f"{pairs // 16 * 126} (s, x, midpoint) codes != {cdiff}; small: {spairs} bf16 (x, amax), codes != {sdiff} "
          f"({time.time() - t0:.0f} s)")
