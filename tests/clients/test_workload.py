"""The synthetic MMLU-Pro-shaped workload and the capacity-boundary blocks, without a server."""
from __future__ import annotations

import math

import numpy as np
import pytest

from clients.protocol import ProtocolConfig, make_phases
from clients.workload import (MMLU_PRO_CATEGORIES, WorkloadConfig, block_size, build_workload, category_counts,
                              phase_blocks)
from trtllm_dasc.errors import UserError


def test_full_size_workload_has_mmlu_pro_shape():
    work = build_workload(WorkloadConfig(vocab=32000))
    assert len(work) == 12032 == sum(MMLU_PRO_CATEGORIES.values())
    assert len(work.prefixes) == 14
    # category by category, each exactly its MMLU-Pro size
    runs = [(c, sum(1 for _ in g)) for c, g in __import__("itertools").groupby(work.categories)]
    assert runs == list(MMLU_PRO_CATEGORIES.items())
    assert all(1500 <= len(p) <= 2500 for p in work.prefixes.values())
    starts = np.cumsum([0] + list(MMLU_PRO_CATEGORIES.values()))[:-1]
    for i in [0, 1, 5000, 12031, *starts]:
        p = work.prompt(int(i))
        prefix = work.prefixes[work.categories[i]]
        assert p.dtype == np.int32 and np.array_equal(p[:len(prefix)], prefix)
        assert 100 <= len(p) - len(prefix) <= 300
        assert p.min() >= 3 and p.max() < 32000
    # questions are distinct, prefixes distinct across categories
    assert not np.array_equal(work.prompt(1), work.prompt(2))
    firsts = [tuple(p[:50]) for p in work.prefixes.values()]
    assert len(set(firsts)) == 14


def test_workload_is_deterministic_and_seeded():
    a, b = (build_workload(WorkloadConfig(vocab=3072, prompts=300, scale=0.1)) for _ in range(2))
    assert a.categories == b.categories
    assert all(np.array_equal(a.prompt(i), b.prompt(i)) for i in range(300))
    c = build_workload(WorkloadConfig(vocab=3072, prompts=300, scale=0.1, seed=1))
    assert not np.array_equal(a.prompt(0), c.prompt(0))


def test_scaled_sizes():
    cfg = WorkloadConfig(vocab=3072, prompts=140, scale=0.1)
    work = build_workload(cfg)
    assert cfg.scaled(cfg.prefix_tokens) == (150, 250) and cfg.scaled(cfg.question_tokens) == (10, 30)
    assert all(150 <= len(p) <= 250 for p in work.prefixes.values())
    assert all(160 <= len(work.prompt(i)) <= 280 for i in range(140))
    assert cfg.max_prompt_tokens == 280
    counts = category_counts(140)
    assert sum(counts.values()) == 140 and min(counts.values()) >= 1
    assert counts["math"] > counts["history"]


@pytest.mark.parametrize("slots,q", [(127, 150), (6, 8), (14, 17), (31, 37), (17, 20), (85, 100), (1, 2)])
def test_block_size_is_ceil_n_over_085(slots, q):
    # Q(W) = ceil(N(W) / 0.85) exactly: 17 / 0.85 and 85 / 0.85 are whole numbers
    assert block_size(slots) == q
    assert q == min(k for k in range(1, 1000) if k * 85 >= slots * 100)


def test_phase_blocks_match_the_paper():
    # Kimi-KDA dense: 127 slots -> Q = 150 -> 80 blocks of the 12,032 prompts
    assert len(phase_blocks(12032, block_size(127))) == 80
    blocks = phase_blocks(12032, 150, max_blocks=3)
    assert len(blocks) == 3 and all(b - a == 150 for a, b in blocks)
    assert blocks[0][0] > 0 and blocks[-1][1] < 12032         # spread, not the first three
    with pytest.raises(UserError):
        phase_blocks(100, 150)
    with pytest.raises(UserError):
        block_size(0)


def test_phases_one_per_distinct_boundary():
    phases = make_phases({"dense": 6, "nr16": 14, "wr16": 14, "nr16+int8": 31}, 12032,
                         ProtocolConfig(blocks_per_phase=1))
    assert [(p.q, p.arms) for p in phases] == [(8, ["dense"]), (17, ["nr16", "wr16"]), (37, ["nr16+int8"])]
    assert all(len(p.blocks) == 1 for p in phases)
    assert math.ceil(6 / 0.85) == 8


def test_dense_repeats_and_full_phase_follow_the_paper():
    """The paper: the dense-boundary phase replayed six times, then one block of the whole dataset."""
    from clients.protocol import requests_per_arm
    cfg = ProtocolConfig(blocks_per_phase=1, dense_repeats=6, full_phase=True, seeds=(42, 123, 7))
    phases = make_phases({"dense": 6, "nr16": 14}, 500, cfg)
    assert [(p.q, p.arms, p.blocks) for p in phases][-1] == (500, ["full dataset"], [(0, 500)])
    # fill + replay per block, per seed: the dense phase six times, the others once
    assert requests_per_arm(phases, cfg) == 2 * 3 * (6 * 8 + 17 + 500)
    with pytest.raises(UserError):
        ProtocolConfig(dense_repeats=0)
