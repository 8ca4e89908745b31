#!/usr/bin/env bash
# nvidia-h200-x8: the TP8 matched-HBM grid of benchmarks/serve_matched_hbm_tp8.py (placements off / storage /
# hybrid x W 16/64/128/512 x nr/wr, plus dense) on the Kimi-Linear-shaped (ARCH=kda, /tmp/kimi48) or
# Qwen3-Next-shaped (ARCH=gdn, /tmp/qwen80) checkpoint, one tritonserver over mpirun -np 8 per arm.
# One call per ARCH; a call is at most 10 minutes and an arm's server took ~110 s to get ready at TP2 on the
# 48B-shaped model (serve_matched_hbm_tp2_h200x2.json), so pass ARMS to split the 25 arms over calls (the
# JSON of each call names its arms; merge them with benchmarks/merge_matched_hbm.py), e.g.
#   ARCH=kda ARMS=dense,nr16:off,nr16:storage,nr16:hybrid COMMIT=<hash> bash scripts/gpu/tp8.sh
# Carry: ../shared/tools/gpu-wheels .whl serve (tritonserver, tritonclient; a first INSTALL_ONLY=1 call when
# the carry passes 64 MiB). Writes $OUT/serve_matched_hbm_tp8_h200x8_$ARCH.json (+ .png) and tp8.log.
set -uo pipefail
ARCH=${ARCH:-kda}
[ "$ARCH" = kda ] || SHAPED_MODEL=0          # the prelude writes the Kimi-shaped model; gdn's is written below
source scripts/gpu/prelude.sh
[ "$GPUS" -ge 8 ] || { echo "TP8 needs 8 GPUs, $GPUS here"; exit 5; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout "${SERVE_LIMIT:-560}" python3 -m benchmarks serve_matched_hbm_tp8 --arch "$ARCH" --kernel-cache "$CACHE" \
  ${ARMS:+--arms "$ARMS"} --out "$OUT/serve_matched_hbm_tp8_h200x8_$ARCH.json" ${COMMIT:+--commit "$COMMIT"} \
  > "$OUT/tp8.log" 2>&1
echo "rc=$?"
grep -v "it/s\]\|eta " "$OUT/tp8.log" | tail -60
