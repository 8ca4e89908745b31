"""The fma quotient the GPU kernels use instead of div_rn (kernels._div_fma) gives the reference's codes:
its numpy twin (fma_quotient.py, an exact fma by round-to-odd) against ieee fp32 division, on every bf16 x
of an amax's 12 binades for every bf16 amax of several binades (the whole bf16 range: `python
tests/state/fma_quotient.py`, about 40 s). The kernels' own fast path runs on a GPU only (the interpreter's
fma rounds twice): test_conv8's cuda test compares it with the torch reference. And for the int4 rows
(fp32): every x near a code boundary for sampled scale significands (all of them in the __main__, ~80 s)."""
import numpy as np
import pytest

from fma_quotient import bf16_values, check_bf16, check_fp32_boundaries, check_floor, fast_quotient, fma32


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
    # the int4 store's fp32 rows: every 97th scale significand and the all-ones one (Markstein's edge case:
    # s = 2 - 2^-23, x = 1 sits 2^-71 above an fp32 midpoint), every x within 8 steps of each k + 1/2
    pairs, qdiff, cdiff = check_fp32_boundaries(7.0, np.append(np.arange(0, 1 << 23, 97), (1 << 23) - 1))
    assert pairs > 1_000_000 and qdiff == 0 and cdiff == 0
