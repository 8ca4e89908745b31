"""Helpers of tests/tp: tiny checkpoints with 8 head bundles (so TP 1, 2, 4 and 8 all divide them) and
running a job on T MPI ranks. (The folder is not tests/dist: pytest never collects folders named dist.)"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
from hybrid_tiny import VOCAB, build

__all__ = ["VOCAB", "build_tp_model", "run_job", "run_batch", "have_mpi"]

# 8 bundles per linear layer: gdn 8 key heads with 2 value heads each, kda 8 heads. kda's 8 MLA heads split
# at every degree; gdn's 2 attention heads (1 KV head, shared by the ranks) split at TP2 and stay whole at
# TP 4 and 8; MLP and expert channels (16, 8, 8) split at every degree
OVERRIDES = {
    "gdn": dict(hidden_size=32, linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=8,
                linear_value_head_dim=8, num_attention_heads=2, head_dim=8),
    "kda": dict(hidden_size=32, linear_num_heads=8, linear_head_dim=8, num_attention_heads=8, num_key_value_heads=8,
                v_head_dim=8, qk_nope_head_dim=4, qk_rope_head_dim=4),
}


def build_tp_model(path, arch: str, seed: int = 0):
    """A small random checkpoint (transformers' save_pretrained); returns the transformers model."""
    return build(path, arch, seed=seed, long=True, **OVERRIDES[arch])


def have_mpi() -> str | None:
    """None when TP runs can start here, else why not."""
    try:
        import mpi4py  # noqa: F401
    except ImportError as e:
        return f"mpi4py is not installed ({e})"
    from trtllm_dasc.parallel.launch import find_mpirun
    from trtllm_dasc.errors import UserError
    try:
        find_mpirun()
    except UserError as e:
        return str(e)
    return None


def run_job(num_ranks: int, job_args: list[str], out: Path, timeout: float = 300.0, script: str = "tp_job.py") -> dict:
    """Run tests/tp/<script> on ``num_ranks`` ranks; its JSON result (rank 0 writes ``out``)."""
    from trtllm_dasc.parallel.launch import mpirun_command
    cmd, env = mpirun_command(num_ranks, [str(HERE / script), *job_args, "--out", str(out)])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"mpirun -np {num_ranks} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def run_batch(num_ranks: int, tasks: list[dict], folder: Path, timeout: float = 600.0) -> list[dict]:
    """Run ``tasks`` (batch_job.py's list) on one mpirun of ``num_ranks`` ranks; per task {"result": ...}
    or {"error": why}, where a task that never ran (an earlier one ended the mpirun) gets mpirun's output."""
    from trtllm_dasc.parallel.launch import mpirun_command
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tasks.json").write_text(json.dumps(tasks))
    out = folder / "out.json"
    cmd, env = mpirun_command(num_ranks, [str(HERE / "batch_job.py"), "--tasks", str(folder / "tasks.json"),
                                          "--out", str(out)])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    done = json.loads(out.read_text()) if out.exists() else []
    if proc.returncode == 0 and len(done) == len(tasks):
        return done
    why = (f"mpirun -np {num_ranks} failed ({proc.returncode}) after {len(done)} of {len(tasks)} tasks:\n"
           f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return done + [{"error": why}] * (len(tasks) - len(done))
