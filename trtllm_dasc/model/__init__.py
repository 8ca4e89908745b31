"""Model runtime: GDN / KDA linear attention, gated GQA / MLA attention, MLP / MoE, paged KV cache,
recurrent-state pool, HF safetensors loader with TP bundle slicing. See model.py for the entry point."""
from trtllm_dasc.model.kv_cache import KVCacheConfig, PagedKVCache, SeqKV
from trtllm_dasc.model.model import DTYPES, ForwardOutput, HybridModel, SeqInput
from trtllm_dasc.model.recurrence import get_backend, run_recurrence
from trtllm_dasc.model.spec import ModelSpec
from trtllm_dasc.model.state import RecurrentState, StateRows
from trtllm_dasc.model.weights import CheckpointReader, DummyWeights, RandomWeights, WeightError

__all__ = ["HybridModel", "SeqInput", "ForwardOutput", "DTYPES", "PagedKVCache", "KVCacheConfig",
           "SeqKV", "RecurrentState", "StateRows", "ModelSpec", "CheckpointReader", "RandomWeights",
           "DummyWeights", "WeightError", "get_backend", "run_recurrence"]
