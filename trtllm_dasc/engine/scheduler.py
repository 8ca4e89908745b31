"""Scheduler: rank 0's bookkeeping. It owns the request queues and the cache manager (cache.CacheManager:
KV blocks, checkpoint slots, state rows and the radix tree), turns the queue into one StepPlan per step, and
applies the StepOutput back. It touches the cache only through the manager's API.

Per request: match -> lock the checkpoint node -> reserve every KV block it may write (one rule,
cache.fresh_blocks: reused full blocks shared, a reused partial block copied, fresh blocks for the rest)
-> load the deepest checkpoint (nr zero-fill; wr also replays the last W cached tokens from a zero
scratch row inside the first step) -> prefill the rest in chunks, capturing checkpoints at the interval
grid, the branch point and the prompt end -> insert the prompt into the tree -> decode -> release.

A request writes KV only into blocks it allocated, so nothing is copied after admission and a running
request never starves. One that cannot fit waits; one that could not fit an idle cache is refused at
submit; a hit that cannot fit with nothing running (it pins its own prefix) is admitted as a miss.
"""
from __future__ import annotations

import time
from collections import deque

from trtllm_dasc.cache import CacheManager, fresh_blocks
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.sequence import Sequence
from trtllm_dasc.engine.step import Span, StepOutput, StepPlan
from trtllm_dasc.errors import UserError



def replay_blocks(prompt_len: int, block_size: int, replay_window: int) -> int:
    """KV blocks a cached hit's replay takes beside its sequence's: its min(W, prompt - 1) positions."""
    replay = min(replay_window, prompt_len - 1)
    return fresh_blocks(0, replay, block_size) if replay > 0 else 0


def worst_case_blocks(prompt_len: int, max_new: int, block_size: int, replay_window: int) -> int:
    """Blocks a request needs with nothing reused (a hit needs no more: see fresh_blocks). Also dasc-build's
    check that the KV cache holds a sequence of the max context."""
    return fresh_blocks(0, prompt_len + max_new - 1, block_size) + replay_blocks(prompt_len, block_size,
                                                                                 replay_window)

