"""Helpers of the engine tests: tiny checkpoints (transformers' save_pretrained) and engine builders."""

import torch

from hybrid_tiny import VOCAB, build

from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.engine.engine import Engine

__all__ = ["VOCAB", "build", "make_engine", "greedy", "reference_greedy", "split_wmax"]


def make_engine(path, **over) -> Engine:
    kw = dict(model=str(path), max_batch=4, block_size=4, num_kv_blocks=400, interval=8, max_context=512)
    kw.update(over)
    return Engine(EngineConfig(**kw))


def greedy(rid, prompt, n=4, **kw) -> GenerationRequest:
    return GenerationRequest(rid, list(prompt), n, SamplingParams(), **kw)


def reference_greedy(hf_model, prompt, n) -> list[int]:
    """Greedy continuation by transformers itself (full recompute each step): the independent reference."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = hf_model(torch.tensor(ids)[None]).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def split_wmax(path) -> int:
    """A W_max that keeps some units and omits others (the test needs both kinds)."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    for wmax in (4, 8, 16, 32, 64, 128, 256, 512):
        plan, _ = plan_from_path(str(path), PlanOptions(wmax=wmax, tp=1, placement="off"))
        kept = sum(map(len, plan.retained))
        if 0 < kept < plan.config.units_per_layer * len(plan.retained):
            return wmax
    raise AssertionError("no W_max splits this model's units")
