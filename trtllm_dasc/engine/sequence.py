"""One admitted request's bookkeeping inside the scheduler (ints and lists: rows, blocks, slots)."""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.cache.manager import Lease, Replay
from trtllm_dasc.engine.request import GenerationRequest

__all__ = ["Replay", "Sequence"]


@dataclass(slots=True, eq=False)
class Sequence:
    req: GenerationRequest
    callback: object                      # callable(RequestOutput) or None
    # what the cache manager reserved at admission (rows, blocks, lock, captures); None while waiting
    lease: Lease | None = None
    done_tokens: int = 0                  # prompt tokens processed (starts at the cached prefix)
    output: list[int] = field(default_factory=list)
    context_logits: list = field(default_factory=list)   # chunks of returned prompt logits
    cum_log_prob: float = 0.0             # sum of the output tokens' log probs (return_log_probs)
    step_log_prob: float | None = None    # the last sampled token's, until it is emitted
    step_gen_logits: object = None        # the last sampled token's raw logits [vocab], until it is emitted
    finish_reason: str | None = None
    # a host-tier hit admitted while others decode: its loads and resets, held back one step so that its
    # promotion's copy overlaps that step's compute (StepPlan's loads, warm_loads, resets); None otherwise
    joining: object = None

    # the lease's parts under their old names (read-only: the cache manager changes them)
    @property
    def row(self) -> int:
        """Active recurrent-state row (-1: not admitted yet, or released)."""
        return self.lease.row if self.lease is not None else -1

    @property
    def table(self) -> list[int]:
        return self.lease.table if self.lease is not None else []

    @property
    def match(self):
        return self.lease.match if self.lease is not None else None

    @property
    def replay(self) -> Replay | None:
        return self.lease.replay if self.lease is not None else None

    @property
    def captured(self) -> dict:
        return self.lease.captured if self.lease is not None else {}

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt

    @property
    def rid(self):
        return self.req.request_id

    @property
    def in_prefill(self) -> bool:
        return self.done_tokens < len(self.req.prompt)

    @property
    def end_len(self) -> int:
        """Positions whose KV this request may write: the prompt and every output token but the last
        (which is sampled, never fed back)."""
        return len(self.req.prompt) + self.req.max_new_tokens - 1
