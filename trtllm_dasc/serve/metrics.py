"""The engine's counters on Triton's metrics port, through the Python backend's custom-metrics API.

Every family is prefixed dasc_ and labelled with the model; gauges are set and counters advanced from
EngineHost.stats() twice a second by a background thread (and once more when the model stops), so a
scrape of /metrics shows cached and prompt tokens, the hit rate, free and used checkpoint slots, KV
blocks and state rows, evictions by kind, loads by policy, replayed tokens and the queue.
"""
from __future__ import annotations

import threading

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
    ("dasc_engine_alive", "1 while the engine serves, 0 once it stopped after an error", "gauge",
     lambda s: 0 if s["dead"] else 1),
]
LABELLED = [
    ("dasc_checkpoint_slots", "checkpoint slots", "gauge", "state",
     lambda s: {"free": s["checkpoint_slots_free"], "used": s["checkpoint_slots"] - s["checkpoint_slots_free"]}),
    ("dasc_kv_blocks", "full-attention KV blocks", "gauge", "state",
     lambda s: {"free": s["kv_blocks_free"], "used": s["kv_blocks"] - s["kv_blocks_free"]}),
    ("dasc_state_rows", "active recurrent-state rows", "gauge", "state",
     lambda s: {"free": s["state_rows_free"], "used": s["state_rows"] - s["state_rows_free"]}),
    ("dasc_evictions_total", "cache evictions", "counter", "kind", lambda s: dict(s["evictions"])),
    ("dasc_checkpoint_loads_total", "checkpoint loads on a hit", "counter", "policy",
     lambda s: dict(s["checkpoint_loads"])),
    ("dasc_requests_ended_total", "requests ended without completing", "counter", "reason",
     lambda s: dict(s["ended"])),
    # only where the TP storage balance moves units (the stats' exchange is None otherwise: no series)
    ("dasc_checkpoint_exchange_seconds_total", "seconds in the storage balance's all-to-all (rank 0)", "counter",
     "op", lambda s: {op: v["seconds"] for op, v in (s.get("exchange") or {}).items()}),
]


class EngineMetrics:
    def __init__(self, pb_utils, host):
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
        self._stop = threading.Event()
        self.update()
        self._thread = threading.Thread(target=self._loop, name="dasc-metrics", daemon=True)
        self._thread.start()

    def update(self) -> None:
        stats = self.host.stats()
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
            self.update()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.update()
        # metrics before their families (the backend's rule)
        self.metrics.clear()
        self.families.clear()
