#!/usr/bin/env bash
# H200: matched-HBM serving through tritonserver (benchmarks/serve_matched_hbm.py) on a Kimi-Linear-48B-shaped
# checkpoint, within one device call (~9 minutes). Carry the serving wheels as .whl:
#   ../shared/tools/gpu-wheels .whl serve numpy==1.26.4
# numpy 1.x because the Triton Python backend stub exchanges tensors through numpy 1.x's ABI (under numpy 2,
# which the GPU machine has, inputs arrive wrong: pyproject.toml says how it was found). If the wheels pass
# one call's 64 MiB, carry them in two calls on the same warm machine: the first with INSTALL_ONLY=1.
# Writes $OUT/serve_matched_hbm_h200.json and .png; copy them to benchmarks/results/.
set -uo pipefail
# into the interpreter's own site-packages (not --target): the server is looked up there
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && exit 0
export PYTHONPATH=$PWD
python3 - <<'PY' || exit 3
import sys
import numpy
import tritonclient.grpc  # noqa: F401  (needs grpcio on the machine)
from trtllm_dasc.serve.tritonserver import find_server
find_server()
if int(numpy.__version__.split(".")[0]) >= 2:
    sys.exit(f"numpy {numpy.__version__}: the Triton Python backend stub needs numpy<2 (carry numpy==1.26.4)")
print(f"serving stack ready: numpy {numpy.__version__}, tritonserver at {find_server().binary}")
PY
[ -f /tmp/kimi48/model.safetensors ] || python3 -m benchmarks shaped_model /tmp/kimi48 --device cuda
# the device's .git may be stale: COMMIT (set by the caller) names the real one
timeout "${SERVE_BENCH_LIMIT:-450}" python3 -m benchmarks serve_matched_hbm --model /tmp/kimi48 \
  --out "$OUT/serve_matched_hbm_h200.json" ${COMMIT:+--commit "$COMMIT"} "$@"
