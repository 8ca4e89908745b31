"""benchmarks/state_bandwidth.py's codec arms (issue 35): every codec's store / load counts the bytes its
kernels read and write. Counted here by hand from the layout's shapes (row widths of each codec, one fp32
scale per row of d_v, the 8-bit conv's padded rows), and the written half measured: bytes of the pool (store)
or the active state (load) that the op changed under a 0x00 and a 0xff fill."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import state_bandwidth as bw
from benchmarks import state_codec_arms as arms

B = 2
# stored bytes of one row of V values: the codes, then (quantizing codecs) one fp32 scale
ROW = {"native": lambda V: 4 * V, "int8": lambda V: V + 4, "fp8": lambda V: V + 4, "int4": lambda V: V // 2 + 4}


def hand_count(shape: dict, unit_codecs: list[str], conv_codec: str) -> dict:
    """(read, written) per op for B checkpoints of the kept units ``unit_codecs`` (one entry a unit)."""
    L, n, V, R, cd, cw = (shape[k] for k in ("L", "n", "V", "R", "conv_dim", "conv_width"))
    kept_fp32 = len(unit_codecs) * R * V * 4
    stored = sum(R * ROW[c](V) for c in unit_codecs)
    active_conv = L * cd * cw * 2                     # bf16
    if conv_codec == "native":
        slot_conv_write = slot_conv_read = L * cd * cw * 2
    else:
        # codes padded to a multiple of 4, then the layer's fp32 scale; the decode skips the padding
        slot_conv_write, slot_conv_read = L * (-(-cd * cw // 4) * 4 + 4), L * (cd * cw + 4)
    return {"store": (B * (kept_fp32 + active_conv), B * (stored + slot_conv_write)),
            "load": (B * (stored + slot_conv_read), B * (L * n * R * V * 4 + active_conv))}


def changed_bytes(tensors, run) -> int:
    """Bytes of ``tensors`` that run() sets, found as those differing from a 0x00 or a 0xff fill (a written
    byte cannot equal both)."""
    hit = None
    for fill in (0x00, 0xFF):
        for t in tensors:
            t.view(torch.uint8).fill_(fill)
        run()
        now = torch.cat([t.view(torch.uint8).flatten() != fill for t in tensors])
        hit = now if hit is None else hit | now
    return int(hit.sum())


def pool_tensors(pool):
    parts = [p for _, p in pool.segments] if hasattr(pool, "segments") else [pool]
    return [t for p in parts for t in (p.payload, p.scales, p.conv) if t is not None]


# every codec under both conv codecs, one on each smoke model (kda: one row a unit, gdn: R rows)
CASES = [(m, c, ("native", "int8")[(i + j) % 2]) for i, m in enumerate(arms.SMOKE_MODELS)
         for j, c in enumerate(arms.ARM_CODECS)]


@pytest.mark.parametrize("model,codec,conv_codec", CASES)
def test_arm_bytes_are_what_the_kernels_read_and_write(model, codec, conv_codec, kernel_device):
    masks = {m.model: m for m in bw.smoke_masks()}[model]
    shape = bw.SHAPES[model]
    arm = arms.build(masks, shape, codec, conv_codec, "ragged", B, kernel_device)
    flat = [c for row in masks.codecs for c in row] if codec == arms.MIXED else [codec] * sum(map(len, masks.lists))
    want = hand_count(shape, flat, conv_codec)
    assert arm.traffic == want
    assert changed_bytes(pool_tensors(arm.pool), arm.store) == want["store"][1]
    assert changed_bytes([arm.temporal, arm.conv], arm.load) == want["load"][1]


def test_smoke_run_records_bytes_and_a_verdict_per_codec(tmp_path, capsys):
    out = tmp_path / "bw.json"
    assert bw.main(["--smoke", "--codecs", "int4,mixed", "--conv-codec", "int8", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    got = {(a["model"], a["codec"], a["op"]): a for a in res["arms"]}
    assert len(got) == len(res["arms"]) == 2 * 2 * 2
    for m in bw.smoke_masks():
        for codec in ("int4", "mixed"):
            flat = [c for row in m.codecs for c in row] if codec == "mixed" else ["int4"] * sum(map(len, m.lists))
            for op, (r, w) in hand_count(bw.SHAPES[m.model], flat, "int8").items():
                a = got[(m.model, codec, op)]
                assert (a["bytes_read"], a["bytes_written"], a["bytes"]) == (r, w, r + w)
                assert a["conv_codec"] == "int8" and a["pct_of_same_size_copy_graph"] > 0
    assert set(res["codec_verdicts"]) == {"int4+c8", "mixed+c8"}
    assert "per codec" in capsys.readouterr().out
