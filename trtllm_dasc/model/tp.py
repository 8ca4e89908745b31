"""Which rows/columns of every coupled linear-attention tensor a TP rank keeps, after the bundle permutation.

bundle_order[l] (one list per linear layer, in linear-layer order) is a permutation of the layer's bundle
ids: position p holds original bundle bundle_order[l][p]; rank r keeps positions [r*B/T, (r+1)*B/T).
A bundle is one key head with the HV/H value heads that read it (gdn; value heads b*HV/H ... (b+1)*HV/H-1,
the grouping of in_proj_qkvz and of repeat_interleave) or one head (kda). The local heads, state rows and
conv channels of a rank are in position order, so concatenating the ranks' states in rank order gives
the permuted full state. Reindexing is exact: every coupled tensor gets the same permutation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_dasc.config import ConfigError


def check_bundle_order(order, num_linear: int, num_bundles: int, tp_size: int) -> list[list[int]]:
    """Validated bundle order (identity when None)."""
    if num_bundles % tp_size:
        raise ConfigError(f"TP degree {tp_size} does not divide the {num_bundles} head bundles per layer")
    if order is None:
        return [list(range(num_bundles)) for _ in range(num_linear)]
    order = [list(map(int, row)) for row in order]
    if len(order) != num_linear:
        raise ConfigError(f"bundle_order has {len(order)} rows but the model has {num_linear} linear layers")
    for l, row in enumerate(order):
        if sorted(row) != list(range(num_bundles)):
            raise ConfigError(f"bundle_order[{l}] must be a permutation of 0..{num_bundles - 1}, got {row}")
    return order


def local_bundles(row: list[int], tp_rank: int, tp_size: int) -> list[int]:
    """Original bundle ids rank tp_rank computes, in position order."""
    if not 0 <= tp_rank < tp_size:
        raise ConfigError(f"tp_rank {tp_rank} is outside 0..{tp_size - 1}")
    per = len(row) // tp_size
    return row[tp_rank * per:(tp_rank + 1) * per]


def _blocks(ids: list[int], size: int) -> torch.Tensor:
    """Indices of blocks `ids` of `size` consecutive entries each."""
    return (torch.tensor(ids, dtype=torch.long)[:, None] * size + torch.arange(size)[None, :]).reshape(-1)


@dataclass(slots=True)
class GDNSlice:
    """Index tensors for one gdn layer on one rank (all int64, into the unsharded tensors)."""

    qkvz_rows: torch.Tensor   # in_proj_qkvz rows: per key head [q K | k K | v r*V | z r*V]
    ba_rows: torch.Tensor     # in_proj_ba rows: per key head [b r | a r]
    conv_channels: torch.Tensor   # conv channels: [q (H*K) | k (H*K) | v (HV*V)]
    value_heads: torch.Tensor     # A_log, dt_bias, state rows
    out_cols: torch.Tensor        # out_proj columns

    @classmethod
    def build(cls, bundles: list[int], H: int, HV: int, K: int, V: int) -> "GDNSlice":
        r = HV // H
        heads = [b * r + j for b in bundles for j in range(r)]
        conv = torch.cat([_blocks(bundles, K), H * K + _blocks(bundles, K), 2 * H * K + _blocks(heads, V)])
        return cls(qkvz_rows=_blocks(bundles, 2 * K + 2 * r * V), ba_rows=_blocks(bundles, 2 * r),
                   conv_channels=conv, value_heads=torch.tensor(heads, dtype=torch.long),
                   out_cols=_blocks(heads, V))


@dataclass(slots=True)
class KDASlice:
    """Index tensors for one kda layer on one rank."""

    heads: torch.Tensor       # b_proj rows, A_log, state rows
    head_rows: torch.Tensor   # q/k/v/f_b/g_b_proj rows, each conv's channels, dt_bias, o_proj columns

    @classmethod
    def build(cls, bundles: list[int], K: int) -> "KDASlice":
        return cls(heads=torch.tensor(bundles, dtype=torch.long), head_rows=_blocks(bundles, K))


@dataclass(frozen=True, slots=True)
class RankShare:
    """This process's place among the TP ranks, for the layers other than linear attention: attention
    heads, MLP and expert intermediate channels are split in equal contiguous parts (column-parallel in,
    row-parallel out, the partial outputs summed by the model's all-reduce). A part a TP degree does not
    divide stays whole on every rank (replicated: computed fully, never all-reduced)."""

    rank: int = 0
    size: int = 1

    def part(self, n: int) -> list[int] | None:
        """This rank's ids of n equal parts; None when unsplit (TP1, or size does not divide n)."""
        if self.size == 1 or n % self.size:
            return None
        k = n // self.size
        return list(range(self.rank * k, (self.rank + 1) * k))

    def kv_heads(self, num_heads: int, num_kv_heads: int) -> list[int] | None:
        """GQA key/value heads of this rank's query heads: split when the degree divides them, else the
        one head its query group reads (each shared by size / num_kv_heads ranks, as vLLM does)."""
        if self.part(num_heads) is None:
            return None
        if num_kv_heads % self.size == 0:
            return self.part(num_kv_heads)
        if self.size % num_kv_heads == 0:
            return [self.rank // (self.size // num_kv_heads)]
        return None

    @property
    def owns_bias(self) -> bool:
        """A row-parallel output's bias is added once: on rank 0 (the all-reduce sums the ranks)."""
        return self.rank == 0


def blocks(ids: list[int], size: int) -> torch.Tensor:
    """Row/column indices of blocks ``ids`` of ``size`` consecutive entries (a head's rows, ...)."""
    return _blocks(ids, size)
