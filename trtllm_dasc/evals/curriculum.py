"""The context-length curriculum of the quality models' training (evals/train.py).

Stages double the batch length from `start` (256, 512, 1024, ...) up to `max_length`; the last stage draws
lengths in [min_length, max_length]. A stage is left when the answer loss, smoothed by an exponential
moving average, falls under `advance_loss` (the model retrieves at this length), or after `stage_steps`
steps, whichever comes first. Why a gate and not a fixed schedule: with lengths reaching 4k after 300
steps, both tiny models sat at chance on the H200 (answer loss about 3, that is guessing among the answer
vocabulary, after 600-700 steps): retrieval is learned on short haystacks first, and only then moved out.

Lengths are rounded up to a multiple of `bucket`, so fla's kernels (autotuned per batch shape) see a
handful of shapes instead of a new one every step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class LengthCurriculum:
    start: int = 256
    min_length: int = 1024
    max_length: int = 4096
    bucket: int = 512
    advance_loss: float = 1.0
    stage_steps: int = 800
    ema_decay: float = 0.95
    min_stage_steps: int = 20           # the gate needs an EMA over this many batches, not one lucky batch
    # progress (saved with a staged run, so --resume continues the same stage)
    stage: int = 0
    steps_in_stage: int = 0
    ema: float | None = None

    def __post_init__(self):
        if not 64 <= self.start <= self.max_length:
            raise ValueError(f"curriculum start must be in [64, max_length={self.max_length}], got {self.start}")
        if not self.min_length <= self.max_length:
            raise ValueError(f"need min_length <= max_length, got {self.min_length}, {self.max_length}")
        if not 0.0 <= self.ema_decay < 1.0 or self.stage_steps < 1 or self.bucket < 1 or self.min_stage_steps < 1:
            raise ValueError("need 0 <= ema_decay < 1, stage_steps >= 1, min_stage_steps >= 1 and bucket >= 1")

    @property
    def caps(self) -> list[int]:
        """The batch length of every stage but the last (which draws from [min_length, max_length])."""
        caps, n = [], self.start
        while n < self.max_length:
            caps.append(n)
            n *= 2
        return caps

    @property
    def final(self) -> bool:
        return self.stage >= len(self.caps)

    def length(self, rng) -> int:
        """This step's batch length."""
        if not self.final:
            return self.caps[self.stage]
        return int(rng.choice(self.final_lengths))

    @property
    def final_lengths(self) -> list[int]:
        """The last stage's batch lengths: the bucket multiples in [min_length, max_length] (and max_length),
        drawn uniformly (rounding a uniform draw up would make the shortest one rare)."""
        first = -(-self.min_length // self.bucket) * self.bucket
        return sorted(set(range(first, self.max_length + 1, self.bucket)) | {self.max_length})

    def update(self, answer_loss: float) -> str | None:
        """Record one step's answer loss; returns a message when the stage changes."""
        self.ema = answer_loss if self.ema is None else self.ema_decay * self.ema + (1 - self.ema_decay) * answer_loss
        self.steps_in_stage += 1
        if self.final:
            return None
        learned = self.ema < self.advance_loss and self.steps_in_stage >= self.min_stage_steps
        if not learned and self.steps_in_stage < self.stage_steps:
            return None
        why = f"answer loss EMA {self.ema:.3f} < {self.advance_loss}" if learned else \
            f"{self.stage_steps} steps (answer loss EMA {self.ema:.3f})"
        old = self.caps[self.stage]
        self.stage += 1
        self.steps_in_stage = 0
        self.ema = None                 # a longer haystack is a new task: the EMA restarts
        new = "the final stage" if self.final else f"{self.caps[self.stage]} tokens"
        return f"curriculum: {old} -> {new} after {why}"

    def state(self) -> dict:
        return asdict(self)

    def resume(self, state: dict) -> None:
        """Continue a staged run's progress (stage, steps in it, EMA) under this run's settings: a resume
        with new --stage-steps or lengths takes them, it is not overridden by the saved ones."""
        self.stage = min(int(state.get("stage", 0)), len(self.caps))
        self.steps_in_stage = int(state.get("steps_in_stage", 0))
        self.ema = state.get("ema")
