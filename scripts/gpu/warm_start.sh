#!/usr/bin/env bash
# H200: the cold/warm benchmark on a Kimi-Linear-48B-shaped checkpoint (device tool, .whl carried).
# Kernel tests are not run here: compiling every Triton variant of tests/state takes over 10 minutes.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
[ -f /tmp/kimi48/model.safetensors ] || python3 -m benchmarks shaped_model /tmp/kimi48 --device cuda
# the device's .git may be stale: .commit (written here before the run, untracked) names the real one
timeout "${WARM_START_LIMIT:-500}" python3 -m benchmarks warm_start --model /tmp/kimi48 --out "$OUT/warm_start_h200.json" \
  ${COMMIT:+--commit "$COMMIT"} "$@"
