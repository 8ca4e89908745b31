"""CUDA graphs of decode steps: one per batch-size bucket (1, 2, 4, ..., max_batch), replayed with the
step's tokens copied into fixed buffers; anything else runs eagerly (model.forward).

Why: a decode step of the Kimi-Linear-shaped stack is hundreds of small kernels, each launched from Python;
at batch 1 the launches, not the weight reads, set the step time. A graph replays them in one launch.

What a graph needs, and where it comes from: HybridModel.decode_static (no host values inside: the batched
paged attention, fla's recurrent kernels in batch mode, the one-token conv update); fixed buffers for the
token ids, positions, state rows, block tables ([max_batch, max_blocks]), lengths and new KV rows; and, for
the padding of a batch up to its bucket, one state row and one KV block that no request owns (pad_row,
pad_block: the caller reserves them; padded entries write garbage there and nowhere else).
Off the GPU (use_graphs False) the same buffers run decode_static eagerly: the tests' path.
"""
from __future__ import annotations

import torch

from trtllm_dasc.model.kv_cache import PagedKVCache
from trtllm_dasc.model.state import RecurrentState


def buckets_for(max_batch: int) -> list[int]:
    """Powers of two up to max_batch, and max_batch itself."""
    return sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})


def capturable(model) -> bool:
    """Whether a decode step of this model can be captured: on a GPU, and with dense MLPs only (an MoE
    layer's expert loop reads its routing on the host, model/mlp.py)."""
    from trtllm_dasc.model.mlp import DenseMLP
    return model.device.type == "cuda" and all(isinstance(m, DenseMLP) for _, m, *_ in model.layers)


class DecodeGraphs:
    def __init__(self, model, state: RecurrentState, kv: PagedKVCache, max_batch: int, max_blocks: int,
                 pad_row: int, pad_block: int, use_graphs: bool | None = None):
        if not 0 <= pad_row < state.num_rows or not 0 <= pad_block < kv.cfg.num_blocks:
            raise ValueError(f"pad row {pad_row} / pad block {pad_block} outside the state / KV cache")
        self.model, self.state, self.kv = model, state, kv
        self.max_batch, self.max_blocks = max_batch, max_blocks
        self.pad_row, self.pad_block = pad_row, pad_block
        self.buckets = buckets_for(max_batch)
        self.use_graphs = capturable(model) if use_graphs is None else use_graphs and capturable(model)
        dev, B = model.device, max_batch
        self.ids = torch.zeros(B, dtype=torch.long, device=dev)
        self.positions = torch.zeros(B, dtype=torch.long, device=dev)
        self.rows = torch.zeros(B, dtype=torch.long, device=dev)
        self.tables = torch.zeros(B, max_blocks, dtype=torch.int32, device=dev)
        self.lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.new_rows = torch.zeros(B, dtype=torch.long, device=dev)
        self.graphs: dict[int, tuple] = {}       # bucket -> (CUDAGraph, its logits output)
        self.pool = None                         # one memory pool shared by every bucket's graph
        self._pad(0, B)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def eligible(self, starts: list[int]) -> bool:
        """A batch of one-token sequences at positions starts that the buffers can hold (the caller checks
        the rest; run's decode_tables validates the block tables)."""
        bs = self.kv.block_size
        return (0 < len(starts) <= self.max_batch and self.model.tp_size == 1
                and all(s // bs + 1 <= self.max_blocks for s in starts))

    def _pad(self, a: int, b: int) -> None:
        """Entries a..b-1 are padding: the reserved state row, one key in the reserved block."""
        self.ids[a:b] = 0
        self.positions[a:b] = 0
        self.rows[a:b] = self.pad_row
        self.tables[a:b] = self.pad_block
        self.lens[a:b] = 1
        self.new_rows[a:b] = self.pad_block * self.kv.block_size

    def _body(self, b: int) -> torch.Tensor:
        return self.model.decode_static(self.ids[:b], self.positions[:b], self.rows[:b],
                                        (self.tables[:b], self.lens[:b], self.new_rows[:b]), self.state, self.kv)

    def capture(self, b: int) -> None:
        """Record bucket b's graph (warm-up runs first: Triton compiles and autotunes outside the capture).
        Every entry is padding meanwhile: the warm-up runs execute, and must touch only the reserved row."""
        self._pad(0, b)
        side = torch.cuda.Stream(device=self.model.device)
        side.wait_stream(torch.cuda.current_stream(self.model.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._body(b)
        torch.cuda.current_stream(self.model.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._body(b)
        self.pool = graph.pool()
        self.graphs[b] = (graph, out)

    def warmup(self) -> None:
        """Capture every bucket now, before serving (a capture inside a user's first step costs seconds)."""
        if self.use_graphs:
            for b in self.buckets:
                if b not in self.graphs:
                    self.capture(b)

    def run(self, ids: torch.Tensor, starts: list[int], rows: list[int], decode) -> torch.Tensor:
        """Logits fp32 [n, vocab] of one decode step: ids [n] (one token per sequence at position starts[i],
        state row rows[i]) and decode = kv.decode_tables(their block tables, starts), which validates the
        tables; the rest the caller checked (model.forward's checks). A failing capture raises before any
        real row is touched; after that, errors are the step's own."""
        n = len(starts)
        b = self.bucket(n)
        tables, lens, new_rows = decode
        if self.use_graphs and b not in self.graphs:
            self.capture(b)                 # pads the buffers first: the real entries are filled below
        self.ids[:n].copy_(ids, non_blocking=True)
        self.positions[:n].copy_(torch.tensor(starts, dtype=torch.long), non_blocking=True)
        self.rows[:n].copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
        self.tables[:n].zero_()
        self.tables[:n, :tables.shape[1]].copy_(tables)
        self.lens[:n].copy_(lens)
        self.new_rows[:n].copy_(new_rows)
        self._pad(n, b)
        if not self.use_graphs:
            return self._body(b)[:n]
        graph, out = self.graphs[b]
        graph.replay()
        return out[:n].clone()       # the next replay overwrites the graph's output
