#!/usr/bin/env bash
# H200: one call of the paper's matched-HBM matrix (App. C.2) on Kimi-Linear-48B-A3B at its full size, dummy
# weights made at load time from tests/data/kimi-linear-48b-a3b.config.json (nothing of their 96 GB is written),
# resumable: dense + the arm in CALL_ARMS run the cells not yet done in the carried cells directory $CELLS, a unit
# is started only when it and the arm's cells of it fit before the call's deadline, and the cells and the newly
# compiled kernels come back in $OUT. --paper checkpoints prompt ends only (BRANCH=1: the engine's branch points
# too); the KV cache is sized by --memory-limit-bytes device (the device less a
# 21.27 GiB headroom beside the engine's count, clients/kv_sizing.py; HEADROOM=<GiB> to change it). Repeat the call (same COMMIT, BLOCKS,
# BRANCH, HEADROOM: the default CELLS names them) until the plan says done:
#   python -m clients.matched_hbm ...the same flags... --cells-dir $CELLS --memory-limit-bytes N --plan-only
#
# Wheels: no package index on the device, and nvidia-pytriton's wheel (55 MB) with the carried tree (~30 MB) is
# more than one call's 64 MiB; packed as an xz tar of its files (scripts/gpu/pack_wheel.sh, 34 MB) it fits, so a
# fresh machine is staged in two calls, the second already a cells call, within ~30 s of each other while the
# machine is warm (.gitignore has /.whl_*/). Prepare them here once:
#   ../shared/tools/gpu-wheels /tmp/w serve numpy==1.26.4        # numpy 1.x: the Triton Python stub dies with 2
#   bash scripts/gpu/pack_wheel.sh /tmp/w/nvidia_pytriton-0.7.0-*.whl .whl_a   # .whl_a: only this file
#   mkdir -p .whl .whl_c && cp /tmp/w/fla_core-*.whl .whl/
#   mv /tmp/w/fla_core-*.whl /tmp/w/tritonclient-*.whl /tmp/w/python_rapidjson-*.whl /tmp/w/numpy-1.26.4-*.whl .whl_c/
#   call A  carry [".whl_a", ".whl"]  (tree + 34 + 1 MB of 67 MB: with a tree past ~32 MB only [".whl_a"] fits,
#           and the fla tests, which need .whl, wait for a later call)
#           run:   bash scripts/gpu/first_call.sh   (installs nvidia-pytriton, then the GPU tests before numpy 1.26)
#   once the tree is past ~33 MB the packed wheel goes in two parts, one a call (pack_wheel.sh with two folders;
#   or split the packed file itself: split -n 2 -d -a 3 F p- -> .whl_p1/F.part-1-of-2, .whl_p2/F.part-2-of-2):
#   call A0 carry [".whl_p1"] run INSTALL_ONLY=1 bash scripts/gpu/first_call.sh, then call A carry [".whl_p2",
#   ".whl"] run bash scripts/gpu/first_call.sh (the prelude installs the wheel when the second part comes)
#   two calls instead of three (the tree at ~35 MB, 12-05): a big first part and a small second, which travels with
#   .whl_c in the first cells call (FIRST_PART_BYTES = 64 MiB less the tree's bytes less ~1 MB of growth):
#     T=$(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
#     FIRST_PART_BYTES=$((64 * 1048576 - T - 1000000)) bash scripts/gpu/pack_wheel.sh /tmp/w/nvidia_pytriton-*.whl .whl_q1 .whl_q2
#   call A0 carry [".whl_q1"] run INSTALL_ONLY=1 bash scripts/gpu/first_call.sh; then, within 30 s, call B carry
#   [".whl_q2", ".whl_c"] (".kernel_cache" too where it fits) and run its usual command: the cells script's prelude
#   joins the parts and installs nvidia-pytriton before it checks the serving wheels
#   call B  carry [".whl_c", ".kernel_cache"]
#           run:   rm -rf .whl && cp -r .whl_c .whl && COMMIT=<sha> CALL_ARMS=nr16 BLOCKS=1 bash scripts/gpu/matched_cells.sh
#   later calls on the same warm machine (within 30 s of the last: keep the replies short) carry nothing and
#   run the script alone (the wheels and the cells stay there; a fresh machine starts again at call A).
# A session with more device time than one call can run the cells as one job over several calls instead
# (scripts/gpu/cells_background.sh: one server start per arm, units longer than a call):
#   call B: rm -rf .whl && cp -r .whl_c .whl && BG_LIMIT=<s> COMMIT=<sha> CALL_ARMS=nr16 BLOCKS=1 \
#           bash scripts/gpu/cells_background.sh start scripts/gpu/matched_cells.sh 540
#   then:   bash scripts/gpu/cells_background.sh poll 540     (each within 30 s of the last reply)
# One commit a cells directory: the merge refuses cells of mixed commits, and COMMIT must name the code that ran.
# A later session resumes a directory from its commit: in the lead's checkout
#   git checkout --detach $COMMIT && git checkout main -- $CELLS && git reset -q   (the cells, untracked, travel)
# run the calls and bring the cells back there; then copy $CELLS aside, `git checkout main`, copy it back and
# commit it on main. Code may change on main meanwhile: the cells measure $COMMIT's code.
# Bring back after each call: tar xzf $files_at/cells.tgz -C $CELLS (the name the call printed) and commit it
# (cells_background.sh's polls return cells_all.tgz instead, rooted one level up: tar xzf ... -C benchmarks/cells);
# cat $files_at/matched_kernels.tgz.part-* > .kernel_cache/matched_<n>.tgz (the kernels this call compiled,
# ~1 MB: keep the files in the lead's checkout so the next session's first call carries them; with them a
# 48B server was ready in 31-35 s instead of 224 s); and add the autotune records in them to the shipped ones
# (unpack the .tgz, then python -m trtllm_dasc.engine.kernel_cache collect DIR/kernels, and commit
# trtllm_dasc/assets/autotune/ with its README's table). The device's .git may be stale: COMMIT names the real
# commit (one for all calls of a cells directory).
set -uo pipefail
CALL_LIMIT=${CALL_LIMIT:-600}
SHAPED_MODEL=0
source scripts/gpu/prelude.sh
check_serve || exit 3
# the settings that make a different manifest are in the name: the block subset, the checkpoints, the headroom
# the commit too: the merge refuses cells of mixed commits. Tracked (benchmarks/cells/): the tree carries them
# to every call and a later session resumes them (ignored files do not outlive a session's checkout)
# MODEL=kimi48 (default: Kimi-Linear-48B-A3B, one H200) or qwen80 (Qwen3-Next-80B-A3B at TP2: kind
# nvidia-h200-x2, the run's placement off and the other two placements at W=16 as arms of their own;
# its 21.27 GiB headroom is Kimi's TP1 measurement, not yet checked at TP2)
MODEL=${MODEL:-kimi48}
# ARM_SET=paper (default): the paper's eight arms; ARM_SET=precision: issue 35's serving arms, the 13.09x point
# (bare +horizon, dasc-build's default bands, with the 8-bit conv state: 1,663 slots against dense's 127 at the
# H200's memory; 12.35x / 1,568 with the first decay profile) beside dense, nr16 and nr16+int8, in a cells
# directory of its own (_precision in its name: another arm list is another manifest). The phases are the paper's.
# FULL_SAMPLE=<N> (>= 2 x the most slots of any arm + 96: 7,272 for the paper set, 3,422 for the precision set at
# the H200's memory; 2,844 / 3,232 with the first decay profile): the full-dataset phase within a session (its whole fill and replay take a 48B server ~25
# minutes an arm): fill only the last N prompts of its fill order and replay the first N of the seeded shuffle
# (clients/protocol.ProtocolConfig: what the tail leaves is what the whole fill leaves; the replay a uniform
# sample, weighted as the whole). Another manifest: _fs<N> in the directory's name.
# FULL_FILL=auto (with FULL_SAMPLE): each arm fills its own tail, 2 x its slots + 96, and replays the first
# FULL_SAMPLE: with the decay profile fitted to the paper's capacities (12-07) nr512 holds ~3,590 checkpoints, so
# one N for every arm would be >= 7,272 and dense would fill 7,272 prompts where 350 leave what the whole fill
# leaves. Another manifest: _ff<FULL_FILL> in the directory's name.
case "${ARM_SET:-paper}" in
  paper) ARMS=dense,nr16,nr64,nr128,nr512,wr16,wr64,nr16+int8; SET_TAG= ;;
  precision) ARMS=dense,nr16,nr16+int8,nr16+horizon+conv-int8; SET_TAG=_precision ;;
  *) echo "ARM_SET must be paper or precision, got $ARM_SET"; exit 2 ;;
