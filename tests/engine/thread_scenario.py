"""The engine-seam thread scenario, shared by the in-process test (tests/engine/test_engine_threads.py)
and the TP runs on MPI ranks (tests/tp): 8 submitter threads, 500 mixed requests (shared prefixes, some
aborted mid-stream, some malformed), the loop on its own thread. Every good request gets exactly the
reference's greedy tokens (transformers' generate, computed by the caller); every aborted one a single
final 'cancelled' event; afterwards every block, slot and row is free and the invariants hold."""
import random
import threading
from collections import defaultdict

from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.errors import UserError

N_THREADS, N_REQUESTS = 8, 500
# small pools: KV blocks and checkpoint slots are evicted all the time
ENGINE = dict(max_batch=4, num_kv_blocks=90, interval=4, block_size=4, prefill_chunk=11, max_context=512,
              state_budget_bytes=None)


def scenario_prompts(vocab: int) -> list[tuple[int, ...]]:
    rng = random.Random(0)
    bases = [[rng.randrange(vocab) for _ in range(rng.randrange(6, 30))] for _ in range(6)]
    return sorted({tuple(b[:rng.randrange(3, len(b) + 1)] + [rng.randrange(vocab) for _ in range(rng.randrange(0, 5))])
                   for b in bases for _ in range(8)})


def run_scenario(engine, reference: dict, vocab: int) -> dict:
    """reference: prompt tuple -> its first 4 greedy tokens. Raises AssertionError on any violation;
    returns the engine's final stats."""
    prompts = scenario_prompts(vocab)
    VOCAB = vocab
    engine.start()
    events = defaultdict(list)
    lock = threading.Lock()
    expect, aborted_in_callback, malformed = {}, set(), []

    def callback(out, rid, abort_after_first):
        with lock:
            events[rid].append(out)
        if abort_after_first and len(events[rid]) == 1 and not out.finished:
            engine.abort(rid)

    def submitter(t):
        r = random.Random(100 + t)
        for i in range(N_REQUESTS // N_THREADS + (t < N_REQUESTS % N_THREADS)):
            rid = f"{t}-{i}"
            kind = r.random()
            if kind < 0.08:
                bad = r.choice([[], [VOCAB + 3], [1, -2], "abc"])
                try:
                    engine.submit(GenerationRequest(rid, bad, 2))
                except UserError as e:
                    malformed.append(str(e))
                continue
            prompt = r.choice(prompts)
            n = r.randrange(1, 5)
            abort_mid = kind < 0.2 and n >= 3
            with lock:
                expect[rid] = (prompt, n, abort_mid)
                if abort_mid:
                    aborted_in_callback.add(rid)
            engine.submit(GenerationRequest(rid, list(prompt), n),
                          lambda out, rid=rid, a=abort_mid: callback(out, rid, a))
            if kind > 0.95:
                # a racy abort from this thread: cancelled or finished, either is fine, never both
                engine.abort(rid)
    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(N_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    engine.shutdown(drain=True, timeout=300)
    assert malformed and all("input_ids" in m for m in malformed)
    assert set(events) == set(expect)
    cancelled = 0
    for rid, (prompt, n, abort_mid) in expect.items():
        evs = events[rid]
        finals = [e for e in evs if e.finished]
        assert len(finals) == 1 and evs[-1].finished, (rid, evs)
        tokens = [t for e in evs for t in e.token_ids]
        if finals[0].finish_reason == "cancelled":
            cancelled += 1
            assert finals[0].token_ids == []
            assert tokens == reference[prompt][:len(tokens)]
        else:
            assert not abort_mid, f"{rid} was aborted after its first token yet finished"
            assert finals[0].finish_reason == "length" and tokens == reference[prompt][:n], rid
    assert cancelled >= len(aborted_in_callback)
    engine.sanity_check()
    engine.flush()
    s = engine.stats()
    assert s["kv_blocks_free"] == engine.cfg.num_kv_blocks
    assert s["checkpoint_slots_free"] == s["checkpoint_slots"] and s["state_rows_free"] == s["state_rows"]
    assert s["hit_rate"] > 0.2 and s["queued"] == s["running"] == 0 and s["dead"] is None
    return s
