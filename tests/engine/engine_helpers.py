"""Helpers of the engine tests: tiny checkpoints (transformers' save_pretrained) and engine builders."""

import torch

from hybrid_tiny import VOCAB, build

from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.engine.engine import Engine

__all__ = ["VOCAB", "build", "make_engine", "greedy", "reference_greedy", "split_wmax", "one_torch_thread",
           "SERVED_GEOMETRIES", "warmup_watching"]

# the engine geometries warm-up must cover, as pytest parameters (ids: their keys)
SERVED_GEOMETRIES = {
    # the matched-HBM cells' engine (clients/matched_hbm.py's build flags on the 48B: prompt ends only, a
    # 2,801-token interval, one chunk a prompt)
    "matched_hbm": dict(interval=2801, prefill_chunk=8192, max_num_tokens=8192, max_context=2816, prompt_only=True),
    # the GPU tests' and real_model's: short prompts of 2 x interval + 5 tokens
    "interval_256": dict(interval=256, prefill_chunk=2048, max_context=4096),
}


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


def one_torch_thread():
    """A module-scoped fixture's body: torch on one thread while the module runs, then as it was. The tiny
    models' ops take microseconds; on 2 cores torch's second thread only adds its fork/join and spin-waits
    (a logits run measured 3.4 CPU s with 2 threads against 0.1-2.6 s with 1 on a loaded 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def warmup_watching(engine, name: str, watch) -> None:
    """engine.warmup() with the model's method ``name`` wrapped: ``watch(*args, **kw)`` sees each call first."""
    model = engine.runner.model
    method = getattr(model, name)

    def watching(*args, **kw):
        watch(*args, **kw)
        return method(*args, **kw)
    setattr(model, name, watching)
    try:
        engine.warmup()
    finally:
        delattr(model, name)
