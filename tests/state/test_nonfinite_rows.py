"""A row (unit) holding a NaN or an infinity: its scale is NaN and it decodes to NaN on both paths, for every
quantising codec (INT8, FP8, INT4, the 8-bit conv state). Triton's tl.max drops NaN where torch's amax keeps
it, so the kernels used to write a finite scale and plausible codes: a diverged state came back from a
cached checkpoint as a sane-looking one on the GPU path only (nan row: fp8 [0.0067, 1, -2, 0.5], int4
[0, 0.857, -2, 0.571]; a +inf row's fp8 decoded to -inf). Found by a review helper; the kernel half fails on
the old code. Rows without a non-finite value are untouched: the bit-exact tests beside this one cover them."""
import pytest
import torch

from trtllm_dasc.state import codec_naive, conv8_naive, conv8_ops, naive

BAD = [float("nan"), float("inf"), float("-inf")]


def _rows(device):
    x = torch.tensor([[1.0, -2.0, 0.5, 0.25]] * 4, device=device)
    for i, v in enumerate(BAD):
        x[i, i] = v
    return x          # rows 0-2 poisoned, row 3 finite


def _check(scales, decoded, finite_row_scale):
    assert bool(scales[:3].isnan().all()), scales
    assert bool(decoded[:3].isnan().all()), decoded
    assert float(scales[3]) == pytest.approx(finite_row_scale) and bool(decoded[3].isfinite().all())


@pytest.mark.parametrize("codec,qmax", [("fp8", 448.0), ("int4", 7.0)])
def test_fp8_int4_rows(codec, qmax, device):
    from trtllm_dasc.state import codec_ops
    x = _rows(device)
    for name, (q, s), dec in (
            ("torch", codec_naive.QUANTIZE[codec](x), lambda q, s: codec_naive.DEQUANTIZE[codec](q, s)),
            ("triton", codec_ops.quantize(x, codec), lambda q, s: codec_ops.dequantize(q, s, codec, 4))):
        _check(s.float().cpu(), dec(q, s).float().cpu(), 2.0 / qmax)


def test_int8_rows(device):
    from trtllm_dasc.state import triton_ops
    x = _rows(device)
    for q, s in (naive.quantize_int8(x), triton_ops.quantize_int8(x)):
        _check(s.float().cpu(), naive.dequantize_int8(q.cpu(), s.cpu()), 2.0 / 127)


def test_conv8_layers(device):
    # [L=2, N=3, conv_dim=5, width=3]: request 0's layer 1 holds a NaN, request 1's layer 0 an infinity
    g = torch.Generator().manual_seed(0)
    conv = torch.randn(2, 3, 5, 3, generator=g)
    conv[1, 0, 2, 1], conv[0, 1, 4, 0] = float("nan"), float("inf")
    conv = conv.to(device)
    row = conv8_naive.conv8_row_bytes(15)
    for store in (conv8_naive.store, conv8_ops.store):
        codes = torch.zeros((3, 2, row), dtype=torch.int8, device=device)
        store(conv, [0, 1, 2], codes, [0, 1, 2])
        s = conv8_naive.scales(codes).cpu()
        assert bool(s[0, 1].isnan()) and bool(s[1, 0].isnan()), (store, s)
        assert bool(s[0, 0].isfinite()) and bool(s[1, 1].isfinite()) and bool(s[2].isfinite().all()), (store, s)
        out = conv8_naive.decode(codes, 5, 3).cpu()
        assert bool(out[0, 1].isnan().all()) and bool(out[1, 0].isnan().all()) and bool(out[2].isfinite().all())
