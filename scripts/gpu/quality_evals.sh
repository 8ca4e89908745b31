#!/usr/bin/env bash
# nvidia-h200-x2 (or nvidia-h200: both models on its one GPU), one device call (about EVAL_LIMIT + 1 minute):
# the quality protocol (python -m trtllm_dasc.evals.run, the paper's 37 arms) on the two trained models side by
# side, KDA on GPU 0 and GDN on GPU 1, each split over PROCS processes (--shard i/PROCS: the tiny models leave the GPU idle, the engine's
# step loop is CPU-bound), then each model's shards merged (--merge) into one result with the statistics.
# Carry .whl with fla-core (and the numpy 2.x wheel when an earlier call of the session installed numpy 1.26);
# .kernel_cache when present (the engine's compiled kernels, kernels/ in h200_kernels_*.tgz and the parts this
# script returns: otherwise 16 processes compile the same kernels at once). Pass COMMIT=<hash>.
# MODELS (default benchmarks/quality_models) holds kda/ and gdn/; INSTANCES (20), LENGTHS (1024,2048,4096),
# TASKS (comma-separated, default all 13), PROCS (8), EVAL_LIMIT (seconds, 450): a shard cut by the limit keeps the arms it finished.
# ARMS (default paper: the 37 arms) names the arms to run, e.g. the ones a cut call left out; merge the result with
# the earlier one: python -m trtllm_dasc.evals.run --merge earlier.json new.json --out joined.json
# WARM (1): compile the kernels in one process a model before the shards start (below: why), within WARM_LIMIT
# (300 s) or half of EVAL_LIMIT, whichever is less; under 30 s left for the shards, none starts (exit 4).
# PAPER=1: the paper's RULER protocol (evals.run --paper: 13 subtasks x 30 instances x 4k,8k, 3 replay rounds,
# dense / nr / wr at 16-512, INT8 at 16, five random masks at every W; INSTANCES / LENGTHS / ARMS / TASKS still
# override it), then the horizon validation of both models ($OUT/horizon_validation_{kda,gdn}.json, HV_LIMIT
# seconds, 300) and the paper-style tables of both models with Table 1b in $OUT/quality_tables.md
# (evals.paper_tables --horizons).
# Writes $OUT/quality_{kda,gdn}.json and .png, $OUT/evals.log, $OUT/eval_kernels.tgz.part-* (compiled kernels).
set -uo pipefail
SHAPED_MODEL=0 source scripts/gpu/prelude.sh          # wheels, PYTHONPATH, both kernel caches in $CACHE
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
MODELS=${MODELS:-benchmarks/quality_models}
for arch in kda gdn; do
  [ -f $MODELS/$arch/config.json ] || { echo "no model at $MODELS/$arch (MODELS=...)"; exit 2; }
done
# a warm machine keeps /tmp: never merge an earlier call's shards
EV=${EV_DIR:-/tmp/ev}      # the shards' results and logs (a test points it elsewhere)
rm -rf "$EV" "${EV}_warm"
mkdir -p "$EV"
sleep 1; touch /tmp/kernels_before_evals   # only kernels compiled by this call go back
P=${PROCS:-8}
# a machine without the engine's compiled kernels: 16 processes compiling and autotuning the same kernels at once
# took KDA's first step 316 s on 12-05 (an H100, no .kernel_cache carried), and EVAL_LIMIT cut every KDA shard
# before its first arm ended (a second call, kernels compiled, ran the whole KDA half in 21 s). So one process a
# model first runs two instances through an arm of each codec (native, INT8, the horizon bands with the 8-bit conv
# state), filling $CACHE for the shards; its seconds come out of EVAL_LIMIT. WARM=0 skips it (a warm cache).
# It runs as many instances as the shards do: the engine's pools, so its batches, so the token counts that key
# the autotuned kernels (fla's layer norm) follow the instance count. With 2 instances (until 12-06) the shards'
# first step (14 prompts of 4096 tokens) autotuned again in 16 processes at once, and 5 of 8 GDN shards died of
# CUDA out of memory inside the autotuner's benchmark on an H100
if [ "${WARM:-1}" = 1 ]; then
  started=$SECONDS
  warm_instances=${INSTANCES:-$([ "${PAPER:-0}" = 1 ] && echo 30 || echo 20)}
  # the warm-up never takes more than half the limit: the shards keep the rest
  warm_limit=$(( ${WARM_LIMIT:-300} < ${EVAL_LIMIT:-450} / 2 ? ${WARM_LIMIT:-300} : ${EVAL_LIMIT:-450} / 2 ))
  mkdir -p ${EV}_warm
  for g in 0 1; do
    arch=$([ $g = 0 ] && echo kda || echo gdn)
    CUDA_VISIBLE_DEVICES=$((g % GPUS)) timeout "$warm_limit" python3 -m trtllm_dasc.evals.run \
      --model $MODELS/$arch --arms dense,nr16+int8,nr16+horizon+conv-int8 --tasks niah_single_1 --instances "$warm_instances" \
      --lengths "${LENGTHS:-1024,2048,4096}" --device cuda --dtype bfloat16 --out ${EV}_warm/$arch.json \
      > ${EV}_warm/$arch.log 2>&1 &
  done
  wait
  echo "quality_evals: kernels warmed in $((SECONDS - started)) s"
  EVAL_LIMIT=$(( ${EVAL_LIMIT:-450} - (SECONDS - started) ))
