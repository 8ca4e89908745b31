"""One admitted request's bookkeeping inside the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.cache import MatchResult
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import Sampler


@dataclass(slots=True)
class Replay:
    """A pending dasc-wr replay: tokens [start, end) from a zero scratch row, on a forked KV sequence."""

    start: int
    end: int
    row: int
    seq_id: object


@dataclass(slots=True, eq=False)
class Sequence:
    req: GenerationRequest
    sampler: Sampler
    on_token: object                      # callable(token_id, final, stats) or None
    row: int                              # active recurrent-state row
    seq_id: object                        # KV sequence id
    match: MatchResult
    positions: list[int]                  # where this prompt's prefill stores checkpoints
    done_tokens: int                      # prompt tokens processed (starts at the cached prefix)
    replay: Replay | None = None
    captured: dict = field(default_factory=dict)   # position -> checkpoint slot, handed to the tree
    output: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt

    @property
    def in_prefill(self) -> bool:
        return self.done_tokens < len(self.req.prompt)

    def blocks_needed(self, block_size: int, have: int) -> int:
        """KV blocks still to be allocated for the whole request: its tokens, two copy-on-writes (a hit
        inside a shared block; the first decode into the prompt's last block, shared once inserted),
        and a pending wr replay's forked sequence."""
        total = -(-(len(self.req.prompt) + self.req.max_new_tokens) // block_size)
        replay = -(-(self.replay.end - self.replay.start) // block_size) + 1 if self.replay else 0
        return max(0, total - have) + 2 + replay
