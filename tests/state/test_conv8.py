"""8-bit conv state (issue 35): the torch reference against an independent numpy fake-quant (one scale per
(layer, request), paper Eq. 10 over the layer), the Triton kernels against the reference bit for bit on
poisoned slots and rows (interpreter on CPU, both on the GPU there), a pool round trip, and the bytes the planner counts."""
import numpy as np
import pytest
import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.state import CheckpointPool, StateLayout, conv8_naive, conv8_ops
from state_helpers import KIMI, QWEN, retained_lists


def numpy_conv8(x: np.ndarray) -> np.ndarray:
    """One layer's values (any shape) -> what a load gives back, fp32: s = max(amax, 1e-8) / 127."""
    x = x.astype(np.float32)
    s = np.float32(max(np.abs(x).max(), np.float32(1e-8))) / np.float32(127)
    return (np.clip(np.rint(x / s), -127, 127).astype(np.float32) * np.float32(s)).astype(np.float32)


def conv_cases(dtype, L=3, N=5, cd=10, w=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(L, N, cd, w, generator=g) * torch.logspace(-6, 3, N)[None, :, None, None]
    x[1, 2] = 0.0                                   # an all-zero layer: the scale floor
    x[2, 3, 0, :] = 1e4                             # one hot channel: the rest of the layer rounds coarsely
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cd", [10, 7], ids=["cd10", "cd7-padded"])
def test_reference_equals_numpy_fake_quant(dtype, cd):
    conv = conv_cases(dtype, cd=cd)
    row = conv8_naive.conv8_row_bytes(cd * 3)
    assert row % 4 == 0 and row >= cd * 3 + 4
    store = torch.zeros((6, 3, row), dtype=torch.int8)
    conv8_naive.store(conv, [0, 2, 4, 1, 3], store, [5, 1, 3, 0, 2])
    out = torch.full_like(conv, 9.0)
    conv8_naive.load(store, [1, 3, 5, 0, 2], out, [0, 1, 2, 3, 4])
    src = conv.float().numpy()
    for b, n in enumerate([2, 4, 0, 1, 3]):
        for l in range(3):
            want = torch.from_numpy(numpy_conv8(src[l, n])).to(dtype)
            assert torch.equal(out[l, b], want), (b, l)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cd,block", [(10, 2048), (700, 256)], ids=["one-block", "looped"])
def test_triton_equals_reference_bit_for_bit(dtype, cd, block, device, monkeypatch):
    monkeypatch.setattr(conv8_ops, "BLOCK", block)
    conv = conv_cases(dtype, cd=cd).to(device)
    row = conv8_naive.conv8_row_bytes(cd * 3)
    ref, tri = (torch.full((6, 3, row), -128, dtype=torch.int8, device=device) for _ in range(2))
    rows, slots = [0, 2, 4, 1], [5, 1, 3, 0]
    conv8_naive.store(conv, rows, ref, slots)
    conv8_ops.store(conv, rows, tri, slots)
    assert torch.equal(ref, tri)
    a, b = torch.full_like(conv, float("nan")), torch.full_like(conv, float("nan"))
    conv8_naive.load(ref, [3, 5, 1], a, [1, 4, 0])
    conv8_ops.load(ref, [3, 5, 1], b, [1, 4, 0])
    assert torch.equal(a[:, [1, 4, 0]], b[:, [1, 4, 0]]) and bool(b[:, [2, 3]].isnan().all())


@pytest.mark.parametrize("backend", ["naive", "triton"])
def test_pool_with_conv8_round_trip(backend, device):
    lay = StateLayout.from_retained(retained_lists(2, 6, 0.5, 0), units_per_layer=6, unit_elements=8, value_dim=8,
                                    codec="int8", conv_dim=10, conv_width=3, conv_codec="int8")
    native = StateLayout.from_retained(retained_lists(2, 6, 0.5, 0), units_per_layer=6, unit_elements=8,
                                       value_dim=8, codec="int8", conv_dim=10, conv_width=3)
    # 2 layers x (30 codes padded to 32 + a 4-byte scale) against 2 x 30 bf16 values
    assert lay.conv_bytes_per_slot() == 2 * 36 and native.conv_bytes_per_slot() == 2 * 60
    pool = CheckpointPool(lay, 10 * lay.slot_bytes(), device=device)
    pool.sanity_check()
    assert pool.conv.dtype == torch.int8 and tuple(pool.conv.shape[1:]) == (2, 36)
    g = torch.Generator().manual_seed(1)
    temporal = torch.randn(2, 3, 6, 1, 8, generator=g).to(device)
    conv = torch.randn(2, 3, 10, 3, generator=g).to(device=device, dtype=torch.bfloat16)
    pool.store(temporal, conv, [0, 2], [4, 7], backend=backend)
    t_out, c_out = torch.zeros_like(temporal), torch.full_like(conv, 9.0)
    pool.load([7, 4], t_out, c_out, [1, 0], backend=backend)
    conv, c_out = conv.cpu(), c_out.cpu()
    for b, n in enumerate([2, 0]):
        for l in range(2):
            want = torch.from_numpy(numpy_conv8(conv[l, n].float().numpy())).to(torch.bfloat16)
            assert torch.equal(c_out[l, [1, 0][b]], want)


def test_planner_counts_conv8_bytes():
    # Kimi-Linear at TP8: 20 KDA layers of 3 x 32 x 128 / 8 = 1536 conv channels x 3 (paper shapes); bf16
    # conv is 20 x 1536 x 3 x 2 = 184,320 B, int8 20 x (4608 + 4) = 92,240 B
    kimi, qwen = HybridConfig.from_dict(KIMI), HybridConfig.from_dict(QWEN)
    assert kimi.conv_bytes_per_rank(8) == 184_320 and kimi.conv_bytes_per_rank(8, "int8") == 92_240
    # Qwen3-Next at TP8: 36 GDN layers, (2 x 16 x 128 + 32 x 128) / 8 = 1024 channels
    assert qwen.conv_bytes_per_rank(8, "int8") == 36 * (1024 * 3 + 4)
    from trtllm_dasc.plan import PlanOptions
    from trtllm_dasc.plan.plan import build_plan
    plan = build_plan(kimi, None, PlanOptions(wmax=0, tp=8, conv_codec="int8"))
    assert plan.slot_bytes_per_rank()[0] == kimi.dense_checkpoint_bytes_per_rank(8) - 184_320 + 92_240
    lay = StateLayout.from_plan(plan, 0)
    assert lay.slot_bytes() == plan.slot_bytes_per_rank()[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fma quotient (conv8_ops.fast_div) runs on a GPU only")
def test_fma_quotient_encode_equals_reference_on_gpu():
    # bf16 layers whose values sit on and beside the half-integer multiples of the layer's scale (amax known)
    g = torch.Generator().manual_seed(5)
    L, N, cd, w = 4, 64, 1536, 3
    mag = 10.0 ** (torch.rand(L, N, 1, 1, generator=g) * 12 - 9)
    s = torch.clamp(mag.to(torch.bfloat16).float(), min=1e-8) / 127
    half = (torch.randint(-126, 126, (L, N, cd, w), generator=g) + 0.5) * s
    x = torch.where(torch.rand(L, N, cd, w, generator=g) < 0.5, half, (torch.rand(L, N, cd, w, generator=g) * 2 - 1) * mag)
    x = x.to(torch.bfloat16)
    x[:, :, 0, 0] = mag[..., 0, 0].to(torch.bfloat16)
    row = conv8_naive.conv8_row_bytes(cd * w)
    ref = torch.zeros((N, L, row), dtype=torch.int8)
    conv8_naive.store(x, list(range(N)), ref, list(range(N)))
    got = torch.zeros((N, L, row), dtype=torch.int8, device="cuda")
    conv8_ops.store(x.cuda(), list(range(N)), got, list(range(N)))
    assert torch.equal(got.cpu(), ref)
