"""DirectRunner: the model without a scheduler, for tests, benchmarks and one-off tools.

Row r owns the fixed KV blocks [r * M, (r + 1) * M) (M = blocks for ``max_tokens``), so nothing is
allocated and no prefix is shared; it tracks how many tokens each row holds and builds the SeqInputs.
The serving engine never uses this: its rows and blocks come from cache/allocators.py.
"""
from __future__ import annotations

from trtllm_dasc.model.model import HybridModel, SeqInput


class DirectRunner:
    def __init__(self, model: HybridModel, rows: int = 1, max_tokens: int = 1024, block_size: int = 16):
        self.model = model
        self.blocks_per_row = -(-max_tokens // block_size)
        self.state = model.new_state(rows)
        self.kv = model.new_kv_cache(rows * self.blocks_per_row, block_size)
        self.lengths = [0] * rows

    def table(self, row: int) -> list[int]:
        return list(range(row * self.blocks_per_row, (row + 1) * self.blocks_per_row))

    def seq(self, token_ids, row: int, capture_at=()) -> SeqInput:
        """The next tokens of ``row`` (capture_at: absolute prefix lengths)."""
        return SeqInput(token_ids, row, self.table(row), self.lengths[row], tuple(capture_at))

    def forward(self, batch: list[SeqInput], logits="all", **kw):
        out = self.model.forward(batch, self.state, self.kv, logits, **kw)
        for s in batch:
            self.lengths[s.row] = s.start + len(s.token_ids)
        return out

    def run(self, token_ids, row: int = 0, logits="all", capture_at=(), **kw):
        """One sequence's next tokens; returns the ForwardOutput."""
        return self.forward([self.seq(token_ids, row, capture_at)], logits, **kw)

    def reset(self, row: int) -> None:
        """Forget a row: zero state, no cached tokens (its blocks are simply overwritten later)."""
        self.state.reset([row])
        self.lengths[row] = 0
