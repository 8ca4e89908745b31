"""Strict warm/replay quality protocol through the real engine and its cache (paper App. C.3).

For every arm, task and context length, one block of N unique instances:
    flush -> warm (one request per instance: prefill, its prompt-end checkpoint stored) ->
    replay (the same prompt again: it must load that checkpoint; greedy answer, scored exactly)
Only replays count. A replay that did not load its own prompt-end checkpoint (cached_tokens !=
prompt length - 1) is a miss: it is reported and excluded, never scored. Engines use prompt-end checkpoints only (the paper's protocol) and a
pool large enough for the whole block, so nothing is evicted between warm and replay.

Arms: `dense`; `nr<W>` / `wr<W>` / `wr-warm<W>` (dasc, that load policy; wr-warm: the replay starts from the
checkpoint's retained units, the quality issue's candidate); `+int8` (INT8 codec); `rand<W>@<seed>` (nr with
the count-matched random mask of that seed: the paper's control).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass

ARM = re.compile(r"(dense|(nr|wr-warm|wr)(\d+)|rand(\d+)@(\d+))(\+int8)?")
PAPER_MASK_SEEDS = (1234, 2027, 3407, 4519, 5683)


@dataclass(slots=True)
class QualityArm:
    spec: str
    wmax: int = 0
    policy: str = "nr"
    codec: str = "native"
    mask_seed: int | None = None

    def engine_fields(self) -> dict:
        return {"wmax": self.wmax, "policy": self.policy, "codec": self.codec,
                "selection": "random" if self.mask_seed is not None else "decay", "mask_seed": self.mask_seed}


def parse_arm(spec: str) -> QualityArm:
    m = ARM.fullmatch(spec.strip())
    if m is None:
        raise ValueError(f"arm {spec!r}: expected dense, nr<W>, wr<W>, wr-warm<W> or rand<W>@<seed>, each optionally +int8")
    codec = "int8" if m.group(6) else "native"
    if m.group(1) == "dense":
        return QualityArm(spec, codec=codec)
    if m.group(2):
        return QualityArm(spec, int(m.group(3)), m.group(2), codec)
    return QualityArm(spec, int(m.group(4)), "nr", codec, int(m.group(5)))


@dataclass(slots=True)
class ProtocolConfig:
    tasks: tuple[str, ...]
    lengths: tuple[int, ...] = (1024, 2048, 4096)
    instances: int = 30                  # unique instances per (task, length): the statistical unit
    seed_base: int = 0                   # instance seeds seed_base .. seed_base + instances - 1
    max_batch: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    warm: bool = True                    # False: no warm pass (a control in which every replay misses)


def _engine(model: str, arm: QualityArm, cfg: ProtocolConfig, longest: int, answer_room: int):
    """An engine for one arm: prompt-end checkpoints, room for a block without eviction."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.engine import Engine
    dense = HybridConfig.from_path(model, conv_dtype=cfg.dtype).dense_checkpoint_bytes_per_rank(1)
    block = 16
    per_request = -(-(longest + answer_room + 1) // block)
    return Engine(EngineConfig(model=model, **arm.engine_fields(), dtype=cfg.dtype, device=cfg.device,
                               max_batch=cfg.max_batch, max_context=per_request * block, block_size=block,
                               num_kv_blocks=(cfg.instances + cfg.max_batch + 1) * per_request,
                               prompt_only=True, interval=per_request * block, prefill_chunk=4096,
                               # every arm keeps the whole block: the budget of a dense pool that does
                               state_budget_bytes=(cfg.instances + 2) * dense))


def _run(engine, requests) -> list:
    """Submit and step to the end; per request (tokens, cached_tokens, error)."""
    results = [None] * len(requests)
    toks = [[] for _ in requests]

    def callback(out, i):
        toks[i].extend(out.token_ids)
        if out.finished:
            results[i] = (toks[i], out.stats.cached_tokens, out.error if out.finish_reason == "error" else None)
    for i, r in enumerate(requests):
        engine.submit(r, lambda out, i=i: callback(out, i))
    engine.run_until_idle()
    return results


def run_arm(model: str, arm: QualityArm, cfg: ProtocolConfig, progress=None) -> dict:
    """{task: {length: {seed: {"score", "cached", "prompt"}}}}, misses under "misses"."""
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.sampling import SamplingParams
    from trtllm_dasc.evals import tasks as T
    from trtllm_dasc.evals.vocab import TaskVocab
    from trtllm_dasc.config import HybridConfig
    vocab = TaskVocab(HybridConfig.from_path(model).schema.network.vocab_size)
    blocks = {(task, n): [T.make(task, n, cfg.seed_base + i, vocab) for i in range(cfg.instances)]
              for task in cfg.tasks for n in cfg.lengths}
    room = max(T.answer_tokens(x) for b in blocks.values() for x in b)
    engine = _engine(model, arm, cfg, max(cfg.lengths), room)
    out = {"arm": arm.spec, "scores": {}, "misses": [], "seconds": 0.0}
    t0 = time.time()
    try:
        for (task, n), block in blocks.items():
            engine.flush()
            if cfg.warm:
                _run(engine, [GenerationRequest(("warm", task, n, x.seed), list(x.model_input), 1, SamplingParams())
                              for x in block])
            replay = [GenerationRequest(("replay", task, n, x.seed), list(x.model_input), T.answer_tokens(x),
                                        SamplingParams()) for x in block]
            cell = out["scores"].setdefault(task, {}).setdefault(str(n), {})
            for x, (tokens, cached, error) in zip(block, _run(engine, replay)):
                if error is not None:
                    raise RuntimeError(f"arm {arm.spec}, {task} at {n}, instance {x.seed}: {error}")
                if cached != len(x.model_input) - 1:
                    # not this prompt's own prompt-end checkpoint (none, or some other prefix): a miss
                    out["misses"].append([task, n, x.seed])
                    continue
                cell[str(x.seed)] = {"score": T.score(x, tokens), "cached": cached, "prompt": len(x.model_input)}
            if progress is not None:
                progress(arm.spec, task, n, cell)
    finally:
        engine.shutdown()
    out["seconds"] = time.time() - t0
    return out
