#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~5 minutes): why a fresh prompt's first replay is slow.
#   GPU 0: benchmarks/first_seed_profile.py for dense and dasc-wr W=16 (one phase, three seeds, every
#          engine step timed, the replays profiled);
#   GPU 1: benchmarks/warm_start.py (issue 8's cold/warm check: warmed first pass within 10% of the second).
# Carry the wheels as .whl (fla-core at least) and, when present, .kernel_cache (a Triton cache tarball
# of an earlier run: skips minutes of first compiles; Triton keys kernels by source, so a stale one is
# only unused). Pass COMMIT=<hash> (the device's .git may be stale).
# Writes $OUT/first_seed_profile_{dense,wr16}_h200.json and $OUT/warm_start_h200.json.
set -uo pipefail
source scripts/gpu/prelude.sh
export TRITON_PRINT_AUTOTUNING=1
(
  for arm in dense wr16; do
    CUDA_VISIBLE_DEVICES=0 timeout "${PROFILE_LIMIT:-200}" python3 -m benchmarks first_seed_profile --model /tmp/kimi48 \
      --arm $arm --kernel-cache $CACHE --work /tmp/fsp_$arm --out "$OUT/first_seed_profile_${arm}_h200.json" \
      ${COMMIT:+--commit "$COMMIT"} > "$OUT/first_seed_profile_$arm.log" 2>&1
    echo "first_seed_profile $arm: exit $?"
  done
) &
CUDA_VISIBLE_DEVICES=1 timeout "${WARM_START_LIMIT:-420}" python3 -m benchmarks warm_start --model /tmp/kimi48 \
  --triton-cache $CACHE --out "$OUT/warm_start_h200.json" ${COMMIT:+--commit "$COMMIT"} > "$OUT/warm_start.log" 2>&1
echo "warm_start: exit $?"
wait
tail -5 "$OUT"/first_seed_profile_*.log "$OUT/warm_start.log"
