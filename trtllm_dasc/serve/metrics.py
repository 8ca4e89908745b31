"""The engine's counters on Triton's metrics port, through the Python backend's custom-metrics API.

Every family is prefixed dasc_ and labelled with the model; gauges are set and counters advanced from
EngineHost.stats() twice a second by a background thread (and once more when the model stops), so a
scrape of /metrics shows cached and prompt tokens, the hit rate, free and used checkpoint slots, KV
blocks and state rows, evictions by kind, loads by policy, replayed tokens and the queue.

Beside them, TensorRT-LLM's own gauges (its tensorrtllm_backend's custom_metrics_reporter: the family
names, the category label and its values, the model and version labels), for every quantity we have, so
dashboards built on nv_trt_llm_* work unchanged; docs/design.md "Metrics" maps each to its source.
"""
from __future__ import annotations

import os
import threading
import time

INTERVAL_S = 0.5

# (metric, help, kind, how to read it from stats, labels)
FAMILIES = [
    ("dasc_prompt_tokens_total", "prompt tokens of completed requests", "counter", lambda s: s["prompt_tokens"]),
    ("dasc_cached_tokens_total", "prompt tokens served from a checkpoint (Eq. 9 numerator)", "counter",
     lambda s: s["cached_tokens"]),
    ("dasc_replayed_tokens_total", "tokens dasc-wr hits replayed", "counter", lambda s: s["replayed_tokens"]),
    ("dasc_requests_total", "completed requests", "counter", lambda s: s["requests"]),
    ("dasc_hit_rate", "token-weighted cache hit rate (paper Eq. 9)", "gauge", lambda s: s["hit_rate"]),
    ("dasc_queue_length", "requests waiting for admission", "gauge", lambda s: s["queued"]),
    ("dasc_running_requests", "requests running in the engine", "gauge", lambda s: s["running"]),
    ("dasc_requests_rejected_total", "requests refused before the engine ran them (also in ended{error})",
     "counter", lambda s: s.get("rejected", 0)),
    ("dasc_engine_alive", "1 while the engine serves, 0 once it stopped after an error", "gauge",
     lambda s: 0 if s["dead"] else 1),
    # the host tier (0 while it is off): checkpoints copied host -> device for a hit, and device evictions
    # that kept the checkpoint on the host (written back, or already there)
    ("dasc_checkpoint_promotions_total", "host-tier checkpoints copied back to the device for a hit", "counter",
     lambda s: s.get("checkpoint_promotions", 0)),
    ("dasc_checkpoint_demotions_total", "device checkpoint evictions kept in the host tier", "counter",
     lambda s: s.get("checkpoint_demotions", 0)),
    # checkpoints that left the cache for good, each once (the per-tier eviction series count copies: a
    # demoted checkpoint is a device eviction and later a host one)
    ("dasc_checkpoints_dropped_total", "cached checkpoints gone from every tier (evicted, flushed, lost with "
     "their KV, or a failed copy's)", "counter", lambda s: s.get("checkpoints_dropped", 0)),
    # the copy stream's seconds on finished copies (checkpoints and KV blocks share one stream; rank 0)
    ("dasc_host_tier_copy_seconds_total", "seconds the host tier's copy stream spent copying (rank 0)", "counter",
     lambda s: (s.get("host_tier") or {}).get("copy_seconds", 0.0)),
    # warm-up is meant to leave nothing to compile: a rise means a user's request waited for a compile (the
    # server log names the kernel; engine/compile_watch.py). 0 where nothing is watched (a CPU engine)
    ("dasc_kernels_compiled_after_warmup_total", "Triton kernels compiled inside requests, after warm-up (rank 0)",
     "counter", lambda s: s.get("kernels_compiled_after_warmup") or 0),
]
_NO_COPIES = {"to_host": 0, "to_device": 0}
LABELLED = [
    ("dasc_checkpoint_slots", "checkpoint slots", "gauge", "state",
     lambda s: {"free": s["checkpoint_slots_free"], "used": s["checkpoint_slots"] - s["checkpoint_slots_free"]}),
    ("dasc_kv_blocks", "full-attention KV blocks", "gauge", "state",
     lambda s: {"free": s["kv_blocks_free"], "used": s["kv_blocks"] - s["kv_blocks_free"]}),
    ("dasc_state_rows", "active recurrent-state rows", "gauge", "state",
     lambda s: {"free": s["state_rows_free"], "used": s["state_rows"] - s["state_rows_free"]}),
    ("dasc_evictions_total", "cache evictions", "counter", "kind", lambda s: dict(s["evictions"])),
    ("dasc_host_checkpoint_slots", "host-tier checkpoint slots (0 while the tier is off)", "gauge", "state",
     lambda s: {"free": s.get("host_checkpoint_slots_free", 0),
                "used": s.get("host_checkpoint_slots", 0) - s.get("host_checkpoint_slots_free", 0)}),
    ("dasc_checkpoint_bytes", "bytes of cached checkpoints per tier", "gauge", "tier",
     lambda s: dict(s.get("checkpoint_bytes") or {"device": 0, "host": 0})),
    ("dasc_checkpoint_hits_total", "requests that reused a checkpoint, by the tier it was found in", "counter",
     "tier", lambda s: dict(s.get("checkpoint_hits") or {"device": 0, "host": 0})),
    ("dasc_checkpoint_hit_tokens_total", "prompt tokens reused from a checkpoint, by the tier it was found in",
     "counter", "tier", lambda s: dict(s.get("checkpoint_hit_tokens") or {"device": 0, "host": 0})),
    # checkpoint copies by cause: device -> host at a device eviction (write-back) or at store time
    # (write-through), host -> device for a hit; and what the host tier itself evicted (dropped for good)
    ("dasc_checkpoint_tier_copies_total", "checkpoint copies between the tiers, by cause", "counter", "kind",
     lambda s: {"demotion": s.get("checkpoint_demotion_copies", 0),
                "write_through": s.get("checkpoint_write_through_copies", 0),
                "promotion": s.get("checkpoint_promotions", 0)}),
    ("dasc_host_evictions_total", "entries the host tier dropped, by kind", "counter", "kind",
     lambda s: {"checkpoints": s.get("checkpoint_host_evictions", 0),
                "kv_nodes": (s.get("kv_tier") or {}).get("host_evictions", 0)}),
    # host KV (--host-kv-blocks): prefix nodes and blocks demoted to the host and warmed back for a hit
    ("dasc_host_kv_blocks", "host-tier KV blocks (0 while host KV is off)", "gauge", "state",
     lambda s: {"free": s.get("host_kv_blocks_free", 0),
                "used": s.get("host_kv_blocks", 0) - s.get("host_kv_blocks_free", 0)}),
    ("dasc_kv_tier_blocks_total", "KV blocks moved between the tiers", "counter", "kind",
     lambda s: {"demoted": (s.get("kv_tier") or {}).get("demoted_blocks", 0),
                "warmed": (s.get("kv_tier") or {}).get("warmed_blocks", 0)}),
    ("dasc_kv_tier_nodes_total", "prefix nodes whose KV moved between the tiers", "counter", "kind",
     lambda s: {"demoted": (s.get("kv_tier") or {}).get("demoted_nodes", 0),
                "warmed": (s.get("kv_tier") or {}).get("warmed_nodes", 0)}),
    ("dasc_tier_copy_failures_total", "host-tier copies that failed (each fails only the requests that read it)",
     "counter", "kind", lambda s: dict(s.get("tier_copy_failures") or {})),
    ("dasc_host_tier_copy_bytes_total", "bytes queued on the host tier's copy stream (rank 0), by direction",
     "counter", "direction", lambda s: dict((s.get("host_tier") or {}).get("copy_bytes") or _NO_COPIES)),
    ("dasc_checkpoint_loads_total", "checkpoint loads on a hit", "counter", "policy",
     lambda s: dict(s["checkpoint_loads"])),
    # errors: failed in the engine, or refused before it ran them (EngineHost.stats counts both)
    ("dasc_requests_ended_total", "requests ended without completing", "counter", "reason",
     lambda s: dict(s["ended"])),
    # only where the TP storage balance moves units (the stats' exchange is None otherwise: no series)
    ("dasc_checkpoint_exchange_seconds_total", "seconds in the storage balance's all-to-all (rank 0)", "counter",
     "op", lambda s: {op: v["seconds"] for op, v in (s.get("exchange") or {}).items()}),
]



