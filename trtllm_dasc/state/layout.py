"""StateLayout: where each retained state unit of one TP rank lives inside a checkpoint slot.

Active temporal state of a rank: fp32 ``[L, N, HV, K, V]`` (fla's K-before-V layout), viewed as
``[L, N, n_units, E]`` with E = unit_elements (gdn: a unit is a value head, E = K*V; kda: a unit is a key
channel (h, k), E = V). Every unit is ``R = E // V`` rows of V contiguous elements; the int8 codec keeps
one scale per row (paper Eq. 10: per (l, h, k), shared over d_v).

A slot stores ``width`` unit positions. Retained unit j (ragged order: by layer, then unit) sits at
``slot_pos[j]``: ragged ``j`` (layer l at [o_l, o_{l+1})), padded ``l * block + (j - o_l)`` with
``block = width // L >= R_max`` (App. B, Scheme 1). Positions no retained unit maps to are unused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from trtllm_dasc.config import conv_bytes, unit_byte_parts
from trtllm_dasc.errors import UserError
from trtllm_dasc.state import codec_naive
from trtllm_dasc.spec import CODECS, DEFAULT_CODEC, DEFAULT_LAYOUT, LAYOUTS


class LayoutError(UserError):
    """A retained-unit list or slot geometry that cannot describe a checkpoint slot."""


class LayoutIndex(NamedTuple):
    """int64 index tables of one layout on one device (what the ops and kernels read)."""

    unit_layer: torch.Tensor    # [U] layer of retained unit j
    unit_local: torch.Tensor    # [U] unit id inside its layer
    slot_pos: torch.Tensor      # [U] position inside the slot
    pos_of_unit: torch.Tensor   # [L * n_units] slot position of (l, u), -1 when omitted, -2 when foreign
    omit_layer: torch.Tensor    # [M] layer of omitted unit i (foreign units are not omitted)
    omit_local: torch.Tensor    # [M] unit id inside its layer
    # what a zero-filling load writes: every unit the layout owns (retained and omitted, not foreign),
    # layer-major, with its slot position or -1 (omitted: written as zero)
    fill_layer: torch.Tensor    # [F] layer of unit i
    fill_local: torch.Tensor    # [F] unit id inside its layer
    fill_pos: torch.Tensor      # [F] slot position, -1 when omitted


@dataclass(slots=True, eq=False)
class StateLayout:
    num_layers: int                     # L: linear-attention layers
    units_per_layer: int                # n_units per rank per layer (gdn: HV, kda: H*K)
    unit_elements: int                  # E
    value_dim: int                      # V: contiguous row length; E // V rows per unit
    layer_of_unit: torch.Tensor         # [U] int64, sorted by layer then unit
    unit_in_layer: torch.Tensor         # [U] int64
    offsets: torch.Tensor               # [L + 1] int64, o_l
    width: int                          # unit positions per slot
    codec: str = DEFAULT_CODEC
    layout: str = DEFAULT_LAYOUT
    conv_dim: int = 0                   # conv channels per layer per rank (0: no conv state)
    conv_width: int = 0                 # kernel - 1
    temporal_dtype: torch.dtype = torch.float32
    conv_dtype: torch.dtype = torch.bfloat16
    # [F] int64 flat ids l * n_units + u of units another codec group of the same checkpoint stores
    # (horizon precision, state/mixed.py): neither stored here nor zeroed by this layout's load
    foreign: torch.Tensor | None = None
    # conv state in the slot: its dtype (native) or int8 with one scale per layer (state/conv8_naive.py)
    conv_codec: str = "native"
    slot_pos: torch.Tensor = field(init=False, repr=False)
    _cache: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self):
        if self.codec not in CODECS:
            raise LayoutError(f"codec must be one of {CODECS}, got {self.codec!r}")
        if self.layout not in LAYOUTS:
            raise LayoutError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        for name in ("num_layers", "units_per_layer", "unit_elements", "value_dim"):
            if getattr(self, name) < 1:
                raise LayoutError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.unit_elements % self.value_dim:
            raise LayoutError(f"unit_elements {self.unit_elements} is not a multiple of value_dim {self.value_dim}")
        if self.conv_codec not in ("native", "int8"):
            raise LayoutError(f"conv_codec must be native or int8, got {self.conv_codec!r}")
        if self.codec == "int4" and self.value_dim % 2:
            raise LayoutError(f"codec int4 packs two values a byte: value_dim {self.value_dim} must be even")
        if self.conv_dim < 0 or self.conv_width < 0 or (self.conv_dim == 0) != (self.conv_width == 0):
            raise LayoutError(f"conv shape ({self.conv_dim}, {self.conv_width}) must be both zero or both positive")
        if self.temporal_dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise LayoutError(f"temporal_dtype must be a float dtype, got {self.temporal_dtype}")
        if self.codec != "native":          # the scales of int8 / fp8 / int4 are kept in the temporal dtype
            try:
                codec_naive.check_scale_dtype(self.temporal_dtype)
            except ValueError as e:
                raise LayoutError(f"codec {self.codec} with temporal_dtype {self.temporal_dtype}: {e}") from None
        self.layer_of_unit = torch.as_tensor(self.layer_of_unit, dtype=torch.int64).flatten().cpu()
        self.unit_in_layer = torch.as_tensor(self.unit_in_layer, dtype=torch.int64).flatten().cpu()
        self.offsets = torch.as_tensor(self.offsets, dtype=torch.int64).flatten().cpu()
        self.foreign = torch.as_tensor([] if self.foreign is None else self.foreign, dtype=torch.int64).flatten().cpu()
        self._check_units()
        counts = self.retained_counts
        if self.layout == "ragged":
            self.slot_pos = torch.arange(self.num_retained, dtype=torch.int64)
            need = self.num_retained
        else:
            block = self.width // self.num_layers
            if self.width % self.num_layers:
                raise LayoutError(f"padded width {self.width} must be a multiple of L={self.num_layers}")
            starts = self.offsets[:-1].repeat_interleave(torch.tensor(counts, dtype=torch.int64))
            j = torch.arange(self.num_retained, dtype=torch.int64)
            self.slot_pos = self.layer_of_unit * block + (j - starts)
            need = self.num_layers * max(counts, default=0)
        if self.width < need:
            raise LayoutError(f"slot width {self.width} is smaller than the {need} positions the "
                              f"{self.layout} layout needs")

    def _check_units(self):
        L, n, U = self.num_layers, self.units_per_layer, self.layer_of_unit.numel()
        if self.unit_in_layer.numel() != U:
            raise LayoutError(f"layer_of_unit has {U} entries but unit_in_layer {self.unit_in_layer.numel()}")
        if self.offsets.numel() != L + 1:
            raise LayoutError(f"offsets must have L+1={L + 1} entries, got {self.offsets.numel()}")
        if U and (self.layer_of_unit.min() < 0 or self.layer_of_unit.max() >= L
                  or self.unit_in_layer.min() < 0 or self.unit_in_layer.max() >= n):
            raise LayoutError(f"retained unit outside layers [0, {L}) or units [0, {n})")
        flat = self.layer_of_unit * n + self.unit_in_layer
        if U > 1 and not bool((flat[1:] > flat[:-1]).all()):
            raise LayoutError("retained units must be sorted by layer then unit, without repeats")
        counts = torch.bincount(self.layer_of_unit, minlength=L)
        expect = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        if not torch.equal(self.offsets, expect):
            raise LayoutError(f"offsets {self.offsets.tolist()} disagree with the retained counts {counts.tolist()}")
        f = self.foreign
        if f.numel() and (f.min() < 0 or f.max() >= L * n or f.unique().numel() != f.numel()
                          or torch.isin(f, flat).any()):
            raise LayoutError("foreign units must be distinct units of [0, L * n_units) that this layout does not keep")

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_retained(cls, retained_per_layer: list[list[int]], *, units_per_layer: int, unit_elements: int,
                      value_dim: int, codec: str = DEFAULT_CODEC, layout: str = DEFAULT_LAYOUT, width: int | None = None,
                      conv_dim: int = 0, conv_width: int = 0, temporal_dtype: torch.dtype = torch.float32,
                      conv_dtype: torch.dtype = torch.bfloat16,
                      foreign_per_layer: list[list[int]] | None = None, conv_codec: str = "native") -> "StateLayout":
        """Build from per-layer sorted retained *local* unit ids; width defaults to the layout's minimum
        (ragged: sum_l r_l, padded: L * R_max). foreign_per_layer: per layer, the local ids another codec
        group stores (see ``foreign``)."""
        L = len(retained_per_layer)
        layers, units = [], []
        for l, kept in enumerate(retained_per_layer):
            layers.extend([l] * len(kept))
            units.extend(int(u) for u in kept)
        counts = [len(k) for k in retained_per_layer]
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        if width is None:
            width = offsets[-1] if layout == "ragged" else L * max(counts, default=0)
        return cls(num_layers=L, units_per_layer=units_per_layer, unit_elements=unit_elements,
                   value_dim=value_dim, layer_of_unit=torch.tensor(layers, dtype=torch.int64),
                   unit_in_layer=torch.tensor(units, dtype=torch.int64), offsets=torch.tensor(offsets),
                   width=width, codec=codec, layout=layout, conv_dim=conv_dim, conv_width=conv_width,
                   temporal_dtype=temporal_dtype, conv_dtype=conv_dtype, conv_codec=conv_codec,
                   foreign=[l * units_per_layer + int(u) for l, us in enumerate(foreign_per_layer or []) for u in us])

    @classmethod
    def from_config(cls, cfg, tp: int, retained_per_layer: list[list[int]] | None = None, *,
                    codec: str = DEFAULT_CODEC, layout: str = DEFAULT_LAYOUT, width: int | None = None,
                    foreign_per_layer: list[list[int]] | None = None, conv: bool = True,
                    conv_codec: str = "native") -> "StateLayout":
        """From a HybridConfig and one rank's retained local units (None: dense, every unit); conv=False:
        no conv state (another codec group's layout holds it)."""
        shard = cfg.shard(tp)
        if retained_per_layer is None:
            retained_per_layer = [list(range(shard.units))] * cfg.num_linear_layers
        if len(retained_per_layer) != cfg.num_linear_layers:
            raise LayoutError(f"{len(retained_per_layer)} retained lists for {cfg.num_linear_layers} linear layers")
        dt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
        return cls.from_retained(retained_per_layer, units_per_layer=shard.units, unit_elements=cfg.unit_elements,
                                 value_dim=cfg.value_head_dim, codec=codec, layout=layout, width=width,
                                 conv_dim=shard.conv_dim if conv else 0, conv_width=cfg.conv_kernel - 1 if conv else 0,
                                 temporal_dtype=dt[cfg.temporal_dtype], conv_dtype=dt[cfg.conv_dtype],
                                 foreign_per_layer=foreign_per_layer, conv_codec=conv_codec)

    @classmethod
    def from_plan(cls, plan, rank: int = 0, segment: int | None = None) -> "StateLayout":
        """One rank's slot layout from a DascPlan: its retained local units, codec, layout and the slot
        width the planner accounted for (so the pool matches the planner to the byte).

        A horizon-precision plan stores one codec group per segment (state/mixed.py): ``segment`` picks
        one; the others' units are foreign to it, and only the conv segment (plan.conv_segment) holds the
        conv state.

        A rank that stores units of other ranks, or sends its own away (storage balancing at tp > 1 with
        transfers touching it), has its pool from parallel.storage.BalancedPool (the all-to-all): refused here."""
        if not 0 <= rank < plan.options.tp:
            raise LayoutError(f"rank {rank} outside the plan's TP degree {plan.options.tp}")
        mixed = plan.options.bands is not None
        if mixed and segment is None:
            raise LayoutError(f"precision {plan.options.precision}: a checkpoint of mixed codecs has one layout "
                              "per codec segment (pass segment=, or build state.mixed.MixedPool.from_plan)")
        seg = 0 if segment is None else segment
        if plan.storage is not None and any(rank in (t.src, t.dst) for t in plan.storage.transfers
                                            if t.segment == seg or not mixed):
            raise LayoutError(f"rank {rank} exchanges checkpoint units with other ranks under placement "
                              f"'{plan.options.placement}': its pool is parallel.storage.BalancedPool (the storage all-to-all)")
        if not mixed:
            return cls.from_config(plan.config, plan.options.tp, plan.local_retained(rank), codec=plan.options.codec,
                                   layout=plan.options.layout, width=plan.rank_widths()[rank],
                                   conv_codec=plan.options.conv_codec)
        return cls.from_config(plan.config, plan.options.tp, plan.segment_retained(rank, seg),
                               codec=plan.codec_segments[seg], layout="ragged",
                               width=plan.segment_widths()[seg][rank], foreign_per_layer=plan.segment_foreign(rank, seg),
                               conv=seg == plan.conv_segment, conv_codec=plan.options.conv_codec)

    # ---- shape facts --------------------------------------------------------------------------------
    @property
    def num_retained(self) -> int:
        """U: retained units of this rank."""
        return self.layer_of_unit.numel()

    @property
    def retained_counts(self) -> list[int]:
        """r_l per layer."""
        return (self.offsets[1:] - self.offsets[:-1]).tolist()

    @property
    def rows_per_unit(self) -> int:
        """R = E // V: rows of V elements per unit, and int8 scales per unit."""
        return self.unit_elements // self.value_dim

    @property
    def payload_unit_elements(self) -> int:
        """Payload elements of one stored unit (its dtype: temporal native, int8, or uint8 for fp8 / int4)."""
        return self._unit_byte_parts()[0] // (self.temporal_dtype.itemsize if self.codec == "native" else 1)

    @property
    def payload_dtype(self) -> torch.dtype:
        return {"native": self.temporal_dtype, "int8": torch.int8}.get(self.codec, torch.uint8)

    @property
    def num_omitted(self) -> int:
        return self.num_layers * self.units_per_layer - self.num_retained - self.foreign.numel()

    # ---- bytes (config.py's formulas, so equal to HybridConfig.unit_bytes / conv_bytes_per_rank) ------
    def _unit_byte_parts(self) -> tuple[int, int]:
        return unit_byte_parts(self.unit_elements, self.rows_per_unit, self.temporal_dtype.itemsize, self.codec)

    def unit_bytes(self) -> int:
        return sum(self._unit_byte_parts())

    def payload_bytes_per_slot(self) -> int:
        """Temporal payload (native dtype or int8), scales excluded."""
        return self.width * self._unit_byte_parts()[0]

    def scale_bytes_per_slot(self) -> int:
        return self.width * self._unit_byte_parts()[1]

    def conv_bytes_per_slot(self) -> int:
        return conv_bytes(self.num_layers, self.conv_dim, self.conv_width, self.conv_dtype.itemsize, self.conv_codec)

    def slot_bytes(self) -> int:
        """width * unit_bytes(codec) + conv bytes: one physical slot of this rank."""
        return self.width * self.unit_bytes() + self.conv_bytes_per_slot()

    # ---- device tables ------------------------------------------------------------------------------
    def index(self, device) -> LayoutIndex:
        """The index tables on ``device`` (built once per device, then cached)."""
        device = torch.device(device)
        key = str(device)
        if key not in self._cache:
            L, n = self.num_layers, self.units_per_layer
            pos = torch.full((L * n,), -1, dtype=torch.int64)
            pos[self.layer_of_unit * n + self.unit_in_layer] = self.slot_pos
            pos[self.foreign] = -2
            omitted = torch.nonzero(pos == -1).flatten()
            owned = torch.nonzero(pos != -2).flatten()
            tabs = (self.layer_of_unit, self.unit_in_layer, self.slot_pos, pos, omitted // n, omitted % n,
                    owned // n, owned % n, pos[owned])
            self._cache[key] = LayoutIndex(*(t.to(device) for t in tabs))
        return self._cache[key]
