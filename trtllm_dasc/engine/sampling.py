"""Token sampling: greedy, or seeded temperature / top-k / top-p.

Sampling is stateless: the draw of output token i of a request uses a generator seeded from (seed, i), so
a request's tokens depend on neither the batch it ran in nor on which process samples it (TP ranks, a
restarted worker), and a sampling decision is plain data in a StepPlan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtllm_dasc.errors import UserError

U64 = 1 << 64


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: no top-k cut (1: greedy)
    top_p: float = 1.0            # 1: no nucleus cut
    seed: int | None = None       # None: 0

    def __post_init__(self):
        self.temperature = _real("temperature", self.temperature)
        if not self.temperature >= 0.0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}")
        self.top_p = _real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < U64:
                raise UserError(f"seed must lie in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def _integer(name: str, value) -> int:
    """An int (numpy/torch integer scalars accepted; bools and floats refused)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise UserError(f"{name} must be an integer, got {value!r}")
    return int(value.__index__())


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise UserError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise UserError(f"{name} must be finite, got {value!r}")
    return out


def draw_seed(seed: int | None, token_index: int) -> int:
    """A 63-bit generator seed from (request seed, output index): splitmix64 of their combination."""
    z = ((seed or 0) + 0x9E3779B97F4A7C15 * (token_index + 1)) % U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % U64
    return (z ^ (z >> 31)) >> 1


def draw_uniform(seed: int | None, token_index: int) -> float:
    """The one uniform number in [0, 1) that decides output token token_index of a request: drawn on the
    host from (seed, index) alone, so every device and every TP rank picks the same token from the same
    distribution."""
    gen = torch.Generator().manual_seed(draw_seed(seed, token_index))
    return float(torch.rand(1, generator=gen, dtype=torch.float64))


def sample(logits: torch.Tensor, params: SamplingParams, token_index: int) -> int:
    """The next token from one position's logits [vocab], computed where the logits are (a 151,936 or
    163,840-entry row never crosses to the host: only the chosen id does).

    temperature scales the logits; top-k keeps the k largest (ties at the k-th kept); softmax; the tokens
    are ranked by probability (ties by id) and top-p keeps the smallest prefix whose mass reaches top_p;
    the token is the first in that order whose cumulative mass exceeds u x the kept mass (inverse CDF), u
    = draw_uniform(seed, token_index)."""
    if params.greedy:
        return int(torch.argmax(logits))
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    ranked, order = torch.sort(probs, descending=True, stable=True)
    # the running sums in fp64: 150k fp32 terms would carry ~1e-5 of rounding into every boundary; and
    # renormalised there: the fp32 softmax sums to 1 - O(1e-6) (its exp's last bits differ between CPU
    # kinds), which would move the top-p cut by that much
    ranked = ranked.double()
    ranked = ranked / ranked.sum()
    if params.top_p < 1.0:
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        ranked = ranked.masked_fill(torch.cumsum(ranked, 0) - ranked >= params.top_p, 0.0)
    cdf = torch.cumsum(ranked, 0)
    target = (cdf[-1] * draw_uniform(params.seed, token_index)).reshape(1)
    # the first rank whose cumulative mass exceeds the target has a probability > 0
    pos = torch.searchsorted(cdf, target, right=True).clamp_max(cdf.numel() - 1)
    return int(order[pos])
