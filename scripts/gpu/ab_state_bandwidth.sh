#!/usr/bin/env bash
# H200: the store / load bandwidth of two commits in one call on one machine (a kernel change against the code
# before it), order ABBA so drift cancels: base, head, head, base. The base tree travels ignored, prepared here:
#   rm -rf .ab_base && mkdir .ab_base && git archive BASE trtllm_dasc benchmarks tests/data | tar x -C .ab_base \
#     --exclude=benchmarks/results --exclude=benchmarks/cells --exclude=benchmarks/quality_models
#   rm -rf .ab_base/trtllm_dasc/assets            # ~2 MB left; carry [".ab_base"]
# then, at a clean HEAD:
#   BASE=<sha> HEAD_SHA=<sha> bash scripts/gpu/ab_state_bandwidth.sh --codecs int8,int4,mixed --conv-codec int8
# Each run writes $OUT/{base,head}_{1,2}.json (benchmarks/state_bandwidth.py --quick plus the flags given);
# `python -m benchmarks ab_state_bandwidth DIR --out RESULT.json` joins them here.
set -u
[ -d .ab_base/trtllm_dasc ] || { echo "ab_state_bandwidth: no .ab_base tree (the header says how to make it)"; exit 2; }
: "${BASE:?set BASE (the base tree's commit)}" "${HEAD_SHA:?set HEAD_SHA (this tree's commit)}"
run() {  # tree commit out [flags]
  local tree=$1 commit=$2 out=$3; shift 3
  echo "== $(basename "$out" .json) ($commit)"
  (cd "$tree" && PYTHONPATH=$PWD timeout "${RUN_S:-85}" python3 -m benchmarks state_bandwidth --quick "$@" \
     --commit "$commit" --out "$out" 2>&1 | grep -A12 "^per codec")
}
run "$PWD/.ab_base" "$BASE" "$OUT/base_1.json" "$@"
run "$PWD" "$HEAD_SHA" "$OUT/head_1.json" "$@"
run "$PWD" "$HEAD_SHA" "$OUT/head_2.json" "$@"
run "$PWD/.ab_base" "$BASE" "$OUT/base_2.json" "$@"
