"""CheckpointPool: the per-rank slots that hold compressed recurrent-state checkpoints.

Sized from a byte budget like the paper's Eq. 8: ``N = floor(B / slot_bytes) - 1`` deployable slots plus
slot 0, which is allocated (so the budget covers it) but never handed out: a zero slot id can then mean
"no checkpoint" in tables that the cache keeps. Tensors only: which slot holds what is the radix
cache's bookkeeping (cache/allocators.IdPool.checkpoint_slots(N)); store/load take slot ids.

Invariant: allocated tensor bytes (slot 0 included) == (N + 1) * slot_bytes <= budget.
"""
from __future__ import annotations

import torch

from trtllm_dasc.errors import UserError
from trtllm_dasc.state import ops
from trtllm_dasc.state.conv8_naive import conv8_row_bytes
from trtllm_dasc.state.layout import StateLayout
from trtllm_dasc.plan.accounting import slots_for_budget


class PoolError(UserError):
    """A pool that cannot be built from its budget, or a slot id misuse (double free, foreign id)."""


class CheckpointPool:
    """Tensors (S = N + 1 physical slots):
      payload    [S, width, E]            temporal dtype (native) or int8
      scales     [S, width, E // V]       temporal dtype, int8 codec only (else None)
      conv       [S, L, conv_dim, conv_width]  layout.conv_dtype (None without conv state);
                 [S, L, conv8_row_bytes] int8 with conv_codec int8
    """

    def __init__(self, layout: StateLayout, budget_bytes: int, device="cpu", max_slots: int | None = None):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise PoolError(f"state budget must be a non-negative integer of bytes, got {budget_bytes!r}")
        self.layout = layout
        self.budget_bytes = budget_bytes
        self.slot_bytes = layout.slot_bytes()
        if self.slot_bytes <= 0:
            raise PoolError("a checkpoint slot of 0 bytes: the layout holds no unit and no conv state")
        n = budget_bytes // self.slot_bytes - 1
        if max_slots is not None:
            n = min(n, max_slots)
        if n < 1:
            raise PoolError(f"state budget {budget_bytes} B holds no deployable slot: one slot takes "
                            f"{self.slot_bytes} B and slot 0 is reserved (need >= {2 * self.slot_bytes} B)")
        self.num_slots = n
        S, R = n + 1, layout.rows_per_unit
        # fp8 / int4: uint8 codes, [S, width, R * row bytes] (state/codec_naive.py)
        self.payload = torch.zeros((S, layout.width, layout.payload_unit_elements), dtype=layout.payload_dtype,
                                   device=device)
        self.scales = (torch.zeros((S, layout.width, R), dtype=layout.temporal_dtype, device=device)
                       if layout.codec != "native" else None)
        # 8-bit conv: one int8 row per layer, codes then the layer's fp32 scale (state/conv8_naive.py)
        conv_shape = ((layout.num_layers, conv8_row_bytes(layout.conv_dim * layout.conv_width))
                      if layout.conv_codec == "int8" else (layout.num_layers, layout.conv_dim, layout.conv_width))
        self.conv = (torch.zeros((S, *conv_shape), dtype=torch.int8 if layout.conv_codec == "int8" else layout.conv_dtype,
                                 device=device) if layout.conv_dim else None)

    @classmethod
    def from_plan(cls, plan, budget_bytes: int, rank: int = 0, device="cpu") -> "CheckpointPool":
        """Rank ``rank``'s pool: every rank holds the same N slots, N set by the bottleneck rank
        (a logical checkpoint spans all ranks), so lighter ranks use less than the budget."""
        n = slots_for_budget(budget_bytes, plan.bottleneck_slot_bytes())
        return cls(StateLayout.from_plan(plan, rank), budget_bytes, device=device, max_slots=n)

    def sanity_check(self) -> None:
        assert self.allocated_bytes() == (self.num_slots + 1) * self.slot_bytes <= self.budget_bytes

    # ---- data movement (backend 'auto': Triton on CUDA tensors, torch otherwise) ---------------------
    def store(self, temporal, conv, rows, slots, backend: str = "auto") -> None:
        """Checkpoint active rows[b] (temporal [L, N, ...], conv [L, N, conv_dim, conv_width]) into slots[b]."""
        ops.store(temporal, conv, rows, self.payload, self.scales, self.conv, slots, self.layout, backend=backend)

    def load(self, slots, temporal, conv, rows, zero_fill: bool = True, backend: str = "auto") -> None:
        """Restore slots[b] into active rows[b]; omitted units are zeroed (policy nr)."""
        ops.load(self.payload, self.scales, self.conv, slots, temporal, conv, rows, self.layout,
                 zero_fill=zero_fill, backend=backend)

    # ---- accounting ------------------------------------------------------------------------------
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.payload, self.scales, self.conv) if t is not None)

    def memory_report(self) -> dict:
        lay, S = self.layout, self.num_slots + 1
        return {"slots": self.num_slots, "physical_slots": S, "slot_bytes": self.slot_bytes,
                "codec": lay.codec, "conv_codec": lay.conv_codec, "layout": lay.layout, "width": lay.width,
                "unit_bytes": lay.unit_bytes(), "temporal_bytes_per_slot": lay.payload_bytes_per_slot(),
                "scale_bytes_per_slot": lay.scale_bytes_per_slot(), "conv_bytes_per_slot": lay.conv_bytes_per_slot(),
                "temporal_bytes": S * lay.payload_bytes_per_slot(), "scale_bytes": S * lay.scale_bytes_per_slot(),
                "conv_bytes": S * lay.conv_bytes_per_slot(), "total_bytes": self.allocated_bytes(),
                "budget_bytes": self.budget_bytes}
