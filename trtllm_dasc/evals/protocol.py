"""Strict warm/replay quality protocol through the real engine and its cache (paper App. C.3).

For every arm, task and context length, one block of N unique instances:
    flush -> warm (one request per instance: prefill, its prompt-end checkpoint stored) ->
    replay x rounds (the same prompt again: it must load that checkpoint; greedy answer, scored exactly)
Only replays count. With rounds > 1 (the paper: three measured rounds after one warm-up pass) an instance's
score is the mean of its rounds, so it stays one unit of the statistics (N = 30, not 90); its round scores
are kept beside it. A replay that did not load its own prompt-end checkpoint (cached_tokens !=
prompt length - 1) is a miss: it is reported and excluded, never scored. Engines use prompt-end
checkpoints only (the paper's protocol) and a pool large enough for the whole block, so nothing is
evicted between warm and replay.

Arms: `dense`; `nr<W>` / `wr<W>` / `wr-warm<W>` (dasc, that load policy; wr-warm: the replay starts from the
checkpoint's retained units, the quality issue's candidate); `+int8` (INT8 codec); `rand<W>@<seed>` (nr with
the count-matched random mask of that seed: the paper's control); `+horizon...` (horizon bands);
`+conv-int8` (the conv state in 8 bits): engine/arms.py has the full syntax.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

# arm specs are the serving benchmarks' (engine/arms.py): dense, nr<W>, wr<W>, wr-warm<W>, rand<W>@<seed>, +int8
from trtllm_dasc.engine.arms import ArmSpec, parse_arm  # noqa: F401  (parse_arm: this module's API too)
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.evals import tasks as T
from trtllm_dasc.evals.vocab import TaskVocab

PAPER_MASK_SEEDS = (1234, 2027, 3407, 4519, 5683)


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
    rounds: int = 1                      # measured replay rounds per instance (the paper's RULER protocol: 3)
    replay_window: int | None = None     # tokens a wr hit replays (None: the plan's, W_max): a diagnostic, e.g.
                                         # how far back the units a W omits still matter on a task

    def __post_init__(self):
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.replay_window is not None and (isinstance(self.replay_window, bool) or
                                               not isinstance(self.replay_window, int) or self.replay_window < 1):
            raise ValueError(f"replay_window must be a positive integer, got {self.replay_window!r}")


def _engine(model: str, arm: ArmSpec, cfg: ProtocolConfig, longest: int, answer_room: int):
    """An engine for one arm: prompt-end checkpoints, room for a block without eviction."""
    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.engine.engine import Engine
    dense = HybridConfig.from_path(model, conv_dtype=cfg.dtype).dense_checkpoint_bytes_per_rank(1)
    block = 16
    per_request = -(-(longest + answer_room + 1) // block)
    return Engine(EngineConfig(model=model, **arm.engine_fields(), dtype=cfg.dtype, device=cfg.device,
                               max_batch=cfg.max_batch, max_context=per_request * block, block_size=block,
                               num_kv_blocks=(cfg.instances + cfg.max_batch + 1) * per_request,
                               prompt_only=True, interval=per_request * block, prefill_chunk=4096,
                               replay_window=cfg.replay_window,
                               # every arm keeps the whole block: the budget of a dense pool that does
                               state_budget_bytes=(cfg.instances + 2) * dense))


def run_arm(model: str, arm: ArmSpec, cfg: ProtocolConfig, progress=None) -> dict:
    """{task: {length: {seed: {"score" (mean of the rounds), "rounds", "cached", "prompt"}}}}; instances no
    round loaded under "misses", single rounds that missed under "round_misses" [task, length, seed, round]."""
    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.sampling import SamplingParams
    vocab = TaskVocab(HybridConfig.from_path(model).schema.network.vocab_size)
    blocks = {(task, n): [T.make(task, n, cfg.seed_base + i, vocab) for i in range(cfg.instances)]
              for task in cfg.tasks for n in cfg.lengths}
    room = max(T.answer_tokens(x) for b in blocks.values() for x in b)
    engine = _engine(model, arm, cfg, max(cfg.lengths), room)
    out = {"arm": arm.spec, "scores": {}, "misses": [], "round_misses": [], "rounds": cfg.rounds, "seconds": 0.0}
    t0 = time.time()
    try:
        for (task, n), block in blocks.items():
            engine.flush()
            if cfg.warm:
                engine.generate([GenerationRequest(("warm", task, n, x.seed), list(x.model_input), 1,
                                                   SamplingParams()) for x in block])
            hits: dict[int, list] = {x.seed: [] for x in block}
            for r in range(cfg.rounds):
                replay = [GenerationRequest(("replay", r, task, n, x.seed), list(x.model_input), T.answer_tokens(x),
                                            SamplingParams()) for x in block]
                # a failed request raises (RequestFailed, naming it): a replay is never silently dropped
                for x, req, tokens in zip(block, replay, engine.generate(replay)):
                    cached = req.stats.cached_tokens
                    if cached != len(x.model_input) - 1:
                        # not this prompt's own prompt-end checkpoint (none, or some other prefix): a miss
                        out["round_misses"].append([task, n, x.seed, r])
                        continue
                    hits[x.seed].append((T.score(x, tokens), cached))
            cell = out["scores"].setdefault(task, {}).setdefault(str(n), {})
            for x in block:
                got = hits[x.seed]
                if not got:
                    # no round loaded the instance's checkpoint: the instance is a miss, never scored
                    out["misses"].append([task, n, x.seed])
                    continue
                cell[str(x.seed)] = {"score": sum(v for v, _ in got) / len(got), "rounds": [v for v, _ in got],
                                     "cached": got[0][1], "prompt": len(x.model_input)}
            if progress is not None:
                progress(arm.spec, task, n, cell)
    finally:
        engine.shutdown()
    out["seconds"] = time.time() - t0
    return out
