"""benchmarks/train_step.py end to end on the CPU (a smoke run: the GPU arms it compares need fla's kernels;
on the CPU both arms are transformers' torch path and the target cannot be met)."""
from __future__ import annotations

import json


def test_a_cpu_smoke_run_records_both_arms_and_does_not_claim_the_target(tmp_path, capsys):
    from benchmarks import train_step
    out = tmp_path / "train_step.json"
    assert train_step.main(["--archs", "gdn", "--lengths", "256", "--steps", "1", "--warmup", "0",
                            "--profile-length", "256", "--device", "cpu", "--size", "tiny",
                            "--tokens-per-step", "512", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(a["arch"], a["arm"], a["conv"]) for a in result["arms"]] == [("gdn", "torch", "torch"),
                                                                          ("gdn", "auto", "torch")]
    assert result["complete"] is True
    assert result["target_met"] is False and set(result["speedup_torch_over_fla"]["gdn"]) == {"256"}
    profile = result["arms"][0]["profile"]
    assert profile["steps"] == 3 and profile["top"] and profile["busy_us_per_step"] > 0
    assert result["arms"][0]["rows"][0]["batch"] == 2 and "python -m benchmarks train_step" in result["command"]
    assert "target not met" in capsys.readouterr().out


def test_without_a_gpu_the_benchmark_says_so(capsys, monkeypatch):
    import torch
    from benchmarks import train_step
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert train_step.main(["--out", "unused.json"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
