"""The full-dataset phase within a budget (clients/protocol.ProtocolConfig.full_fill_last / full_replay_first):
its fill cut to the last N sends of the whole fill and its replay to the seeded shuffle's first R requests.

The claim that makes the cut fill sound: once the tail alone overflows every checkpoint slot, it leaves the
cache the whole fill leaves, so the replay hits exactly as it would. Checked through the engine's own cache
manager (cache/manager.py, no model: the hits are its bookkeeping), one request at a time, against the whole
fill; and shown to fail when the tail is shorter than the slots. No server."""
from __future__ import annotations

import numpy as np
import pytest

from clients.protocol import ProtocolConfig, fill_and_replay_order, make_phases, unit_requests
from clients.report import phase_weights
from clients.workload import WorkloadConfig, build_workload
from trtllm_dasc.cache.manager import CacheManager
from trtllm_dasc.errors import UserError

BS = 4


def test_the_cut_fill_is_the_whole_fill_s_last_sends_and_the_replay_its_first_requests():
    cats = ["a"] * 5 + ["b"] * 4 + ["c"] * 6
    whole, order = fill_and_replay_order(cats, seed=7, lo=30)
    # by hand: the category firsts (positions 0, 5, 9), then every other position in order
    assert whole == [[0, 5, 9], [1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14]]
    assert order == list(np.random.default_rng([7, 30]).permutation(15))
    cut, first = fill_and_replay_order(cats, seed=7, lo=30, fill_last=4, replay_first=6)
    assert cut == [[0, 5, 9], [11, 12, 13, 14]]
    assert first == order[:6]


def _drive(mgr: CacheManager, prompts: list[list[int]]) -> list[int]:
    """Each prompt as one request through the manager, in turn; the tokens each reused."""
    cached = []
    for p in prompts:
        lease = mgr.admit(p, len(p) + 1)
        assert lease is not None, "nothing runs: a request must be admitted"
        cached.append(lease.match.ckpt_len)
        captures = mgr.extend(lease, lease.match.ckpt_len, len(p))
        mgr.store(lease, captures, [True] * len(captures))
        mgr.insert(lease, p)
        mgr.release(lease)
        mgr.take_copies()
    return cached


def _replay(fill_last: int | None, slots: int = 100, blocks: int = 300, n: int = 420) -> list[int]:
    work = build_workload(WorkloadConfig(vocab=500, prompts=n, scale=0.02))
    prompts = [[int(t) for t in work.prompt(i)] for i in range(n)]
    parts, order = fill_and_replay_order(work.categories, seed=42, lo=0, fill_last=fill_last)
    mgr = CacheManager.create(BS, blocks, slots, num_rows=4, prompt_only=True)
    for part in parts:
        _drive(mgr, [prompts[k] for k in part])
    cached = _drive(mgr, [prompts[k] for k in order])
    mgr.sanity_check([])
    return cached


def test_a_tail_that_overflows_the_slots_leaves_the_cache_the_whole_fill_leaves():
    whole = _replay(None)
    # the replay does hit (a dozen of 420: past every arm's capacity, as the phase is), so there is something
    # to compare; KV (300 blocks) runs short and evicts in both fills too
    assert sum(c > 0 for c in whole) >= 8
    # 2 x 100 slots + 1 in flight: the rule check_fill_tail enforces
    assert _replay(201) == whole
    assert _replay(300) == whole


def test_a_tail_shorter_than_the_slots_does_not():
    # 50 prompts cannot leave what the whole fill leaves in 100 slots: the replay's hits differ
    assert _replay(50) != _replay(None)


