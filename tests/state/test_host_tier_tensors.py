"""HostTier: a checkpoint demoted to host memory and promoted back into another device slot loads exactly
what it loaded before (pure byte copies of every slot tensor: payload, scales, conv). CPU here; the same
test on a GPU runs the pinned-memory, own-stream path."""
import pytest
import torch

from state_helpers import retained_lists
from trtllm_dasc.state import CheckpointPool, StateLayout
from trtllm_dasc.state.host_tier import HostTier, slot_tensors

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
def test_demote_then_promote_loads_the_same_bytes(device):
    lay = StateLayout.from_retained(retained_lists(2, 6, 0.5, 0), units_per_layer=6, unit_elements=8, value_dim=8,
                                    codec="int8", conv_dim=10, conv_width=3, conv_codec="int8")
    pool = CheckpointPool(lay, 6 * lay.slot_bytes(), device=device)
    tier = HostTier(pool, 2, device)
    assert len(slot_tensors(pool)) == 3 and tier.allocated_bytes() == 2 * lay.slot_bytes()
    g = torch.Generator().manual_seed(3)
    temporal = torch.randn(2, 3, 6, 1, 8, generator=g).to(device)
    conv = torch.randn(2, 3, 10, 3, generator=g).to(device)
    pool.store(temporal, conv, [0, 1], [1, 2])

    def load(slot):
        t, c = torch.zeros_like(temporal), torch.zeros_like(conv)
        pool.load([slot], t, c, [0])
        return t[:, 0].cpu(), c[:, 0].cpu()

    before = [load(1), load(2)]
    # write back both, then reuse the device slots for other checkpoints (a store after the demotion)
    tier.run([(1, 0), (2, 1)], [])
    pool.store(temporal.flip(1), conv.flip(1), [0, 1], [1, 2])
    assert not torch.equal(load(1)[0], before[0][0])
    # promote into other slots and the originals' own (slot 1 <- host 1, slot 3 <- host 0)
    tier.run([], [(1, 1), (0, 3)])
    for (t, c), (rt, rc) in zip([load(3), load(1)], before):
        assert torch.equal(t, rt) and torch.equal(c, rc)
