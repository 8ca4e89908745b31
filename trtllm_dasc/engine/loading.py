"""Before a runner loads its model: where the weights come from, and whether the model fits the device."""
from __future__ import annotations

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.model.weights import CheckpointReader
from trtllm_dasc.checkpoint_files import dummy_marker
from trtllm_dasc.model.footprint import check_fits, device_free_bytes, model_footprint
from trtllm_dasc.model.workspace import largest_step
from trtllm_dasc.model.weights import DummyWeights
from trtllm_dasc.plan.synthetic import profile_of_record
from trtllm_dasc.model.rank_weights import RankWeights


def weight_source(cfg: EngineConfig, model_cfg: HybridConfig, tp_rank: int, bundle_order):
    """Where this rank's weights come from: its own file (dasc-build --tp), the checkpoint's safetensors, or
    dummy weights made on the device (--load-format dummy; the seed from the checkpoint's dummy record)."""
    marker = dummy_marker(cfg.model)
    if cfg.load_format == "dummy" or (cfg.load_format == "auto" and marker is not None):
        # the decay profile the build planned with (an engine built before profiles had names: the legacy one)
        return DummyWeights(model_cfg, seed=(marker or {}).get("seed", 0), device=cfg.device,
                            profile=profile_of_record(marker))
    if cfg.rank_weights:
        # this rank's own file (dasc-build --tp): already cut, checked against the plan's bundle order
        return RankWeights(cfg.rank_weights, tp_rank, cfg.tp_size, bundle_order, cfg.rank_weights_id)
    return CheckpointReader(cfg.model)


def check_memory(cfg: EngineConfig, model_cfg: HybridConfig, source, tp_rank: int, bundle_order, num_rows: int,
                 budget: int, replay_window: int = 0):
    """This rank's footprint (weights, KV cache, state rows, checkpoint pool and the largest step's transient
    tensors, with dasc-wr's replay spans of `replay_window` tokens), refused in one line when it exceeds
    cfg.memory_limit_bytes or the device's free memory (model/footprint.py)."""
    # the CUDA-graph padding row and block are at most one more each
    need = model_footprint(model_cfg, source, dtype=cfg.dtype, tp_rank=tp_rank, tp_size=cfg.tp_size,
                           bundle_order=bundle_order, state_rows=num_rows + 1, kv_blocks=cfg.num_kv_blocks + 1,
                           block_size=cfg.block_size, pool_bytes=budget,
                           step=largest_step(cfg, replay_window))
    if cfg.memory_limit_bytes is not None:
        check_fits(need, cfg.memory_limit_bytes, "the memory limit (memory_limit_bytes)")
    else:
        check_fits(need, device_free_bytes(cfg.device), f"device {cfg.device}")
    return need
