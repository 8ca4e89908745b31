"""Engine-wide request counters, readable by the serving layer (and its metrics endpoint)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from trtllm_dasc.engine.request import RequestStats


@dataclass(slots=True)
class Telemetry:
    requests: int = 0                # completed (length or stop)
    prompt_tokens: int = 0           # sum L_i over completed requests
    cached_tokens: int = 0           # sum C_i
    replayed_tokens: int = 0
    checkpoint_loads: dict = field(default_factory=lambda: {"nr": 0, "wr": 0})
    checkpoint_stores: int = 0
    rejected_requests: int = 0       # refused at submit
    ended: dict = field(default_factory=lambda: {"cancelled": 0, "error": 0})
    kv_matched_tokens: int = 0       # prompt tokens of completed requests whose KV the cache held
    # host-tier copies that failed (each failed only the requests reading what it was to write), by kind
    tier_copy_failures: dict = field(default_factory=lambda: {"checkpoint_demotion": 0, "checkpoint_promotion": 0,
                                                              "kv_demotion": 0, "kv_warm_back": 0})
    # the last step's batch (TensorRT-LLM's per-iteration stats): sequences with a span, those in prefill
    # (replays count), their tokens, and those decoding
    last_step: dict = field(default_factory=lambda: {"scheduled": 0, "context": 0, "context_tokens": 0,
                                                     "generation": 0})

    def record(self, stats: RequestStats) -> None:
        self.requests += 1
        self.prompt_tokens += stats.prompt_tokens
        self.cached_tokens += stats.cached_tokens
        self.replayed_tokens += stats.replayed_tokens
        self.kv_matched_tokens += stats.kv_matched_tokens
        self.checkpoint_stores += stats.checkpoints_stored
        if stats.checkpoint_loaded:
            # a load is wr only where a replay really ran (a plan with nothing omitted replays nothing)
            self.checkpoint_loads["wr" if stats.replayed_tokens else "nr"] += 1

    def note_step(self, spans, owners) -> None:
        """One step's plan: ``owners[i]`` is the sequence of ``spans[i]``; a span starting inside the prompt
        is prefill (context), one past it is a decode."""
        context, generation, tokens = set(), set(), 0
        for span, s in zip(spans, owners):
            if span.in_prompt(len(s.prompt)):
                context.add(id(s))
                tokens += len(span.token_ids)
            else:
                generation.add(id(s))
        self.last_step = {"scheduled": len(context | generation), "context": len(context),
                          "context_tokens": tokens, "generation": len(generation)}

    @property
    def hit_rate(self) -> float:
        """Token-weighted external cache hit, paper Eq. 9: sum C_i / sum L_i."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def snapshot(self) -> dict:
        out = asdict(self)
        out["hit_rate"] = self.hit_rate
        return out

    def reset(self) -> None:
        fresh = Telemetry()
        for name in self.__slots__:
            setattr(self, name, getattr(fresh, name))
