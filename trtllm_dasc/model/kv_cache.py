"""Paged KV cache for the full-attention layers: a pool of fixed-size token blocks, per-sequence block tables.

Invariant: every block is either free (refcount 0, in the free list) or referenced; a block's refcount is
the number of sequence block tables holding it plus the references taken with `incref` (e.g. by the
prefix cache). A block returns to the free list exactly when its refcount drops to 0. Block ids are
shared by all layers (block b of layer l lives at pools[l][c][b]). A sequence only writes into blocks it
holds alone: appending into a shared, partly filled last block copies it first (copy on write), so a
prefix shared by several requests is never overwritten.

Per-token contents are given by `token_shapes` (one entry per cached component): gqa caches k and v
[H_kv, D]; MLA caches one [1, kv_lora_rank + qk_rope_head_dim] latent row (expanded at attention time).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch


class KVCacheFull(RuntimeError):
    """Not enough free blocks for the request; the caller evicts (prefix cache) or waits."""


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


@dataclass(slots=True)
class _Seq:
    blocks: list[int] = field(default_factory=list)
    length: int = 0


class PagedKVCache:
    def __init__(self, cfg: KVCacheConfig):
        self.cfg = cfg
        self.pools = [[torch.zeros(cfg.num_blocks, cfg.block_size, *shape, dtype=cfg.dtype, device=cfg.device)
                       for shape in cfg.token_shapes] for _ in range(cfg.num_layers)]
        self.ref = [0] * cfg.num_blocks
        self.free = deque(range(cfg.num_blocks))
        self.seqs: dict[object, _Seq] = {}

    # ---- blocks -----------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def allocate(self, n: int) -> list[int]:
        """n fresh blocks with refcount 1 (owned by the caller)."""
        if n > len(self.free):
            raise KVCacheFull(f"need {n} KV blocks, {len(self.free)} free")
        out = [self.free.popleft() for _ in range(n)]
        for b in out:
            self.ref[b] = 1
        return out

    def incref(self, blocks) -> None:
        for b in blocks:
            assert self.ref[b] > 0, f"incref of free block {b}"
            self.ref[b] += 1

    def decref(self, blocks) -> None:
        for b in blocks:
            assert self.ref[b] > 0, f"decref of free block {b}"
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)

    # ---- sequences --------------------------------------------------------------------------------
    def add_sequence(self, seq_id, blocks=(), length: int = 0) -> None:
        """Start a sequence, optionally on shared prefix blocks holding `length` tokens (increfs them)."""
        if seq_id in self.seqs:
            raise KeyError(f"sequence {seq_id!r} already exists")
        blocks = list(blocks)
        if len(blocks) != -(-length // self.cfg.block_size):
            raise ValueError(f"{len(blocks)} blocks cannot hold exactly {length} tokens")
        self.incref(blocks)
        self.seqs[seq_id] = _Seq(blocks, length)

    def has_sequence(self, seq_id) -> bool:
        return seq_id in self.seqs

    def seq_len(self, seq_id) -> int:
        return self.seqs[seq_id].length

    def block_table(self, seq_id) -> list[int]:
        return list(self.seqs[seq_id].blocks)

    def free_sequence(self, seq_id) -> None:
        self.decref(self.seqs.pop(seq_id).blocks)

    def reserve(self, seq_id, new_length: int) -> None:
        """Make room for tokens [length, new_length): unshare the partly filled last block, add blocks."""
        s, bs = self.seqs[seq_id], self.cfg.block_size
        if s.length % bs and self.ref[s.blocks[-1]] > 1 and new_length > s.length:
            (fresh,) = self.allocate(1)
            for layer in self.pools:
                for pool in layer:
                    pool[fresh].copy_(pool[s.blocks[-1]])
            self.decref([s.blocks[-1]])
            s.blocks[-1] = fresh
        need = -(-new_length // bs) - len(s.blocks)
        if need > 0:
            s.blocks.extend(self.allocate(need))

    def commit(self, seq_id, new_length: int) -> None:
        """Record that tokens up to new_length are written (after every layer wrote them)."""
        s = self.seqs[seq_id]
        assert len(s.blocks) * self.cfg.block_size >= new_length
        s.length = new_length

    # ---- data -------------------------------------------------------------------------------------
    def _slots(self, seq_id, start: int, end: int) -> torch.Tensor:
        bs = self.cfg.block_size
        table = torch.tensor(self.seqs[seq_id].blocks, dtype=torch.long, device=self.cfg.device)
        pos = torch.arange(start, end, device=self.cfg.device)
        return table[pos // bs] * bs + pos % bs

    def write(self, layer: int, seq_id, start: int, values: list[torch.Tensor]) -> None:
        """Store components [n, *token_shape] for tokens [start, start + n) (space from `reserve`)."""
        slots = self._slots(seq_id, start, start + values[0].shape[0])
        for pool, val in zip(self.pools[layer], values):
            pool.view(-1, *pool.shape[2:]).index_copy_(0, slots, val.to(pool.dtype))

    def read(self, layer: int, seq_id, end: int) -> list[torch.Tensor]:
        """Components [end, *token_shape] of tokens [0, end)."""
        slots = self._slots(seq_id, 0, end)
        return [pool.view(-1, *pool.shape[2:]).index_select(0, slots) for pool in self.pools[layer]]

    def export_sequence(self, seq_id) -> "SeqKV":
        """Copies of a sequence's cached tokens: per layer, per component [length, *token_shape]."""
        n = self.seq_len(seq_id)
        return SeqKV(n, [[t.clone() for t in self.read(l, seq_id, n)] for l in range(self.cfg.num_layers)])

    def import_sequence(self, seq_id, data: "SeqKV") -> None:
        """New sequence holding exported tokens (in fresh blocks)."""
        self.add_sequence(seq_id)
        self.reserve(seq_id, data.length)
        for l, comps in enumerate(data.layers):
            self.write(l, seq_id, 0, comps)
        self.commit(seq_id, data.length)

    def sanity_check(self) -> None:
        counts = [0] * self.cfg.num_blocks
        for s in self.seqs.values():
            assert len(s.blocks) >= -(-s.length // self.cfg.block_size)
            for b in s.blocks:
                counts[b] += 1
        free = set(self.free)
        assert len(free) == len(self.free), "block listed twice as free"
        for b, r in enumerate(self.ref):
            assert r >= counts[b], f"block {b}: refcount {r} < {counts[b]} table references"
            assert (r == 0) == (b in free), f"block {b}: refcount {r} but free={b in free}"
