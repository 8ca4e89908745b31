"""EngineHost: the engine inside the Triton model's process, behind a plumbing-free interface.

model_repo/dasc_hybrid/1/model.py adapts Triton's request objects and response senders to ``submit`` and
a ``Sink`` (send tensors or an error, flag the final response, say whether the client cancelled); this
class owns the Engine (built from an engine directory, warmed up before the model reports ready, its
loop on its own thread), converts requests and events (serve/convert.py), watches for cancellations, and
keeps what the metrics endpoint reports.
"""
from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from typing import Protocol

from trtllm_dasc.engine.config import engine_config, from_engine_fields  # noqa: F401 - engine_config: the callers' name
from trtllm_dasc.engine_dir import EngineDir
from trtllm_dasc.engine_dir import read as read_engine_dir
from trtllm_dasc.engine.engine import Engine, EngineDead
from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.bls import forwarded_ids
from trtllm_dasc.serve.drain import DRAIN_ENV, mark_drained, read_drain_request
from trtllm_dasc.serve.convert import (Control, ServeRequest, cancelled_tensors, finish_tensor, parse_request,
                                      response_tensors, stats_tensor, stopped_tensors)
from trtllm_dasc.engine.ranks import start_rank

log = logging.getLogger("trtllm_dasc.serve")

# the share of prompt tokens with cached KV above which a near-zero hit rate deserves a warning
SHARED_PREFIX_WARN = 0.3
LOW_HIT_WARN = 0.02
WARN_WINDOW = 64


class Sink(Protocol):
    def send(self, tensors: dict | None, error: str | None, final: bool) -> None: ...
    def cancelled(self) -> bool: ...


# TensorRT-LLM's words for a stop without an id (its model.py answers the same)
NO_STOP_ID = "a stop request needs the request id of the request to stop (an empty id matches no request)"
DRAINING = ("the server is shutting down: new requests are refused (the requests in flight finish or are "
            "cancelled within its drain time)")


def dummy_notice(engine_dir: str | EngineDir) -> str | None:
    """One line saying plainly that the engine's weights are dummy ones, or None for real weights."""
    w = (engine_dir if isinstance(engine_dir, EngineDir) else read_engine_dir(engine_dir)).weights
    if w.get("load_format") != "dummy":
        return None
    return (f"{w.get('note', 'DUMMY WEIGHTS: random values; outputs are meaningless')} (seed {w.get('seed')}"
            + (f", {w['released_shapes']} shapes" if w.get("released_shapes") else "") + ")")


def _cap_output_len(gen, longest_output) -> None:
    """TensorRT-LLM's rule (LlmRequest::validate): a prompt that fits leaves its request_output_len cut to the
    context left, with a warning, rather than refused (clients that send a large max_tokens are served); a
    prompt that fills the context, or bad values, are left to the engine's one-line refusals. An engine whose
    KV cache holds fewer tokens than its max context (dasc-build warns) cuts to what the cache holds instead:
    ``longest_output(prompt_len)`` is Engine.longest_output, (the most, what bounds it)."""
    try:
        prompt, asked = len(gen.prompt), int(gen.max_new_tokens)
    except (TypeError, ValueError):
        return
    if prompt <= 0:
        return
    most, bound = longest_output(prompt)
    if 0 < most < asked:
        log.warning("request_output_len %d with a prompt of %d tokens exceeds %s: changed to %d",
                    asked, prompt, bound, most)
        gen.max_new_tokens = most


