"""The prefill's conv kernels (model/kernels/conv.py; Triton's interpreter on the CPU) against the
torch references (conv_kernel's, built on ops.causal_conv and ops.l2norm), and the mixers' conv step that
uses them against the torch path."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

from trtllm_dasc.model.kernels.conv import BLOCK_T, conv_parts, conv_parts_reference, supports  # noqa: E402
from trtllm_dasc.model.ops import l2norm  # noqa: E402

# natively on a GPU; on the CPU in Triton's interpreter (tests/conftest.py sets it without a GPU)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(lens, parts, W, dtype, seed=0):
    """x as a column slice of a wider projection, the carried state as a slice of a wider one (strided)."""
    g = torch.Generator().manual_seed(seed)
    C = sum(parts)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    x = torch.randn(cu[-1], C + 24, generator=g)[:, 8:8 + C]
    weight = torch.randn(C, W, generator=g) * 0.5
    state = torch.randn(len(lens), C + 5, W - 1, generator=g)[:, 2:2 + C]
    return x.to(DEV, dtype), weight.to(DEV, dtype), state.to(DEV, dtype), cu


@pytest.mark.parametrize("tiles", [(16, 4, 4), (64, 8, 2)], ids=["BT16-G4", "BT64-G2"])
def test_conv_parts_tile_choices_the_benchmark_times_match_reference(tiles):
    # several tiles a program, the last program's short of tiles, tiles spanning sequence ends. The lengths
    # are in tiles (the interpreter's time grows with them): 7 tiles (1 + 1 + 1 + 1 + 3), so with G = 4 and
    # G = 2 the last program holds 3 and 1; 1 and 2 tokens shorter than the window, bt exactly one tile,
    # 5 one partial tile, 2 bt + 2 two full tiles then a partial one
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    bt = tiles[0]
    parts, lens = [32, 32, 64], [1, 2, bt, 5, 2 * bt + 2]
    x, weight, state, cu = _inputs(lens, parts, 4, dtype)
    got, new_state = conv_parts(x, weight, state, cu, parts, 2, 16, tiles)
    ref, ref_state = conv_parts_reference(x.float(), weight, state, cu, parts, 2, 16)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for part, want in zip(got, ref):
        torch.testing.assert_close(part.float(), want.float(), **tol)
    torch.testing.assert_close(new_state.float(), ref_state.float(), **tol)


@pytest.mark.parametrize("rows", [(8, 32, 4), (16, 16, 1)], ids=["R8-C32", "R16-C16"])
def test_conv_rows_kernel_matches_reference(rows):
    # the rows kernel (W = 4): ranges shorter than, equal to and longer than one 8-row step, ranges that end
    # inside a step, sequences shorter than the window, channel blocks of one and of several heads (q / k
    # normalised per head inside a block of several). The lengths are in ranges of P rows (the interpreter's
    # time grows with the steps): 1 and 2 shorter than the window, 5 a range ending inside a step, P exactly
    # one range (one step at R8, two at R16), 2P + 2 two full ranges then one of 2 rows (its first taps
    # read the range before), 17 two or one full ranges then a range of 1 row. R8-C32 takes blocks of two
    # heads, R16-C16 of one (ranges of 16 over blocks of two heads, and of four: test_conv_parts_match_
    # reference's W = 4); the module's default (ROWS: 64 rows, 70 tokens = a full range and a short one) is
    # test_mixer_conv_step's
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    P = rows[0]
    parts, lens = [32, 32, 64], [1, 2, P, 5, 2 * P + 2, 17]
    x, weight, state, cu = _inputs(lens, parts, 4, dtype, seed=3)
    got, new_state = conv_parts(x, weight, state, cu, parts, 2, 16, rows=rows)
    ref, ref_state = conv_parts_reference(x.float(), weight, state, cu, parts, 2, 16)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for part, want in zip(got, ref):
        torch.testing.assert_close(part.float(), want.float(), **tol)
    torch.testing.assert_close(new_state.float(), ref_state.float(), rtol=0, atol=0)


def test_rows_block_never_straddles_parts():
    from trtllm_dasc.model.kernels.conv import rows_block
    assert rows_block([4096, 4096, 4096], 128, 1024) == 1024
    assert rows_block([2048, 2048, 4096], 128, 4096) == 2048
    assert rows_block([384, 384, 384], 128, 1024) == 128        # 384 = 3 heads: one head a block
    assert rows_block([256], 128, 64) == 128                      # never below a head


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("parts", [[32, 32, 64], [48, 48, 48], [32, 96], [64]],
                         ids=["gdn-like", "kda-like", "two-parts", "one-part"])
@pytest.mark.parametrize("fp32_state", [False, pytest.param(True, marks=pytest.mark.skipif(
    DEV == "cpu", reason="on the CPU the inputs are fp32 already"))], ids=["state-as-x", "fp32-state"])
def test_conv_parts_match_reference(W, parts, fp32_state):
    # sequences shorter than the window (their first outputs read the carried state), one that ends
    # exactly on a chunk, one over two chunks; q and k (the first two parts, where there are two)
    # l2-normalised per head; a carried state in fp32 next to bf16 inputs (a checkpoint's conv dtype).
    # A chunk: at W = 2 the tile kernel's default tile (BLOCK_T), at W = 4 a rows-kernel range of 16 rows,
    # two 8-row steps (the default, 64, costs the interpreter 4x the steps; test_conv_rows_kernel and
    # test_mixer_conv_step run it): 1 and 2 tokens shorter than the window, 5 ending inside the first
    # chunk (and step), one chunk exactly, two full chunks then one of 2 tokens
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    head, normalized = 16, min(2, len(parts))
    rows = (16, 256, 1) if W == 4 else None
    chunk = rows[0] if rows else BLOCK_T
    lens = [1, 2, chunk, 5, 2 * chunk + 2]
    x, weight, state, cu = _inputs(lens, parts, W, dtype)
    state = state.float() if fp32_state else state
    got, new_state = conv_parts(x, weight, state, cu, parts, normalized, head, rows=rows)
    ref, ref_state = conv_parts_reference(x.float(), weight, state, cu, parts, normalized, head)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for part, want, p in zip(got, ref, parts):
        assert part.shape == (cu[-1], p) and part.is_contiguous() and part.dtype == dtype
        torch.testing.assert_close(part.float(), want, **tol)
    # the new state is the last W-1 inputs: copied, exactly, in the state's dtype
    assert new_state.dtype == state.dtype
    torch.testing.assert_close(new_state.float(), ref_state.float(), rtol=0, atol=0)


def test_supports_only_whole_power_of_two_heads():
    assert supports([256, 256, 512], 128, 4)
    assert not supports([256, 256, 500], 128, 4)            # a part that is not whole heads
    assert not supports([96, 96, 96], 96, 4)                # head dim not a power of two
    assert not supports([128] * 4, 128, 4)                  # more than three parts


def test_mixer_conv_step_matches_the_reference_path():
    # linear_attn._conv_parts, fused (a prefill: our kernel, q and k normalised) against the torch path,
    # with checkpoint captures inside the window of the carried state and at a sequence's end
    from trtllm_dasc.model.linear_attn import _conv_parts
    parts, head, W = [32, 32, 64], 16, 4
    x, weight, state, cu = _inputs([3, 70, 9], parts, W, torch.float32, seed=3)
    cuts = [[1, 3], [64], [2, 9]]
    (q, k, v), conv, conv_b, normed = _conv_parts(x, weight, state, cu, cuts, parts, True, head)
    (rq, rk, rv), rconv, rconv_b, rnormed = _conv_parts(x, weight, state, cu, cuts, parts, False, head)
    assert normed and not rnormed
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q, l2norm(rq.reshape(-1, 2, head)).reshape(-1, 32), **tol)
    torch.testing.assert_close(k, l2norm(rk.reshape(-1, 2, head)).reshape(-1, 32), **tol)
    torch.testing.assert_close(v, rv, **tol)
    torch.testing.assert_close(conv, rconv, rtol=0, atol=0)
    torch.testing.assert_close(conv_b, rconv_b, rtol=0, atol=0)


@pytest.mark.parametrize("W", [2, 4])
def test_conv_decode_in_place_matches_reference_and_leaves_other_rows(W):
    # one token per sequence, the layer's state rows read and shifted where they live (states in fp32
    # next to bf16 inputs on a GPU, as a checkpoint's conv dtype may be)
    from trtllm_dasc.model.kernels.conv import conv_decode_in_place, conv_decode_reference
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32
    g = torch.Generator().manual_seed(W)
    parts, head, R = [32, 32, 64], 16, 9
    C = sum(parts)
    x = torch.randn(4, C + 10, generator=g)[:, 3:3 + C].to(DEV, dtype)
    weight = (torch.randn(C, W, generator=g) * 0.5).to(DEV, dtype)
    states = torch.randn(R, C, W - 1, generator=g).to(DEV)
    rows = torch.tensor([7, 0, 3, 5], device=DEV)
    before = states.clone()
    got = conv_decode_in_place(x, weight, states, rows, parts, head)
    after_ref = before.clone()
    ref = conv_decode_reference(x, weight, after_ref, rows, parts, head)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for part, want in zip(got, ref):
        assert part.is_contiguous() and part.dtype == dtype
        torch.testing.assert_close(part.float(), want.float(), **tol)
    torch.testing.assert_close(states[rows], after_ref[rows], rtol=0, atol=0)     # shifted, the new input last
    others = [r for r in range(R) if r not in rows.tolist()]
    torch.testing.assert_close(states[others], before[others], rtol=0, atol=0)
