"""numpy twin of the fma quotient the GPU kernels use for x / s (kernels._div_fma): r = RN(1 / s), q0 = RN(x r),
y = RN(q0 + RN(x - s q0) r), both steps fused multiply-adds. numpy has no fma: RN32(a b + c) is computed
exactly in float64 with round-to-odd (a b of two fp32 is exact in float64; the sum's error from TwoSum; an
inexact sum moved to its odd neighbour), whose rounding to fp32 is then the correctly rounded result
(Boldo & Melquiond: round-to-odd at >= p + 2 bits, 53 >= 26, then round to nearest gives RN). The reference
is numpy's fp32 division (ieee, like torch's), rounded to the codes the way conv8_naive / naive do."""
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


def check_fp32_boundaries(qmax: float, s_bits=None, window: int = 8, quotient=fast_quotient) -> tuple[int, int, int]:
    """fp32 x: the quotient is RN(q0 + rho r) with q0 within 2 ulp of x / s and rho r = (x / s - q0)(1 + ~3
    2^-24), so it is within 1/2 ulp + 2^-21 ulp of x / s, one of x / s's two fp32 neighbours, as is the ieee
    quotient; their codes can differ only when a code boundary (a half-integer k + 1/2 < qmax) lies within
    an ulp of x / s, that is x within s ulp(b) <= 2 ulp(x) of s b: 3 fp32 steps of RN(s b), 6 across a binade
    edge (window 8 covers it). Everything scales by powers of two (no under/overflow near a boundary: s >= 1e-8 / qmax,
    1 / s normal), so s in [1, 2) covers every scale: for each s significand (s_bits: the low 23 bits, all
    by default) and boundary b, the x within `window` fp32 steps of RN(s b), positive (every step is odd in
    x). Returns (pairs, quotients unequal, codes unequal)."""
    s_bits = np.arange(1 << 23, dtype=np.uint32) if s_bits is None else np.asarray(s_bits, np.uint32)
    pairs = qdiff = cdiff = 0
    steps = np.arange(-window, window + 1, dtype=np.int32)
    for chunk in np.array_split(s_bits, max(1, len(s_bits) // (1 << 18))):
        s = ((np.uint32(127 << 23) | chunk).view(np.float32))[:, None]
        for k in range(int(qmax)):
            center = (s * np.float32(k + 0.5)).astype(np.float32)
            x = (center.view(np.int32) + steps[None, :]).view(np.float32)
            ref, got = (x / s).astype(np.float32), quotient(x, s)
            qdiff += int((ref != got).sum())
            cdiff += int((int_codes(ref, qmax) != int_codes(got, qmax)).sum())
            pairs += x.size
    return pairs, qdiff, cdiff


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