class EngineHost:
    def __init__(self, engine_dir: str, *, decoupled: bool = True, exclude_input_default: bool = False,
                 warmup: bool = True):
        self.decoupled, self.exclude_default = decoupled, exclude_input_default
        found = read_engine_dir(engine_dir)
        cfg = from_engine_fields(found.engine, f"{found.path}/config.json")
        self.dummy_notice = dummy_notice(found)
        if self.dummy_notice:
            log.warning("%s", self.dummy_notice)
        if cfg.step_delay_s or cfg.step_slowdown != 1.0:
            log.warning("ABLATION: every step is held %g ms + %g x its own time once ready (dasc-build "
                        "--ablation-step-*): this engine is slower on purpose", cfg.step_delay_s * 1e3,
                        cfg.step_slowdown - 1.0)
        if cfg.tp_size > 1:
            # this process (the server's Python backend stub) is rank 0 of the mpirun that `dasc serve --tp`
            # started; the other ranks are serve.worker processes beside the server
            self.engine = start_rank(cfg)
        else:
            self.engine = Engine(cfg)
        self.warmup_report = self.engine.warmup() if warmup else None
        if self.warmup_report:
            # the server log's model load spans weights and warm-up: this line splits them (a cold kernel cache
            # put 5.6 minutes there on the H200, a warm one ~35 s)
            r = self.warmup_report
            print(f"dasc: warm-up: {r['requests']} requests in {r['seconds']:.1f} s (prompts up to "
                  f"{r['longest_prompt']} tokens, batch sizes {r['batch_sizes']})", file=sys.stderr, flush=True)
        self.engine.start()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._inflight: dict[object, tuple[ServeRequest, Sink]] = {}
        # non-empty Triton id -> its requests in flight, oldest first (ids may repeat across clients)
        self._by_triton_id: dict[str, list[_Group]] = {}
        self._recent: list[tuple[int, int, int]] = []     # (prompt, matched KV, cached) per finished request
        self._groups: set[_Group] = set()                 # every Triton request in flight (for the drain)
        self._stop = threading.Event()
        # Triton requests answered with an error before the engine ran them (bad input, a stop without an
        # id, a duplicate id, a refusal while draining or once the engine is gone): Triton's python backend
        # counts a decoupled request as a success whatever its response says, so this is the only count
        self.rejected = 0
        # `dasc serve` asks for a graceful drain by writing this file (serve/drain.py): {"deadline": epoch s}
        self._drain_file = os.environ.get(DRAIN_ENV) or None
        self._drain_deadline: float | None = None
        self._drained = False
        self._watcher = threading.Thread(target=self._watch, name="dasc-cancel-watch", daemon=True)
        self._watcher.start()

    # ---- requests ---------------------------------------------------------------------------------------
    def submit(self, inputs: dict, triton_id: str, sink: Sink) -> None:
        """Answer one Triton request through ``sink``; every path ends with exactly one final response."""
        try:
            # a stop signal comes with dummy inputs (TensorRT-LLM's client sends input_lengths 0): first
            stop = inputs.get("stop")
            if stop is not None and stop.size and bool(stop.reshape(-1)[0]):
                self._stop_request(triton_id or "", sink)
                return
            parsed = parse_request(inputs, triton_id or "", decoupled=self.decoupled,
                                   exclude_default=self.exclude_default)
            if isinstance(parsed, Control):
                self._control(parsed, sink)
                return
            self._run(parsed, triton_id, sink)
        except UserError as e:
            self._reject(sink, str(e))
        except Exception as e:  # noqa: BLE001 - the request fails, the model keeps serving
            log.exception("request %r failed", triton_id)
            self._reject(sink, f"internal error: {type(e).__name__}: {e}")

    def _reject(self, sink: Sink, error: str) -> None:
        with self._lock:
            self.rejected += 1
        sink.send(None, error, True)

    def _run(self, parsed: list[ServeRequest], triton_id: str, sink: Sink) -> None:
        if self._drain_deadline is not None:
            raise UserError(DRAINING)
        if not self.decoupled and len(parsed) > 1:
            # a plain request has exactly one response, and a response holds one sequence (a streamed batch
            # answers each entry with its batch_index): refused, never answered with one entry of the batch
            raise UserError(f"input_ids: a batch of {len(parsed)} sequences needs the decoupled model (build "
                            "without --no-decoupled), or send one request per sequence")
        for sreq in parsed:
            _cap_output_len(sreq.gen, self.engine.longest_output)
        group = _Group(len(parsed), sink, self.engine.abort, lambda g: self._unregister(triton_id, g))
        # engine ids are ours: Triton ids may be empty or repeat across clients
        for sreq in parsed:
            sreq.gen.request_id = (triton_id, next(self._ids))
            group.rids.append(sreq.gen.request_id)
        if len(parsed) == 1 and not parsed[0].streaming:
            # a stopped non-streaming request answers what it generated (its client saw nothing yet)
            group.partial = lambda s=parsed[0]: stopped_tensors(s)
        with self._lock:
            # ids may repeat (clients that each number theirs from 0): TensorRT-LLM serves both and a stop
            # names the latest with that id (model_instance_state.cc maps the id to the newest request); here
            # too, and once the latest ends the one before it is the stop's again. An empty id is "no id":
            # never registered, never matched by a stop
            # a request a forwarding model made (bls.forward_id) under its client's id too: a stop naming either
            # finds it, and the forwarder's cancellation (the whole id) finds it alone
            for key in _stop_keys(triton_id):
                self._by_triton_id.setdefault(key, []).append(group)
            self._groups.add(group)
            for sreq in parsed:
                self._inflight[sreq.gen.request_id] = (sreq, sink)
        try:
            # the whole batch or none of it (Engine.submit_all): a bad entry, a shutdown or the engine's death
            self.engine.submit_all([(sreq.gen, lambda out, s=sreq: self._event(s, group, out)) for sreq in parsed])
        except (UserError, EngineDead) as e:
            # a dead or shut-down engine refuses like bad input: one line, nothing left registered
            with self._lock:
                self.rejected += 1
                for rid in group.rids:
                    self._inflight.pop(rid, None)
            group.fail(str(e))

    def _event(self, sreq: ServeRequest, group: "_Group", out) -> None:
        if out.finished:
            with self._lock:
                self._inflight.pop(sreq.gen.request_id, None)
            if out.finish_reason in ("length", "stop"):
                st = out.stats
                self._note_hit(st.prompt_tokens, st.kv_matched_tokens, st.cached_tokens)
        if out.finish_reason == "error":
            group.fail(out.error or "request failed")
        elif out.finish_reason == "cancelled":
            group.cancel()
        else:
            group.send(response_tensors(sreq, out), out.finished, out.finish_reason)

    def _unregister(self, triton_id: str, group: "_Group") -> None:
        """The request's final response is out: its id is free again (for a new request and for stops)."""
        with self._lock:
            self._groups.discard(group)
            for key in _stop_keys(triton_id):
                groups = self._by_triton_id.get(key, [])
                if group in groups:
                    groups.remove(group)
                    if not groups:
                        del self._by_triton_id[key]

    def _stop_request(self, triton_id: str, sink: Sink) -> None:
        """TensorRT-LLM's `stop` input: end the in-flight request with this (non-empty) request id. The
        stopped request's final response says so (finish_reason 'cancelled', no tokens), never passing for
        a normal completion; the stop itself gets an empty final response."""
        if not triton_id:
            raise UserError(NO_STOP_ID)
        with self._lock:
            groups = self._by_triton_id.get(triton_id)
            group = groups[-1] if groups else None
        if group is not None:
            group.cancel(stopped=True)
        sink.send(None, None, True)

    def _control(self, control: Control, sink: Sink) -> None:
        if control.command == "flush":
            self.engine.flush()
        sink.send(stats_tensor(self.stats()), None, True)

    # ---- cancellation -----------------------------------------------------------------------------------
    def _watch(self) -> None:
        """Client cancellations reach the engine as aborts (a queued request produces no event to notice
        them on, so this polls)."""
        while not self._stop.wait(0.05):
            self._check_drain()
            with self._lock:
                items = list(self._inflight.items())
            for rid, (_, sink) in items:
                try:
                    if sink.cancelled():
                        self.engine.abort(rid)
                except Exception:  # noqa: BLE001 - a dead sender is a cancelled one
                    self.engine.abort(rid)

    # ---- graceful drain ---------------------------------------------------------------------------------
    def _check_drain(self) -> None:
        """Once `dasc serve` asked for a drain: admission is closed (submit refuses in one line), the requests
        in flight run on until the deadline, then every one left is cancelled (its final response says
        'cancelled'); once none is left a marker file says so, and `dasc serve` stops tritonserver, which
        then finds nothing in flight and unloads the models at once."""
        if self._drain_deadline is None:
            if self._drain_file is None or not os.path.exists(self._drain_file):
                return
            self._drain_deadline = read_drain_request(self._drain_file)
            log.warning("draining: %d requests in flight, cancelled in %.1f s unless finished", len(self._groups),
                        max(0.0, self._drain_deadline - time.time()))
        with self._lock:
            left = list(self._groups)
        if not left:
            if not self._drained:
                self._drained = True
                mark_drained(self._drain_file)
                log.warning("drained: nothing in flight")
            return
        if time.time() < self._drain_deadline:
            return
        for group in left:
            group.cancel()
        log.warning("drain deadline: cancelled %d requests", len(left))

    # ---- reporting -----------------------------------------------------------------------------------------
    def _note_hit(self, prompt: int, matched: int, cached: int) -> None:
        with self._lock:
            self._recent.append((prompt, matched, cached))
            if len(self._recent) < WARN_WINDOW:
                return
            window, self._recent = self._recent, []
        total = sum(p for p, _, _ in window)
        shared = sum(m for _, m, _ in window) / total
        hit = sum(c for _, _, c in window) / total
        if shared > SHARED_PREFIX_WARN and hit < LOW_HIT_WARN:
            s = self.engine.stats()
            log.warning("the last %d requests share prefixes (%.0f%% of prompt tokens had cached KV) but only "
                        "%.1f%% were served from a checkpoint: %d checkpoint slots, %d checkpoint evictions "
                        "so far; consider a larger --state-budget-bytes, a larger --wmax or --codec int8",
                        len(window), 100 * shared, 100 * hit, s["checkpoint_slots"],
                        s["evictions"]["checkpoints"] + s["evictions"]["checkpoints_with_kv"])

    def stats(self) -> dict:
        s = self.engine.stats()
        s["inflight"] = len(self._inflight)
        s["rejected"] = self.rejected
        # the server's view, as the metrics port shows it (dasc_requests_ended_total): a request refused before
        # the engine ran it ended in error too (cache_control's stats said error 0 beside 14 refusals). The
        # engine's own count of the refusals it made at submit stays rejected_requests (a part of rejected)
        s["ended"] = {**s["ended"], "error": s["ended"]["error"] + self.rejected}
        s["draining"] = self._drain_deadline is not None
        s["time_ns"] = time.time_ns()
        return s

    def shutdown(self, timeout: float = 30.0) -> None:
        """Finish what is running (Triton's finalize), then stop."""
        self._stop.set()
        self.engine.shutdown(drain=True, timeout=timeout)


