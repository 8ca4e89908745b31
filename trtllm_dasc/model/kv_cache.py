"""Paged KV cache of the full-attention layers: tensors only, addressed by block tables.

A pool of fixed-size token blocks per layer and cached component; block b of layer l lives at
pools[l][c][b]. Which sequence owns which block is bookkeeping (cache/allocators.py, the scheduler on
rank 0): a forward receives every sequence's block table and never allocates. Token position p of a
sequence with block table T lives in block T[p // bs], row p % bs.

Per-token contents are given by `token_shapes` (one entry per cached component): gqa caches k and v
[H_kv, D]; MLA caches one [1, kv_lora_rank + qk_rope_head_dim] latent row (expanded at attention time).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class KVCacheConfig:
    num_layers: int                          # full-attention layers
    token_shapes: list[tuple[int, ...]]      # per component, per token
    num_blocks: int
    block_size: int = 16
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    def __post_init__(self):
        if self.num_blocks < 1 or self.block_size < 1 or self.num_layers < 0:
            raise ValueError(f"bad KV cache geometry: {self.num_layers} layers, {self.num_blocks} blocks "
                             f"of {self.block_size} tokens")


@dataclass(slots=True)
class SeqKV:
    """One sequence's cached tokens, detached from any pool (export/import)."""

    length: int
    layers: list[list[torch.Tensor]]     # per full-attention layer, per component [length, *token_shape]


class PagedKVCache:
    def __init__(self, cfg: KVCacheConfig):
        self.cfg = cfg
        self.pools = [[torch.zeros(cfg.num_blocks, cfg.block_size, *shape, dtype=cfg.dtype, device=cfg.device)
                       for shape in cfg.token_shapes] for _ in range(cfg.num_layers)]

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    def check_table(self, block_table: list[int], tokens: int) -> int:
        """The blocks a sequence of `tokens` tokens takes from its block table; ValueError when the table is
        shorter or names a block outside the pool (a write there would land in another sequence's rows)."""
        need = -(-tokens // self.cfg.block_size)
        if len(block_table) < need:
            raise ValueError(f"block table of {len(block_table)} blocks cannot hold {tokens} tokens")
        if need and (min(block_table[:need]) < 0 or max(block_table[:need]) >= self.cfg.num_blocks):
            raise ValueError(f"block table {list(block_table[:need])} names blocks outside "
                             f"0..{self.cfg.num_blocks - 1}")
        return need

    def token_index(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """Flat row indices (block * bs + offset) of positions [start, end) of a sequence: computed once
        per forward and reused by every layer."""
        bs = self.cfg.block_size
        need = self.check_table(block_table, end)
        # every row of the blocks the span touches, then the span's slice of them: no per-position
        # division (two int64 divisions over a 16k-token prefill's positions were most of its host prologue)
        first = start // bs
        rows = (torch.tensor(block_table[first:need], dtype=torch.long)[:, None] * bs + torch.arange(bs)).view(-1)
        return rows[start - first * bs:end - first * bs].to(self.cfg.device)

    def token_tables(self, block_tables: list[list[int]], starts: list[int], counts: list[int]):
        """What the paged attention kernel (kernels/decode_attention.py) reads for new tokens: sequence i brings
        counts[i] tokens at positions starts[i].. . Per new token, in batch order: its sequence's block table
        (one int32 tensor [tokens, max blocks], padded with 0, never read past a length), its length
        position + 1 (int32: it sees keys 0..position, causal) and its flat KV row (int64), on the cache's
        device: three copies per step where token_index made one per sequence. Validates (check_table)."""
        bs = self.cfg.block_size
        need = [self.check_table(table, s + c) for table, s, c in zip(block_tables, starts, counts)]
        width = max(need)
        tables = torch.tensor([[int(b) for b in t[:n]] + [0] * (width - n) for t, n in zip(block_tables, need)],
                              dtype=torch.int32)
        n = torch.tensor(counts)
        seq = torch.repeat_interleave(torch.arange(len(starts)), n)              # each token's sequence
        first = torch.cumsum(n, 0) - n                                           # its sequence's first token
        pos = torch.tensor(starts)[seq] + torch.arange(len(seq)) - first[seq]    # its absolute position
        write = tables.long()[seq, pos // bs] * bs + pos % bs
        dev = self.cfg.device
        per_token = tables.to(dev)
        if len(seq) != len(starts):
            # each token's row of the table, gathered on the device (one [B, width] copy, not [tokens, width])
            per_token = per_token.index_select(0, seq.to(dev))
        return per_token, (pos + 1).to(torch.int32).to(dev), write.to(dev)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Block dst <- block src in every layer and component (copy-on-write of a reused partial block)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=self.cfg.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=self.cfg.device)
        for layer in self.pools:
            for pool in layer:
                pool.index_copy_(0, dst, pool.index_select(0, src))

    def write(self, layer: int, index: torch.Tensor, values: list[torch.Tensor]) -> None:
        """Store components [n, *token_shape] at flat pool positions ``index`` [n]."""
        for pool, val in zip(self.pools[layer], values):
            pool.view(-1, *pool.shape[2:]).index_copy_(0, index, val.to(pool.dtype))

    def read(self, layer: int, index: torch.Tensor) -> list[torch.Tensor]:
        """Components [n, *token_shape] at flat pool positions ``index`` [n]."""
        return [pool.view(-1, *pool.shape[2:]).index_select(0, index) for pool in self.pools[layer]]

    def export_tokens(self, block_table: list[int], length: int) -> SeqKV:
        """Copies of a sequence's cached tokens [0, length): per layer, per component."""
        index = self.token_index(block_table, 0, length)
        return SeqKV(length, [[t.clone() for t in self.read(l, index)] for l in range(self.cfg.num_layers)])

    def import_tokens(self, block_table: list[int], data: SeqKV) -> None:
        """Write exported tokens into the blocks of ``block_table``."""
        index = self.token_index(block_table, 0, data.length)
        for l, comps in enumerate(data.layers):
            self.write(l, index, comps)
