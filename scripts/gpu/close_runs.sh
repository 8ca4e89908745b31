#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~6 minutes): the checks left open by earlier runs, side by side.
#   GPU 0: benchmarks/warm_start.py (cold/warm: the warmed first pass within 10% of the second, all arms)
#   GPU 1: dasc-nr W=16 through tritonserver and in-process (Triton's overhead), prompt-end checkpoints,
#          8 dense slots, the phases of all five arms (as scripts/gpu/serve_pair.sh, so it joins that run)
# Then `PARTS=serve bash scripts/gpu/tp2.sh` in a second call (both GPUs: TP2 dense and dasc-nr W=16).
# Carry the serving wheels as .whl (two calls: the first INSTALL_ONLY=1 with nvidia_pytriton alone) and
# .kernel_cache when present. Pass COMMIT=<hash>. Writes $OUT/warm_start_h200.json, $OUT/serve_inprocess.json.
set -uo pipefail
source scripts/gpu/prelude.sh
CUDA_VISIBLE_DEVICES=0 timeout "${WARM_START_LIMIT:-400}" python3 -m benchmarks warm_start --model /tmp/kimi48 \
  --triton-cache $CACHE --out "$OUT/warm_start_h200.json" ${COMMIT:+--commit "$COMMIT"} > "$OUT/warm_start.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout "${SERVE_BENCH_LIMIT:-420}" python3 -m benchmarks serve_matched_hbm --model /tmp/kimi48 \
  --work /tmp/smh_c --out "$OUT/serve_inprocess.json" ${COMMIT:+--commit "$COMMIT"} --kernel-cache $CACHE \
  --arms nr16 --inprocess nr16 --prompt-only --dense-slots 8 > "$OUT/serve_inprocess.log" 2>&1 &
wait
grep -v "autotun\|^\s*$" "$OUT/warm_start.log" | grep "ratio" ; grep -v "it/s\]" "$OUT/serve_inprocess.log" | tail -8
tar czf "$OUT/kernels.tgz" --transform 's,^triton_cache,kernels,' -C /tmp triton_cache 2>/dev/null
