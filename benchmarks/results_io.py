"""What every benchmark result records and how it is written: the exact command, the commit it ran on,
and the machine, so a figure quoted anywhere can be traced to a run. A result written into benchmarks/results/
must name a clean commit (refused otherwise); anywhere else it may name any."""
from __future__ import annotations

import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def provenance(script: str, argv=None, commit: str | None = None) -> dict:
    """``script``: the benchmark's path relative to the repository (e.g. 'benchmarks/wr_cost.py'); a benchmark
    here is recorded as its entry point's command (``python -m benchmarks wr_cost ...``).
    ``commit``: pass it where the checkout's .git may be stale (a device machine's copy of the tree)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if commit is None:
        from trtllm_dasc.provenance import git_commit
        commit = git_commit(HERE)
    device = "cpu"
    try:
        import torch
        if torch.cuda.is_available():
            device = torch.cuda.get_device_name()
    except ImportError:
        pass
    name = os.path.splitext(os.path.basename(script))[0]
    command = ["python", "-m", "benchmarks", name] if script == f"benchmarks/{name}.py" else ["python", script]
    return {"command": " ".join([*command, *args]), "commit": commit or None,
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "device": device}


def write_result(path: str, result: dict) -> None:
    """Refused (UserError) inside the repository's benchmarks/results/ unless the result names a clean commit
    (trtllm_dasc/provenance.py: check_results_commit)."""
    from trtllm_dasc.provenance import check_results_commit
    check_results_commit(path, result)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")
