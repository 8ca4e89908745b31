"""The fma quotient the GPU kernels use instead of div_rn (kernels._div_fma) gives the reference's codes:
its numpy twin (fma_quotient.py, an exact fma by round-to-odd) against ieee fp32 division, on every bf16 x
of an amax's 12 binades for every bf16 amax of several binades (the whole bf16 range: `python
tests/state/fma_quotient.py`, about 40 s). The kernels' own fast path runs on a GPU only (the interpreter's
fma rounds twice): test_conv8's cuda test compares it with the torch reference. And for the int4 and fp8
rows (fp32): every x near a code boundary (int4's k + 1/2, every e4m3fn midpoint) for sampled scale
significands (all of them in the __main__: int4 ~70 s, fp8 ~190 s)."""
import numpy as np
import pytest
import torch

from fma_quotient import (bf16_values, check_bf16, check_floor, check_fp8_small, check_fp32_boundaries,
                          check_scaling, fast_quotient, fma32, fp8_boundaries, fp8_codes, fp8_values)

# every 97th scale significand and the all-ones one (Markstein's edge case: s = 2 - 2^-23, x = 1 sits 2^-71
# above an fp32 midpoint)
SAMPLED = np.append(np.arange(0, 1 << 23, 97), (1 << 23) - 1)


def _binades(*exps):
    return np.concatenate([bf16_values((127 + e) << 7, (128 + e) << 7) for e in exps])


def test_fma32_is_correctly_rounded():
    # against exact rationals: a b + c with c near -a b, where a plain float32 a * b + c would be far off
    from fractions import Fraction as F
    g = np.random.default_rng(3)
    a, b = g.standard_normal(2000).astype(np.float32), g.standard_normal(2000).astype(np.float32)
    c = (-(a * b) * np.float32(1 + 2 ** -20)).astype(np.float32)
    # and one just above an fp32 midpoint by far less than a float64 ulp: 0.5 + 2^-25 + 2^-71 (rounds up)
    a[0], b[0], c[0] = np.float32(-(2.0 ** -24) + 2.0 ** -47), np.float32(0.5 + 2.0 ** -24), np.float32(0.5 + 2.0 ** -24)
    got = fma32(a, b, c)
    assert got[0] == np.float32(0.5 + 2.0 ** -24)
    for i in range(0, 2000, 7):
        exact = F(float(a[i])) * F(float(b[i])) + F(float(c[i]))
        up, dn = (np.nextafter(got[i], np.float32(d)) for d in (np.inf, -np.inf))
        err = abs(F(float(got[i])) - exact)
        assert err <= abs(F(float(up)) - exact) and err <= abs(F(float(dn)) - exact), i


@pytest.mark.parametrize("qmax", [127.0, 7.0], ids=["int8", "int4"])
def test_fma_quotient_codes_equal_ieee_on_bf16(qmax):
    amax = _binades(-3, -2, -1, 0, 1, 2, -27, -100, 100, 126)
    pairs, qdiff, cdiff = check_bf16(amax, qmax)
    assert pairs > 2_000_000 and qdiff == 0 and cdiff == 0
    fpairs, fdiff = check_floor(qmax)
    assert fpairs > 20_000 and fdiff == 0


def test_the_check_sees_an_uncorrected_quotient():
    # RN(x RN(1 / s)) alone (no fma correction) is not the ieee quotient: the check must see its codes
    def product(x, s):
        with np.errstate(all="ignore"):
            return x * (np.float32(1) / s)
    _, qdiff, cdiff = check_bf16(_binades(0, 1), 127.0, quotient=product)
    assert qdiff > 0 and cdiff > 0
    assert check_bf16(_binades(0, 1), 127.0, quotient=fast_quotient)[1:] == (0, 0)


def test_fma_quotient_int4_codes_equal_ieee_on_fp32_near_boundaries():
    # the int4 store's fp32 rows: the sampled scale significands, every x within 8 steps of each k + 1/2
    pairs, qdiff, cdiff = check_fp32_boundaries(7.0, SAMPLED)
    assert pairs > 1_000_000 and qdiff == 0 and cdiff == 0


def _product(x, s):
    # RN(x RN(1 / s)) alone (no fma correction): not the ieee quotient
    with np.errstate(all="ignore"):
        return x.astype(np.float32) * (np.float32(1) / s)


def test_fp8_boundaries_are_every_e4m3fn_midpoint():
    # against torch's own e4m3fn: every byte as a float8_e4m3fn, the finite non-negative ones, midpoints
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    v = torch.unique(v[torch.isfinite(v) & (v >= 0)]).numpy()          # sorted; -0 and +0 once
    assert len(v) == 127 and v[-1] == 448
    np.testing.assert_array_equal(fp8_values(), v.astype(np.float32))
    np.testing.assert_array_equal(fp8_boundaries(), ((v[:-1] + v[1:]) / 2).astype(np.float32))
    # each is where the code steps: just below a midpoint is the lower value's code, just above the next one
    b = fp8_boundaries()
    below, above = np.nextafter(b, np.float32(0)), np.nextafter(b, np.float32(np.inf))
    np.testing.assert_array_equal(fp8_codes(above).astype(int), fp8_codes(below).astype(int) + 1)


def test_fma_quotient_fp8_codes_equal_ieee_on_fp32_near_boundaries():
    # the fp8 store's fp32 rows: the sampled scale significands, every x within 8 steps of each of the 16
    # midpoint significands, codes (torch's cast) at each of the 126 midpoints
    pairs, qdiff, cdiff = check_fp32_boundaries(448.0, SAMPLED, boundaries=fp8_boundaries(), codes=fp8_codes)
    assert pairs > 20_000_000 and qdiff == 0 and cdiff == 0
    # the reduction to s in [1, 2) and 16 significands, checked at the scales' extremes (the floor 1e-8 / 448
    # is in 2^-36's binade, 2^128 / 448 in 2^119's) and every midpoint
    pairs, diff = check_scaling(SAMPLED[::50], fp8_boundaries(), (-36, -20, 0, 60, 119))
    assert pairs > 10_000_000 and diff == 0


def test_fp8_check_sees_an_uncorrected_quotient():
    pairs, qdiff, cdiff = check_fp32_boundaries(448.0, SAMPLED[::20], quotient=_product, boundaries=fp8_boundaries(),
                                                codes=fp8_codes)
    assert qdiff > 0 and cdiff > 0


def test_fp8_signed_zero_and_tiny_quotients():
    # the store keeps x where x == 0 (fma_quotient.fp8_quotient): the bare fma sequence loses -0's sign, one
    # code (0x00 for torch's 0x80) for each of the four scales
    pairs, cdiff = check_fp8_small()
    assert pairs > 100_000 and cdiff == 0
    assert check_fp8_small(fast_quotient)[1] == 4
