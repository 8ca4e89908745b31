"""Faults that must fail cleanly at TP, on real MPI ranks (CPU, gloo), each against what TP1 does with the same
input. Found by a review helper; both fail on the old code (the first by its timeout: mpirun never ended).

- A rank that cannot start (its rank weight file written for another rank) left the other ranks waiting in
  the pool reports' gather, and mpirun, seeing no rank exit, kept `dasc serve --tp` "not ready" for its 30
  minute timeout. Now every rank raises one UserError naming the rank, at once.
- A captured state that is non-finite on one rank's heads only: each rank decided alone whether to store it.
  With the storage placement one rank entered the all-to-all without the other (a hang, then the whole
  server aborted); with placement off rank 0 recorded a checkpoint the other rank never wrote (the next
  request counted 39 cached tokens where TP1 refuses the checkpoint). Now the ranks agree (an all-reduce).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tp_helpers import ROOT, HERE, build_tp_model, have_mpi

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=str(have_mpi()))


def _mpirun(num_ranks: int, args: list[str], out: Path, timeout: float = 240.0):
    from trtllm_dasc.parallel.launch import mpirun_command
    cmd, env = mpirun_command(num_ranks, [str(HERE / "fault_job.py"), *args, "--out", str(out)])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_a_rank_that_cannot_start_fails_every_rank_at_once(tmp_path):
    model = tmp_path / "kda"
    build_tp_model(model, "kda", seed=11)
    engine = tmp_path / "eng"
    r = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(model), "--output",
                        str(engine), "--device", "cpu", "--tp", "2", "--wmax", "0", "--dtype", "float32"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _mpirun(2, ["start", str(engine)], tmp_path / "ok.json") == ["started", "started"]
    # rank 1 given rank 0's weight manifest
    shutil.copy(engine / "weights" / "rank0.json", engine / "weights" / "rank1.json")
    seen = _mpirun(2, ["start", str(engine)], tmp_path / "bad.json", timeout=180)
    assert len(seen) == 2
    for s in seen:
        assert s.startswith("UserError: TP rank 1 of 2 could not start") and "rank1.json" in s, s
        assert "TP rank 0" not in s


def test_a_state_non_finite_on_one_rank_is_refused_by_every_rank(tmp_path):
    from safetensors.torch import load_file, save_file
    model = tmp_path / "kda_inf"
    build_tp_model(model, "kda", seed=11)
    # the last linear layer's value head 7 (on rank 1 at TP2) overflows fp32; every weight stays finite
    path = model / "model.safetensors"
    t = load_file(str(path))
    key = next(k for k in sorted(t, reverse=True) if k.endswith("self_attn.v_proj.weight"))
    w = t[key]
    w[56:64] = torch.sign(w[56:64]) * 3e38
    save_file(t, str(path), metadata={"format": "pt"})
    tp1 = _mpirun(1, ["nonfinite", str(model), "off", "--tp", "1"], tmp_path / "tp1.json")
    assert [r["cached"] for r in tp1] == [0, 0]
    assert all("non-finite" in (r["error"] or "") for r in tp1), tp1
    for placement in ("off", "storage"):
        got = _mpirun(2, ["nonfinite", str(model), placement], tmp_path / f"tp2_{placement}.json", timeout=180)
        assert [r["cached"] for r in got] == [r["cached"] for r in tp1], (placement, got)
        assert all("non-finite" in (r["error"] or "") for r in got), (placement, got)


def _build_tp2(model: Path, engine: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(model), "--output",
                        str(engine), "--device", "cpu", "--tp", "2", "--wmax", "0", "--dtype", "float32"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return engine


def test_a_rank_file_of_another_build_or_a_corrupt_one_is_refused(tmp_path):
    """A rank's weight files copied from an engine of another model with the same shapes served mixed weights
    without a word (tokens [36, 87, 50, 66] against [88, 64, 55, 11]); a truncated rank file raised
    SafetensorError and a manifest that is a list an AttributeError, neither a one-line error. From a review
    helper; fails on the old code."""
    from trtllm_dasc.engine.config import engine_config
    from trtllm_dasc.errors import UserError
    from trtllm_dasc.model.rank_weights import RankWeights
    engines = []
    for seed in (11, 12):
        build_tp_model(tmp_path / f"m{seed}", "kda", seed=seed)
        engines.append(_build_tp2(tmp_path / f"m{seed}", tmp_path / f"e{seed}"))
    a, b = engines
    cfg = engine_config(str(a))
    order = json.loads((a / "weights" / "rank1.json").read_text())["bundle_order"]
    assert cfg.rank_weights_id and cfg.rank_weights_id != engine_config(str(b)).rank_weights_id
    RankWeights(cfg.rank_weights, 1, 2, order, cfg.rank_weights_id)          # its own files: fine
    for name in ("rank1.json", "rank1.safetensors"):
        shutil.copy(b / "weights" / name, a / "weights" / name)
    with pytest.raises(UserError, match="another build"):
        RankWeights(cfg.rank_weights, 1, 2, order, cfg.rank_weights_id)
    w = a / "weights" / "rank0.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(UserError, match="cannot be read"):
        RankWeights(cfg.rank_weights, 0, 2, order, cfg.rank_weights_id)
    shutil.copy(b / "weights" / "rank0.safetensors", w)
    (a / "weights" / "rank0.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="not a rank weight manifest"):
        RankWeights(cfg.rank_weights, 0, 2, order, cfg.rank_weights_id)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA sees no device")
def test_a_cuda_engine_on_a_machine_without_cuda_is_one_line_at_tp(tmp_path):
    """TP1 refuses a CUDA device where there is none in one line; at TP each rank picked its GPU as
    rank % device_count() and every rank died of ZeroDivisionError (a traceback each, then mpirun's report),
    in `dasc logits --tp` and in a server's ranks alike. From a review helper; fails on the old code."""
    model = tmp_path / "kda"
    build_tp_model(model, "kda", seed=11)
    r = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "logits", "--model", str(model), "--ids", "1,2,3",
                        "--out", str(tmp_path / "x.npy"), "--tp", "2", "--device", "cuda"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["dasc logits: error: device cuda requested but CUDA is not available"]
    # the ranks themselves (as the Triton model and serve.worker start them from an engine directory)
    engine = _build_tp2(model, tmp_path / "eng")
    cfg = json.loads((engine / "config.json").read_text())
    cfg["engine"]["device"] = "cuda"
    (engine / "config.json").write_text(json.dumps(cfg))
    seen = _mpirun(2, ["start", str(engine)], tmp_path / "cuda.json", timeout=120)
    assert seen == ["UserError: device cuda requested but CUDA is not available"] * 2, seen


def test_a_hung_rank_ends_the_job_after_the_tp_timeout(tmp_path):
    """A worker rank hung inside a step (here: asleep for 600 s in its first one) held rank 0 in the step's
    all-reduce for the TP group's fixed 600-s timeout, the server's requests stalled all that time. The
    timeout is the engine's tp_timeout_s (dasc-build --tp-timeout-s): at 3 s, rank 0's collective fails, it
    aborts every rank, and mpirun ends long before the hung rank would have woken."""
    import time
    from trtllm_dasc.parallel.launch import mpirun_command
    model = tmp_path / "kda"
    build_tp_model(model, "kda", seed=11)
    cmd, env = mpirun_command(2, [str(HERE / "fault_job.py"), "hang", str(model), "--out", str(tmp_path / "o.json")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        # the ranks run under MPI's daemon, outside mpirun's process group: by the job's own path
        subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)
        raise AssertionError("the job outlived its TP timeout: rank 0 waited for the hung rank") from None
    ended = time.time()
    assert proc.returncode != 0 and not (tmp_path / "o.json").exists(), out[-2000:] + err[-4000:]
    # rank 0's all-reduce timing out, or its step watchdog at the same bound (parallel/runner.py): whichever first
    assert "step failed; aborting every rank" in err or "has not ended in 3 s" in err, err[-4000:]
    submitted = float(err.split("hang job: submitting at ")[1].split()[0])
    assert ended - submitted < 120, ended - submitted       # the hung rank sleeps 600 s
