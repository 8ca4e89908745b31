#!/usr/bin/env bash
# H200: one call of the paper's matched-HBM matrix (App. C.2) on Kimi-Linear-48B-A3B at its full size, dummy
# weights made at load time from tests/data/kimi-linear-48b-a3b.config.json (nothing of their 96 GB is written),
# resumable: dense + the arm in CALL_ARMS run the cells not yet done in the carried cells directory $CELLS, a unit
# is started only when it and the arm's cells of it fit before the call's deadline, and the cells and the newly
# compiled kernels come back in $OUT. Repeat the call (same COMMIT, same CELLS, BLOCKS) until the plan says done:
#   python -m clients.matched_hbm ...the same flags... --cells-dir $CELLS --memory-limit-bytes N --plan-only
#
# Wheels (no package index on the device; ../shared/tools/gpu-wheels downloads them here into .whl/, which git
# ignores; .whl/ travels as a carried path). Together they pass one call's 64 MiB, so a fresh machine takes two:
#   call 1 (stage): .whl/ holding only nvidia-pytriton-0.7.0-*.whl (~50 MB), run with INSTALL_ONLY=1
#         ../shared/tools/gpu-wheels /tmp/w serve numpy==1.26.4 && mkdir -p .whl && mv /tmp/w/nvidia_pytriton* .whl/
#         run: INSTALL_ONLY=1 bash scripts/gpu/matched_cells.sh            carry: [".whl"]
#   call 2 (measure, within ~30 s while the machine is warm): .whl/ holding the rest, fla-core, tritonclient,
#         python-rapidjson, numpy==1.26.4 (~22 MB: numpy 1.x, the Triton Python stub dies with numpy 2)
#         rm .whl/nvidia_pytriton* && mv /tmp/w/*.whl .whl/
#         run: COMMIT=<sha> CALL_ARMS=nr16 BLOCKS=1 bash scripts/gpu/matched_cells.sh
#         carry: [".whl", ".kernel_cache", ".cells"]   (kernel parts of earlier calls: cat them into one .tgz)
#   later calls on the same warm machine carry .kernel_cache and .cells only (the wheels stay installed).
# Bring back: tar xzf $files_at/cells.tgz -C .cells; cat $files_at/matched_kernels.tgz.part-* >
# .kernel_cache/matched_<n>.tgz. The device's .git may be stale: COMMIT names the real commit (one for all calls).
set -uo pipefail
CALL_LIMIT=${CALL_LIMIT:-600}
SHAPED_MODEL=0
source scripts/gpu/prelude.sh
python3 - <<'PY' || exit 3
import sys
import numpy
from trtllm_dasc.serve.tritonserver import find_server
find_server()
if int(numpy.__version__.split(".")[0]) >= 2:
    sys.exit(f"numpy {numpy.__version__}: the Triton Python backend stub needs numpy<2 (carry numpy==1.26.4)")
PY
CELLS=${CELLS:-.cells/mh_kimi48_full}
mkdir -p "$CELLS"
touch /tmp/matched_cells.marker
# what is left of the call after the prelude, less the time to stop the last server and pack the results
DEADLINE=$((CALL_LIMIT - ${MARGIN:-60} - SECONDS))
echo "matched_cells: deadline ${DEADLINE} s for dense + ${CALL_ARMS:-nr16}"
timeout $((DEADLINE + 40)) python3 -m clients.matched_hbm --paper \
  --model tests/data/kimi-linear-48b-a3b.config.json --load-format dummy --seed 0 \
  --arms dense,nr16,nr64,nr128,nr512,wr16,wr64,nr16+int8 --call-arms "${CALL_ARMS:-nr16}" \
  --device cuda --dtype bfloat16 --max-batch-size 96 --memory-limit-bytes device \
  ${BLOCKS:+--blocks-per-phase "$BLOCKS"} --cells-dir "$CELLS" --call-deadline-s "$DEADLINE" \
  --out /tmp/matched_cells --kernel-cache "$CACHE" --json "$OUT/matched_hbm_kimi48_full.json" --plot none \
  ${COMMIT:+--commit "$COMMIT"} "$@"
rc=$?
tar czf "$OUT/cells.tgz" -C "$CELLS" .
return_new_kernels matched_kernels kernels /tmp/matched_cells.marker
cp /tmp/matched_cells/servers/*/*.log "$OUT/" 2>/dev/null
exit $rc
