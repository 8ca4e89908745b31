"""Engine: the serving loop. Thread-safe ``submit`` / ``abort``, a step loop on its own thread (``start``,
``shutdown``), or synchronous ``step`` / ``generate`` for tools and tests.

One step: take in new requests and aborts -> the scheduler's StepPlan -> ``ModelRunner.execute`` ->
book the output -> deliver callbacks. A step that raises fails only its own requests (each gets an error
callback, everything they held is freed) and the loop goes on; if the bookkeeping itself is found
inconsistent afterwards, the engine stops and reports itself dead rather than serve from a broken cache.
A callback that raises is dropped and its request released.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

from trtllm_dasc.engine import compile_watch
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest, RequestOutput, RequestStats
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.engine.scheduler import Scheduler
from trtllm_dasc.engine.sequence import Sequence
from trtllm_dasc.engine.slow_step import SlowStepLog, threshold
from trtllm_dasc.engine.telemetry import Telemetry
from trtllm_dasc.errors import UserError, naming_entry
from trtllm_dasc.engine.warmup import warmup


def ablation_hold_s(delay_s: float, slowdown: float, step_s: float) -> float:
    """How long a step's results wait under the ablation knobs (EngineConfig.step_delay_s / step_slowdown): a
    fixed delay plus (slowdown - 1) x the step's own runner time; 0 with the defaults."""
    return delay_s + (slowdown - 1.0) * step_s


log = logging.getLogger("trtllm_dasc.engine")


class EngineDead(RuntimeError):
    """The engine stopped after an unrecoverable error; the message says which."""


class RequestFailed(RuntimeError):
    """``generate``: a request ended with an error."""


