"""The TP worker contract: a StepPlan is plain data; a second ModelRunner built from the same checkpoint,
executing the unpickled plans of a whole random workload, ends bit-identical to the engine's runner in
outputs, recurrent states, KV and checkpoint contents. Plus warm-up leaving the engine clean."""
import pickle
import random

import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, split_wmax
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.runner import ModelRunner
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.engine.step import StepPlan


def _plain(x) -> bool:
    """Only plain data inside: no callables, no tensors, no engine objects."""
    if isinstance(x, (int, float, str, bool, type(None))):
        return True
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    if hasattr(x, "__slots__") and type(x).__module__.startswith("trtllm_dasc.engine"):
        return all(_plain(getattr(x, f)) for f in x.__slots__)
    return False


def _tensors(runner):
    kv = [p for layer in runner.kv.pools for p in layer]
    pool = [t for t in (runner.pool.payload, runner.pool.scales, runner.pool.conv) if t is not None]
    return [runner.state.temporal, runner.state.conv, *kv, *pool]


@pytest.mark.parametrize("arch,arm", [("gdn", dict(policy="wr", codec="int8")),
                                      ("kda", dict(policy="wr", replay_window=6))])
def test_pickled_plans_replayed_on_a_second_runner_are_bit_identical(tiny_models, arch, arm):
    path = tiny_models[arch][0]
    # a W_max that omits some units, so wr really replays and merges
    arm = dict(arm, wmax=split_wmax(path))
    kw = dict(num_kv_blocks=80, max_batch=3, interval=4, block_size=4, prefill_chunk=7, state_budget_bytes=None, **arm)
    engine = make_engine(path, **kw)
    recorded = []
    execute = engine.runner.execute

    def record(plan, *a, **k):
        blob = pickle.dumps(plan)
        out = execute(plan, *a, **k)
        recorded.append((blob, out))
        return out
    engine.runner.execute = record
    rng = random.Random(3)
    bases = [[rng.randrange(VOCAB) for _ in range(rng.randrange(5, 20))] for _ in range(4)]
    for i in range(60):
        base = rng.choice(bases)
        prompt = base[:rng.randrange(2, len(base) + 1)] + [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 4))]
        params = SamplingParams(temperature=0.9, top_p=0.8, seed=i) if i % 3 == 0 else SamplingParams()
        engine.submit(GenerationRequest(i, prompt, rng.randrange(1, 4), params))
        if i % 2:
            engine.step()
    engine.run_until_idle()
    engine.sanity_check()
    assert len(recorded) > 25 and engine.stats()["checkpoint_loads"]["wr"] > 5
    worker = ModelRunner(engine.cfg)
    for blob, out in recorded:
        plan = pickle.loads(blob)
        assert isinstance(plan, StepPlan) and _plain(plan)
        mine = worker.execute(plan)
        assert (mine.tokens, mine.errors, mine.stored) == (out.tokens, out.errors, out.stored)
    for a, b in zip(_tensors(engine.runner), _tensors(worker)):
        assert torch.equal(a, b)


def test_warmup_compiles_and_leaves_a_clean_engine(tiny_models, tmp_path):
    engine = make_engine(tiny_models["kda"][0], wmax=16, policy="wr", max_batch=4, interval=8,
                         kernel_cache_dir=str(tmp_path / "kernels"))
    report = engine.warmup()
    assert engine.ready and report["batch_sizes"] == [1, 2, 4]
    s = engine.stats()
    assert s["requests"] == 0 and s["checkpoints_cached"] == 0
    assert s["kv_blocks_free"] == engine.cfg.num_kv_blocks and s["state_rows_free"] == 8
    engine.sanity_check()
    # and it serves afterwards
    assert len(engine.generate([greedy("x", [1, 2, 3], 2)])[0]) == 2
