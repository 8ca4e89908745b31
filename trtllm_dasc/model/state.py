"""Recurrent state of the linear-attention layers for N rows (one TP rank's share).

Layout (other modules rely on it):
  temporal: fp32 [L_linear, N, HV_local, K, V]   fla's K-before-V layout; kda: HV_local = heads per rank
  conv:     model dtype [L_linear, N, conv_dim_local, kernel - 1]
Each running request computes in one row (a dasc-wr replay borrows a second, scratch row); rows are
handed out by the scheduler (cache/allocators.IdPool); "slot" means a checkpoint slot everywhere else.
Heads and conv channels are in the rank's bundle-position order (tp.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_dasc.config import HybridConfig


@dataclass(slots=True)
class StateRows:
    """Some rows' states, detached from the pool: temporal [L, n, HV, K, V] fp32, conv [L, n, C, W-1]."""

    temporal: torch.Tensor
    conv: torch.Tensor

    def to(self, device) -> "StateRows":
        return StateRows(self.temporal.to(device), self.conv.to(device))


class RecurrentState:
    def __init__(self, temporal: torch.Tensor, conv: torch.Tensor):
        assert temporal.dim() == 5 and temporal.dtype == torch.float32, "temporal must be fp32 [L, N, HV, K, V]"
        assert conv.dim() == 4 and conv.shape[:2] == temporal.shape[:2], "conv must be [L, N, C, W-1]"
        self.temporal, self.conv = temporal, conv

    @classmethod
    def zeros(cls, cfg: HybridConfig, num_rows: int, tp_size: int = 1, dtype=torch.float32,
              device="cpu") -> "RecurrentState":
        shard = cfg.shard(tp_size)
        L, K, V = cfg.num_linear_layers, cfg.key_head_dim, cfg.value_head_dim
        temporal = torch.zeros(L, num_rows, shard.value_heads, K, V, dtype=torch.float32, device=device)
        conv = torch.zeros(L, num_rows, shard.conv_dim, cfg.conv_kernel - 1, dtype=dtype, device=device)
        return cls(temporal, conv)

    @property
    def num_rows(self) -> int:
        return self.temporal.shape[1]

    def _idx(self, rows) -> torch.Tensor:
        rows = torch.as_tensor(rows, dtype=torch.long).reshape(-1)
        if rows.numel() and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"state rows {rows.tolist()} outside 0..{self.num_rows - 1}")
        return rows.to(self.temporal.device)

    def reset(self, rows) -> None:
        """Zero the given rows (a request starting without a cached prefix, a wr scratch row)."""
        idx = self._idx(rows)
        self.temporal[:, idx] = 0
        self.conv[:, idx] = 0

    def export_rows(self, rows) -> StateRows:
        """Copies of the given rows' states, in the order of `rows`."""
        idx = self._idx(rows)
        return StateRows(self.temporal[:, idx].clone(), self.conv[:, idx].clone())

    def import_rows(self, rows, data: StateRows) -> None:
        """Overwrite the given rows with exported states (data row j -> rows[j])."""
        idx = self._idx(rows)
        if data.temporal.shape[1] != idx.numel() or data.temporal.shape[2:] != self.temporal.shape[2:]:
            raise ValueError(f"state rows {list(data.temporal.shape)} do not fit rows {idx.tolist()} "
                             f"of a pool {list(self.temporal.shape)}")
        if data.conv.shape[2:] != self.conv.shape[2:]:
            raise ValueError(f"conv rows {list(data.conv.shape)} do not fit a pool {list(self.conv.shape)}")
        self.temporal[:, idx] = data.temporal.to(self.temporal.device, torch.float32)
        self.conv[:, idx] = data.conv.to(self.conv.device, self.conv.dtype)
