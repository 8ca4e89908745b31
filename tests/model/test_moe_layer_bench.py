"""benchmarks/moe_layer.py on the CPU (--smoke): both arms run through the real layers, the fused one's
output matches the loop's, and the JSON records the target, the command and the commit."""
from __future__ import annotations

import json
import os

import pytest
import torch

# --smoke runs the fused arms on CPU tensors in Triton's interpreter (and sets TRITON_INTERPRET for the
# process): on a GPU machine without it triton's launcher refuses CPU tensors (the GPU run is the benchmark)
ON_GPU_LAUNCHER = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


@pytest.mark.skipif(ON_GPU_LAUNCHER, reason="the CPU smoke run needs Triton's interpreter")
def test_smoke_run_records_both_arms_and_the_target(tmp_path, monkeypatch, capsys):
    from benchmarks import moe_layer
    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "moe.json"
    assert moe_layer.main(["--smoke", "--no-sweep", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # the target is stated before any figure
    assert printed.index(moe_layer.TARGET) < printed.index("T=    1")
    got = json.loads(out.read_text())
    assert got["target"] == moe_layer.TARGET and got["command"].startswith("python -m benchmarks moe_layer --smoke")
    assert "commit" in got and got["device"] == "cpu"
    for key in ("kimi", "qwen"):
        m = got["models"][key]
        assert m["arms"] == ["loop", "triton"] and [r["tokens"] for r in m["rows"]] == [1, 9]
        for r in m["rows"]:
            assert r["loop_ms"] > 0 and r["triton_ms"] > 0
            # fp32 on both paths: the fused kernels agree with the loop to rounding
            assert r["triton_rel_err"] < 1e-5
            # the other fused path than the one "triton" took, as an arm of its own (9 tokens x top-3 = 27
            # pairs: the small path, as at 1)
            assert r["triton_path"] == "small" and r["triton_grouped_rel_err"] < 1e-5 and r["triton_grouped_ms"] > 0
        assert m["small_pairs"] >= 27
    assert got["models"]["kimi"]["shape"]["n_group"] == 4


def test_bad_arguments_and_no_gpu_are_refused(tmp_path):
    from benchmarks import moe_layer
    assert moe_layer.main(["--smoke", "--reps", "0", "--out", str(tmp_path / "x.json")]) == 2
    if not torch.cuda.is_available():
        assert moe_layer.main(["--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()