class Engine:
    def __init__(self, cfg: EngineConfig, runner=None):
        """``runner``: what executes the step plans (default: a ModelRunner of ``cfg`` in this process;
        parallel.DistributedRunner at tp_size > 1, which also sends every plan to the other ranks)."""
        self.cfg = cfg
        if runner is None and cfg.tp_size > 1:
            raise UserError(f"tp_size {cfg.tp_size} runs on {cfg.tp_size} MPI ranks: start it through "
                            "trtllm_dasc.parallel (dasc serve --tp / dasc logits --tp)")
        self.runner = runner if runner is not None else ModelRunner(cfg)
        runner = self.runner
        self.scheduler = Scheduler(cfg, runner.pool.num_slots, runner.num_rows, runner.replay_window,
                                   host_slots=getattr(runner, "num_host_slots", 0),
                                   slot_bytes=getattr(runner, "slot_bytes", 1),
                                   flops_per_token=getattr(runner, "flops_per_token", 1.0),
                                   flops_per_pair=getattr(runner, "flops_per_pair", 0.0))
        self.telemetry = Telemetry()
        self.slow_steps = SlowStepLog(threshold(cfg.slow_step_s))
        # the compile watch's count at the end of warm-up (None: not watched: no warm-up yet, or a CPU engine)
        self._compiled_base: int | None = None
        self.vocab_size = self.runner.model.spec.vocab_size
        self._cv = threading.Condition()
        self._inbox: deque[Sequence] = deque()
        self._aborts: deque = deque()
        self._commands: deque = deque()             # (callable, threading.Event): run by the loop between steps
        self._seqs: dict[object, Sequence] = {}     # in flight: submitted, final callback not yet delivered
        self._thread: threading.Thread | None = None
        self._stop, self._drain, self._closed = False, True, False
        self.dead: str | None = None
        self.ready = False
        # per TP rank: its checkpoint pool's memory report (set by parallel.run_ranks; this process's alone at TP1)
        self.rank_reports = [self.runner.memory_report()]

    @property
    def cache(self):
        return self.scheduler.cache

    def longest_output(self, prompt_len: int) -> tuple[int, str]:
        """(the largest request_output_len a prompt of prompt_len tokens can be served with, what bounds it):
        the max context, or the KV cache where it holds fewer tokens than the context (dasc-build warns)."""
        by_context = self.cfg.max_context - prompt_len
        by_cache = self.scheduler.longest_output_that_fits(prompt_len)
        if by_cache < by_context:
            return by_cache, f"the KV cache ({self.cfg.num_kv_blocks} blocks of {self.cfg.block_size} tokens)"
        return by_context, f"the max context of {self.cfg.max_context}"

    # ---- submission (any thread) ----------------------------------------------------------------------
    def _check(self, req: GenerationRequest) -> None:
        if not isinstance(req, GenerationRequest):
            raise UserError(f"submit takes a GenerationRequest, got {type(req).__name__}")
        req.validate(self.vocab_size, self.cfg.max_context, self.cfg.out_of_vocab_inputs)
        self.scheduler.check_fits(len(req.prompt), req.max_new_tokens)

    def submit(self, req: GenerationRequest, callback=None) -> None:
        """Queue a request; ``callback(RequestOutput)`` is called from the engine's thread. Bad input raises
        UserError here, before anything is allocated."""
        self.submit_all([(req, callback)])

    def submit_all(self, items: list) -> None:
        """Queue several (request, callback) pairs as one (a Triton request's batch): every one is checked,
        then all are queued under one lock, or none is: a batch with one bad entry (its error names it), or a
        shutdown or the engine's death meanwhile, refuses the whole batch, never leaves its first entries running
        (they ran a step, were aborted, and one refused request also counted as a cancellation)."""
        try:
            for i, (req, callback) in enumerate(items):
                with naming_entry(i, len(items)):
                    if callback is not None and not callable(callback):
                        raise UserError("callback must be callable")
                    self._check(req)
            ids = [req.request_id for req, _ in items]
            with self._cv:
                if self.dead:
                    raise EngineDead(f"the engine is dead: {self.dead}")
                if self._closed:
                    raise EngineDead("the engine is shut down")
                for i, rid in enumerate(ids):
                    if rid in self._seqs or rid in ids[:i]:
                        raise UserError(f"request_id {rid!r} is already in flight")
                for req, callback in items:
                    # a request object may be submitted again: its figures start afresh, here, after the check
                    # above (the same object still in flight keeps its own)
                    req.stats = RequestStats(prompt_tokens=len(req.prompt), arrival_time_ns=time.time_ns())
                    seq = Sequence(req, callback)
                    self._seqs[req.request_id] = seq
                    self._inbox.append(seq)
                self._cv.notify()
        except UserError:
            self.telemetry.rejected_requests += 1
            raise

    def abort(self, request_id) -> bool:
        """Cancel a request; it gets one final callback with reason 'cancelled'. False if not in flight."""
        with self._cv:
            seq = self._seqs.get(request_id)
            if seq is None:
                return False
            # the request itself, not its id: if it finishes before the abort is drained, a later request
            # that reuses the id must not be cancelled by it
            self._aborts.append(seq)
            self._cv.notify()
            return True

    # ---- the loop ---------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the engine loop is already running")
        self._stop = False
        # at TP: the step watchdog (parallel/runner.py) times served steps only, not warm-up's compiles
        arm = getattr(self.runner, "arm_step_watchdog", None)
        if callable(arm):
            arm()
        self._thread = threading.Thread(target=self._loop, name="dasc-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._stop or self.has_work()):
                    self._cv.wait()
                if self._stop and not (self._drain and self.has_work()):
                    return
            self.step()
            if self.dead:
                return

    def shutdown(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop the loop; no request is accepted afterwards. drain=True finishes every queued request first,
        False cancels them. Raises TimeoutError (touching nothing) if the loop has not stopped in time."""
        with self._cv:
            self._stop, self._drain, self._closed = True, drain, True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the engine loop did not stop within {timeout} s")
            self._thread = None
        elif drain and not self.dead:
            self.run_until_idle()
        with self._cv:
            queued = list(self._inbox)
            self._inbox.clear()
        self.scheduler.add(queued)
        for seq in list(self._seqs.values()):
            self._finish(seq, "cancelled")
        # the other TP ranks (parallel.DistributedRunner) wait for plans until told to stop
        self.runner.stop()

    def has_work(self) -> bool:
        """Anything queued, running, to be cancelled or a command to run."""
        return bool(self._inbox or self._aborts or self._commands or self.scheduler.has_work())

    def run_until_idle(self) -> None:
        self._check_sync()
        while self.has_work():
            self.step()
            if self.dead:
                raise EngineDead(self.dead)

    def _check_sync(self) -> None:
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("the engine loop runs on its own thread: use submit/abort")

    # ---- one step ----------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one step; False when there was nothing to do."""
        self._check_sync()
        if self.dead:
            raise EngineDead(self.dead)
        self._drain_inbox()
        try:
            sched = self.scheduler.schedule()
        except Exception as e:  # noqa: BLE001 - scheduling is bookkeeping: a failure means it is broken
            log.exception("scheduling failed")
            self._die(f"scheduling failed: {type(e).__name__}: {e}")
            return True
        if sched is None:
            return False
        plan, owners = sched
        self.telemetry.note_step(plan.spans, owners)
        try:
            out = self._execute(plan, owners)
        except Exception as e:  # noqa: BLE001 - a failing step fails its requests, never the loop
            log.exception("step %d failed", plan.step)
            self.scheduler.free_captures(plan)
            for s in dict.fromkeys(owners + self.scheduler.joining() + self.scheduler.prepared_by(plan)):
                self._finish(s, "error", f"step failed: {type(e).__name__}: {e}")
            return True
        if out.copy_errors:
            # a failed copy fails only the requests that read what it was to write (scheduler.apply)
            log.error("step %d: host tier copies failed: %s", plan.step,
                      "; ".join(f"{plan.copy_name(i)}: {e}" for i, e in enumerate(out.copy_errors) if e))
            for i, e in enumerate(out.copy_errors):
                if e:
                    self.telemetry.tier_copy_failures[plan.copy_kind(i)] += 1
        try:
            events = self.scheduler.apply(plan, owners, out)
            for s, token, error in events:
                if error is not None:
                    self._finish(s, "error", error)
                elif s.finish_reason is None:
                    self._emit(s, token)
        except Exception as e:  # noqa: BLE001 - bookkeeping broke: stop rather than serve a corrupt cache
            log.exception("bookkeeping failed in step %d", plan.step)
            self._die(f"bookkeeping failed in step {plan.step}: {type(e).__name__}: {e}")
        return True

    def _execute(self, plan, owners):
        """runner.execute, timed: a step past the slow-step threshold logs what it ran, failed or not."""
        watch = compile_watch.WATCH
        t0, n0, s0 = time.perf_counter(), watch.count, watch.seconds
        try:
            out = self.runner.execute(plan)
        finally:
            took = time.perf_counter() - t0
            compiled = None if self._compiled_base is None else (watch.count - n0, watch.seconds - s0)
            try:
                self.slow_steps.note(plan, owners, took, compiled)
            except Exception:  # noqa: BLE001 - a diagnostic must not fail the step
                log.exception("the slow-step log failed")
        hold = ablation_hold_s(self.cfg.step_delay_s, self.cfg.step_slowdown, took)
        if hold > 0 and self.ready:
            # the ablation's slower engine (EngineConfig.step_delay_s / step_slowdown): results wait, as its
            # would; served traffic only (warm-up, before ready, runs at the engine's own speed)
            time.sleep(hold)
        return out

    def _drain_inbox(self) -> None:
        with self._cv:
            new, aborts, commands = list(self._inbox), list(self._aborts), list(self._commands)
            self._inbox.clear()
            self._aborts.clear()
            self._commands.clear()
        self.scheduler.add(new)
        for seq in aborts:
            self._finish(seq, "cancelled")     # no-op when it has finished meanwhile
        for fn, done in commands:
            try:
                fn()
            finally:
                done.set()

    def _on_loop(self, fn) -> None:
        """Run ``fn`` where the bookkeeping lives: here when no loop thread runs, else on the loop between
        steps (waiting for it)."""
        if self._thread is None or threading.current_thread() is self._thread:
            fn()
            return
        done = threading.Event()
        with self._cv:
            if self.dead:
                raise EngineDead(f"the engine is dead: {self.dead}")
            self._commands.append((fn, done))
            self._cv.notify()
        # a loop that dies (or is shut down) with the command queued never runs it: never wait forever
        while not done.wait(0.2):
            if not self._thread_alive() and not done.is_set():
                raise EngineDead(f"the engine is dead: {self.dead}" if self.dead else "the engine loop has stopped")

    def _thread_alive(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def _emit(self, s: Sequence, token: int) -> None:
        st, now = s.req.stats, time.time_ns()
        # the end token stops the request but is not part of its output, as TensorRT-LLM's executor returns it
        # (NVIDIA/TensorRT-LLM#2190: "stop at the endId, but not include it"): output_ids and sequence_length
        # without it, its final event carries no token (nor a log prob or generation logits for it), unless
        # the request asks for it (include_end_token: the OpenAI frontend). Stop words stay in the output.
        stopped = token == s.req.end_id
        dropped = stopped and not s.req.include_end_token
        if not dropped:
            s.output.append(token)
        st.output_tokens = len(s.output)
        st.first_token_time_ns = st.first_token_time_ns or now
        st.last_token_time_ns = now
        reason = None
        if stopped or any(s.output[-len(w):] == w for w in s.req.stop_words):
            reason = "stop"
        elif len(s.output) >= s.req.max_new_tokens:      # validate keeps prompt + max_new <= max_context
            reason = "length"
        out = RequestOutput(s.rid, [] if dropped else [token], reason is not None, reason, stats=st)
        # the context logits on the first token's event and on the final one (TensorRT-LLM's clients read
        # them from the last response)
        if s.req.return_context_logits and (len(s.output) == 1 or reason is not None):
            import torch
            out.context_logits = torch.cat(s.context_logits) if s.context_logits else None
        if s.req.return_log_probs:
            lp = s.step_log_prob
            if not dropped:
                s.cum_log_prob += lp if lp is not None else 0.0
            out.log_probs, out.cum_log_prob = ([] if dropped else [lp]), s.cum_log_prob
        if s.req.return_generation_logits and s.step_gen_logits is not None and not dropped:
            out.generation_logits = s.step_gen_logits[None]
        s.step_log_prob = s.step_gen_logits = None
        if reason is not None:
            self._finish(s, reason, out=out)
        elif not self._deliver(s, out):
            self._finish(s, "error", "the request's callback raised; it was dropped")

    def _finish(self, s: Sequence, reason: str, error: str | None = None, out: RequestOutput | None = None) -> None:
        """Release a request (running or waiting) and deliver its final event, exactly once."""
        if s.finish_reason is not None:
            return
        s.finish_reason = reason
        self.scheduler.drop(s)
        if reason in ("length", "stop"):
            self.telemetry.record(s.req.stats)
        else:
            self.telemetry.ended[reason] += 1
        with self._cv:
            self._seqs.pop(s.rid, None)
        self._deliver(s, out or RequestOutput(s.rid, [], True, reason, error, s.req.stats))

    def _deliver(self, s: Sequence, out: RequestOutput) -> bool:
        if s.callback is None:
            return True
        try:
            s.callback(out)
            return True
        except Exception:  # noqa: BLE001 - a caller's bug must not reach other requests
            log.exception("callback of request %r raised; dropped", s.rid)
            s.callback = None
            return False

    def _die(self, why: str) -> None:
        """Stop serving: every in-flight request gets a final error; the bookkeeping is left as found."""
        # under the lock submit checks and queues under: a request is queued before this (and failed below) or
        # refused as dead, never queued unseen in between (it would wait for an answer forever)
        with self._cv:
            self.dead = why
            self.ready = False
            seqs = list(self._seqs.values())
        for seq in seqs:
            seq.finish_reason = "error"
            self.telemetry.ended["error"] += 1
            with self._cv:
                self._seqs.pop(seq.rid, None)
            self._deliver(seq, RequestOutput(seq.rid, [], True, "error", f"the engine is dead: {why}",
                                             seq.req.stats))

    # ---- conveniences --------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest], raise_errors: bool = True) -> list[list[int]]:
        """Run requests to completion; outputs in request order (tools and tests). With the loop running
        this waits for it; otherwise it steps in the calling thread."""
        if not requests:
            return []
        outputs = {id(r): [] for r in requests}
        ends, done = {}, threading.Event()

        def collect(out: RequestOutput, key):
            outputs[key].extend(out.token_ids)
            if out.finished:
                ends[key] = out
                if len(ends) == len(requests):
                    done.set()
        # one batch: a bad request refuses them all (submitted one by one, those before it stayed queued, and
        # a retry of the batch was refused as already in flight)
        self.submit_all([(r, lambda out, key=id(r): collect(out, key)) for r in requests])
        if self._thread is None:
            self.run_until_idle()
        else:
            done.wait()
        failed = [e for e in ends.values() if e.finish_reason == "error"]
        if failed and raise_errors:
            raise RequestFailed(f"request {failed[0].request_id!r}: {failed[0].error}")
        return [outputs[id(r)] for r in requests]

    def flush(self) -> None:
        """Drop every cached prefix and checkpoint not pinned by a running request (between protocol phases).
        Safe from any thread: with the loop running it runs there, between steps."""
        self._on_loop(self.scheduler.manager.evict)

    def warmup(self) -> dict:
        # warm-up compiles and autotunes on purpose: neither its compiles nor its slow steps are findings.
        # Afterwards every Triton compile is one (compile_watch.py): its count starts here
        with compile_watch.WATCH.warming(), self.slow_steps.paused():
            report = warmup(self)
        self._compiled_base = compile_watch.watch_after_warmup(self.cfg.device)
        return report

    def reset_stats(self) -> None:
        """Zero the request telemetry and the cache's eviction counters (warm-up's traffic is not the users').
        The count of kernels compiled after warm-up stays: it says whether warm-up missed a specialisation, a
        fact of the process (each compiles once) rather than of the traffic since the reset, and a benchmark
        that resets between phases must still see that its first phase paid for compiles."""
        self.telemetry.reset()
        self.scheduler.manager.reset_stats()
        reset_tiers = getattr(self.runner, "reset_tier_stats", None)
        if reset_tiers is not None:
            reset_tiers()

    def stats(self) -> dict:
        sch = self.scheduler
        out = self.telemetry.snapshot()
        # None: not watched (a CPU engine, no warm-up yet); see reset_stats for why a reset keeps it
        out["kernels_compiled_after_warmup"] = (None if self._compiled_base is None
                                                else compile_watch.WATCH.count - self._compiled_base)
        out.update(arm=self.cfg.arm, **sch.manager.stats())
        out.update(queued=len(sch.waiting) + len(self._inbox), running=len(sch.running), dead=self.dead,
                   steps=sch.steps, max_batch=self.cfg.max_batch, block_size=self.cfg.block_size,
                   # every rank's checkpoint slot as allocated (the planner predicts the largest) and, where the
                   # storage balance moves units, rank 0's all-to-all time per store and load
                   checkpoint_slot_bytes_per_rank=[r.get("slot_bytes") for r in self.rank_reports],
                   exchange=self.runner.exchange_report(), host_tier=self.runner.tier_report())
        return out

    def sanity_check(self) -> None:
        self.scheduler.sanity_check()
        self.runner.pool.sanity_check()
        known = set(self._seqs.values())
        assert set(self.scheduler.running) | set(self.scheduler.waiting) <= known, "a request is untracked"
