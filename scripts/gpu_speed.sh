#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~9 minutes with the shaped checkpoint's write; keep it under the 600 s limit): the speed issue's measurements, arms side by side in each run.
#   GPU 0: benchmarks/model_prefill.py --arch kda and --arch gdn with --compare-fla (our mixer per layer next
#          to fla's KimiDeltaAttention / GatedDeltaNet on the same tokens; tokens/s and % of the bf16 peak),
#          then benchmarks/state_bandwidth.py (the planner's TP8 masks; store/load against copy bandwidth)
#   GPU 1: benchmarks/decode_step.py (batch 1/8/32/64 against the weight-bandwidth bound), then
#          benchmarks/wr_hit_cost.py (dasc-wr minus dasc-nr per hit in a batched replay, W=16)
# Carry as .whl: ../shared/tools/gpu-wheels .whl kernels flash-linear-attention==0.6.0 einops transformers==5.24.0
#   huggingface-hub tokenizers httpx2 httpcore2 hf-xet anyio idna truststore h11 click typing-extensions
# (fla's layers need transformers >= 5.6; hub 2.x needs httpx2), and .kernel_cache when present. COMMIT=<hash>.
# On one GPU (nvidia-h200) the two halves run one after the other, never side by side (they time the GPU):
# PARTS=prefill (GPU 0's half) or PARTS=decode (GPU 1's half) keeps a call under the 600 s limit.
# Writes $OUT/model_prefill_{kda,gdn}.json, state_bandwidth.json, decode_step.json, wr_hit_cost.json, speed.log.
set -uo pipefail
PARTS=${PARTS:-prefill,decode}
[[ $PARTS == *decode* ]] || SHAPED_MODEL=0          # only the decode half reads the shaped checkpoint
source scripts/gpu_prelude.sh
C=${COMMIT:+--commit $COMMIT}
prefill_half() {
  export CUDA_VISIBLE_DEVICES=0
  for arch in kda gdn; do
    timeout 200 python3 benchmarks/model_prefill.py --arch $arch --compare-fla --out "$OUT/model_prefill_$arch.json" $C
  done
  timeout 150 python3 benchmarks/state_bandwidth.py $C
}
decode_half() {
  export CUDA_VISIBLE_DEVICES=$((1 % GPUS))
  timeout 200 python3 benchmarks/decode_step.py --model /tmp/kimi48 --out "$OUT/decode_step.json" $C
  timeout 260 python3 benchmarks/wr_hit_cost.py --model /tmp/kimi48 --out "$OUT/wr_hit_cost.json" $C
}
if [ "$GPUS" -lt 2 ] && [[ $PARTS == *prefill* && $PARTS == *decode* ]]; then
  echo "one GPU: both halves in sequence may pass the 600 s call limit; PARTS=prefill or PARTS=decode per call"
fi
if [ "$GPUS" -ge 2 ]; then
  [[ $PARTS == *prefill* ]] && prefill_half > "$OUT/speed_gpu0.log" 2>&1 &
  [[ $PARTS == *decode* ]] && decode_half > "$OUT/speed_gpu1.log" 2>&1 &
  wait
else
  [[ $PARTS == *prefill* ]] && prefill_half > "$OUT/speed_gpu0.log" 2>&1
  [[ $PARTS == *decode* ]] && decode_half > "$OUT/speed_gpu1.log" 2>&1
fi
cat "$OUT"/speed_gpu*.log | grep -v "autotun\|it/s\]" | tail -60 > "$OUT/speed.log"
cat "$OUT/speed.log"
