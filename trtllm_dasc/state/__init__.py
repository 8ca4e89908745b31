"""Checkpoint store: slot pool, ragged/padded layouts, native and int8 codecs, pack/unpack/merge ops.

naive.py is the torch reference; kernels.py + triton_ops.py the Triton path; ops.py dispatches.
"""
from trtllm_dasc.state.layout import LayoutError, LayoutIndex, StateLayout
from trtllm_dasc.state.ops import dequantize_int8, load, pack, quantize_int8, replay_merge, store, unpack
from trtllm_dasc.state.pool import CheckpointPool, PoolError

__all__ = ["StateLayout", "LayoutIndex", "LayoutError", "CheckpointPool", "PoolError",
           "pack", "unpack", "replay_merge", "quantize_int8", "dequantize_int8", "store", "load"]
