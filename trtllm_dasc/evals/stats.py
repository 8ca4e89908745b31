"""Paired inference over unique instances (the paper's Appendix C).

The unique instance (problem) is the statistical unit. Each instance's repeated scores (generations,
replay rounds, random-mask draws) are averaged first; two arms are compared through the paired
instance-level differences; uncertainty comes from bootstrapping unique instances (percentile CI,
two-sided centered-bootstrap p-value), and a family of comparisons is corrected with Holm.

Resampling the per-instance differences is the same as resampling instances with all their
generations and both arms kept together: an instance's mean in each arm is a fixed function of its
own scores, so drawing the instance draws its difference.

numpy only, deterministic given a seed.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

# bootstrap means are computed a block of resamples at a time so that resamples x n indices never
# have to sit in memory at once (10,000 x 50,000 instances would be 4 GB of int64)
_MAX_DRAWS_PER_CHUNK = 1 << 22


def instance_means(scores: Mapping[Hashable, Sequence[float]]) -> dict[Hashable, float]:
    """Average each instance's repeated scores (generations, replay rounds, random masks)."""
    means = {}
    for instance_id, values in scores.items():
        values = np.asarray(values, dtype=float).ravel()
        if values.size == 0:
            # an instance with no score is a harness bug, not a zero; silently dropping it would bias the mean
            raise ValueError(f"instance {instance_id!r} has no scores")
        means[instance_id] = float(values.mean())
    return means


def paired_differences(a: Mapping[Hashable, float], b: Mapping[Hashable, float]
                       ) -> tuple[list[Hashable], np.ndarray]:
    """Per-instance differences a - b over the ids both arms scored, in sorted id order (the bootstrap's draws
    index them: the same scores in another dict order must give the same p).

    Ids present in only one arm cannot be paired; they are dropped and a UserWarning says how many
    (and which, for the first few), so a missing instance never passes unnoticed.
    """
    ids = sorted((instance_id for instance_id in a if instance_id in b), key=repr)
    only_a = [instance_id for instance_id in a if instance_id not in b]
    only_b = [instance_id for instance_id in b if instance_id not in a]
    if only_a or only_b:
        examples = (only_a + only_b)[:5]
        warnings.warn(f"paired_differences dropped {len(only_a) + len(only_b)} unpaired instance(s) "
                      f"({len(only_a)} only in a, {len(only_b)} only in b), e.g. {examples!r}",
                      stacklevel=2)
    diffs = np.array([a[instance_id] - b[instance_id] for instance_id in ids], dtype=float)
    return ids, diffs


@dataclasses.dataclass(frozen=True)
class PairedResult:
    """A paired comparison: mean instance-level difference (in the scores' units, e.g. fractions), its
    percentile CI, centered-bootstrap p-value and, once a family is corrected, the Holm p-value."""
    n: int
    mean_diff: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float | None = None
    n_dropped: int = 0  # unpaired instances left out (compare_arms fills it in)

    def format_pp(self, digits: int = 1) -> str:
        """The result with fraction-valued scores shown as percentage points, e.g.
        '+3.2 pp [+1.1, +5.0], p=0.0040, Holm p=0.0120, n=200'."""
        def pp(value: float) -> str:
            return f"{100 * value:+.{digits}f}"
        text = f"{pp(self.mean_diff)} pp [{pp(self.ci_low)}, {pp(self.ci_high)}], p={self.p_value:.4f}"
        if self.p_holm is not None:
            text += f", Holm p={self.p_holm:.4f}"
        return text + f", n={self.n}"