esac
case "$MODEL" in
  kimi48) CONFIG=tests/data/kimi-linear-48b-a3b.config.json; TP=${TP:-1}; TAG=kimi48 ;;
  qwen80) CONFIG=tests/data/qwen3-next-80b-a3b.config.json; TP=${TP:-2}; TAG=qwen80_tp${TP}
          ARMS=$ARMS,nr16:storage,nr16:hybrid ;;
  *) echo "MODEL must be kimi48 or qwen80, got $MODEL"; exit 2 ;;
esac
[ "$GPUS" -ge "$TP" ] || { echo "TP $TP needs $TP GPUs, this machine has $GPUS (qwen80: kind nvidia-h200-x2)"; exit 5; }
# STEP_DELAY_MS=<ms> / STEP_SLOWDOWN=<x>: the engine-speed ablation (issue 33: a missed target, the engine's speed or
# the workload's scale?): every arm's engine held that much more a step (clients.matched_hbm --step-delay-ms /
# --step-slowdown); another manifest, so _delay<ms> / _slow<x> in the directory's name
if [ -n "${FULL_FILL:-}" ] && [ -z "${FULL_SAMPLE:-}" ]; then
  echo "FULL_FILL=$FULL_FILL needs FULL_SAMPLE (the replay sample): without it the phase runs whole"; exit 2
