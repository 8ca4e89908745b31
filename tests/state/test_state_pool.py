import pytest
import torch

from state_helpers import KIMI, QWEN, make_layout
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.state import CheckpointPool, PoolError, StateLayout


@pytest.mark.parametrize("raw, budget", [(KIMI, 694_681_600), (QWEN, 1_236_271_104)], ids=["kimi48b", "qwen80b"])
def test_paper_budgets_give_127_dense_slots(raw, budget):
    cfg = HybridConfig.from_dict(raw)
    # meta tensors: the accounting is exact without allocating a gigabyte here
    pool = CheckpointPool(StateLayout.from_config(cfg, 8), budget, device="meta")
    rep = pool.memory_report()
    assert rep["slots"] == 127 and rep["physical_slots"] == 128
    assert rep["total_bytes"] == 128 * cfg.dense_checkpoint_bytes_per_rank(8) == budget
    for codec in ("native", "int8"):
        lay = StateLayout.from_config(cfg, 8, codec=codec)
        pool = CheckpointPool(lay, budget, device="meta")
        assert pool.num_slots == budget // lay.slot_bytes() - 1
        assert pool.allocated_bytes() <= budget


@pytest.mark.parametrize("codec", ["native", "int8"])
@pytest.mark.parametrize("budget_slots", [2.0, 5.5, 9.99])
def test_pool_never_exceeds_budget(codec, budget_slots):
    lay = make_layout(L=4, n=6, R=3, V=8, codec=codec)
    budget = int(budget_slots * lay.slot_bytes())
    pool = CheckpointPool(lay, budget)
    rep = pool.memory_report()
    assert pool.num_slots == int(budget_slots) - 1
    assert rep["total_bytes"] == pool.allocated_bytes() == (pool.num_slots + 1) * rep["slot_bytes"] <= budget
    assert rep["temporal_bytes"] + rep["scale_bytes"] + rep["conv_bytes"] == rep["total_bytes"]
    assert pool.payload.shape == (pool.num_slots + 1, lay.width, 24)
    assert (pool.scales is None) == (codec == "native")
    assert pool.conv.shape == (pool.num_slots + 1, 4, 6, 3) and pool.conv.dtype == torch.bfloat16


def test_budget_too_small_is_a_user_error():
    lay = make_layout(L=2, n=3, R=2, V=4)
    with pytest.raises(UserError, match="no deployable slot"):
        CheckpointPool(lay, 2 * lay.slot_bytes() - 1)
    with pytest.raises(PoolError, match="non-negative"):
        CheckpointPool(lay, -5)


def test_max_slots_caps_allocation():
    lay = make_layout(L=2, n=3, R=2, V=4)
    pool = CheckpointPool(lay, 100 * lay.slot_bytes(), max_slots=3)
    assert pool.num_slots == 3 and pool.allocated_bytes() == 4 * lay.slot_bytes()


@pytest.mark.parametrize("codec", ["native", "int8"])
def test_pool_store_load_round_trip(codec):
    torch.manual_seed(0)
    lay = make_layout(L=4, n=5, R=3, V=8, keep=0.5, codec=codec)
    pool = CheckpointPool(lay, 8 * lay.slot_bytes())
    temporal = torch.randn(4, 6, 5, 3, 8)
    conv = torch.randn(4, 6, 6, 3).to(torch.bfloat16)
    slots = [3, 1, 5]
    pool.store(temporal, conv, [4, 0, 2], slots)
    out, cout = torch.full_like(temporal, float("nan")), torch.full_like(conv, float("nan"))
    pool.load(slots, out, cout, [1, 2, 3])
    kept = lay.index("cpu").pos_of_unit.view(4, 5) >= 0
    for src, dst in ((4, 1), (0, 2), (2, 3)):
        ref = temporal[:, src][kept]
        got = out[:, dst][kept]
        if codec == "native":
            assert torch.equal(got, ref)
        else:
            # one int8 step per row at most half a scale: |x - x_hat| <= amax / 254 (plus fp32 slack)
            bound = ref.abs().amax(-1, keepdim=True) / 254 * (1 + 1e-5)
            assert ((got - ref).abs() <= bound).all()
        assert (out[:, dst][~kept] == 0).all()
        assert torch.equal(cout[:, dst], conv[:, src])
    assert out[:, [0, 4, 5]].isnan().all()
    pool.sanity_check()
