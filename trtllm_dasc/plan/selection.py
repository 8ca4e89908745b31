"""Unit selection for a threshold W_max, the ragged / padded temporal layouts, and the dasc-wr window.

A unit is *global* (kept in the checkpoint) iff H_s > W_max (paper Sec. 4.1); W_max = 0 keeps every unit.
Ragged layout: layer l's r_l kept units are flat-packed at offsets o_0 = 0, o_{l+1} = o_l + r_l.
Padded layout: every layer reserves R_max = max_l r_l positions (App. B, Scheme 1).
"""
from __future__ import annotations

import math

import numpy as np

from trtllm_dasc.errors import UserError


# horizons are doubles, compared with W_max: past 2^53 not every integer is a double, so a larger W_max
# would no longer mean what it says (a wr window is further bounded by the cached tokens it replays)
MAX_WMAX = 2**53


def check_wmax(wmax) -> int:
    if isinstance(wmax, bool) or not isinstance(wmax, int):
        raise UserError(f"--wmax must be an integer number of tokens, got {wmax!r}")
    if wmax < 0:
        raise UserError(f"--wmax must be >= 0 (0 keeps every unit), got {wmax}")
    if wmax > MAX_WMAX:
        raise UserError(f"--wmax must be at most {MAX_WMAX} tokens (2^53: the doubles' integers), got {wmax}")
    return wmax


def select_units(horizons: list[np.ndarray], wmax: int) -> list[list[int]]:
    """Sorted kept unit ids per linear layer."""
    check_wmax(wmax)
    if wmax == 0:
        return [list(range(len(h))) for h in horizons]
    return [np.flatnonzero(h > wmax).tolist() for h in horizons]


def random_units(counts: list[int], units_per_layer: int, mask_seed: int) -> list[list[int]]:
    """The paper's count-matched control (Sec. 5, Table 3): per layer, ``counts[l]`` units drawn uniformly
    without replacement, seeded by (mask_seed, layer), so compression is the decay selection's and only
    the ranking differs. Paper seeds: 1234, 2027, 3407, 4519, 5683."""
    out = []
    for layer, r in enumerate(counts):
        rng = np.random.default_rng([mask_seed, layer])
        out.append(sorted(rng.choice(units_per_layer, size=r, replace=False).tolist()))
    return out


def ragged_offsets(retained_counts: list[int]) -> list[int]:
    """o_0 = 0, o_{l+1} = o_l + r_l: L + 1 entries, the last is the slot width sum_l r_l."""
    offsets = [0]
    for r in retained_counts:
        offsets.append(offsets[-1] + r)
    return offsets


def padded_width(retained_counts: list[int]) -> int:
    """R_max: positions every layer reserves in the padded layout."""
    return max(retained_counts, default=0)


def replay_unit_window(horizon: float, wmax: int) -> int:
    """One omitted unit's replay window: its horizon rounded up to a power of two, clamped to [4, W_max]."""
    if horizon <= 1:
        pow2 = 1
    elif math.isinf(horizon):
        pow2 = wmax
    else:
        # frexp is exact (horizon = m * 2^e, 0.5 <= m < 1): the power of two at or above it without a log2,
        # whose last ulp could move a horizon that is itself a power of two
        m, e = math.frexp(horizon)
        pow2 = 1 << (e - 1 if m == 0.5 else e)
    return int(min(max(pow2, 4), wmax))


def replay_window(horizons: list[np.ndarray], retained: list[list[int]], wmax: int) -> int:
    """dasc-wr replays the longest window over all omitted units (paper Sec. 4.2); 0 when none is omitted."""
    longest = 0
    for h, kept in zip(horizons, retained):
        omitted = np.ones(len(h), dtype=bool)
        omitted[kept] = False
        if omitted.any():
            longest = max(longest, replay_unit_window(float(h[omitted].max()), wmax))
    return longest
