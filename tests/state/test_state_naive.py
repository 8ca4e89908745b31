"""The torch reference against independent ones: python loops for data movement, numpy for Eq. 10."""
import numpy as np
import pytest
import torch

from state_helpers import loop_merge, loop_pack, loop_unpack, make_layout, new_slots, numpy_eq10, retained_lists
from trtllm_dasc.state import naive, ops

# (L, n, R, V): gdn-like (R = K rows per head unit) and kda-like (R = 1, a channel unit)
SHAPES = [(3, 4, 3, 5), (4, 7, 1, 6)]


def _ids(shape):
    return "L{}-n{}-R{}-V{}".format(*shape)


@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_pack_unpack_against_loops(shape, layout_kind):
    L, n, R, V = shape
    torch.manual_seed(1)
    lay = make_layout(L, n, R, V, keep=0.5, seed=3, layout=layout_kind)
    ret, block = retained_lists(L, n, 0.5, 3), lay.width // L
    t = torch.randn(L, 5, n, R * V)
    rows, slots = [3, 0, 4], [2, 5, 1]
    ref = torch.full((6, lay.width, R * V), float("nan"))
    loop_pack(t, rows, ref, slots, ret, layout_kind, block)
    got = ref.clone().fill_(float("nan"))
    naive.pack(t, rows, got, slots, lay)
    assert torch.equal(got.nan_to_num(7.0), ref.nan_to_num(7.0))
    for zero_fill in (True, False):
        a = torch.randn(L, 5, n, R * V)
        b = a.clone()
        loop_unpack(ref, slots, a, [1, 2, 0], ret, layout_kind, block, zero_fill)
        naive.unpack(ref, slots, b, [1, 2, 0], lay, zero_fill)
        assert torch.equal(a, b)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_replay_merge_against_loops(shape):
    L, n, R, V = shape
    lay = make_layout(L, n, R, V, keep=0.4, seed=5)
    scratch, t = torch.randn(L, 3, n, R * V), torch.randn(L, 4, n, R * V)
    ref = t.clone()
    loop_merge(scratch, [2, 0], ref, [1, 3], retained_lists(L, n, 0.4, 5))
    naive.replay_merge(scratch, [2, 0], t, [1, 3], lay)
    assert torch.equal(t, ref)


def _eq10_cases() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 24, generator=g) * torch.logspace(-12, 3, 40)[:, None]
    # exact ties: amax 127 gives s = 1, so x / s lands on .5 and round half to even decides
    x[0] = torch.tensor([127.0, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 1.5] * 3)
    x[1] = 0.0
    x[2] = 1e-9
    x[3, :] = -4.0
    return x.float()


def test_quantize_matches_numpy_eq10():
    x = _eq10_cases()
    q, s = naive.quantize_int8(x)
    qn, sn = numpy_eq10(x.numpy())
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    np.testing.assert_array_equal(q.numpy(), qn)
    np.testing.assert_array_equal(s.numpy().view(np.int32), sn.view(np.int32))
    assert q[0, :8].tolist() == [127, 2, -2, 4, -4, 0, 0, 2]
    assert (q[1] == 0).all() and s[1] == np.float32(1e-8) / np.float32(127)
    assert (q[3] == -127).all() and q.min() >= -127
    xh = naive.dequantize_int8(q, s)
    np.testing.assert_array_equal(xh.numpy(), qn.astype(np.float32) * sn[:, None])


@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_store_load_int8_against_numpy(shape, layout_kind):
    L, n, R, V = shape
    lay = make_layout(L, n, R, V, keep=0.5, seed=2, codec="int8", layout=layout_kind)
    t = torch.randn(L, 4, n, R * V) * 3
    conv = torch.randn(L, 4, 6, 3)
    payload, scales, cstore = new_slots(lay, 5, "cpu")
    naive.store(t, conv, [1, 3], payload, scales, cstore, [4, 2], lay)
    ix = lay.index("cpu")
    for row, slot in ((1, 4), (3, 2)):
        x = t[ix.unit_layer, row, ix.unit_local].view(-1, R, V).numpy()
        qn, sn = numpy_eq10(x)
        np.testing.assert_array_equal(payload[slot, ix.slot_pos].view(-1, R, V).numpy(), qn)
        np.testing.assert_array_equal(scales[slot, ix.slot_pos].numpy(), sn)
        assert torch.equal(cstore[slot], conv[:, row].to(torch.bfloat16))
    out, cout = torch.full_like(t, float("nan")), torch.full_like(conv, float("nan"))
    naive.load(payload, scales, cstore, [4, 2], out, cout, [0, 1], lay)
    kept = ix.pos_of_unit.view(L, n) >= 0
    for row, slot in ((0, 4), (1, 2)):
        qn = payload[slot, ix.slot_pos].view(-1, R, V).numpy().astype(np.float32)
        ref = qn * scales[slot, ix.slot_pos].numpy()[..., None]
        np.testing.assert_array_equal(out[:, row][kept].view(-1, R, V).numpy(), ref)
        assert (out[:, row][~kept] == 0).all()
        assert torch.equal(cout[:, row], cstore[slot].float())


@pytest.mark.parametrize("layout_kind", ["ragged", "padded"])
def test_native_round_trip_bit_exact_and_zero(layout_kind):
    L, n, R, V = 5, 4, 3, 8
    lay = make_layout(L, n, R, V, keep=0.5, seed=9, layout=layout_kind)
    # bit patterns torch arithmetic would not preserve: denormals, -0.0, huge values
    t = torch.randn(L, 3, n, R, V) * torch.tensor([1e-40, -0.0, 1e38, 1.0]).repeat(2)[None, None, None, None]
    conv = torch.randn(L, 3, 6, 3).to(torch.bfloat16)
    payload, scales, cstore = new_slots(lay, 4, "cpu")
    ops.store(t, conv, [0, 1, 2], payload, scales, cstore, [3, 1, 2], lay)
    out = torch.full_like(t, float("nan"))
    cout = torch.full_like(conv, float("nan"))
    ops.load(payload, scales, cstore, [3, 1, 2], out, cout, [0, 1, 2], lay)
    kept = (lay.index("cpu").pos_of_unit.view(L, n) >= 0)
    assert torch.equal(out[:, :, :][kept.unsqueeze(1).expand(L, 3, n)].view(torch.int32),
                       t[kept.unsqueeze(1).expand(L, 3, n)].view(torch.int32))
    omitted = out.transpose(1, 2)[~kept]
    assert omitted.numel() and (omitted.view(torch.int32) == 0).all()
    assert torch.equal(cout.view(torch.int16), conv.view(torch.int16))
