"""A prefill split at K through the real checkpoint store: the engine's hit path, one request, all logits.

Used by `dasc logits --split` and by tests: prefill [0, K) capturing the state at K -> store it in the
pool -> load it into a fresh row (nr zero-fill; wr replays [K - W, K) from a zero scratch row in the same
forward and merges the omitted units) -> continue [K, T) on the KV blocks of the first part.
"""
from __future__ import annotations

import torch

from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.errors import UserError
from trtllm_dasc.model import SeqInput
from trtllm_dasc.model.model import Refresh


def split_prefill_logits(cfg: EngineConfig, ids: list[int], split: int, check_vocab=None) -> torch.Tensor:
    if not 0 < split < len(ids):
        raise UserError(f"--split must be in 1..{len(ids) - 1} for {len(ids)} tokens, got {split}")
    runner = ModelRunner(cfg)
    if check_vocab is not None:
        check_vocab(ids, runner.model.spec.vocab_size)
    model, kv, state = runner.model, runner.kv, runner.state
    first_row = runner.take_row()
    out = model.forward([SeqInput(ids[:split], first_row, seq_id="prefix", capture_at=(split,))], state, kv)
    (slot,) = runner.pool.alloc(1)
    runner.store_captures(out, [0], [slot])
    prefix_logits, table = out.logits, kv.block_table("prefix")
    # a fresh row: nothing of the first pass's state carries over but the checkpoint
    row = runner.take_row()
    runner.load_checkpoint(slot, row)
    kv.add_sequence("rest", blocks=table, length=split)
    batch, refresh = [], None
    fork = runner.fork_replay(table, split, "replay")
    if fork is not None:
        start, scratch = fork
        batch.append(SeqInput(ids[start:split], scratch, seq_id="replay"))
        refresh = Refresh(1, [scratch], [row], runner.merge_omitted)
    batch.append(SeqInput(ids[split:], row, seq_id="rest"))
    rest = model.forward(batch, state, kv, refresh=refresh)
    skip = rest.cu_seqlens[-2]        # the replay's rows come first
    return torch.cat([prefix_logits, rest.logits[skip:]])
