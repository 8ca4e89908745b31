"""Serving arms at one matched checkpoint budget: slots, dasc-build and each arm's server.

Arm specs (`dense`, `nr16`, `wr16`, `nr16+int8`, ...) are trtllm_dasc/engine/arms.py's.
"""
from __future__ import annotations

import os
import subprocess
import sys

from trtllm_dasc.engine.arms import ArmSpec as Arm
from trtllm_dasc.engine.arms import parse_arms as _parse_arms
from trtllm_dasc.errors import UserError


def parse_arms(text: str) -> list[Arm]:
    try:
        return _parse_arms(text)
    except UserError as e:
        raise UserError(f"--arms: {e}") from None


def dense_checkpoint_bytes(model: str, dtype: str, tp: int = 1) -> int:
    """Bytes of one complete dense checkpoint on one rank (temporal fp32 + conv in the model's dtype)."""
    from trtllm_dasc.config import HybridConfig
    return HybridConfig.from_path(model, conv_dtype=dtype).dense_checkpoint_bytes_per_rank(tp)


def capacity(model: str, arm: Arm, budget: int, dtype: str, tp: int = 1, placement: str = "off",
             dummy_seed: int | None = None) -> dict:
    """What dasc-build will plan for this arm: slots N(W) = floor(B / bytes) - 1 and the bytes per slot of
    the most loaded rank (``budget`` is per rank, Eq. 8). ``placement``: the run's, unless the arm names one;
    ``dummy_seed``: dummy weights of this seed (dasc-build --load-format dummy plans their decay profile)."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    # every plan field the arm's dasc-build gets (precision and conv codec included): the runner checks the
    # engine's slots against these, and a horizon arm planned as plain nr<W> failed that check
    plan, _ = plan_from_path(model, PlanOptions(**arm.plan_fields(tp, placement)), conv_dtype=dtype,
                             dummy_seed=dummy_seed)
    r = plan.report(budget)
    return {"slots": r["slots"], "dense_slots": r["dense_slots"], "checkpoint_bytes": r["bottleneck_slot_bytes"],
            "compression_ckpt": r["compression_ckpt"],
            # what a hit of a wr arm replays (the engine caps it at its max_context): its step's extra tokens
            "wr_window": r["wr_window"]}


def build_engine(model: str, arm: Arm, out: str, budget: int, flags: list[str]) -> str:
    """The arm's engine directory, made by dasc-build (a subprocess: what a user runs)."""
    cmd = [sys.executable, "-m", "build_scripts.dasc_build", "--model", model, "--output", out, "--force",
           "--state-budget-bytes", str(budget), *flags, *arm.build_flags()]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()
        raise UserError(f"dasc-build for arm {arm.spec} failed: {lines[-1]}")
    return out


def share_kernels(engine_dir: str, cache_dir: str) -> None:
    """Point the engine's compiled-kernel cache at a shared directory: arms compile the same kernels
    (Triton keys them by source and specialisation), and on the H200 the first compile took 99 s."""
    os.makedirs(cache_dir, exist_ok=True)
    kernels = os.path.join(engine_dir, "kernels")
    if os.path.isdir(kernels) and not os.path.islink(kernels):
        os.rmdir(kernels)
    if not os.path.islink(kernels):
        os.symlink(os.path.abspath(cache_dir), kernels)


def serve(engine_dir: str, work_dir: str, timeout: float, torch_threads: int | None = None, tp: int = 1):
    """The arm's tritonserver, ready (warm-up done). Only tensorrt_llm is loaded: the text models' (and the dasc_hybrid
    forwarder's) processes would compete for the CPU with the engine and are not part of what is measured.
    ``torch_threads`` sets the engine's OpenMP threads (on a 2-core CPU shared with the client, two
    threads made a bf16 depthwise conv on the engine's loop thread 20x slower than one)."""
    from trtllm_dasc.serve.tritonserver import new_admin_key, start_server
    env = {"OMP_NUM_THREADS": str(torch_threads)} if torch_threads else None
    # explicit model control opens the repository API (load a model from any path: run its model.py): it
    # and the shared-memory API answer only this run's key (server.admin_headers())
    server = start_server(os.path.join(engine_dir, "model_repo"), work_dir, env=env,
                          extra_args=["--model-control-mode=explicit", "--load-model=tensorrt_llm"],
                          tp=(tp, engine_dir), admin_key=new_admin_key())
    try:
        server.wait_ready(timeout)
    except (RuntimeError, TimeoutError) as e:
        server.stop()
        raise RuntimeError(f"{e} (log: {server.log_path})") from None
    except BaseException:
        server.stop()            # interrupted (a signal): never leave a server behind
        raise
    return server
