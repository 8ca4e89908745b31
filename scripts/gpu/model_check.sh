#!/usr/bin/env bash
# GPU check of the model runtime: fla kernels vs the torch reference, then the prefill benchmark.
# Run from the repository root on the GPU machine, with fla-core's wheel carried in .whl/:
#     bash scripts/gpu/model_check.sh
# Results (pytest log, benchmark JSON) are copied to $OUT when it is set. Fails loudly on any error.
set -euo pipefail
cd "$(dirname "$0")/../.."
# the GPU machine's torch lives in /opt/torch/.venv; PYTHON overrides
if [ -z "${PYTHON:-}" ] && [ -x /opt/torch/.venv/bin/python ]; then PYTHON=/opt/torch/.venv/bin/python; fi
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-benchmarks/results}
mkdir -p "$OUT_DIR" benchmarks/results

echo "== environment ($PY)"
$PY - <<'PY'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
import triton; print("triton", triton.__version__)
try:
    import transformers; print("transformers", transformers.__version__)
except ImportError:
    print("transformers: not installed (not needed here)")
if not torch.cuda.is_available():
    sys.exit("gpu_model_check: no CUDA device")
PY

echo "== installing fla from .whl/"
ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_model_check: no wheel in .whl/ (carry fla_core-0.6.0-py3-none-any.whl)" >&2; exit 1; }
$PY -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$(pwd):${PYTHONPATH:-}
$PY -c "import fla, fla.ops.kda, fla.ops.gated_delta_rule; print('fla', getattr(fla, '__version__', '?'), fla.__file__)"
$PY -c "from trtllm_dasc.model.recurrence import fla; ok, why = fla.available(); print('fla backend:', why); assert ok, why"

echo "== tests/model/test_fla_gpu.py"
# -rs prints skip reasons: a skipped GPU test here is a failure of the check
$PY -m pytest -q -rs -p no:cacheprovider tests/model/test_fla_gpu.py 2>&1 | tee "$OUT_DIR/test_fla_gpu.log"
if grep -q "skipped" "$OUT_DIR/test_fla_gpu.log"; then echo "gpu_model_check: GPU tests were skipped" >&2; exit 1; fi

echo "== benchmarks/model_prefill.py"
$PY -m benchmarks model_prefill --tokens 4096 16384 --reps 3
echo "== done; results in $OUT_DIR"
