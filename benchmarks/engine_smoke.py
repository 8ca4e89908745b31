"""GPU smoke run of the whole engine: fla recurrence + Triton checkpoint kernels + radix cache.

Runs the make-run prefix-reuse workload on CUDA for the dense and dasc arms and checks the invariants.
    python -m benchmarks engine_smoke MODEL_DIR [OUT_JSON] [COMMIT]
The JSON records the command and the commit (pass COMMIT where the device's .git may be stale).
"""
import json
import sys
import time

import torch

from benchmarks.prefix_reuse import prefix_reuse_workload, run_arm
from benchmarks.results_io import provenance, write_result
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.engine.config import EngineConfig


def main() -> int:
    model = sys.argv[1]
    if not torch.cuda.is_available():
        sys.exit("gpu_engine_smoke: no CUDA device")
    work = prefix_reuse_workload(num_docs=20, doc_len=96, questions_per_doc=3)
    budget = 11 * HybridConfig.from_path(model, conv_dtype="bfloat16").dense_checkpoint_bytes_per_rank(1)
    rows = []
    for arm in ({}, {"wmax": 16}, {"wmax": 16, "policy": "wr"}, {"wmax": 16, "codec": "int8"}):
        t = time.time()
        cfg = EngineConfig(model=model, state_budget_bytes=budget, interval=work.doc_len, block_size=16,
                           num_kv_blocks=4096, max_batch=4, device="cuda", dtype="bfloat16", **arm)
        r = run_arm(cfg, work)
        r["wall_s"] = time.time() - t
        rows.append(r)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    if len(sys.argv) > 2:
        run = provenance("benchmarks/engine_smoke.py", commit=sys.argv[3] if len(sys.argv) > 3 else None)
        write_result(sys.argv[2], {**run, "torch": torch.__version__, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