def _busy(s: dict) -> bool:
    return bool(s["running"] or s["queued"])


def _step(s: dict, key: str) -> int:
    # TensorRT-LLM reports the last iteration's batch; an idle engine runs none, so its batch is empty
    return s["last_step"][key] if _busy(s) else 0


def memory_bytes() -> dict:
    """This process's resident memory and the bytes torch holds on the GPU (0 without CUDA)."""
    out = {"cpu": 0, "gpu": 0}
    try:
        with open("/proc/self/statm") as f:
            out["cpu"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["gpu"] = sum(torch.cuda.memory_allocated(d) for d in range(torch.cuda.device_count()))
    return out


# TensorRT-LLM's gauge families: (name, help, category label, {label value: how to read it from stats})
TRTLLM = [
    ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type", {
        "active": lambda s: s["running"], "max": lambda s: s["max_batch"],
        "scheduled": lambda s: _step(s, "scheduled"), "context": lambda s: _step(s, "context"),
        "waiting": lambda s: s["queued"]}),
    ("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics", "memory_type", {
        "cpu": lambda s: s["memory"]["cpu"], "gpu": lambda s: s["memory"]["gpu"]}),
    ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type", {
        "max": lambda s: s["kv_blocks"], "free": lambda s: s["kv_blocks_free"],
        "used": lambda s: s["kv_blocks"] - s["kv_blocks_free"], "tokens_per": lambda s: s["block_size"],
        "reused": lambda s: s["kv_matched_tokens"] // s["block_size"],
        "fraction": lambda s: (s["kv_blocks"] - s["kv_blocks_free"]) / s["kv_blocks"]}),
    ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
     "inflight_batcher_specific_metric", {
        "total_context_tokens": lambda s: _step(s, "context_tokens"),
        "generation_requests": lambda s: _step(s, "generation"),
        # no pipeline parallelism (one micro batch) and no pausing (a request keeps its blocks to the end)
        "micro_batch_id": lambda s: 0, "paused_requests": lambda s: 0}),
    ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type", {
        "timestamp": lambda s: s["time_ns"] // 1000, "iteration_counter": lambda s: s["steps"]}),
]


