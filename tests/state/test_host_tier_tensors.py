"""HostTier: a checkpoint demoted to host memory and promoted back into another device slot loads exactly
what it loaded before (pure byte copies of every slot tensor: payload, scales, conv), with the copies off
the compute stream. CPU: the deferred reference stream (a copy runs only when something waits on it, the
latest a side stream may run it), so a missing wait reads or writes the wrong bytes here; the same tests on
a GPU run the pinned-memory side CUDA stream."""
import pytest
import torch

from state_helpers import retained_lists
from trtllm_dasc.state import CheckpointPool, StateLayout
from trtllm_dasc.state.copy_stream import CudaCopyStream, DeferredCopyStream
from trtllm_dasc.state.host_tier import HostTier, slot_tensors

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]


def _setup(device, device_slots=6, host_slots=2):
    lay = StateLayout.from_retained(retained_lists(2, 6, 0.5, 0), units_per_layer=6, unit_elements=8, value_dim=8,
                                    codec="int8", conv_dim=10, conv_width=3, conv_codec="int8")
    pool = CheckpointPool(lay, device_slots * lay.slot_bytes(), device=device)
    tier = HostTier(pool, host_slots, device)
    g = torch.Generator().manual_seed(3)
    temporal = torch.randn(2, 3, 6, 1, 8, generator=g).to(device)
    conv = torch.randn(2, 3, 10, 3, generator=g).to(device)
    return lay, pool, tier, temporal, conv


def _load(pool, tier, temporal, conv, slot):
    # the runner's order: wait for the slot's copies, then load
    tier.wait_slots([slot])
    t, c = torch.zeros_like(temporal), torch.zeros_like(conv)
    pool.load([slot], t, c, [0])
    return t[:, 0].cpu(), c[:, 0].cpu()


def _store(pool, tier, temporal, conv, which, slots):
    tier.wait_slots(slots)
    pool.store(temporal, conv, which, slots)


@pytest.mark.parametrize("device", DEVICES)
def test_demote_then_promote_loads_the_same_bytes(device):
    lay, pool, tier, temporal, conv = _setup(device)
    assert len(slot_tensors(pool)) == 3 and tier.allocated_bytes() == 2 * lay.slot_bytes()
    assert isinstance(tier.stream, CudaCopyStream if device == "cuda" else DeferredCopyStream)
    _store(pool, tier, temporal, conv, [0, 1], [1, 2])
    before = [_load(pool, tier, temporal, conv, 1), _load(pool, tier, temporal, conv, 2)]
    # write back both, then reuse the device slots for other checkpoints (a store after the demotion)
    tier.run([(1, 0), (2, 1)], [])
    _store(pool, tier, temporal.flip(1), conv.flip(1), [0, 1], [1, 2])
    assert not torch.equal(_load(pool, tier, temporal, conv, 1)[0], before[0][0])
    # promote into other slots and the originals' own (slot 1 <- host 1, slot 3 <- host 0)
    tier.run([], [(1, 1), (0, 3)])
    for (t, c), (rt, rc) in zip([_load(pool, tier, temporal, conv, 3), _load(pool, tier, temporal, conv, 1)],
                                before):
        assert torch.equal(t, rt) and torch.equal(c, rc)


def test_the_copies_are_off_the_compute_stream_until_a_slot_is_touched():
    # the reference stream: queued copies have not run when run() returns, a wait on a slot runs them
    _, pool, tier, temporal, conv = _setup("cpu")
    _store(pool, tier, temporal, conv, [0], [1])
    tier.run([(1, 0)], [])
    assert tier.stream.queue and not tier.host[0].any()
    # a slot no copy touches waits for nothing
    tier.wait_slots([4])
    assert tier.stream.queue
    tier.wait_slots([1])
    assert not tier.stream.queue and tier.host[0].any() and not tier.pending


