"""The paper's count-matched random control (--selection random --mask-seed S): per layer as many units as
the decay selection keeps, drawn uniformly; a seed fixes the mask; the engine serves such a plan."""
from __future__ import annotations

import random

import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.plan import PlanOptions, plan_from_path

TINY = "trtllm_dasc/assets/tiny-kimi-linear"
SEEDS = (1234, 2027, 3407, 4519, 5683)


def test_random_masks_are_count_matched_seeded_and_distinct():
    decay, horizons = plan_from_path(TINY, PlanOptions(wmax=16))
    masks = [plan_from_path(TINY, PlanOptions(wmax=16, selection="random", mask_seed=s))[0] for s in SEEDS]
    n = decay.config.units_per_layer
    for m in masks:
        assert [len(k) for k in m.retained] == [len(k) for k in decay.retained]
        assert all(k == sorted(set(k)) and all(0 <= u < n for u in k) for k in m.retained)
        assert m.bottleneck_slot_bytes() == decay.bottleneck_slot_bytes()
    assert len({str(m.retained) for m in masks}) == len(SEEDS)
    again = plan_from_path(TINY, PlanOptions(wmax=16, selection="random", mask_seed=SEEDS[0]))[0]
    assert again.retained == masks[0].retained
    # not the decay ranking: some layer keeps a unit the decay selection omits
    assert any(set(k) != set(d) for k, d in zip(masks[0].retained, decay.retained))
    # the mask is uniform over units: across many seeds each unit of a layer is kept about r / n of the time
    layer = max(range(len(decay.retained)), key=lambda i: len(decay.retained[i]))
    r = len(decay.retained[layer])
    from trtllm_dasc.plan.selection import random_units
    hits = [0] * n
    for s in range(400):
        for u in random_units([0] * layer + [r], n, s)[layer]:
            hits[u] += 1
    expected = 400 * r / n
    assert max(hits) < expected + 6 * expected ** 0.5 and min(hits) > expected - 6 * expected ** 0.5


@pytest.mark.parametrize("opts, msg", [({"selection": "random"}, "needs --mask-seed"),
                                       ({"mask_seed": 3}, "needs --selection random"),
                                       ({"selection": "best"}, "--selection must be"),
                                       ({"selection": "random", "mask_seed": -1}, r"--mask-seed must be an integer in \[0, ")])
def test_bad_selection_options_are_one_line(opts, msg):
    with pytest.raises(UserError, match=msg):
        PlanOptions(wmax=16, **opts)


def test_the_engine_serves_a_random_mask_and_its_plan_round_trips(tmp_path):
    from engine_helpers import greedy
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.engine import Engine
    cfg = dict(model=TINY, wmax=16, max_batch=2, block_size=4, num_kv_blocks=200, interval=8, max_context=256)
    engine = Engine(EngineConfig(**cfg, selection="random", mask_seed=2027))
    expect = plan_from_path(TINY, PlanOptions(wmax=16, placement="off", selection="random", mask_seed=2027))[0]
    assert engine.runner.plan.retained == expect.retained
    rng = random.Random(0)
    prompt = [rng.randrange(3, 200) for _ in range(40)]
    outs = engine.generate([greedy(0, prompt)]) + engine.generate([greedy(1, prompt + [5, 6])])
    assert all(len(o) == 4 for o in outs)
    assert engine.stats()["cached_tokens"] > 0
    engine.shutdown()
