"""One kernel launch per checkpoint store / load, and a load that visits only the units it writes (issue 35).

The H200 run at 3ebf2ca (benchmarks/results/state_bandwidth_codecs_h200.json) found the +c8 and fp8 / int4
stores a launch short of their bandwidth (the conv state in a second launch) and the mixed loads at 56-60% of
a copy: each segment's load walked every row of the state, its own and the other segments'. These tests
count the launches and the rows each launch covers (the grids), and compare every byte the Triton kernels
(the interpreter; on a GPU the kernels and the reference both there) write with the torch reference's, slots
and loaded state alike.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from state_helpers import retained_lists  # noqa: E402
from trtllm_dasc.state import CheckpointPool, StateLayout  # noqa: E402
from trtllm_dasc.state import codec_kernels, conv8_kernels, kernels  # noqa: E402
from trtllm_dasc.state.mixed import MixedPool  # noqa: E402

L, N_UNITS, V, CONV = 3, 8, 16, (10, 3)


class Launches:
    """Records (kernel name, grid) of every checkpoint kernel launch while installed."""

    def __init__(self, monkeypatch):
        self.calls = []
        for mod, name in ((kernels, "gather_units_kernel"), (kernels, "scatter_units_kernel"),
                          (codec_kernels, "store_units_kernel"), (codec_kernels, "load_units_kernel"),
                          (conv8_kernels, "conv8_encode_kernel"), (conv8_kernels, "conv8_decode_kernel")):
            monkeypatch.setattr(mod, name, self._wrap(name, getattr(mod, name)))

    def _wrap(self, name, fn):
        outer = self

        class Rec:
            def __getitem__(self, grid):
                outer.calls.append((name, tuple(grid)))
                return fn[grid]
        return Rec()

    def take(self):
        out, self.calls = self.calls, []
        return out


def layout(codec, conv_codec, R, lists, foreign=None, conv=True):
    return StateLayout.from_retained(lists, units_per_layer=N_UNITS, unit_elements=R * V, value_dim=V, codec=codec,
                                     conv_dim=CONV[0] if conv else 0, conv_width=CONV[1] if conv else 0,
                                     conv_codec=conv_codec, foreign_per_layer=foreign)


def states(R, B, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(L, B, N_UNITS, R, V, generator=g) * torch.logspace(-2, 1, V)
    c = torch.randn(L, B, *CONV, generator=g).to(torch.bfloat16)
    return t.to(device), c.to(device)


@pytest.mark.parametrize("conv_codec", ["native", "int8"])
@pytest.mark.parametrize("codec", ["native", "int8", "fp8", "int4"])
@pytest.mark.parametrize("R", [1, 2])
def test_store_and_load_are_one_launch_equal_to_torch(codec, conv_codec, R, device, monkeypatch):
    lay = layout(codec, conv_codec, R, retained_lists(L, N_UNITS, 0.5, seed=R))
    t, c = states(R, 3, device)
    rows, slots = [2, 0], [3, 1]
    ref, tri = (CheckpointPool(lay, 5 * lay.slot_bytes(), device=device) for _ in range(2))
    for p in (ref, tri):
        for x in (p.payload, p.scales, p.conv):
            if x is not None:
                x.fill_(-7 if not x.is_floating_point() else float("nan"))
    rec = Launches(monkeypatch)
    ref.store(t, c, rows, slots, backend="naive")
    tri.store(t, c, rows, slots, backend="triton")
    assert len(rec.take()) == 1, "the store (units and conv state) must be one launch"
    for a, b in ((ref.payload, tri.payload), (ref.scales, tri.scales), (ref.conv, tri.conv)):
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    outs = []
    for backend in ("naive", "triton"):
        to, co = torch.full_like(t, 5.0), torch.full_like(c, 5.0)
        ref.load([1, 3], to, co, [1, 2], backend=backend)
        outs.append((to, co))
    assert len(rec.take()) == 1, "the load (units and conv state) must be one launch"
    for a, b in zip(*outs):
        assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                           b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))


@pytest.mark.parametrize("R", [1, 4])
def test_mixed_load_visits_only_its_own_units(R, device, monkeypatch):
    """Each segment's load covers its own units (the first also the omitted ones, zero fill), never the
    other segments': grid rows = listed rows, not L * n_units * R; and the result equals torch's."""
    from trtllm_dasc.state import codec_ops, triton_ops
    # two rows a program: the grids tell the listed rows from a walk of every row
    monkeypatch.setattr(triton_ops, "TILE_ELEMS", 2 * V)
    lists = retained_lists(L, N_UNITS, 0.75, seed=3)
    codecs = ("int4", "int8", "native")
    own = [[[u for i, u in enumerate(us) if i % 3 == s] for us in lists] for s in range(3)]
    other = [[[u for i, u in enumerate(us) if i % 3 != s] for us in lists] for s in range(3)]
    segs = [(c, CheckpointPool(lay, 4 * lay.slot_bytes(), device=device, max_slots=3))
            for s, c in enumerate(codecs)
            for lay in [layout(c, "int8", R, own[s], other[s], conv=s == 0)]]
    pool = MixedPool(segs, sum(p.allocated_bytes() for _, p in segs))
    t, c = states(R, 2, device, seed=1)
    pool.store(t, c, [0, 1], [2, 1], backend="triton")
    rec = Launches(monkeypatch)
    outs = []
    for backend in ("naive", "triton"):
        to, co = torch.full_like(t, 5.0), torch.full_like(c, 5.0)
        pool.load([1, 2], to, co, [1, 0], backend=backend)
        outs.append((to, co))
    calls = rec.take()
    assert len(calls) == len(segs)
    for i, ((codec, p), (_, grid)) in enumerate(zip(segs, calls)):
        lay = p.layout
        rows = (lay.num_retained + (lay.num_omitted if i == 0 else 0)) * R
        if codec in codec_ops.CODEC_ID:
            br = codec_ops._blocks(rows, lay.payload_unit_elements // R, codec_ops.CODEC_ID[codec])[0]
        else:
            br = triton_ops._blocks(rows, V)[0]
        n_conv = L if lay.conv_dim else 0            # the 8-bit conv decode: one block a layer here
        assert grid == (-(-rows // br) + n_conv, 2), (codec, grid)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