fi
# `timeout 0` would mean no limit at all, and a negative one runs nothing: refuse a limit the shards cannot use
if [ "${EVAL_LIMIT:-450}" -lt 30 ]; then
  echo "quality_evals: ${EVAL_LIMIT} s left for the shards: not starting them (raise EVAL_LIMIT)"; exit 4
fi
for g in 0 1; do
  arch=$([ $g = 0 ] && echo kda || echo gdn)
  for i in $(seq 0 $((P - 1))); do
    if [ "${PAPER:-0}" = 1 ]; then
      preset=(--paper ${ARMS:+--arms "$ARMS"} ${INSTANCES:+--instances "$INSTANCES"} ${LENGTHS:+--lengths "$LENGTHS"})
    else
      preset=(--arms "${ARMS:-paper}" --instances "${INSTANCES:-20}" --lengths "${LENGTHS:-1024,2048,4096}")
    fi
    CUDA_VISIBLE_DEVICES=$((g % GPUS)) timeout "${EVAL_LIMIT:-450}" python3 -m trtllm_dasc.evals.run --model $MODELS/$arch \
      "${preset[@]}" --shard $i/$P ${TASKS:+--tasks "$TASKS"} \
      --device cuda --dtype bfloat16 --out $EV/${arch}_$i.json ${COMMIT:+--commit "$COMMIT"} \
      > $EV/${arch}_$i.log 2>&1 &
  done
done
wait
# the engine's kernels this call compiled (its first arm spent 210 s compiling on a machine with an older
# cache): join the parts into .kernel_cache/NAME.tgz for the next call
return_new_kernels eval_kernels kernels /tmp/kernels_before_evals
for arch in kda gdn; do
  grep -h "\[evals\]" $EV/${arch}_*.log | sed "s/^/$arch /" >> "$OUT/evals.log"
  python3 -m trtllm_dasc.evals.run --merge $(ls $EV/${arch}_*.json) --out "$OUT/quality_$arch.json" \
    --plot "$OUT/quality_$arch.png" 2>&1 | tee -a "$OUT/evals.log"
done
if [ "${PAPER:-0}" = 1 ]; then
  # Table 1b: the horizon validation of both models (evals.horizon_validation, the torch reference on the CPU,
  # side by side, HV_LIMIT seconds each, half the cores each: not the shards' 2 threads), passed to paper_tables
  # as --horizons (docs/quality.md's commands); a validation cut by the limit leaves its model's Table 1b out
  for arch in kda gdn; do
    OMP_NUM_THREADS=$(( ($(nproc) + 1) / 2 )) timeout "${HV_LIMIT:-300}" \
      python3 -m trtllm_dasc.evals.horizon_validation --model $MODELS/$arch \
      --out "$OUT/horizon_validation_$arch.json" ${COMMIT:+--commit "$COMMIT"} > $EV/hv_$arch.log 2>&1 &
  done
  wait
  hv=()
  for arch in kda gdn; do
    sed "s/^/$arch hv /" $EV/hv_$arch.log >> "$OUT/evals.log"
    [ -s "$OUT/horizon_validation_$arch.json" ] && hv+=("$arch=$OUT/horizon_validation_$arch.json")
  done
  horizons=$(IFS=,; echo "${hv[*]:-}")
  python3 -m trtllm_dasc.evals.paper_tables "$OUT/quality_kda.json" "$OUT/quality_gdn.json" \
    ${horizons:+--horizons "$horizons"} --out "$OUT/quality_tables.md" --json "$OUT/quality_tables.json" 2>&1 |
    tee -a "$OUT/evals.log"
fi
