#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~9 minutes): the matched-HBM serving benchmark of the five arms, split
# over the two GPUs so that it fits one call; each half has its own dense arm (ratios stay within a run)
# and both use the phases of all five arms (benchmarks/serve_matched_hbm.py), so they join with
#   python -m benchmarks merge_matched_hbm A.json B.json --out benchmarks/results/....json
#   GPU 0: dense, dasc-nr W=16, dasc-nr W=16 + INT8, and dasc-nr W=16 in-process (Triton's overhead)
#   GPU 1: dense, dasc-nr W=64, dasc-wr W=16
# First the GPU attention parity test (cuDNN kept out of SDPA; tests/model/test_attention_gpu.py).
# Further arguments go to both halves (e.g. --prompt-only --dense-slots 8).
# Carry the serving wheels as .whl (two calls: the first INSTALL_ONLY=1 with nvidia_pytriton alone) and
# .kernel_cache when present. Pass COMMIT=<hash>. Writes $OUT/serve_pair_{a,b}.json (+ .png, logs).
set -uo pipefail
source scripts/gpu/prelude.sh
python3 -m pytest -q -p no:cacheprovider tests/model/test_attention_gpu.py 2>&1 | tail -3 | tee "$OUT/test_attention_gpu_h200.log"
LIMIT=${SERVE_BENCH_LIMIT:-520}
CUDA_VISIBLE_DEVICES=0 timeout $LIMIT python3 -m benchmarks serve_matched_hbm --model /tmp/kimi48 --work /tmp/smh_a \
  --out "$OUT/serve_pair_a.json" ${COMMIT:+--commit "$COMMIT"} --kernel-cache $CACHE \
  --arms dense,nr16,nr16+int8 --inprocess nr16 "$@" > "$OUT/serve_pair_a.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout $LIMIT python3 -m benchmarks serve_matched_hbm --model /tmp/kimi48 --work /tmp/smh_b \
  --out "$OUT/serve_pair_b.json" ${COMMIT:+--commit "$COMMIT"} --kernel-cache $CACHE \
  --arms dense,nr64,wr16 --inprocess none "$@" > "$OUT/serve_pair_b.log" 2>&1 &
wait
for h in a b; do grep -v "^\s*$" "$OUT/serve_pair_$h.log" | grep -v "it/s\]" | tail -12; done
