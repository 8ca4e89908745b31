"""The storage-level balance at run time (paper Sec. 4.3; the planner's StoragePlan): every rank keeps
the first C of its U_r kept units in its own slot and sends the tail to ranks below C; on load the tail
comes home before the state is restored. Only remotely stored units move, each exactly once.

The exchange moves *encoded* units (the codec's payload and, for int8, its per-row scales), so it is exact
for every codec: a rank encodes all its U_r units into a staging slot (its compute-local 'off' layout,
width U_r), keeps positions [0, min(U_r, C)) and ships the rest; a receiver writes what it gets at the
plan's slot positions. One ``all_to_all_single`` with split sizes per tensor and direction; ranks without
transfers take part with zero-sized splits (the collective needs everyone).

Ragged layout only (one segment, the paper's Route A); the padded layout's per-layer segments are refused.
A horizon-precision plan balances each codec segment on its own: one BalancedPool per segment
(``segment``), composed by state.mixed.MixedPool.
"""
from __future__ import annotations

import math

import torch

from trtllm_dasc.parallel.exchange_clock import ExchangeClock
from trtllm_dasc.errors import UserError
from trtllm_dasc.state import CheckpointPool, StateLayout
from trtllm_dasc.state import ops as state_ops
from trtllm_dasc.plan.accounting import slots_for_budget


def exchanges(plan) -> bool:
    """Whether this plan moves units between ranks at run time."""
    return plan.storage is not None and bool(plan.storage.transfers)


