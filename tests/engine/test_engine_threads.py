"""The serving loop under concurrency: 8 submitter threads, 500 mixed requests (shared prefixes, some
aborted mid-stream, some malformed), the loop on its own thread. Every good request gets exactly
transformers' greedy generate; every aborted one a single final 'cancelled' event; afterwards every
block, slot and row is free and the invariants hold."""
import random
import threading
from collections import defaultdict

import torch

from engine_helpers import VOCAB, make_engine
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.errors import UserError

N_THREADS, N_REQUESTS = 8, 500


def hf_generate(hf, prompt, n):
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # an explicit mask: generate would otherwise take prompt tokens equal to pad_token_id for padding
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_threads_submit_abort_and_malformed(tiny_models):
    path, hf = tiny_models["kda"]
    rng = random.Random(0)
    bases = [[rng.randrange(VOCAB) for _ in range(rng.randrange(6, 30))] for _ in range(6)]
    prompts = sorted({tuple(b[:rng.randrange(3, len(b) + 1)] + [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 5))])
                      for b in bases for _ in range(8)})
    reference = {p: hf_generate(hf, list(p), 4) for p in prompts}
    # small pools: KV blocks and checkpoint slots are evicted all the time
    engine = make_engine(path, max_batch=4, num_kv_blocks=90, interval=4, block_size=4, prefill_chunk=11,
                         state_budget_bytes=None)
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
