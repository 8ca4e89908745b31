#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~9 minutes with the shaped checkpoint's write; keep it under the 600 s limit): the speed issue's measurements, arms side by side in each run.
#   GPU 0: (PARTS has parity) the fused mixers' GPU tests against the torch reference, then
#          benchmarks/model_prefill.py --arch kda and --arch gdn with --compare-fla (our mixer per layer next
#          to fla's KimiDeltaAttention / GatedDeltaNet on the same tokens; tokens/s and % of the bf16 peak) and
#          --compare-unfused (the same model with the torch conv, gate and norm), then (PARTS has store)
#          benchmarks/state_bandwidth.py (the planner's TP8 masks; store/load against copy bandwidth)
#   GPU 1: benchmarks/decode_step.py --compare-eager (batch 1/8/32/64 against the weight-bandwidth bound; the
#          batched decode attention kernel and the per-sequence path side by side), then
#          benchmarks/wr_hit_cost.py (dasc-wr minus dasc-nr per hit in a batched replay, W=16)
# Carry as .whl: ../shared/tools/gpu-wheels .whl kernels flash-linear-attention==0.6.0 einops transformers==5.24.0
#   huggingface-hub tokenizers httpx2 httpcore2 hf-xet anyio idna truststore h11 click typing-extensions
# (fla's layers need transformers >= 5.6; hub 2.x needs httpx2), and .kernel_cache when present. COMMIT=<hash>.
# On one GPU (nvidia-h200) the two halves run one after the other, never side by side (they time the GPU):
# PARTS=prefill (GPU 0's half; add parity / store for the tests / the bandwidth run) or PARTS=decode (GPU 1's
# half) keeps a call under the 600 s limit. PARITY_LIMIT (130) and PREFILL_LIMIT (200) bound those runs.
# Writes $OUT/model_prefill_{kda,gdn}.json, state_bandwidth.json, decode_step.json, wr_hit_cost.json, speed.log,
# speed_kernels.tgz.part-* (join them into .kernel_cache_speed/NAME.tgz for the next call: on a bare machine
# fla's autotuning of the big shapes took most of a 160 s run). With that cache the carry passes 64 MiB: send
# .whl first with INSTALL_ONLY=1, then .kernel_cache_speed in a second call under 30 s later.
set -uo pipefail
PARTS=${PARTS:-parity,prefill,store,decode}
[[ $PARTS == *decode* ]] || SHAPED_MODEL=0          # only the decode half reads the shaped checkpoint
source scripts/gpu_prelude.sh
C=${COMMIT:+--commit $COMMIT}
sleep 1; touch /tmp/kernels_before_speed    # the kernels this call compiles go back as speed_kernels.tgz.part-*
prefill_half() {
  export CUDA_VISIBLE_DEVICES=0
  if [[ $PARTS == *parity* ]]; then       # the fused mixers against the torch reference first: a wrong kernel
    timeout ${PARITY_LIMIT:-130} python3 -m pytest -q -p no:cacheprovider tests/model/test_fused_ops.py tests/model/test_decode_attention.py \
      tests/model/test_decode_graphs.py tests/engine/test_decode_graphs_engine.py \
      "tests/model/test_fla_gpu.py::test_model_fla_matches_torch_backend" \
      "tests/model/test_fla_gpu.py::test_boundary_states_match_reference" 2>&1 | tail -15
  fi
  if [[ $PARTS == *prefill* ]]; then
    for arch in kda gdn; do
      timeout ${PREFILL_LIMIT:-200} python3 benchmarks/model_prefill.py --arch $arch --compare-fla --compare-unfused \
        --out "$OUT/model_prefill_$arch.json" $C
    done
  fi
  [[ $PARTS == *store* ]] && timeout 150 python3 benchmarks/state_bandwidth.py $C
}
decode_half() {
  export CUDA_VISIBLE_DEVICES=$((1 % GPUS))
  timeout 200 python3 benchmarks/decode_step.py --model /tmp/kimi48 --compare-eager --out "$OUT/decode_step.json" $C
  timeout 260 python3 benchmarks/wr_hit_cost.py --model /tmp/kimi48 --out "$OUT/wr_hit_cost.json" $C
}
if [ "$GPUS" -lt 2 ] && [[ $PARTS == *prefill* && $PARTS == *decode* ]]; then
  echo "one GPU: both halves in sequence may pass the 600 s call limit; PARTS=prefill or PARTS=decode per call"
fi
if [ "$GPUS" -ge 2 ]; then
  [[ $PARTS == *prefill* || $PARTS == *parity* || $PARTS == *store* ]] && prefill_half > "$OUT/speed_gpu0.log" 2>&1 &
  [[ $PARTS == *decode* ]] && decode_half > "$OUT/speed_gpu1.log" 2>&1 &
  wait
else
  [[ $PARTS == *prefill* || $PARTS == *parity* || $PARTS == *store* ]] && prefill_half > "$OUT/speed_gpu0.log" 2>&1
  [[ $PARTS == *decode* ]] && decode_half > "$OUT/speed_gpu1.log" 2>&1
fi
return_new_kernels speed_kernels kernels /tmp/kernels_before_speed
cat "$OUT"/speed_gpu*.log | grep -v "autotun\|it/s\]" | tail -60 > "$OUT/speed.log"
cat "$OUT/speed.log"
