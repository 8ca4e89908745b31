"""The pool built from a plan matches the planner's accounting to the byte, on every rank."""
import pytest

from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.plan.synthetic import write_checkpoint
from trtllm_dasc.state import CheckpointPool, LayoutError, StateLayout


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("plans")
    return {a: write_checkpoint(str(root / a), a, seed=1, shards=1) for a in ("kda", "gdn")}


@pytest.mark.parametrize("arch,budget", [("kda", 694_681_600), ("gdn", 1_236_271_104)])
@pytest.mark.parametrize("wmax,codec,layout,placement", [
    (0, "native", "ragged", "off"), (16, "native", "ragged", "hybrid"), (128, "int8", "ragged", "off"),
    (64, "native", "padded", "off"), (512, "int8", "padded", "hybrid")])
def test_pool_from_plan_matches_planner(checkpoints, arch, budget, wmax, codec, layout, placement):
    plan, _ = plan_from_path(checkpoints[arch], PlanOptions(wmax=wmax, tp=8, codec=codec, layout=layout,
                                                            placement=placement))
    report = plan.report(budget)
    moving = {r for t in (plan.storage.transfers if plan.storage else []) for r in (t.src, t.dst)}
    for rank in range(8):
        if rank in moving:
            with pytest.raises(LayoutError, match="all-to-all"):
                StateLayout.from_plan(plan, rank)
            continue
        lay = StateLayout.from_plan(plan, rank)
        assert lay.slot_bytes() == report["slot_bytes_per_rank"][rank]
        assert lay.retained_counts == [len(u) for u in plan.local_retained(rank)]
        pool = CheckpointPool.from_plan(plan, budget, rank, device="meta")
        assert pool.num_slots == report["slots"]
        assert pool.allocated_bytes() <= budget
