"""ModelRunner: the model plus everything a request's state lives in, for one arm (dense or dasc).

  model        HybridModel (one TP rank)
  plan         DascPlan (W_max, codec, layout); dense is the plan with W_max = 0 and the native codec
  state        RecurrentState rows: each running request has one, a dasc-wr hit borrows a scratch row
  kv           PagedKVCache for the full-attention layers (block ids shared with the radix cache)
  pool         CheckpointPool of compressed checkpoints, sized from the state budget by the planner's rule

It moves checkpoints between the pool and state rows (store after a prefill captured them, load with
zero-fill on a hit, the wr merge during a replay) and nothing else: scheduling lives in scheduler.py.
"""
from __future__ import annotations

import torch

from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.model import HybridModel
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.state import CheckpointPool, StateLayout
from trtllm_dasc.state import ops as state_ops

DENSE_SLOTS_DEFAULT = 64


class KVBlocks:
    """The radix cache's block allocator interface over the PagedKVCache's ref-counted blocks, so the
    tree, the request block tables and the KV tensors agree on one set of counts."""

    def __init__(self, kv):
        self.kv = kv

    @property
    def num_free(self) -> int:
        return self.kv.num_free_blocks

    @property
    def refs(self) -> list[int]:
        return self.kv.ref

    def try_alloc(self) -> int | None:
        return self.kv.allocate(1)[0] if self.kv.num_free_blocks else None

    def incref(self, block: int) -> None:
        self.kv.incref([block])

    def decref(self, block: int) -> None:
        self.kv.decref([block])

    def free_ids(self) -> set[int]:
        return set(self.kv.free)


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"device {cfg.device} requested but CUDA is not available")
        self.model = HybridModel.from_pretrained(cfg.model, dtype=cfg.dtype, device=cfg.device,
                                                 backend=cfg.backend)
        # the conv state is checkpointed in the model's own precision (the paper's native-precision b^conv)
        options = PlanOptions(wmax=cfg.wmax, tp=1, placement="off", codec=cfg.codec, layout=cfg.layout)
        self.plan, _ = plan_from_path(cfg.model, options, conv_dtype=cfg.dtype)
        self.layout = StateLayout.from_plan(self.plan, 0)
        dense = self.plan.config.dense_checkpoint_bytes_per_rank(1)
        self.budget = (DENSE_SLOTS_DEFAULT + 1) * dense if cfg.state_budget_bytes is None else cfg.state_budget_bytes
        self.pool = CheckpointPool.from_plan(self.plan, self.budget, 0, device=cfg.device)
        # one row per running request plus one scratch row each for a wr replay
        self.state = self.model.new_state(2 * cfg.max_batch)
        self.kv = self.model.new_kv_cache(cfg.num_kv_blocks, cfg.block_size)
        self.kv_blocks = KVBlocks(self.kv)
        self._free_rows = list(range(2 * cfg.max_batch - 1, -1, -1))
        self.replay_window = self._replay_window()
        self._layer_layouts = [self._one_layer_layout(kept) for kept in self.plan.local_retained(0)]

    # ---- rows --------------------------------------------------------------------------------------
    def take_row(self) -> int:
        row = self._free_rows.pop()
        self.state.reset([row])
        return row

    def give_row(self, row: int) -> None:
        self._free_rows.append(row)

    @property
    def free_rows(self) -> int:
        return len(self._free_rows)

    def fork_replay(self, block_table: list[int], cached: int, seq_id) -> tuple[int, int] | None:
        """dasc-wr on a hit at ``cached`` tokens: a zero scratch row and a KV sequence forked at the replay
        start (sharing the cached blocks before it). Returns (start, row), or None when nothing replays."""
        if not (self.replay_window and cached):
            return None
        start = max(0, cached - self.replay_window)
        self.kv.add_sequence(seq_id, blocks=block_table[:-(-start // self.cfg.block_size)], length=start)
        return start, self.take_row()

    # ---- checkpoints -------------------------------------------------------------------------------
    def load_checkpoint(self, slot: int, row: int) -> None:
        """Restore a checkpoint into an active row: retained units exact, omitted ones zero (nr)."""
        self.pool.load([slot], self.state.temporal, self.state.conv, [row], zero_fill=True)

    def store_captures(self, out, which: list[int], slots: list[int]) -> None:
        """Store captured boundary states ``which`` (indices into the forward's captures) into slots."""
        if not which:
            return
        # captures are [n, L, ...]; the store reads [L, n, ...] views (any stride along L and n)
        temporal = out.capture_temporal.transpose(0, 1)
        conv = out.capture_conv.transpose(0, 1)
        self.pool.store(temporal, conv, which, slots)

    def merge_omitted(self, layer: int, src_rows: list[int], dst_rows: list[int]) -> None:
        """wr: copy the units the checkpoint omitted, in one linear layer, from replay rows into rows."""
        view = self.state.temporal[layer:layer + 1]
        state_ops.refresh_merge(view, src_rows, view, dst_rows, self._layer_layouts[layer])

    def _one_layer_layout(self, kept: list[int]) -> StateLayout:
        cfg = self.plan.config
        return StateLayout.from_retained([kept], units_per_layer=cfg.units_per_layer,
                                         unit_elements=cfg.unit_elements, value_dim=cfg.value_head_dim)

    def _replay_window(self) -> int:
        """wr replays the plan's window (paper Sec. 4.2) unless the config overrides it."""
        # nothing to refresh when the checkpoint omits no unit (dense), whatever the policy says
        if self.cfg.policy != "wr" or not self.plan.wr_window:
            return 0
        window = self.plan.wr_window if self.cfg.replay_window is None else self.cfg.replay_window
        # a replay never reaches further back than a prompt can be long
        return min(window, self.cfg.max_context)

    def memory_report(self) -> dict:
        report = self.pool.memory_report()
        report.update(arm=self.cfg.arm, dense_slot_bytes=self.plan.config.dense_checkpoint_bytes_per_rank(1),
                      wr_window=self.replay_window)
        return report