fi
CELLS=${CELLS:-benchmarks/cells/mh_${TAG}${SET_TAG}_full_b${BLOCKS:-all}${FULL_SAMPLE:+_fs$FULL_SAMPLE}${FULL_FILL:+_ff$FULL_FILL}${STEP_DELAY_MS:+_delay$STEP_DELAY_MS}${STEP_SLOWDOWN:+_slow$STEP_SLOWDOWN}_$([ "${BRANCH:-0}" = 1 ] && echo branch || echo prompt_only)_hr${HEADROOM:-21.27}_c${COMMIT:-HEAD}}
cells_work "$CELLS"            # sets WORK (prelude.sh)
touch /tmp/matched_cells.marker
# what is left of the call after the prelude, less the time to stop the last server and pack the results
DEADLINE=$((CALL_LIMIT - ${MARGIN:-60} - SECONDS))
echo "matched_cells: deadline ${DEADLINE} s for dense + ${CALL_ARMS:-nr16}, cells in $CELLS"
timeout $((DEADLINE + 40)) python3 -m clients.matched_hbm --paper \
  --model "$CONFIG" --load-format dummy --seed 0 --tp "$TP" \
  --arms "$ARMS" --call-arms "${CALL_ARMS:-nr16}" \
  --device cuda --dtype bfloat16 --max-batch-size 96 --memory-limit-bytes device \
  ${BLOCKS:+--blocks-per-phase "$BLOCKS"} ${HEADROOM:+--memory-headroom-gib "$HEADROOM"} \
  ${FULL_SAMPLE:+--full-fill-last "${FULL_FILL:-$FULL_SAMPLE}" --full-replay-first "$FULL_SAMPLE"} \
  ${STEP_DELAY_MS:+--step-delay-ms "$STEP_DELAY_MS"} ${STEP_SLOWDOWN:+--step-slowdown "$STEP_SLOWDOWN"} \
  $([ "${BRANCH:-0}" = 1 ] && echo --branch-checkpoints) --cells-dir "$WORK" --call-deadline-s "$DEADLINE" \
  --out /tmp/matched_cells --kernel-cache "$CACHE" --json "$OUT/matched_hbm_${TAG}${SET_TAG}_full.json" --plot none \
  ${COMMIT:+--commit "$COMMIT"} "$@"
rc=$?
return_cells matched /tmp/matched_cells/servers /tmp/matched_cells.marker
exit $rc