def paired_bootstrap(diffs: Sequence[float] | np.ndarray, resamples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> PairedResult:
    """Bootstrap the mean of paired instance-level differences by resampling instances.

    With d the n differences and rng = np.random.default_rng(seed), each resample b draws the
    indices rng.integers(0, n, size=n) (all resamples together are the rows of one
    rng.integers(0, n, size=(resamples, n)) draw) and takes m_b = mean(d[indices]).

    - CI: the (1 - level)/2 and (1 + level)/2 percentiles of the m_b (np.percentile, linear).
    - Two-sided centered-bootstrap p-value: the bootstrap distribution shifted to mean zero, as H0
      says, is m_b - mean(d); then

          p = (1 + #{b : |m_b - mean(d)| >= |mean(d)|}) / (1 + resamples)

      so p lies in [1 / (1 + resamples), 1] and is exactly 1 when mean(d) == 0. Scores are often
      discrete (0/1 accuracy), so resamples that sit exactly on the boundary are common; ">=" is
      taken with a tolerance of 1e-9 * max|d| so that rounding in the means cannot decide such ties.

    n == 1: one instance says nothing about noise: the CI collapses to the difference and p is 1.0 (a
    cell brought down to one instance by misses is never marked significant). Identical differences
    over n >= 2: every m_b equals the mean, so the CI collapses to it; p is 1.0 when that mean is 0
    and the minimum 1 / (1 + resamples) otherwise (n instances that all moved the same way).
    """
    diffs = np.asarray(diffs, dtype=float).ravel()
    n = diffs.size
    if n == 0:
        raise ValueError("paired_bootstrap needs at least one instance-level difference")
    if not np.all(np.isfinite(diffs)):
        raise ValueError("paired_bootstrap got a NaN or infinite difference")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")

    rng = np.random.default_rng(seed)
    boot_means = np.empty(resamples)
    rows_per_chunk = max(1, _MAX_DRAWS_PER_CHUNK // n)
    # successive draws continue the same stream, so chunking gives the very indices one big draw would
    for start in range(0, resamples, rows_per_chunk):
        rows = min(rows_per_chunk, resamples - start)
        boot_means[start:start + rows] = diffs[rng.integers(0, n, size=(rows, n))].mean(axis=1)

    mean_diff = float(diffs.mean())
    tail = 100 * (1 - level) / 2
    ci_low, ci_high = np.percentile(boot_means, [tail, 100 - tail])
    # far above the rounding of a mean of n values (~ n * 1e-16 * max|d|), far below any real gap
    tie_tolerance = 1e-9 * float(np.abs(diffs).max())
    extreme = int(np.count_nonzero(np.abs(boot_means - mean_diff) >= abs(mean_diff) - tie_tolerance))
    p_value = (1 + extreme) / (1 + resamples) if n > 1 else 1.0
    return PairedResult(n=n, mean_diff=mean_diff, ci_low=float(ci_low), ci_high=float(ci_high),
                        p_value=p_value)


def compare_arms(per_instance_scores_a: Mapping[Hashable, Sequence[float]],
                 per_instance_scores_b: Mapping[Hashable, Sequence[float]],
                 resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> PairedResult:
    """Arm a minus arm b: instance means -> paired differences -> bootstrap over instances."""
    means_a = instance_means(per_instance_scores_a)
    means_b = instance_means(per_instance_scores_b)
    _, diffs = paired_differences(means_a, means_b)
    n_dropped = len(means_a.keys() ^ means_b.keys())
    result = paired_bootstrap(diffs, resamples=resamples, seed=seed, level=level)
    return dataclasses.replace(result, n_dropped=n_dropped)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    With the m p-values sorted ascending p_(1) <= ... <= p_(m):
    adj_(k) = min(1, max_{j <= k} (m - j + 1) * p_(j)); the running max keeps them monotone.
    """
    p = np.asarray(p_values, dtype=float).ravel()
    if np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must lie in [0, 1], got {list(p_values)}")
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = (m - np.arange(m)) * p[order]
    adjusted_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted.tolist()


def with_holm(results: Sequence[PairedResult]) -> list[PairedResult]:
    """The same results with p_holm filled in, the family being exactly these comparisons."""
    adjusted = holm([result.p_value for result in results])
    return [dataclasses.replace(result, p_holm=p) for result, p in zip(results, adjusted)]


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the average of the ranks they span."""
    n = values.size
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts_group = np.r_[True, sorted_values[1:] != sorted_values[:-1]]
    group_of_sorted = np.cumsum(starts_group) - 1
    starts = np.flatnonzero(starts_group)
    ends = np.r_[starts[1:], n]  # exclusive
    average_rank = (starts + ends - 1) / 2 + 1
    ranks = np.empty(n)
    ranks[order] = average_rank[group_of_sorted]
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks, so ties are handled).

    NaN when either side is constant (the correlation is undefined), has fewer than two values, or
    contains a NaN (propagated, as scipy.stats.spearmanr does by default).
    """
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.size != y.size:
        raise ValueError(f"spearman needs equal lengths, got {x.size} and {y.size}")
    if x.size < 2 or np.any(np.isnan(x)) or np.any(np.isnan(y)):
        return math.nan
    if np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan
    rank_x = _average_ranks(x) - (x.size + 1) / 2  # average ranks always have mean (n + 1) / 2
    rank_y = _average_ranks(y) - (y.size + 1) / 2
    rho = float(rank_x @ rank_y / math.sqrt((rank_x @ rank_x) * (rank_y @ rank_y)))
    return max(-1.0, min(1.0, rho))  # rounding can step just past +-1


def median_iqr(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile), ignoring NaN; all NaN when no value is left."""
    values = np.asarray(values, dtype=float).ravel()
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan, math.nan  # np.nanmedian would warn and return the same
    median, q25, q75 = np.percentile(values, [50, 25, 75])
    return float(median), float(q25), float(q75)