class EngineMetrics:
    def __init__(self, pb_utils, host, model: str = "tensorrt_llm", version: str = "1"):
        self.host = host
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE}
        self.metrics = []      # (metric object, kind, reader, last value)
        # a MetricFamily must outlive its Metrics (the backend refuses updates otherwise): keep them all
        self.families = []
        for name, help_text, kind, read in FAMILIES:
            family = pb_utils.MetricFamily(name=name, description=help_text, kind=kinds[kind])
            self.families.append(family)
            self.metrics.append([family.Metric(labels={}), kind, read, 0])
        for name, help_text, kind, label, read in LABELLED:
            family = pb_utils.MetricFamily(name=name, description=help_text, kind=kinds[kind])
            self.families.append(family)
            for key in read(host.stats()):
                self.metrics.append([family.Metric(labels={label: key}), kind,
                                     lambda s, read=read, key=key: read(s)[key], 0])
        for name, help_text, label, reads in TRTLLM:
            family = pb_utils.MetricFamily(name=name, description=help_text, kind=kinds["gauge"])
            self.families.append(family)
            for key, read in reads.items():
                metric = family.Metric(labels={"model": model, "version": str(version), label: key})
                self.metrics.append([metric, "gauge", read, 0])
        self._stop = threading.Event()
        self.update()
        self._thread = threading.Thread(target=self._loop, name="dasc-metrics", daemon=True)
        self._thread.start()

    def update(self) -> None:
        stats = self.host.stats()
        stats["memory"] = memory_bytes()
        for entry in self.metrics:
            metric, kind, read, last = entry
            value = read(stats)
            if kind == "gauge":
                metric.set(value)
            elif value > last:
                metric.increment(value - last)
            entry[3] = value

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            # never ends on an error: `dasc serve` takes a refresh timestamp that stops for a dead engine
            try:
                self.update()
            except Exception as e:  # noqa: BLE001
                print(f"[dasc metrics] update failed: {type(e).__name__}: {e}", flush=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.update()
        # metrics before their families (the backend's rule)
        self.metrics.clear()
        self.families.clear()
