"""Shared helpers of the state tests: layouts, poisoning, fla-style assert_close, loop references."""
from __future__ import annotations

import random

import numpy as np
import torch

from trtllm_dasc.state import StateLayout

# the two reference models (config.json fields the state store reads)
KIMI = {"model_type": "kimi_linear", "num_hidden_layers": 27,
        "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                               "kda_layers": [i for i in range(1, 27) if i % 4], "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]}}
QWEN = {"model_type": "qwen3_next", "num_hidden_layers": 48, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 4}

# int8 poison: the codec only emits [-127, 127]
INT8_POISON = -128


def assert_close(name: str, ref: torch.Tensor, tri: torch.Tensor, ratio: float = 0.0) -> None:
    """fla style: exact (bitwise, NaN == NaN) when the largest difference is below 1e-6 absolute or
    ratio is 0; otherwise the RMS of the difference over the RMS of ref must stay below ratio."""
    assert ref.shape == tri.shape and ref.dtype == tri.dtype, f"{name}: {ref.shape}/{ref.dtype} vs {tri.shape}/{tri.dtype}"
    r, t = ref.detach().cpu(), tri.detach().cpu()
    if ratio == 0.0:
        same = torch.equal(r, t) if not r.is_floating_point() else bool(
            ((r == t) | (r.isnan() & t.isnan())).all())
        if not same:
            # a NaN on one side only counts as an infinite difference
            diff = torch.where(r.isnan() & t.isnan(), 0.0, (r.double() - t.double()).abs().nan_to_num(float("inf")))
            raise AssertionError(f"{name}: not bit-exact, max |diff| {diff.max().item():.3g} "
                                 f"at {np.unravel_index(int(diff.argmax()), tuple(diff.shape))}")
        return
    diff = (r.double() - t.double())
    assert not t.isnan().any(), f"{name}: NaN in output"
    if diff.abs().max() < 1e-6:
        return
    err = diff.pow(2).mean().sqrt() / r.double().pow(2).mean().sqrt().clamp_min(1e-12)
    assert err <= ratio, f"{name}: rms-relative error {err:.3g} > {ratio}"


def retained_lists(L: int, n: int, keep: float, seed: int) -> list[list[int]]:
    """Sorted kept units per layer; layer 0 keeps everything and layer 1 nothing (when L > 2), so
    ragged vs padded and empty layers are always exercised."""
    rng = random.Random(seed)
    out = [sorted(u for u in range(n) if rng.random() < keep) for _ in range(L)]
    if L > 2:
        out[0], out[1] = list(range(n)), []
    return out


def make_layout(L, n, R, V, keep=0.5, seed=0, codec="native", layout="ragged", conv=(6, 3), width=None):
    return StateLayout.from_retained(retained_lists(L, n, keep, seed), units_per_layer=n, unit_elements=R * V,
                                     value_dim=V, codec=codec, layout=layout, width=width,
                                     conv_dim=conv[0], conv_width=conv[1])


def new_slots(layout: StateLayout, S: int, device, poison=True):
    """(payload, scales or None, conv_store or None), NaN / -128 poisoned."""
    E, R, w = layout.unit_elements, layout.rows_per_unit, layout.width
    if layout.codec == "int8":
        payload = torch.full((S, w, E), INT8_POISON if poison else 0, dtype=torch.int8, device=device)
        scales = torch.full((S, w, R), float("nan") if poison else 0.0, device=device)
    else:
        payload, scales = torch.full((S, w, E), float("nan") if poison else 0.0, device=device), None
    conv = None
    if layout.conv_dim:
        conv = torch.full((S, layout.num_layers, layout.conv_dim, layout.conv_width),
                          float("nan") if poison else 0.0, dtype=layout.conv_dtype, device=device)
    return payload, scales, conv


# ---- explicit python-loop references (small shapes only) --------------------------------------------
def loop_pack(t4, rows, payload, slots, retained, layout_kind, block):
    """t4 [L, N, n, E]; unit j of layer l goes to ragged position o_l + i or padded l * block + i."""
    for row, slot in zip(rows, slots):
        j = 0
        for l, kept in enumerate(retained):
            for i, u in enumerate(kept):
                pos = j if layout_kind == "ragged" else l * block + i
                payload[slot, pos] = t4[l, row, u]
                j += 1


def loop_unpack(payload, slots, t4, rows, retained, layout_kind, block, zero_fill=True):
    n = t4.shape[2]
    for row, slot in zip(rows, slots):
        j = 0
        for l, kept in enumerate(retained):
            for u in range(n):
                if u in kept:
                    i = kept.index(u)
                    pos = j + i if layout_kind == "ragged" else l * block + i
                    t4[l, row, u] = payload[slot, pos]
                elif zero_fill:
                    t4[l, row, u] = 0
            j += len(kept)


def loop_merge(s4, srows, t4, rows, retained):
    n = t4.shape[2]
    for srow, row in zip(srows, rows):
        for l, kept in enumerate(retained):
            for u in range(n):
                if u not in kept:
                    t4[l, row, u] = s4[l, srow, u]


def numpy_eq10(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Paper Eq. 10 on rows x [..., V] in float32 with numpy: a = max|x|, s = max(a, 1e-8) / 127,
    q = clip(round_half_even(x / s), -127, 127)."""
    x = x.astype(np.float32)
    a = np.abs(x).max(axis=-1)
    s = (np.maximum(a, np.float32(1e-8)) / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(x / s[..., None]), -127, 127).astype(np.int8)
    return q, s
