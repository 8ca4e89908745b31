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


def sample(logits: torch.Tensor, params: SamplingParams, token_index: int) -> int:
    """The next token from one position's logits [vocab] (any device)."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits.float().cpu() / params.temperature
    if params.top_k:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the top token)
        drop = torch.cumsum(sorted_probs, 0) - sorted_probs >= params.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        probs = probs / probs.sum()
    gen = torch.Generator().manual_seed(draw_seed(params.seed, token_index))
    return int(torch.multinomial(probs, 1, generator=gen))
