"""One admitted request's bookkeeping inside the scheduler (ints and lists: rows, blocks, slots)."""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.cache import MatchResult
from trtllm_dasc.engine.request import GenerationRequest


@dataclass(slots=True)
class Replay:
    """A pending dasc-wr replay: tokens [start, end) from a zero scratch row, on its own KV table (the
    shared blocks before start, then blocks of its own for what it recomputes)."""

    start: int
    end: int
    row: int
    table: list[int]


@dataclass(slots=True, eq=False)
class Sequence:
    req: GenerationRequest
    callback: object                      # callable(RequestOutput) or None
    row: int = -1                         # active recurrent-state row (-1: not admitted yet)
    table: list[int] = field(default_factory=list)   # KV blocks for positions [0, prompt + max_new - 1)
    match: MatchResult | None = None      # what admission matched; match.ckpt_node is locked until release
    positions: list[int] = field(default_factory=list)   # where this prompt's prefill stores checkpoints
    done_tokens: int = 0                  # prompt tokens processed (starts at the cached prefix)
    replay: Replay | None = None
    captured: dict = field(default_factory=dict)   # position -> checkpoint slot, handed to the tree
    output: list[int] = field(default_factory=list)
    context_logits: list = field(default_factory=list)   # chunks of returned prompt logits
    cum_log_prob: float = 0.0             # sum of the output tokens' log probs (return_log_probs)
    step_log_prob: float | None = None    # the last sampled token's, until it is emitted
    step_gen_logits: object = None        # the last sampled token's raw logits [vocab], until it is emitted
    finish_reason: str | None = None

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
