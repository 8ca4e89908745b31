"""The host tier under horizon-aware precision (--precision horizon: a pool of one segment per codec,
state/host_tier.py's `segments` path): a checkpoint demoted to the host and promoted back gives the hit that
the same checkpoint gives from the device, token for token and logit for logit, because every segment's
encoded bytes (INT4 / INT8 payloads, their scales, the conv state) travel unchanged."""
import torch

from engine_helpers import greedy, make_engine, split_wmax

from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.state.host_tier import slot_tensors

import test_engine_host_tier as base

PRECISION = "horizon:24,64:int4,int8,native"


def engine(path, wmax, slots, host_slots=0):
    plan, _ = plan_from_path(str(path), PlanOptions(wmax=wmax, tp=1, placement="off", precision=PRECISION),
                             conv_dtype="float32")
    sb = plan.bottleneck_slot_bytes()
    return make_engine(path, prompt_only=True, wmax=wmax, precision=PRECISION,
                       state_budget_bytes=(slots + 1) * sb, host_cache_bytes=host_slots * sb)


def test_a_host_hit_equals_a_device_hit_under_mixed_precision(tiny_models):
    path, _ = tiny_models["kda"]
    wmax = split_wmax(path)
    hosted = engine(path, wmax, 2, host_slots=8)
    pool = hosted.runner.pool
    # the pool really is mixed: more than one codec segment, each with its own tensors mirrored on the host
    assert len(getattr(pool, "segments", [])) >= 2, "the tiny model's horizons fill one band only"
    assert len(hosted.runner.host_tier.host) == len(slot_tensors(pool)) > len(pool.segments)
    host_out, host_req, st, host_logits = base.serve(hosted)
    assert st["checkpoint_hits"] == {"device": 0, "host": 1} and st["checkpoint_promotions"] == 1
    dev_out, dev_req, st, dev_logits = base.serve(engine(path, wmax, 8))
    assert st["checkpoint_hits"] == {"device": 1, "host": 0}
    assert host_req.cached_tokens == dev_req.cached_tokens == 12
    assert host_out == dev_out
    torch.testing.assert_close(host_logits, dev_logits, rtol=0, atol=1e-6)