@pytest.mark.parametrize("device", DEVICES)
def test_a_slot_is_not_reused_before_its_demotion_read_it(device):
    """Device slot 1 is demoted and, in the same step, refilled by a capture: the host copy is the old
    checkpoint (the store waited for the demotion), and a later promotion brings the old one back."""
    _, pool, tier, temporal, conv = _setup(device)
    _store(pool, tier, temporal, conv, [0], [1])
    old = _load(pool, tier, temporal, conv, 1)
    tier.run([(1, 0)], [])
    _store(pool, tier, temporal, conv, [2], [1])
    new = _load(pool, tier, temporal, conv, 1)
    assert not torch.equal(new[0], old[0])
    tier.run([], [(0, 5)])
    t, c = _load(pool, tier, temporal, conv, 5)
    assert torch.equal(t, old[0]) and torch.equal(c, old[1])
    # and the capture itself was not overwritten by anything queued
    t, c = _load(pool, tier, temporal, conv, 1)
    assert torch.equal(t, new[0]) and torch.equal(c, new[1])


@pytest.mark.parametrize("device", DEVICES)
def test_a_hit_on_a_checkpoint_being_demoted_loads_it(device):
    """The demotion of step k is still queued when step k+1 promotes the same host slot into another device
    slot (and reuses the demoted device slot for a capture): the promotion reads what the demotion wrote."""
    _, pool, tier, temporal, conv = _setup(device)
    _store(pool, tier, temporal, conv, [0], [2])
    old = _load(pool, tier, temporal, conv, 2)
    tier.run([(2, 1)], [])
    # step k+1: the hit's promotion 1 -> 3, and a capture into device slot 2
    tier.run([], [(1, 3)])
    _store(pool, tier, temporal, conv, [1], [2])
    t, c = _load(pool, tier, temporal, conv, 3)
    assert torch.equal(t, old[0]) and torch.equal(c, old[1])
    tier.synchronize()
    assert not tier.pending


def test_a_missing_wait_is_caught_by_the_reference_stream():
    """The reference's point: a store that skips the wait overwrites the slot before the queued demotion
    reads it, so the host copy is wrong (a real stream might have run it in time, by luck)."""
    _, pool, tier, temporal, conv = _setup("cpu")
    _store(pool, tier, temporal, conv, [0], [1])
    old = _load(pool, tier, temporal, conv, 1)
    tier.run([(1, 0)], [])
    pool.store(temporal, conv, [2], [1])
    tier.run([], [(0, 4)])
    t, _ = _load(pool, tier, temporal, conv, 4)
    assert not torch.equal(t, old[0])


@pytest.mark.parametrize("device", DEVICES)
def test_copies_are_counted_in_bytes_and_seconds(device):
    """The metrics' copy bytes: a slot is every pool tensor's row (the layout's slot bytes, the planner's
    accounting); seconds grow once the copies ran (CUDA: timing events around each batch, read when done)."""
    lay, pool, tier, temporal, conv = _setup(device, host_slots=3)
    _store(pool, tier, temporal, conv, [0, 1], [1, 2])
    assert tier.stream.seconds() == 0
    tier.run([(1, 0), (2, 1)], [])
    tier.run([], [(0, 4)])
    tier.synchronize()
    assert tier.slot_bytes == lay.slot_bytes()
    assert tier.copied == {"to_host": 2 * lay.slot_bytes(), "to_device": lay.slot_bytes()}
    assert tier.stream.seconds() > 0


def test_a_copy_that_cannot_be_queued_is_its_own_and_a_cuda_error_is_the_steps(monkeypatch):
    """A host slot past the tier (an IndexError when queued) fails that copy alone: the step's other copies
    run and the tier says which one failed; a CUDA error (sticky: no device memory can be trusted after it)
    is raised. The reference stream refuses when queued what its copy would refuse when run."""
    _, pool, tier, temporal, conv = _setup("cpu")
    _store(pool, tier, temporal, conv, [0, 1], [1, 2])
    old = _load(pool, tier, temporal, conv, 2)
    errors = tier.run([(1, 7)], [(0, 3)]) + tier.run([(2, 1)], [])
    assert errors[0].startswith("IndexError") and errors[1:] == [None, None]
    tier.run([], [(1, 4)])
    assert all(torch.equal(a, b) for a, b in zip(_load(pool, tier, temporal, conv, 4), old))
    with pytest.raises(RuntimeError, match="a copy of"):
        tier.stream.copy(tier.host[0][0], tier.tensors[0][1:3])

    def sticky(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(tier, "_copy", sticky)
    with pytest.raises(RuntimeError, match="CUDA error"):
        tier.run([(1, 0)], [])
