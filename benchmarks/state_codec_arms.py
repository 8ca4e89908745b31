"""The arms benchmarks/state_bandwidth.py times: one checkpoint store and one load per codec, with the bytes
the kernels read and write.

Codecs (``--codecs``): every temporal codec of spec.CODECS (native, int8, fp8, int4), each under every conv
codec of ``--conv-codec`` (native: the conv state copied in its dtype; int8: state/conv8_*, one scale per
layer), and ``mixed``: horizon precision (plan/precision.py), one codec segment per codec as the engine's
MixedPool holds them (engine/pools.py); its store / load is the whole MixedPool op, one launch per segment
(and one for the 8-bit conv), timed together. Its segments are plain pools of the rank's own units, as the
uniform arms time them: where storage balancing moves a segment's units (parallel.storage.BalancedPool),
the exchange between ranks is not part of the timed op.

Bytes (per checkpoint; B checkpoints per call):
  store  read the retained units in the temporal dtype + the active conv state;
         write each retained unit's payload (native: its dtype; int8 / fp8: one byte a value; int4: two
         values a byte, per row of d_v) + its row scales (temporal dtype, one per row of d_v) + the slot's
         conv (native: its dtype; int8: each layer's codes padded to 4 bytes, then its fp32 scale)
  load   read the payload + scales of the retained units + the slot's conv (int8: codes and scale, not
         the padding); write every unit the layout owns in the active state (retained ones decoded,
         omitted ones zeroed; a mixed segment's foreign units are the other segments' to write) + the
         active conv state
The 8-bit conv store reads each layer twice (its amax, then the codes): the second read of a layer's few
KiB hits the cache and is not counted, as no index table is.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from trtllm_dasc.spec import CODECS

MIXED = "mixed"
ARM_CODECS = (*CODECS, MIXED)
# the CPU smoke run's shapes (--smoke): a kda-like rank (unit = one row) and a gdn-like one (unit = R rows)
SMOKE_MODELS = {
    # 30 x 3 conv values a layer: the 8-bit conv's codes take padding to 4 bytes
    "smoke-kda": dict(arch="kda", L=3, n=16, V=16, R=1, conv_dim=30, conv_width=3),
    "smoke-gdn": dict(arch="gdn", L=2, n=4, V=16, R=8, conv_dim=24, conv_width=3),
}
SMOKE_KEEP = 0.5
# the smoke run's mixed arm: each kept unit's codec drawn from these (int4, int8 and native: every segment kind
# a mixed store writes, the bands of horizon:1024,8192, the default until 12-05)
SMOKE_SEGMENTS = ("int4", "int8", "native")


def parse_list(text: str, allowed, flag: str) -> list[str]:
    """A comma-separated choice list, in the order given, without repeats; None when one is not allowed."""
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in allowed]
    if bad or not names:
        raise ValueError(f"{flag} takes a comma-separated list of {', '.join(allowed)}; got {text!r}")
    return names


def traffic(lay, op: str, B: int, with_conv: bool = True, zero_fill: bool = True) -> tuple[int, int]:
    """(bytes read, bytes written) of one store / load of B checkpoints under one uniform-codec layout."""
    E, t = lay.unit_elements, lay.temporal_dtype.itemsize
    payload, scales = lay._unit_byte_parts()
    units = lay.num_retained * (payload + scales)
    n_conv = lay.conv_dim * lay.conv_width if with_conv else 0
    active_conv = lay.num_layers * n_conv * lay.conv_dtype.itemsize
    # the slot's conv: conv8 keeps codes padded to 4 bytes plus the scale; the decode reads codes and scale
    slot_conv = lay.conv_bytes_per_slot() if n_conv else 0
    slot_conv_read = lay.num_layers * (n_conv + 4) if n_conv and lay.conv_codec == "int8" else slot_conv
    if op == "store":
        return B * (lay.num_retained * E * t + active_conv), B * (units + slot_conv)
    written = (lay.num_retained + lay.num_omitted * zero_fill) * E * t
    return B * (units + slot_conv_read), B * (written + active_conv)


def bytes_moved(lay, op: str, B: int, with_conv: bool = True) -> int:
    """Read + written bytes of one op (state_bandwidth's figure)."""
    return sum(traffic(lay, op, B, with_conv))


@dataclass
class Arm:
    """One codec's store / load of B checkpoints, ready to time."""

    store: object
    load: object
    traffic: dict               # op -> (bytes read, bytes written)
    slot_bytes: int
    kept: int                   # retained units of the rank
    record: dict                # what the row records of the arm's codec layout
    pool: object                # kept alive while timed (and read by the tests)
    temporal: torch.Tensor
    conv: torch.Tensor | None


def segment_lists(lists, unit_codecs, codec):
    """Per layer, (units of ``codec``, units of every other codec)."""
    own = [[u for u, c in zip(us, cs) if c == codec] for us, cs in zip(lists, unit_codecs)]
    other = [[u for u, c in zip(us, cs) if c != codec] for us, cs in zip(lists, unit_codecs)]
    return own, other


def build(masks, shape: dict, codec: str, conv_codec: str, layout: str, B: int, device, with_conv: bool = True,
          seed: int = 0) -> Arm:
    """The pool (uniform codec: a CheckpointPool; mixed: a MixedPool of ragged segments, the conv state in
    masks.conv_segment) holding slots 1..B, active state for rows 0..B-1, and the two ops (Triton kernels,
    backend 'triton': the interpreter on CPU tensors)."""
    from trtllm_dasc.state import CheckpointPool, StateLayout
    from trtllm_dasc.state.mixed import MixedPool
    L, n, V, R = shape["L"], shape["n"], shape["V"], shape["R"]
    geo = dict(units_per_layer=n, unit_elements=R * V, value_dim=V, conv_codec=conv_codec)

    def pool_of(lists, c, lay_kind, conv, foreign=None):
        lay = StateLayout.from_retained(lists, codec=c, layout=lay_kind, conv_dim=shape["conv_dim"] if conv else 0,
                                        conv_width=shape["conv_width"] if conv else 0, foreign_per_layer=foreign,
                                        **geo)
        return CheckpointPool(lay, (B + 1) * lay.slot_bytes(), device=device, max_slots=B)

    if codec == MIXED:
        parts = []
        for s, c in enumerate(masks.segments):
            own, other = segment_lists(masks.lists, masks.codecs, c)
            conv = with_conv and s == masks.conv_segment
            if sum(map(len, own)) or conv:
                parts.append((c, pool_of(own, c, "ragged", conv, other)))
        pool = MixedPool(parts, sum(p.allocated_bytes() for _, p in parts))
        layouts = [p.layout for _, p in parts]
        # the load zero-fills omitted units in its first segment only (state/mixed.py)
        per_op = {op: [traffic(lay, op, B, lay.conv_dim > 0, zero_fill=i == 0) for i, lay in enumerate(layouts)]
                  for op in ("store", "load")}
        flows = {op: tuple(map(sum, zip(*v))) for op, v in per_op.items()}
        record = {"segments": [{"codec": c, "units": p.layout.num_retained, "conv": p.layout.conv_dim > 0}
                               for c, p in parts]}
    else:
        pool = pool_of(masks.lists, codec, layout, with_conv)
        flows = {op: traffic(pool.layout, op, B, with_conv) for op in ("store", "load")}
        record = {}
    gen = torch.Generator(device=device).manual_seed(seed)
    temporal = torch.randn(L, B, n * R, V, generator=gen, device=device)
    conv = torch.randn(L, B, shape["conv_dim"], shape["conv_width"], generator=gen, device=device).to(torch.bfloat16)
    conv = conv if with_conv else None
    rows = torch.arange(B, device=device)
    slots = torch.arange(1, B + 1, device=device)        # slot 0 is reserved
    kept = sum(map(len, masks.lists))
    return Arm(store=lambda: pool.store(temporal, conv, rows, slots, backend="triton"),
               load=lambda: pool.load(slots, temporal, conv, rows, backend="triton"),
               traffic=flows, slot_bytes=pool.slot_bytes, kept=kept, record=record, pool=pool, temporal=temporal,
               conv=conv)


def smoke_lists(shape: dict, seed: int) -> tuple[list[list[int]], list[list[str]]]:
    """SMOKE_KEEP of each layer's units (at least one), and a codec per kept unit for the mixed arm."""
    rng = random.Random(seed)
    lists = [sorted(rng.sample(range(shape["n"]), max(1, round(SMOKE_KEEP * shape["n"]))))
             for _ in range(shape["L"])]
    codecs = [[SMOKE_SEGMENTS[(l + i) % len(SMOKE_SEGMENTS)] for i in range(len(us))] for l, us in enumerate(lists)]
    return lists, codecs
