"""Token sampling: greedy, or seeded temperature / top-k / top-p (one torch.Generator per request so a
request's draws do not depend on what else is in the batch)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_dasc.errors import UserError


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: no top-k cut
    top_p: float = 1.0            # 1: no nucleus cut
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class Sampler:
    """Picks the next token of one request from its last-position logits [vocab]."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator()
            self.generator.manual_seed(params.seed if params.seed is not None else 0)

    def __call__(self, logits: torch.Tensor) -> int:
        p = self.params
        logits = logits.float().cpu()
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if p.top_k:
            kth = torch.topk(logits, min(p.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # keep the smallest prefix whose mass reaches top_p (always at least the top token)
            drop = torch.cumsum(sorted_probs, 0) - sorted_probs >= p.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=self.generator))
