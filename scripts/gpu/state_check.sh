#!/usr/bin/env bash
# GPU check of the checkpoint store: the state tests on the device (kernels native, no interpreter),
# then the store/load bandwidth benchmark. Results go to benchmarks/results/ and to $OUT when set.
# Usage (GPU machine): bash scripts/gpu/state_check.sh [benchmark args, e.g. --quick]
# The interpreter is $PYTHON, else /opt/torch/.venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x /opt/torch/.venv/bin/python ]; then PY=/opt/torch/.venv/bin/python; else PY=python3; fi
fi
# the package is used from the working tree, not installed
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR" benchmarks/results
# the kernels must compile for the device, never fall back to the interpreter
unset TRITON_INTERPRET

"$PY" - <<'PY'
import sys, torch, triton, numpy
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  triton {triton.__version__}  numpy {numpy.__version__}")
if not torch.cuda.is_available():
    sys.exit("gpu_state_check: torch sees no CUDA device; this script must run on the GPU machine")
print(f"device {torch.cuda.get_device_name()}  cuda {torch.version.cuda}")
PY

echo "== state tests (GPU) =="
# pytest may be absent from the GPU image: the tests then cannot run, and that must fail loudly
"$PY" -c "import pytest" || { echo "gpu_state_check: pytest missing for $PY" >&2; exit 1; }
# pipefail: a failing test run fails the script even through tee
"$PY" -m pytest -q -p no:cacheprovider -rs tests/state 2>&1 | tee "$OUT_DIR/state_tests_gpu.txt"

echo "== store/load bandwidth =="
# the benchmark writes benchmarks/results/state_bandwidth.json and, with $OUT set, $OUT/ too
"$PY" -m benchmarks state_bandwidth "$@" 2>&1 | tee "$OUT_DIR/state_bandwidth.txt"
echo "gpu_state_check: OK"
