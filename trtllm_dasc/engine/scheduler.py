"""Engine: continuous batching over the radix prefix cache and the checkpoint store.

Per request: match -> lock the path -> load the deepest checkpoint (nr zero-fill; wr also replays the
last W cached tokens from a zero scratch row inside the first prefill step) -> prefill the rest in chunks,
capturing checkpoints at the interval grid, the branch point and the prompt end -> insert the prompt into
the tree -> decode -> release. Every step runs one forward over all running requests (replays first, then
prefill chunks, then decode tokens).

KV blocks are reserved at admission for the whole request (prompt + max output), so a running request
never starves; a request that cannot fit waits, one that could never fit is refused at submit.
"""
from __future__ import annotations

from collections import deque

from trtllm_dasc.cache import RadixCache
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.engine.sampling import Sampler
from trtllm_dasc.engine.sequence import Replay, Sequence
from trtllm_dasc.engine.telemetry import Telemetry
from trtllm_dasc.errors import UserError
from trtllm_dasc.model import SeqInput
from trtllm_dasc.model.model import Refresh


class Engine:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.runner = ModelRunner(cfg)
        self.cache = RadixCache(cfg.block_size, self.runner.kv_blocks, self.runner.pool, interval=cfg.interval,
                                prompt_only=cfg.prompt_only)
        self.telemetry = Telemetry()
        self.waiting: deque = deque()
        self.running: list[Sequence] = []
        self._next_seq = 0

    # ---- submission ----------------------------------------------------------------------------------
    def submit(self, req: GenerationRequest, on_token=None) -> None:
        """Queue a request. Bad input raises UserError here, before anything is allocated."""
        try:
            req.validate(self.runner.model.spec.vocab_size, self.cfg.max_context)
            worst = (self._blocks_for(len(req.prompt) + req.max_new_tokens)
                     + self._replay_blocks(len(req.prompt) - 1) + 2)
            if worst > self.cfg.num_kv_blocks:
                raise UserError(f"input_ids: the request needs {worst} KV blocks, the cache has "
                                f"{self.cfg.num_kv_blocks}")
        except UserError:
            self.telemetry.rejected_requests += 1
            raise
        self.waiting.append((req, on_token))

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run_until_idle(self) -> None:
        while self.has_work():
            self.step()

    def generate(self, requests: list[GenerationRequest]) -> list[list[int]]:
        """Run requests to completion (a convenience for tests and the CLI); outputs in request order."""
        outputs = {}
        for r in requests:
            self.submit(r, on_token=lambda tok, final, stats, rid=r.request_id: outputs.setdefault(rid, []).append(tok))
        self.run_until_idle()
        return [outputs.get(r.request_id, []) for r in requests]

    # ---- admission -----------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _replay_blocks(self, cached: int) -> int:
        """Blocks a wr replay's forked sequence may take on a hit at ``cached`` tokens."""
        window = min(self.runner.replay_window, cached)
        return self._blocks_for(window) + 1 if window else 0

    def _reserved_blocks(self) -> int:
        kv = self.runner.kv
        return sum(s.blocks_needed(self.cfg.block_size, len(kv.block_table(s.seq_id))) for s in self.running)

    def _admit(self) -> None:
        need_rows = 2 if self.runner.replay_window else 1
        while (self.waiting and len(self.running) < self.cfg.max_batch
               and self.runner.free_rows >= need_rows):
            req, on_token = self.waiting[0]
            m = self.cache.match(req.prompt)
            # only the reused prefix is pinned: the cached KV beyond the checkpoint gets recomputed
            self.cache.lock(m.ckpt_node)
            reuse = len(m.block_table)
            need = (self._blocks_for(len(req.prompt) + req.max_new_tokens) - reuse + 2
                    + self._replay_blocks(m.ckpt_len))
            if not self.cache.make_room(self._reserved_blocks() + need):
                self.cache.unlock(m.ckpt_node)
                return
            self.waiting.popleft()
            self.running.append(self._start(req, on_token, m))

    def _start(self, req: GenerationRequest, on_token, m) -> Sequence:
        runner, c = self.runner, m.ckpt_len
        row, seq_id = runner.take_row(), ("req", self._next_seq)
        self._next_seq += 1
        runner.kv.add_sequence(seq_id, blocks=m.block_table, length=c)
        seq = Sequence(req, Sampler(req.sampling), on_token, row, seq_id, m,
                       self.cache.checkpoint_positions(len(req.prompt), m), done_tokens=c)
        if c:
            runner.load_checkpoint(m.ckpt_slot, row)
            req.stats.cached_tokens, req.stats.checkpoint_loaded = c, True
            rseq = ("replay", seq_id[1])
            fork = runner.fork_replay(m.block_table, c, rseq)
            if fork is not None:
                seq.replay = Replay(fork[0], c, fork[1], rseq)
                req.stats.replayed_tokens = c - fork[0]
        return seq

    # ---- one step --------------------------------------------------------------------------------------
    def step(self) -> None:
        self._admit()
        if not self.running:
            if self.waiting:
                raise RuntimeError("no request can be admitted: the KV cache is pinned")
            return
        replays = [s for s in self.running if s.replay is not None]
        batch = [SeqInput(s.prompt[s.replay.start:s.replay.end], s.replay.row, seq_id=s.replay.seq_id)
                 for s in replays]
        stepping = []
        for s in self.running:
            if s.in_prefill:
                end = min(len(s.prompt), s.done_tokens + self.cfg.prefill_chunk)
                caps = tuple(p for p in s.positions if s.done_tokens < p <= end)
                batch.append(SeqInput(s.prompt[s.done_tokens:end], s.row, seq_id=s.seq_id, capture_at=caps))
                stepping.append((s, end))
            else:
                batch.append(SeqInput([s.output[-1]], s.row, seq_id=s.seq_id))
                stepping.append((s, None))
        if not self.cache.make_room(self._blocks_for_step(batch)):
            raise RuntimeError("KV blocks reserved at admission are gone: reservation accounting is broken")
        refresh = None
        if replays:
            refresh = Refresh(len(replays), [s.replay.row for s in replays], [s.row for s in replays],
                              self.runner.merge_omitted)
        out = self.runner.model.forward(batch, self.runner.state, self.runner.kv, logits="last", refresh=refresh)
        for s in replays:
            self.runner.kv.free_sequence(s.replay.seq_id)
            self.runner.give_row(s.replay.row)
            s.replay = None
        self._store_checkpoints(out, stepping, len(replays))
        for i, (s, end) in enumerate(stepping):
            logits = out.logits[len(replays) + i]
            if end is not None:
                s.done_tokens = end
                if s.in_prefill:
                    continue
                self._insert_prompt(s)
            self._emit(s, s.sampler(logits))
        for s in [s for s in self.running if s.finished]:
            self._finish(s)

    def _blocks_for_step(self, batch) -> int:
        """Blocks this forward allocates: new tokens' blocks plus a copy of a shared, partly filled one."""
        kv, bs, need = self.runner.kv, self.cfg.block_size, 0
        for s in batch:
            table, start = kv.block_table(s.seq_id), kv.seq_len(s.seq_id)
            need += max(0, self._blocks_for(start + len(s.token_ids)) - len(table))
            need += bool(start % bs and kv.ref[table[-1]] > 1)
        return need

    def _store_checkpoints(self, out, stepping, offset: int) -> None:
        which, slots, owners = [], [], []
        for i, (seq_index, pos) in enumerate(zip(out.capture_seq, out.capture_pos)):
            slot = self.cache.alloc_slot()
            if slot is None:
                # every checkpoint is pinned by running requests: this boundary goes uncached
                continue
            which.append(i)
            slots.append(slot)
            owners.append((stepping[seq_index - offset][0], pos))
        self.runner.store_captures(out, which, slots)
        for (s, pos), slot in zip(owners, slots):
            s.captured[pos] = slot

    def _insert_prompt(self, s: Sequence) -> None:
        table = self.runner.kv.block_table(s.seq_id)
        duplicates = self.cache.insert(s.prompt, table, s.captured)
        s.req.stats.checkpoints_stored = len(s.captured) - len(duplicates)
        s.captured = {}

    def _emit(self, s: Sequence, token: int) -> None:
        s.output.append(token)
        s.req.stats.output_tokens = len(s.output)
        s.finished = (len(s.output) >= s.req.max_new_tokens or token == s.req.end_id
                      or len(s.prompt) + len(s.output) >= self.cfg.max_context)
        if s.on_token is not None:
            s.on_token(token, s.finished, s.req.stats)

    def _finish(self, s: Sequence) -> None:
        self.running.remove(s)
        self.runner.kv.free_sequence(s.seq_id)
        self.cache.unlock(s.match.ckpt_node)
        self.runner.give_row(s.row)
        self.telemetry.record(s.req.stats, self.cfg.policy)

    # ---- maintenance -------------------------------------------------------------------------------------
    def flush(self) -> None:
        """Drop every cached prefix and checkpoint not pinned by a running request."""
        self.cache.flush()

    def stats(self) -> dict:
        out = self.telemetry.snapshot(self.cache)
        out["arm"] = self.cfg.arm
        out["checkpoint_slots"] = self.runner.pool.num_slots
        return out

    def sanity_check(self) -> None:
        kv = self.runner.kv
        refs = {}
        for seq_id in kv.seqs:
            for b in kv.block_table(seq_id):
                refs[b] = refs.get(b, 0) + 1
        self.cache.sanity_check(refs)
        kv.sanity_check()
        self.runner.pool.sanity_check()
