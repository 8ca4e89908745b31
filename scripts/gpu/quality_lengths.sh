#!/usr/bin/env bash
# The quality protocol one length at a time: quality_evals.sh once per length of LENGTH_LIST (default "4096 8192"),
# each into $OUT/<length>/ with its shards under $CELLS_ROOT/<length> (default /tmp/evq). Why per length: a shard writes its JSON after
# each whole arm, so an arm cut by the limit is lost; run per length, every arm of the first length can end
# before the longer prompts begin, and a time limit costs the last length's arms, not arms of every length.
# Meant to run detached over several calls (the protocol takes longer than one 10-minute call):
#   BG_LIMIT=<s> CELLS_ROOT=/tmp/evq MODELS=/tmp/qm PAPER=1 ARMS=... COMMIT=<sha> \
#     bash scripts/gpu/cells_background.sh start scripts/gpu/quality_lengths.sh 540
#   CELLS_ROOT=/tmp/evq bash scripts/gpu/cells_background.sh poll 540    (each poll brings back every finished arm)
# CALL_LIMIT (seconds, set from BG_LIMIT by cells_background.sh; default 1200) is the whole job's; a length gets
# FIRST_SHARE percent (default 60) of what is left when it starts, the last length all of it, less MARGIN_S (60:
# the merge and the tables after the shards end). Every other variable goes through to quality_evals.sh.
set -uo pipefail
LIMIT=${CALL_LIMIT:-1200}
MARGIN=${MARGIN_S:-60}
# commas or spaces, as LENGTHS takes them elsewhere
IFS=', ' read -r -a lens <<< "${LENGTH_LIST:-4096 8192}"
# Table 1b (the horizon validation) is the torch reference on a CPU: run it on the CPU after the call
# (docs/quality.md), not once per length here, where its 300 s would come out of the next length's time
export HV_LIMIT=${HV_LIMIT:-1}
root_ev=${CELLS_ROOT:-/tmp/evq}      # the shards' folders: what cells_background.sh's poll brings back
root=$OUT
started=$SECONDS
done_lengths=()
for k in "${!lens[@]}"; do
  len=${lens[$k]}
  left=$(( LIMIT - (SECONDS - started) - MARGIN ))
  share=$([ "$k" -lt $(( ${#lens[@]} - 1 )) ] && echo "${FIRST_SHARE:-60}" || echo 100)
  limit=$(( left * share / 100 ))
  if [ "$limit" -lt 60 ]; then echo "quality_lengths: ${limit} s left for $len tokens: stopping"; break; fi
  echo "quality_lengths: $len tokens, EVAL_LIMIT $limit s"
  mkdir -p "$root/$len"
  OUT=$root/$len EV_DIR=$root_ev/$len LENGTHS=$len EVAL_LIMIT=$limit bash scripts/gpu/quality_evals.sh
  done_lengths+=("$len")
done
echo "quality_lengths: ran ${done_lengths[*]:-no length} of ${lens[*]}"
[ "${#done_lengths[@]}" = "${#lens[@]}" ]      # non-zero when a length had no time left
