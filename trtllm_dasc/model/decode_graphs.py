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

The host work around a replay is kept to two copies in and one out, because at batch 1 it was a sixth of
the step (measured on an H200 by `python -m benchmarks decode_step --model DIR --profile 1`: step 2.90 ms,
the graph alone 2.40 ms): the inputs are written into pinned host mirrors (plain Python, no torch ops) and
copied in two non-blocking copies; the graph itself takes each row's argmax and whether its logits are
finite, which come back in one small copy (the sampler's greedy choice and health check, without three more
kernels and two syncs after the replay).
"""
from __future__ import annotations

import torch

from trtllm_dasc.model.kv_cache import PagedKVCache
from trtllm_dasc.model.state import RecurrentState
from trtllm_dasc.model.mlp import DenseMLP


def buckets_for(max_batch: int) -> list[int]:
    """Powers of two up to max_batch, and max_batch itself."""
    return sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})


def capturable(model) -> bool:
    """Whether a decode step of this model can be captured: on a GPU, with dense MLPs or MoE layers on a
    fused backend (model/moe: the per-expert loop reads its routing on the host, the fused kernels do not)."""
    return model.device.type == "cuda" and all(isinstance(m, DenseMLP) or getattr(m, "capturable", False)
                                               for _, m, *_ in model.layers)


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
        pinned = dev.type == "cuda"
        # one int64 buffer (ids, positions, rows, new KV rows) and one int32 buffer (lengths, then the block
        # tables [B, max_blocks]), each mirrored on the host: a step copies them in two copies (of the
        # tables only the bucket's rows). The graphs read views of the device buffers, which never move.
        self._d64 = torch.zeros(4, B, dtype=torch.long, device=dev)
        self._d32 = torch.zeros(B + B * max_blocks, dtype=torch.int32, device=dev)
        self._h64 = torch.zeros(4, B, dtype=torch.long, pin_memory=pinned)
        self._h32 = torch.zeros(B + B * max_blocks, dtype=torch.int32, pin_memory=pinned)
        self._n64, self._n32 = self._h64.numpy(), self._h32.numpy()
        self.ids, self.positions, self.rows, self.new_rows = self._d64
        self.lens = self._d32[:B]
        self.tables = self._d32[B:].view(B, max_blocks)
        # written by the graph: each row's argmax and whether all its logits are finite (1 / 0)
        self._picks = torch.zeros(2, B, dtype=torch.long, device=dev)
        self._h_picks = torch.zeros(2, B, dtype=torch.long, pin_memory=pinned)
        self._copied = torch.cuda.Event() if pinned else None    # the host mirrors may be rewritten after it
        self.graphs: dict[int, tuple] = {}       # bucket -> (CUDAGraph, its logits output)
        self.pool = None                         # one memory pool shared by every bucket's graph
        self._pad(0, B)

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def eligible(self, starts: list[int]) -> bool:
        """A batch of one-token sequences at positions starts that the buffers can hold (the caller checks
        the rest; fill validates the block tables)."""
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
        logits = self.model.decode_static(self.ids[:b], self.positions[:b], self.rows[:b],
                                          (self.tables[:b], self.lens[:b], self.new_rows[:b]), self.state, self.kv)
        self._picks[0, :b].copy_(torch.argmax(logits, -1))
        self._picks[1, :b].copy_(torch.isfinite(logits).all(-1))
        return logits

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

    def fill(self, ids: list[int], starts: list[int], rows: list[int], tables: list) -> int:
        """Stage one step in the host mirrors: ids (one token per sequence at position starts[i], state row
        rows[i], block table tables[i]; the caller checked ids and rows as model.forward does), entries n..b-1
        padding. Returns the bucket b. Validates the tables (kv.check_table, ValueError) before anything is
        written; touches nothing on the device."""
        bs, nb = self.kv.block_size, self.max_blocks
        needs = [self.kv.check_table(table, s + 1) for table, s in zip(tables, starts)]
        n, B = len(starts), self.max_batch
        b = self.bucket(n)
        if self._copied is not None:
            self._copied.synchronize()          # the last step's copies have read the mirrors
        h, t = self._n64, self._n32
        h[0, :n], h[1, :n], h[2, :n] = ids, starts, rows
        h[3, :n] = [table[s // bs] * bs + s % bs for table, s in zip(tables, starts)]
        h[0, n:b], h[1, n:b], h[2, n:b], h[3, n:b] = 0, 0, self.pad_row, self.pad_block * bs
        t[:n] = [s + 1 for s in starts]
        t[n:b] = 1
        for i, (table, need) in enumerate(zip(tables, needs)):
            row = B + i * nb
            t[row:row + need] = table[:need]
            t[row + need:row + nb] = 0
        t[B + n * nb:B + b * nb] = self.pad_block
        return b

    def launch(self, n: int) -> tuple:
        """Run the staged step of n sequences (fill first; the bucket's graph captured, or eagerly): two
        copies in, the replay, one copy out. Returns (logits fp32 [n, vocab], a view the next step
        overwrites; the argmax of each row; whether each row's logits are all finite), the lists on the
        host."""
        b, B = self.bucket(n), self.max_batch
        self._d64.copy_(self._h64, non_blocking=True)
        self._d32[:B + b * self.max_blocks].copy_(self._h32[:B + b * self.max_blocks], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        if self.use_graphs:
            graph, logits = self.graphs[b]
            graph.replay()
        else:
            logits = self._body(b)
        self._h_picks.copy_(self._picks, non_blocking=self._copied is not None)
        if self._copied is not None:
            torch.cuda.current_stream(self.model.device).synchronize()
        picks = self._h_picks[:, :n].tolist()
        return logits[:n], picks[0], [bool(f) for f in picks[1]]

    def run(self, ids: list[int], starts: list[int], rows: list[int], tables: list) -> tuple:
        """fill, the bucket's capture when it has none yet (which pads the device buffers: the staged step
        is copied in after it), launch."""
        b = self.fill(ids, starts, rows, tables)
        if self.use_graphs and b not in self.graphs:
            self.capture(b)
        return self.launch(len(starts))