def _stop_keys(triton_id: str) -> list[str]:
    """The ids a stop may name a request by: its own (none when empty) and, for a forwarded one, its client's
    and every forwarder's between (bls.forwarded_ids)."""
    return forwarded_ids(triton_id) if triton_id else []


class _Group:
    """The responses of one Triton request (several engine requests when its batch dimension is > 1): each
    sequence's last response carries its own finish_reason (and its batch_index), the final flag goes on the
    last response of the last sequence; an error, a cancellation or a stop ends it once. ``on_done(group)``
    runs after its final response."""

    def __init__(self, n: int, sink: Sink, abort, on_done=None):
        self.left, self.sink, self.done, self.abort, self.on_done = n, sink, False, abort, on_done
        self.rids: list = []
        # the tensors a stop request's final response carries (None: no tokens)
        self.partial = None
        self.lock = threading.Lock()

    def send(self, tensors: dict | None, finished: bool, reason: str | None = None) -> None:
        with self.lock:
            if self.done:
                return
            if finished:
                self.left -= 1
                # this sequence's own reason: a batch's final response said "stop" for a sequence that ran to
                # its length once another had stopped, and the stopped one's last response said nothing
                tensors = {**(tensors or {}), **finish_tensor(reason if reason == "stop" else "length")}
            final = self.left == 0
            self.done = final
            if tensors is not None:
                self.sink.send(tensors, None, final)
        if final:
            self._done()

    def fail(self, error: str) -> None:
        self._end(error)

    def cancel(self, stopped: bool = False) -> None:
        """Cancelled (a stop request naming it, or a shutdown): a final response with finish_reason
        'cancelled' and no tokens, or for a stopped non-streaming request the tokens so far (``partial``).
        (A client that cancelled its own request is not listening any more.)"""
        self._end(None, stopped)

    def _end(self, error: str | None, stopped: bool = False) -> None:
        """The request is answered once: its other sequences stop computing (their events are dropped)."""
        with self.lock:
            if self.done:
                return
            self.done = True
            tensors = None
            if error is None:
                tensors = self.partial() if stopped and self.partial is not None else cancelled_tensors()
            self.sink.send(tensors, error, True)
        self._done()
        for rid in self.rids:
            self.abort(rid)

    def _done(self) -> None:
        if self.on_done is not None:
            self.on_done(self)