class BalancedPool:
    """One rank's share of every checkpoint under storage balancing; the CheckpointPool interface
    (store/load/num_slots/sanity_check/memory_report) with the all-to-all inside."""

    def __init__(self, plan, budget_bytes: int, rank: int, all_to_all, device="cpu", segment: int = 0):
        if plan.options.layout != "ragged":
            raise UserError("storage balancing at run time supports the ragged layout (the paper's Route A); "
                            "use --layout ragged or --placement off")
        cfg, tp, opt = plan.config, plan.options.tp, plan.options
        self.rank, self.all_to_all = rank, all_to_all
        self.width = plan.storage.widths[segment]                   # C
        mixed = opt.bands is not None
        # horizon precision: this segment's codec and units; the other segments' units are foreign
        local = plan.segment_retained(rank, segment) if mixed else plan.local_retained(rank)
        seg = dict(codec=plan.codec_segments[segment], foreign_per_layer=plan.segment_foreign(rank, segment),
                   conv=segment == plan.conv_segment) if mixed else dict(codec=opt.codec)
        seg["conv_codec"] = opt.conv_codec
        self.units = sum(map(len, local))                           # U_r
        self.own = min(self.units, self.width)
        # compute-local staging: all U_r units in layer order at positions 0..U_r-1 (placement 'off')
        self.staging = StateLayout.from_config(cfg, tp, local, layout="ragged", width=self.units, **seg)
        # the slot: own units first, then what other ranks send (positions from the plan)
        kept, left = [], self.own
        for units in local:
            kept.append(units[:left])
            left -= len(kept[-1])
        layout = StateLayout.from_config(cfg, tp, kept, layout="ragged", width=self.width,
                                         **dict(seg, foreign_per_layer=None))
        self.pool = CheckpointPool(layout, budget_bytes, device=device,
                                   max_slots=slots_for_budget(budget_bytes, plan.bottleneck_slot_bytes()))
        t = [x for x in plan.storage.transfers if x.segment == segment]
        # (peer, position on this rank, count): sends read staging positions, receives write slot positions
        self.sends = sorted((x.dst, x.src_start, x.count) for x in t if x.src == rank)
        self.recvs = sorted((x.src, x.dst_start, x.count) for x in t if x.dst == rank)
        self.tp = tp
        self.clock = ExchangeClock(device)

    # the CheckpointPool interface ------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def slot_bytes(self) -> int:
        return self.pool.slot_bytes

    def sanity_check(self) -> None:
        self.pool.sanity_check()

    def allocated_bytes(self) -> int:
        return self.pool.allocated_bytes()

    def exchange_report(self, wait: bool = False) -> dict:
        """The all-to-all's time per store and load on this rank (parallel/exchange_clock.py)."""
        return self.clock.report(wait)

    def memory_report(self) -> dict:
        report = self.pool.memory_report()
        report.update(storage_width=self.width, computed_units=self.units, units_sent=sum(c for _, _, c in self.sends),
                      units_received=sum(c for _, _, c in self.recvs))
        return report

    def store(self, temporal, conv, rows, slots, backend: str = "auto") -> None:
        n = len(slots)
        payload, scales, conv_s = self._staging_buffers(n, temporal.device)
        state_ops.store(temporal, conv, rows, payload, scales, conv_s, list(range(n)), self.staging, backend=backend)
        slot_idx = torch.as_tensor(slots, dtype=torch.long, device=self.pool.payload.device)
        self.pool.payload[slot_idx, :self.own] = payload[:, :self.own]
        if scales is not None:
            self.pool.scales[slot_idx, :self.own] = scales[:, :self.own]
        if conv_s is not None:
            self.pool.conv[slot_idx] = conv_s
        self.clock.op("store")
        for dst_tensor, src_tensor in ((self.pool.payload, payload), (self.pool.scales, scales)):
            if src_tensor is None:
                continue
            got = self._exchange([src_tensor[:, p:p + c] for _, p, c in self.sends], self.sends,
                                 self.recvs, n, src_tensor, "store")
            for (_, p, c), part in zip(self.recvs, got):
                dst_tensor[slot_idx, p:p + c] = part

    def load(self, slots, temporal, conv, rows, zero_fill: bool = True, backend: str = "auto") -> None:
        n = len(slots)
        payload, scales, _ = self._staging_buffers(n, temporal.device)
        slot_idx = torch.as_tensor(slots, dtype=torch.long, device=self.pool.payload.device)
        payload[:, :self.own] = self.pool.payload[slot_idx, :self.own]
        if scales is not None:
            scales[:, :self.own] = self.pool.scales[slot_idx, :self.own]
        # the inverse transfer: what this rank holds for others goes back; its own tail comes home
        self.clock.op("load")
        for stage, held in ((payload, self.pool.payload), (scales, self.pool.scales)):
            if stage is None:
                continue
            got = self._exchange([held[slot_idx, p:p + c] for _, p, c in self.recvs], self.recvs,
                                 self.sends, n, stage, "load")
            for (_, p, c), part in zip(self.sends, got):
                stage[:, p:p + c] = part
        conv_s = self.pool.conv[slot_idx] if self.pool.conv is not None else None
        state_ops.load(payload, scales, conv_s, list(range(n)), temporal, conv, rows, self.staging,
                       zero_fill=zero_fill, backend=backend)

    # ---- helpers ----------------------------------------------------------------------------------
    def _staging_buffers(self, n: int, device):
        lay, pool = self.staging, self.pool
        payload = torch.zeros((n, lay.width, lay.payload_unit_elements), dtype=pool.payload.dtype,
                              device=pool.payload.device)
        scales = (torch.zeros((n, lay.width, lay.rows_per_unit), dtype=pool.scales.dtype, device=pool.payload.device)
                  if pool.scales is not None else None)
        conv = (torch.zeros((n, *pool.conv.shape[1:]), dtype=pool.conv.dtype, device=pool.payload.device)
                if pool.conv is not None else None)
        return payload, scales, conv

    def _exchange(self, parts, outgoing, incoming, n: int, like: torch.Tensor, op: str) -> list[torch.Tensor]:
        """Send parts[i] ([n, count_i, ...]) to outgoing[i]'s peer; returns the incoming parts in order. The
        collective's time goes to ``op`` (store or load) on the clock."""
        tail = like.shape[2:]
        per_unit = n * math.prod(tail)
        send_sizes, recv_sizes = [0] * self.tp, [0] * self.tp
        for peer, _, c in outgoing:
            send_sizes[peer] += c * per_unit
        for peer, _, c in incoming:
            recv_sizes[peer] += c * per_unit
        # flat buffers in peer order (outgoing/incoming are sorted by peer, then position)
        send = (torch.cat([p.reshape(-1) for p in parts]) if parts
                else torch.empty(0, dtype=like.dtype, device=like.device))
        recv = torch.empty(sum(recv_sizes), dtype=like.dtype, device=like.device)
        self.clock.time(op, send.numel() * send.element_size(),
                        lambda: self.all_to_all(recv, send, recv_sizes, send_sizes))
        out, at = [], 0
        for _, _, c in incoming:
            size = c * per_unit
            out.append(recv[at:at + size].reshape(n, c, *tail))
            at += size
        return out