def test_the_budget_is_recorded_weighed_and_counted():
    cfg = ProtocolConfig(seeds=(42,), full_phase=True, full_fill_last=300, full_replay_first=250)
    phases = make_phases({"dense": 40, "nr16": 100}, 1000, cfg)
    full = phases[-1]
    assert (full.q, full.fill_last, full.replay_first) == (1000, 300, 250)
    assert all(p.fill_last is None and p.replay_first is None for p in phases[:-1])
    # fill_requests: what make_manifest counts (the tail and the category firsts; none here, a hand manifest)
    manifest = {"phases": [{"name": p.name, "q": p.q, "repeats": 1, "blocks_in_dataset": 1000 // p.q,
                            "blocks": p.blocks[:1], **({"fill_last": p.fill_last, "fill_requests": p.fill_last,
                                                        "replay_first": p.replay_first}
                                                       if p.fill_last else {})} for p in phases]}
    w = phase_weights(manifest["phases"])
    # the sampled replay stands for the whole one: 1000 / 250; a bounded phase: its blocks over the one measured
    assert w["Q=1000 (full dataset)"] == pytest.approx(4.0)
    assert w[phases[0].name] == pytest.approx((1000 // phases[0].q) / 1)
    assert unit_requests(manifest, f"p{len(phases) - 1}-b0-s42") == 300 + 250
    # a budget larger than the dataset is no budget
    big = make_phases({"dense": 40}, 1000, ProtocolConfig(seeds=(42,), full_phase=True, full_fill_last=5000))
    assert big[-1].fill_last is None


def test_bad_budgets_are_refused_in_one_line():
    with pytest.raises(UserError, match="full-dataset phase"):
        ProtocolConfig(full_fill_last=100)                       # no full phase
    with pytest.raises(UserError, match=">= 1"):
        ProtocolConfig(full_phase=True, full_replay_first=0)
    from clients.matched_hbm import check_fill_tail
    phases = make_phases({"dense": 40}, 1000, ProtocolConfig(full_phase=True, full_fill_last=150))
    with pytest.raises(UserError, match=r"2 x 40 slots \+ 96 in flight = 176"):
        check_fill_tail(phases, 40, 96)
    check_fill_tail(phases, 20, 96)                              # 150 >= 136


def test_a_cut_fill_counts_the_category_firsts_sent_before_its_tail():
    from clients.matched_hbm import fill_requests
    work = build_workload(WorkloadConfig(vocab=500, prompts=60, scale=0.02))
    full = make_phases({"dense": 3}, 60, ProtocolConfig(seeds=(42,), full_phase=True, full_fill_last=25))[-1]
    # 14 MMLU-Pro categories, each first prompt sent before the tail (none of them in it: the tail is "the rest")
    assert len(set(work.categories)) == 14 and fill_requests(work, full) == 14 + 25


def test_a_sampled_phase_weighs_its_hits_once():
    """The sampled full-dataset phase's figures against the whole replay, through the cache manager's own
    bookkeeping: the hits fall almost all in the first slots + in-flight positions, inside the sample, so
    weighing the sample Q / R (the old rule) counted each of them Q / R times; the strata
    (report.sampled_strata) count those once and let the rest stand for the whole tail. From a review helper;
    the old rule's error here is ~100%, the strata's one late hit's worth."""
    from clients.report import sampled_strata, weighted_pooled
    n, slots, r = 420, 100, 200
    work = build_workload(WorkloadConfig(vocab=500, prompts=n, scale=0.02))
    lengths = [len(work.prompt(i)) for i in range(n)]
    _, order = fill_and_replay_order(work.categories, seed=42, lo=0)
    whole = _replay(None, slots=slots, n=n)
    head = slots + 1                                   # one request in flight at a time here
    hits = [i for i, c in enumerate(whole) if c]
    assert len(hits) >= 8 and sum(i < head for i in hits) >= len(hits) - 1, hits
    lens = [lengths[k] for k in order]
    ttft = [10.0 if c else 100.0 for c in whole]      # a hit is fast, a miss slow
    block = {"phase": "full", "seed": "42",
             "replay": {"ttft_ms": ttft[:r], "prompt_len": lens[:r], "cached": whole[:r], "seconds": 1.0,
                        "prompt_tokens": sum(lens[:r]), "cached_tokens": sum(whole[:r])}}
    phases = [{"name": "full", "q": n, "replay_first": r, "blocks_in_dataset": 1, "blocks": [[0, n]]}]
    weights = phase_weights(phases)
    new = weighted_pooled([block], weights, sampled_strata(phases, head))
    old = weighted_pooled([block], weights)
    assert new["requests"] == pytest.approx(n) == old["requests"]
    # cached tokens over the whole replay, as each rule estimates them
    exact = sum(whole)
    est_new = new["hit_rate"] * (sum(lens[:head]) + (n - head) / (r - head) * sum(lens[head:r]))
    est_old = old["hit_rate"] * sum(lens[:r]) * n / r
    assert abs(est_new - exact) < 0.2 * exact and abs(est_old - exact) > 0.8 * exact, (est_new, est_old, exact)
    mean = float(np.mean(ttft))
    assert abs(new["ttft_mean_ms"] - mean) < 0.3 * abs(old["ttft_mean_ms"] - mean), (new, old, mean)
    # no strata past the sample, or without a reach: the phase weight alone
    assert sampled_strata(phases, r) == {} and sampled_strata(phases, None) == {}


def test_per_arm_tails_each_leave_what_the_whole_fill_leaves():
    """--full-fill-last auto: each arm fills 2 x its own slots + in flight. The rule holds per arm (its own
    slots are what the tail must overflow), and one arm's tail is not enough for an arm with more slots, so the
    tail must be the arm's own, never the smallest."""
    from clients.protocol import full_fill_tail
    for slots in (30, 100):
        assert _replay(full_fill_tail(slots, 1), slots=slots) == _replay(None, slots=slots)
    assert _replay(full_fill_tail(30, 1), slots=100) != _replay(None, slots=100)


def test_per_arm_tails_are_fixed_in_the_manifest_and_counted_per_arm():
    from clients.matched_hbm import per_arm_fill
    from clients.protocol import run_cell, unit_fill_last
    work = build_workload(WorkloadConfig(vocab=500, prompts=1000, scale=0.02))
    cfg = ProtocolConfig(seeds=(42,), full_phase=True, full_fill_per_arm=True, full_replay_first=250)
    phases = make_phases({"dense": 40, "nr16": 100}, 1000, cfg)
    full = phases[-1]
    assert (full.fill_last, full.fill_per_arm, full.replay_first) == (None, True, 250)
    budget = per_arm_fill(work, full, {"dense": 40, "nr16": 100, "nr512": 600}, concurrency=8)
    # by hand: 2 x slots + 8 in flight; the fill sends the 14 category firsts before its tail; a tail past the
    # block's other prompts (1000 - 14) is the whole fill
    assert budget["fill_last_by_arm"] == {"dense": 88, "nr16": 208, "nr512": 1208}
    assert budget["fill_requests_by_arm"] == {"dense": 14 + 88, "nr16": 14 + 208, "nr512": 1000}
    manifest = {"arms": [{"key": "dense", "spec": "dense"}, {"key": "nr16", "spec": "nr16"},
                         {"key": "nr16@in-process", "spec": "nr16"}, {"key": "nr512", "spec": "nr512"}],
                "phases": [{"name": p.name, "q": p.q, "repeats": 1, "blocks_in_dataset": 1000 // p.q,
                            "blocks": p.blocks[:1]} for p in phases[:-1]]
                + [{"name": full.name, "q": 1000, "repeats": 1, "blocks_in_dataset": 1, "blocks": [[0, 1000]],
                    "replay_first": 250, **budget}]}
    unit = f"p{len(phases) - 1}-b0-s42"
    assert unit_requests(manifest, unit, "dense") == 102 + 250
    assert unit_requests(manifest, unit, "nr16@in-process") == 222 + 250      # the twin fills as its arm
    assert unit_requests(manifest, unit) == 1000 + 250                         # no arm: the most of any
    assert unit_fill_last(manifest, unit, "nr16") == 208
    assert unit_fill_last(manifest, "p0-b0-s42", "nr16") is None               # a phase run whole
    with pytest.raises(ValueError, match="no fill tail for arm 'wr16'"):
        unit_fill_last(manifest, unit, "wr16")
    # a cell of a per-arm phase without the arm's tail is refused before anything is sent
    with pytest.raises(ValueError, match="needs the arm's fill_last"):
        run_cell(None, work, phases, (len(phases) - 1, 0, 42), cfg)
    with pytest.raises(UserError, match="no fixed N beside it"):
        ProtocolConfig(full_phase=True, full_fill_per_arm=True, full_fill_last=300)
    from clients.protocol import run_protocol
    with pytest.raises(ValueError, match="run it by cells"):
        run_protocol(None, work, phases, cfg)


def test_a_cut_fill_needs_prompt_end_checkpoints(capsys):
    """Branch checkpoints of shared prefixes stored by prompts the cut fill never sends would hit in a whole
    fill's replay (a review helper: 351 cached replay tokens whole against 280 cut): refused in one line."""
    from clients.matched_hbm import main
    args = ["--model", "tests/data/kimi-linear-48b-a3b.config.json", "--load-format", "dummy", "--arms", "dense",
            "--full-phase", "--full-fill-last", "auto", "--full-replay-first", "100", "--plan-only",
            "--dense-slots", "4", "--prompts", "400", "--scale", "0.02", "--device", "cpu"]
    assert main([*args, "--branch-checkpoints"]) == 2
    assert "exact with prompt-end checkpoints only" in capsys.readouterr().err
    assert main([*args, "--prompt-only"]) == 0


def test_a_call_names_its_card_on_a_gpu_only(monkeypatch):
    """calls[].gpu was null in every call of the 48B directories (a review helper): only the benchmarks'
    wrappers passed it."""
    import torch
    from clients.matched_hbm import gpu_name
    assert gpu_name("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert gpu_name("cuda") == "NVIDIA H200" and gpu_name("cuda:0") == "NVIDIA H200"
