#!/usr/bin/env bash
# nvidia-h200-x2, one device call per PARTS selection (keep each under the 600 s call limit): the speed issue's
# measurements, arms side by side in each run. PARTS (comma-separated; default all but attn):
#   GPU 0:  parity   the fused mixers' / decode kernels' / graphs' GPU tests against the torch reference
#           attn     benchmarks/attention_prefill.py: prefill attention kernels side by side (SDPA flash /
#                    efficient / cuDNN, fla's parallel_attn) on the stacks' attention shapes
#           prefill  benchmarks/model_prefill.py for ARCHS (default "kda gdn") with --compare-fla (fla's
#                    KimiDeltaAttention / GatedDeltaNet next to our mixer) and --compare-unfused
#           store    benchmarks/state_bandwidth.py (the planner's TP8 masks; store/load against copy bandwidth)
#           conv     benchmarks/conv_prefill.py (the prefill conv's kernel choices against a copy of its bytes)
#   GPU 1:  decode   benchmarks/decode_step.py --compare-eager (batch 1/8/32/64 against the weight-bandwidth
#                    bound; graphs / no graphs / per-sequence attention), kernel profiles of PROFILE batches
#           wr       benchmarks/wr_hit_cost.py (dasc-wr minus dasc-nr per hit in a batched replay, W=16)
# On one GPU (nvidia-h200) the two halves run one after the other, never side by side (they time the GPU).
# PARTS0 / PARTS1 move parts between the GPUs (see below); STORE_ARGS go to state_bandwidth.py (--sweep),
# PREFILL_ARGS to model_prefill.py (--profile, --tokens ...), COMPARE replaces its default "--compare-fla
# --compare-unfused" (COMPARE= : our forward alone), DECODE_ARGS go to decode_step.py (--batches 1).
# Limits: PARITY_LIMIT (330), PREFILL_LIMIT (190 per arch), STORE_LIMIT (150), DECODE_LIMIT (240), WR_LIMIT
# (220) seconds.
# Carry as .whl: ../shared/tools/gpu-wheels .whl kernels flash-linear-attention==0.6.0 einops transformers==5.24.0
#   huggingface-hub tokenizers httpx2 httpcore2 hf-xet anyio idna truststore h11 click typing-extensions
# (fla's layers need transformers >= 5.6; hub 2.x needs httpx2), and .kernel_cache_speed when present.
# COMMIT=<hash>. Writes $OUT/model_prefill_{kda,gdn}.json, attention_prefill.json, state_bandwidth.json,
# decode_step.json, wr_hit_cost.json, speed.log (GPU 0's log, then GPU 1's), speed_kernels.tgz.part-* (join them into
# .kernel_cache_speed/NAME.tgz for the next call: on a bare machine fla's autotuning of the big shapes took
# most of a 160 s run). With that cache the carry passes 64 MiB: send .whl first with INSTALL_ONLY=1, then
# .kernel_cache_speed in a second call under 30 s later.
set -uo pipefail
PARTS=${PARTS:-parity,prefill,store,decode,wr}
# which GPU runs what: GPU 0 the parity / attn / prefill / store parts, GPU 1 decode / wr, unless PARTS0 and
# PARTS1 say otherwise (e.g. PARTS0=parity PARTS1=prefill,store: the tests beside the benchmarks)
pick() { local out= p; for p in ${PARTS//,/ }; do [[ ",$1," == *",$p,"* ]] && out+="$p,"; done; echo "$out"; }
PARTS0=${PARTS0-$(pick parity,attn,conv,prefill,store)}
PARTS1=${PARTS1-$(pick decode,wr)}
[[ "$PARTS0,$PARTS1" == *decode* || "$PARTS0,$PARTS1" == *wr* ]] || SHAPED_MODEL=0   # only decode / wr read it
source scripts/gpu/prelude.sh
C=${COMMIT:+--commit $COMMIT}
sleep 1; touch /tmp/kernels_before_speed    # the kernels this call compiles go back as speed_kernels.tgz.part-*
run_parts() {   # run_parts PARTS GPU
  local parts=$1
  export CUDA_VISIBLE_DEVICES=$(($2 % GPUS))
  if [[ $parts == *parity* ]]; then       # the fused mixers against the torch reference first: a wrong kernel
    # -v: one line per test as it ends, so a run cut by the limit still names what passed and failed
    # few CPU threads: its torch references must not slow a benchmark timing the host on the other GPU
    OMP_NUM_THREADS=${PARITY_THREADS:-4} timeout ${PARITY_LIMIT:-330} python3 -m pytest -v --tb=short -p no:cacheprovider tests/model/test_fused_ops.py tests/model/test_conv_kernel.py tests/model/test_swiglu_kernel.py tests/model/test_mla_long_prefill.py tests/model/test_gemv_kernel.py tests/state/test_state_kernels.py \
      tests/model/test_decode_attention.py tests/model/test_attention_gpu.py \
      tests/model/test_decode_graphs.py tests/engine/test_decode_graphs_engine.py \
      "tests/model/test_fla_gpu.py::test_model_fla_matches_torch_backend" \
      "tests/model/test_fla_gpu.py::test_boundary_states_match_reference" > /tmp/parity.log 2>&1
    # the -v lines ("tests/...::name PASSED [ 5%]"), not the end summary (which a cut run never prints)
    echo "parity: $(grep -cE '^tests/.* PASSED' /tmp/parity.log) passed," \
      "$(grep -cE '^tests/.* (FAILED|ERROR)' /tmp/parity.log) failed or errored"
    grep -E "^tests/.* (FAILED|ERROR)" /tmp/parity.log | tail -30
    # what each failure said (its short traceback: the assertion and the numbers), which a line summary lost
    sed -n '/= FAILURES =/,/short test summary/p' /tmp/parity.log | grep -v "^\s*$" | tail -120
  fi
  [[ $parts == *conv* ]] && timeout 120 python3 -m benchmarks conv_prefill --out "$OUT/conv_prefill.json" $C
  [[ $parts == *attn* ]] && timeout 120 python3 -m benchmarks attention_prefill --out "$OUT/attention_prefill.json" $C
  if [[ $parts == *prefill* ]]; then
    for arch in ${ARCHS:-kda gdn}; do
      timeout ${PREFILL_LIMIT:-190} python3 -m benchmarks model_prefill --arch $arch ${COMPARE---compare-fla --compare-unfused} \
        ${PREFILL_ARGS:-} --out "$OUT/model_prefill_$arch.json" $C
    done
  fi
  [[ $parts == *store* ]] && timeout ${STORE_LIMIT:-150} python3 -m benchmarks state_bandwidth ${STORE_ARGS:-} $C
  [[ $parts == *decode* ]] && timeout ${DECODE_LIMIT:-240} python3 -m benchmarks decode_step --model /tmp/kimi48 \
    --compare-eager ${PROFILE:+--profile $PROFILE} ${DECODE_ARGS:-} --out "$OUT/decode_step.json" $C
  [[ $parts == *wr* ]] && timeout ${WR_LIMIT:-220} python3 -m benchmarks wr_hit_cost --model /tmp/kimi48 \
    --out "$OUT/wr_hit_cost.json" $C
}
if [ "$GPUS" -lt 2 ] && [ -n "$PARTS0" ] && [ -n "$PARTS1" ]; then
  echo "one GPU: both halves in sequence may pass the 600 s call limit; split PARTS over calls"
fi
if [ "$GPUS" -ge 2 ]; then
  [ -n "$PARTS0" ] && run_parts "$PARTS0" 0 > "$OUT/speed_gpu0.log" 2>&1 &
  [ -n "$PARTS1" ] && run_parts "$PARTS1" 1 > "$OUT/speed_gpu1.log" 2>&1 &
  wait
else
  [ -n "$PARTS0" ] && run_parts "$PARTS0" 0 > "$OUT/speed_gpu0.log" 2>&1
  [ -n "$PARTS1" ] && run_parts "$PARTS1" 1 > "$OUT/speed_gpu1.log" 2>&1
fi
return_new_kernels speed_kernels kernels /tmp/kernels_before_speed
# one log comes back whole (a call returns at most 8 files); here its last lines
cat "$OUT"/speed_gpu*.log > "$OUT/speed.log" 2>/dev/null; rm -f "$OUT"/speed_gpu*.log
grep -v "autotun\|it/s\]" "$OUT/speed.log" | tail -80