class Scheduler:
    def __init__(self, cfg: EngineConfig, num_slots: int, num_rows: int, replay_window: int,
                 manager: CacheManager | None = None, host_slots: int = 0, slot_bytes: int = 1,
                 flops_per_token: float = 1.0, flops_per_pair: float = 0.0):
        """``manager``: the cache to schedule on (default: a fresh one of ``cfg``'s sizes, with ``host_slots``
        host-tier checkpoint slots of ``slot_bytes`` each; flops_per_token / flops_per_pair feed cost-aware
        eviction: model/prefill_flops.py)."""
        self.cfg, self.replay_window = cfg, replay_window
        self.manager = manager if manager is not None else CacheManager.create(
            cfg.block_size, cfg.num_kv_blocks, num_slots, num_rows, interval=cfg.interval,
            prompt_only=cfg.prompt_only, host_slots=host_slots, eviction=getattr(cfg, "eviction", "lru"),
            flops_per_token=flops_per_token, flops_per_pair=flops_per_pair, slot_bytes=slot_bytes,
            write_policy=getattr(cfg, "host_write_policy", "write-back"),
            host_kv_blocks=getattr(cfg, "host_kv_blocks", 0))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps = 0

    # the manager's parts, read-only, for tools and tests (the scheduler itself goes through the manager)
    @property
    def cache(self):
        return self.manager.tree

    @property
    def blocks(self):
        return self.manager.blocks

    @property
    def slots(self):
        return self.manager.slots

    @property
    def rows(self):
        return self.manager.rows

    # ---- the queues ----------------------------------------------------------------------------------
    def add(self, seqs) -> None:
        """Queue new sequences (in order) for admission."""
        self.waiting.extend(seqs)

    def drop(self, s: Sequence) -> None:
        """Take a sequence out, running (everything it holds is given back) or waiting; no-op otherwise."""
        if s in self.running:
            self.release(s)
        elif s in self.waiting:
            self.waiting.remove(s)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- admission -----------------------------------------------------------------------------------
    def worst_case_blocks(self, prompt_len: int, max_new: int) -> int:
        return worst_case_blocks(prompt_len, max_new, self.cfg.block_size, self.replay_window)

    def longest_output_that_fits(self, prompt_len: int) -> int:
        """The largest request_output_len whose worst case fits the KV cache (0: the prompt alone does not):
        worst_case_blocks solved for max_new."""
        room = self.cfg.num_kv_blocks - replay_blocks(prompt_len, self.cfg.block_size, self.replay_window)
        return max(0, room * self.cfg.block_size - prompt_len + 1)

    def check_fits(self, prompt_len: int, max_new: int) -> None:
        worst = self.worst_case_blocks(prompt_len, max_new)
        if worst > self.cfg.num_kv_blocks:
            raise UserError(f"input_ids: the request needs {worst} KV blocks, the cache has {self.cfg.num_kv_blocks}")

    def _forced_tokens(self) -> int:
        """The tokens the running requests take from the next step whatever its budget: a decode token each
        and the replays that run in it (the host-tier hits still waiting to join run theirs later)."""
        return sum(not s.in_prefill for s in self.running) + sum(
            s.replay.end - s.replay.start for s in self.running if s.replay is not None and s.joining is None)

    def _admit(self, plan: StepPlan) -> None:
        # a replay runs whole in its admission step, beside the decode tokens and the replays admitted before
        # it: a hit whose replay would take the step past max_num_tokens waits (several hits admitted at once
        # ran steps of 4x the cap the memory check and warm-up sized for). With nothing running it is admitted
        # (a window longer than the cap could run no other way); the queue is FIFO, so it waits for no longer
        forced = self._forced_tokens()
        while self.waiting and len(self.running) < self.cfg.max_batch:
            seq = self.waiting[0]
            room = (float("inf") if self.cfg.max_num_tokens is None or not self.running
                    else self.cfg.max_num_tokens - forced)
            lease = self.manager.admit(seq.prompt, seq.end_len, seq.req.use_cache, self.replay_window,
                                       idle=not self.running, max_replay=room)
            if lease is None:
                return
            self.waiting.popleft()
            self._start(seq, lease, plan)
            self.running.append(seq)
            if lease.replay is not None:
                forced += lease.replay.end - lease.replay.start

    def _start(self, seq: Sequence, lease, plan: StepPlan) -> None:
        bs, m, st = self.cfg.block_size, lease.match, seq.req.stats
        c = m.ckpt_len
        seq.lease, seq.done_tokens = lease, c
        plan.kv_copies.extend(lease.copies)
        if lease.promoted and any(not s.in_prefill and s.joining is None for s in self.running):
            # the promotion's copy runs beside this step's decodes (they always have a span); the request
            # loads and joins the batch in the next step, whose load waits for the copy (runner._wait_slots)
            seq.joining = plan = StepPlan(plan.step, [])
        st.first_scheduled_time_ns = time.time_ns()
        st.kv_matched_tokens = m.kv_len
        st.kv_reused_blocks = c // bs
        st.kv_new_blocks = len(lease.table) - st.kv_reused_blocks
        st.kv_total_blocks = len(lease.table)
        if not c:
            plan.resets.append(lease.row)
            return
        # a load overwrites the whole row (retained units, zeros elsewhere, conv): no reset needed
        plan.loads.append((m.ckpt_slot, lease.row))
        st.cached_tokens, st.checkpoint_loaded = c, True
        r = lease.replay
        if r is not None:
            # a window reaching position 0 starts from the known zero state (exact, as wr): the warm start
            # stands in for an unknown state inside the prefix, and the state at c put at 0 was lossy
            if self.cfg.policy == "wr-warm" and r.start > 0:
                plan.warm_loads.append((m.ckpt_slot, r.row))
            else:
                plan.resets.append(r.row)
            st.replayed_tokens = c - r.start

    # ---- one step ------------------------------------------------------------------------------------
    def schedule(self) -> tuple[StepPlan, list[Sequence]] | None:
        """The next step's plan and, per span, its sequence (None when there is nothing to run)."""
        plan = StepPlan(self.steps, [])
        # the host-tier hits held back join now, their replays within the step's budget: the replay was fitted
        # to its admission step's budget, but this step also decodes the requests whose prefill ended there
        # (a step past max_num_tokens, the bound of model/workspace.py largest_step). One that does not fit
        # waits for the decodes to end (_admit takes nothing new meanwhile); with none, it fits (admitted
        # beside a decode, its replay is below the cap)
        room = float("inf") if self.cfg.max_num_tokens is None else self.cfg.max_num_tokens - self._forced_tokens()
        held = False
        for s in self.running:
            if s.joining is not None:
                n = 0 if s.replay is None else s.replay.end - s.replay.start
                if n > room:
                    held = True
                    continue
                room -= n
                plan.resets += s.joining.resets
                plan.loads += s.joining.loads
                plan.warm_loads += s.joining.warm_loads
                s.joining = None
        if not held:        # while a hit waits to join, nothing new: the decodes it waits for only finish
            self._admit(plan)
        if not self.running:
            if self.waiting:
                raise RuntimeError("no request can be admitted: the KV cache is pinned")
            return None
        self.steps += 1
        owners = []
        # the step's token budget: replays (they must run in the step of the load they merge into) and decode tokens
        # first, prefill chunks share the rest in admission order; a request left without tokens waits
        budget = self.cfg.max_num_tokens or float("inf")
        for s in self.running:
            if s.replay is not None and s.joining is None:
                r = s.replay
                plan.spans.append(Span(s.prompt[r.start:r.end], r.row, r.start, r.table, replay_into=s.row))
                owners.append(s)
                budget -= r.end - r.start
        budget -= sum(not s.in_prefill for s in self.running)
        # the step's captures (cfg.max_step_captures): the memory check counts the captured states of that many
        captures_left = self.cfg.max_step_captures or float("inf")
        for s in self.running:
            if s.joining is not None:
                continue
            chunk = 1
            if s.in_prefill:
                # what this span takes (a short rest of a prompt takes less than a chunk): the budget left
                # goes to the next requests, not to tokens nobody runs
                chunk = int(min(self.cfg.prefill_chunk, budget, len(s.prompt) - s.done_tokens))
                if captures_left != float("inf"):
                    chunk = self._within_captures(s, chunk, captures_left)
                if chunk < 1:
                    continue
                budget -= chunk
            span = self._span(s, chunk)
            captures_left -= len(span.captures)
            plan.spans.append(span)
            owners.append(s)
        if all(span.replay_into is not None for span in plan.spans):
            # every prefill waited for budget the replays took: give the first one a token
            s = next(s for s in self.running if s.in_prefill and s.joining is None)
            plan.spans.append(self._span(s, 1))
            owners.append(s)
        # every copy between the tiers the bookkeeping above assumed (admission's promotions, the demotions
        # of the checkpoints evicted for them and for this step's captures)
        plan.demotions, plan.promotions = self.manager.take_copies()
        plan.kv_tier_copies = self.manager.take_kv_copies()
        return plan, owners

    @staticmethod
    def _within_captures(s: Sequence, chunk: int, left) -> int:
        """The chunk cut before its capture past `left` (the step's captures left): that checkpoint is the
        next step's, not dropped."""
        ahead = [p for p in s.lease.positions if s.done_tokens < p <= s.done_tokens + chunk]
        return chunk if len(ahead) <= left else ahead[int(left)] - 1 - s.done_tokens

    def _span(self, s: Sequence, chunk: int) -> Span:
        req = s.req
        if not s.in_prefill:
            n = len(s.output)
            return Span([s.output[-1]], s.row, len(s.prompt) + n - 1, s.table, logits="last",
                        sampling=req.sampling, token_index=n, banned=banned_tokens(s), **_extras(s))
        end = min(len(s.prompt), s.done_tokens + chunk)
        captures = self.manager.extend(s.lease, s.done_tokens, end)
        last = end == len(s.prompt)
        logits = "all" if req.return_context_logits else ("last" if last else "none")
        return Span(s.prompt[s.done_tokens:end], s.row, s.done_tokens, s.table, captures, logits,
                    req.sampling if last else None, 0, banned_tokens(s) if last else [], **(_extras(s) if last else {}))

    def apply(self, plan: StepPlan, owners: list[Sequence], out: StepOutput) -> list[tuple[Sequence, int | None, str | None]]:
        """Book a step that ran. Returns (sequence, sampled token or None, error or None) per sequence that
        produced something, in span order, then one error per sequence that read what a failed tier copy was
        to write (held-back hits included); the caller emits them and finishes what is done."""
        failed = self._copy_failures(plan, out)
        stored = iter(out.stored)
        events = []
        for i, (span, s) in enumerate(zip(plan.spans, owners)):
            if span.captures:
                self.manager.store(s.lease, span.captures, [next(stored) for _ in span.captures])
            if s in failed:
                # never inserted: its captures (computed from what the copy left undefined) go at its release
                continue
            if span.replay_into is not None:
                self.manager.end_replay(s.lease)
                continue
            if out.logits[i] is not None:
                s.context_logits.append(out.logits[i])
            if s.in_prefill:
                s.done_tokens = span.start + len(span.token_ids)
                if not s.in_prefill:
                    s.req.stats.checkpoints_stored = self.manager.insert(s.lease, s.prompt)
            if out.tokens[i] is not None:
                s.step_log_prob = out.log_probs[i] if out.log_probs else None
                s.step_gen_logits = out.gen_logits[i] if out.gen_logits else None
            if out.errors[i] is not None or out.tokens[i] is not None:
                events.append((s, out.tokens[i], out.errors[i]))
        return events + [(s, None, error) for s, error in failed.items()]

    def _copy_failures(self, plan: StepPlan, out: StepOutput) -> dict:
        """{sequence: error} for each running sequence that reads what a failed copy between the tiers
        was to write; the cache drops what those copies left undefined. The other sequences of the step
        read none of it (their rows, slots and blocks are their own or were copied intact)."""
        if not out.copy_errors:
            return {}
        hurt = self.manager.copies_failed(plan.demotions, plan.promotions, plan.kv_tier_copies,
                                          failed=[e is not None for e in out.copy_errors],
                                          leases=[s.lease for s in self.running])
        of = {s.lease: s for s in self.running}
        return {of[lease]: f"host tier copy failed ({plan.copy_name(i)}): {out.copy_errors[i]}"
                for lease, i in hurt.items()}

    # ---- release ---------------------------------------------------------------------------------------
    def release(self, s: Sequence) -> None:
        """Give back everything a running sequence holds (finished, failed or aborted)."""
        self.running.remove(s)
        self.manager.release(s.lease)

    def joining(self) -> list[Sequence]:
        """The host-tier hits held back in the last step planned (a failure of the whole step fails them
        too: their promotions' copies were part of it)."""
        return [s for s in self.running if s.joining is not None and s.joining.step == self.steps - 1]

    def prepared_by(self, plan: StepPlan) -> list[Sequence]:
        """The running requests whose state row (or replay row) this plan resets or loads: the requests it
        admitted, including those it left without tokens (budget, capture cap). A failure of the whole step
        leaves their rows and KV copies unwritten, so it fails them too: kept running, they would decode from
        another request's stale state."""
        rows = set(plan.resets) | {dst for _, dst in plan.loads} | {dst for _, dst in plan.warm_loads}
        return [s for s in self.running if s.row in rows or (s.replay is not None and s.replay.row in rows)]

    def free_captures(self, plan: StepPlan) -> None:
        """A step failed whole: the slots it was to fill were never handed to a sequence, and what each of its
        copies was to write is dropped."""
        for span in plan.spans:
            self.manager.abort(span.captures)
        self.manager.copies_failed(plan.demotions, plan.promotions, plan.kv_tier_copies)

    # ---- invariant -----------------------------------------------------------------------------------
    def sanity_check(self) -> None:
        """Every block reference, slot, row and lock is accounted for by the tree or a running request."""
        self.manager.sanity_check([s.lease for s in self.running])


def _extras(s: Sequence) -> dict:
    """A sampling span's asks beyond the token: the text's tokens when penalties count them, log probs,
    generation logits."""
    req = s.req
    return {"history": s.prompt + s.output if req.sampling.penalized else [],
            "log_prob": req.return_log_probs, "raw_logits": req.return_generation_logits}


def banned_tokens(s: Sequence) -> list[int]:
    """What the next sample must not be: the last token of every bad word whose other tokens end the text
    so far, and end_id while fewer than min_tokens outputs exist (TensorRT-LLM's semantics)."""
    req, text = s.req, s.prompt + s.output
    out = {w[-1] for w in req.bad_words if len(w) == 1 or text[len(text) - len(w) + 1:] == w[:-1]}
    if req.end_id is not None and len(s.output) < req.min_tokens:
        out.add(req.end_id)
    return sorted(out)
