"""benchmarks/model_prefill.py on the CPU (--smoke): its FLOP count against one done by hand from
Qwen3-Next's tensor shapes, and the JSON it writes."""
from __future__ import annotations

import json
import os


def test_smoke_run_counts_the_flops_of_the_tiny_gdn_stack(tmp_path, monkeypatch):
    from benchmarks import model_prefill
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "mp.json"
    assert model_prefill.main(["--smoke", "--arch", "gdn", "--tokens", "128", "--reps", "1", "--profile",
                               "--out", str(out)]) == 0
    row = json.loads(out.read_text())["results"][0]
    # by hand, the smoke shapes: hidden 64, 36 GDN layers (2 key / 4 value heads x 16), 12 gated-attention
    # layers (2 heads x 16, 1 KV head; q_proj carries the output gate), dense MLP 128, vocabulary 512
    D, gdn = 64, (2 * (2 * 16 + 2 * 2 * 16)) * 64 + (2 * 4) * 64 + 64 * (4 * 16)    # in_proj_qkvz, ba, out
    attn = (2 * 16 * 2) * D + 16 * D + 16 * D + D * (2 * 16)                        # q (+gate), k, v, o
    params = 36 * gdn + 12 * attn + 48 * 3 * D * 128                                # + the MLPs
    # the LM head runs on the last token only: 1/128 of it per token
    assert row["flops_split"]["matmul"] == 2 * params + 2 * 512 * D / 128
    assert row["flops_split"]["attention"] == 2 * (129 / 2) * 2 * (16 + 16) * 12        # QK^T + PV, causal
    assert row["flops_split"]["recurrence"] == (6 * 16 * 16 + 2 * 64 * (3 * 16 + 2 * 16)) * 4 * 36
    assert row["tokens"] == 128 and row["mixer_ms_per_layer"] > 0 and "fla_layer_ms" not in row
    # --profile: one forward's operators (on the CPU); its 48 layers' projections are matrix products
    prof = row["profile"]
    assert prof["steps"] == 1 and prof["events_per_step"] > 0
    assert sum(t["count_per_step"] for t in prof["top"] if t["name"] in ("aten::mm", "aten::addmm")) >= 48


def test_bad_arguments_are_refused(tmp_path):
    from benchmarks import model_prefill
    assert model_prefill.main(["--smoke", "--reps", "0", "--out", os.fspath(tmp_path / "x.json")]) == 2
