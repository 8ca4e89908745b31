"""A deterministic synthetic MMLU-Pro-shaped workload in token ids, and the paper's capacity-boundary blocks.

MMLU-Pro's test split has 12,032 questions in 14 categories; the paper's prompts put a category's few-shot
prefix (shared by all its questions, 1.5k-2.5k tokens) before each question (100-300 tokens). The dataset
itself is out of reach here (nothing downloads), and what the serving protocol measures depends only on
the lengths and on which tokens are shared, so the ids are drawn from seeded generators: one per category
prefix and one per question, so any prompt is made on demand without building the whole set.
Prompts are ordered category by category (a subject-grouped dataset), so a block of consecutive prompts
shares one or two prefixes, as a slice of such a dataset does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from trtllm_dasc.errors import UserError

# MMLU-Pro test split, questions per category (they sum to 12,032)
MMLU_PRO_CATEGORIES = {
    "math": 1351, "physics": 1299, "chemistry": 1132, "law": 1101, "engineering": 969, "other": 924,
    "economics": 844, "health": 818, "psychology": 798, "business": 789, "biology": 717, "philosophy": 499,
    "computer science": 410, "history": 381}


@dataclass(slots=True)
class WorkloadConfig:
    vocab: int                          # ids are drawn from [first_id, vocab)
    prompts: int = 12032
    scale: float = 1.0                  # multiplies every token length (CPU runs use ~0.1)
    prefix_tokens: tuple[int, int] = (1500, 2500)
    question_tokens: tuple[int, int] = (100, 300)
    seed: int = 0
    # below this id sit pad/bos/eos in the tokenizers we serve: a synthetic prompt should not contain them
    first_id: int = 3

    def __post_init__(self):
        if not isinstance(self.prompts, int) or self.prompts < len(MMLU_PRO_CATEGORIES):
            raise UserError(f"prompts must be an integer >= {len(MMLU_PRO_CATEGORIES)} (one per category), "
                            f"got {self.prompts!r}")
        if not (isinstance(self.scale, (int, float)) and 0 < self.scale <= 16):
            raise UserError(f"scale must be a number in (0, 16], got {self.scale!r}")
        if not isinstance(self.vocab, int) or self.vocab <= self.first_id + 1:
            raise UserError(f"vocab must be an integer > {self.first_id + 1}, got {self.vocab!r}")
        for name in ("prefix_tokens", "question_tokens"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise UserError(f"{name} must be a range 1 <= lo <= hi, got {(lo, hi)}")

    def scaled(self, bounds: tuple[int, int]) -> tuple[int, int]:
        lo = max(1, round(bounds[0] * self.scale))
        return lo, max(lo, round(bounds[1] * self.scale))

    @property
    def max_prompt_tokens(self) -> int:
        return self.scaled(self.prefix_tokens)[1] + self.scaled(self.question_tokens)[1]


@dataclass(slots=True)
class Workload:
    cfg: WorkloadConfig
    categories: list[str] = field(default_factory=list)    # per prompt index
    prefixes: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.categories)

    def prompt(self, i: int) -> np.ndarray:
        """Prompt i: its category's prefix, then its own question (int32 ids)."""
        lo, hi = self.cfg.scaled(self.cfg.question_tokens)
        rng = np.random.default_rng([self.cfg.seed, 1, i])
        question = rng.integers(self.cfg.first_id, self.cfg.vocab, size=int(rng.integers(lo, hi + 1)))
        return np.concatenate([self.prefixes[self.categories[i]], question]).astype(np.int32)


def category_counts(prompts: int) -> dict[str, int]:
    """MMLU-Pro's category sizes scaled to ``prompts`` (largest remainder, each category at least one)."""
    total = sum(MMLU_PRO_CATEGORIES.values())
    exact = {c: n * prompts / total for c, n in MMLU_PRO_CATEGORIES.items()}
    counts = {c: max(1, math.floor(x)) for c, x in exact.items()}
    by_remainder = sorted(exact, key=lambda c: (-(exact[c] - math.floor(exact[c])), c))
    for c in by_remainder[:prompts - sum(counts.values())]:
        counts[c] += 1
    return counts


def build_workload(cfg: WorkloadConfig) -> Workload:
    lo, hi = cfg.scaled(cfg.prefix_tokens)
    work = Workload(cfg)
    for k, (name, n) in enumerate(category_counts(cfg.prompts).items()):
        rng = np.random.default_rng([cfg.seed, 0, k])
        work.prefixes[name] = rng.integers(cfg.first_id, cfg.vocab, size=int(rng.integers(lo, hi + 1)))
        work.categories.extend([name] * n)
    return work


def block_size(slots: int, target: float = 0.85) -> int:
    """Q(W) = ceil(N(W) / target): the unique prompts of a block at an arm's capacity boundary (App. C.2).
    Exact rational arithmetic: 17 / 0.85 is 20 and must not become 21 through a float's last bit."""
    if slots < 1:
        raise UserError(f"an arm with {slots} checkpoint slots has no capacity boundary: raise the budget")
    return math.ceil(Fraction(slots) / Fraction(str(target)))


def phase_blocks(prompts: int, q: int, max_blocks: int | None = None, seed: int | None = None) -> list[tuple[int, int]]:
    """The dataset cut into floor(prompts / Q) consecutive blocks of Q (the paper: 80 for Q = 150 of 12,032);
    with ``max_blocks`` a subset of them: evenly spread, or with ``seed`` a seeded sample (a budget that
    does not favour any part of the dataset; it depends on the seed, Q and the dataset only, so every arm
    of a measurement replays the same blocks)."""
    n = prompts // q
    if n == 0:
        raise UserError(f"a block of {q} prompts does not fit in a dataset of {prompts}: raise --prompts")
    if max_blocks is None or max_blocks >= n:
        picks = range(n)
    elif seed is not None:
        picks = sorted(int(x) for x in np.random.default_rng([seed, q, prompts]).choice(n, max_blocks, replace=False))
    else:
        picks = sorted({(2 * i + 1) * n // (2 * max_blocks) for i in range(max_blocks)})
    return [(b * q, (b + 1) * q) for b in picks]
