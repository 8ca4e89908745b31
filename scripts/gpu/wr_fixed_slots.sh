#!/usr/bin/env bash
# H200: one call of Table 8 (App. F.1, the fixed-slot suffix-refresh cost) on Kimi-Linear-48B-A3B at its full size,
# dummy weights made at load time from tests/data/kimi-linear-48b-a3b.config.json, 899 slots for every arm,
# resumable: per W of WMAX (default 64,128,512,1024,16: W=16's pool, 15.1 GB, is the only tight one, so it runs
# last), dasc-nr through the seeds that lack a pair, then dasc-wr through the same seeds (a pair is one call's);
# nothing starts that the estimate says cannot end before the call's deadline, and the cells and the newly
# compiled kernels come back in $OUT. KV is sized by --memory-limit-bytes device (clients/fixed_slots.py): the
# device less the measured 21.27 GiB headroom beside the engine's count, which holds the largest step's tensors
# (model/workspace.py); batch 32 (the 32 clients of the closed loop all run): every conversation's longest prompt
# fits beside W=16's pool, 72,616 KV blocks (49,416 with OPENING=uniform; plan-only, the H200's 150,109,880,320 B,
# room for 231,642). If W=16's server dies of memory, start a new measurement with
# a larger HEADROOM (another manifest: the cells dir names it).
# OPENING (default lognormal: openings fitted to Table 8's replay tokens per hit, clients/multiturn.py) or
# OPENING=uniform (the first shape, 1,500-2,500-token openings): its cells dir ends in _uniform, and the
# manifest's workload record tells the two shapes apart, so their cells never mix.
# Repeat the call (same COMMIT, MAX_BATCH, HEADROOM: the default CELLS names them) until no pair is left; here
# (CPU, no flags to repeat) `python -m benchmarks serve_wr_fixed_slots --merge $CELLS --out /tmp/t8.json` prints
# the table so far and "pairs left: N; W=... seeds".
#
# Wheels and the call sequence: as scripts/gpu/matched_cells.sh's header (call A, first_call.sh, installs the packed
# nvidia-pytriton; call B carries [".whl_c", ".kernel_cache"] and runs
#   rm -rf .whl && cp -r .whl_c .whl && COMMIT=<sha> bash scripts/gpu/wr_fixed_slots.sh
# later calls on the same warm machine carry nothing and run `COMMIT=<sha> bash scripts/gpu/wr_fixed_slots.sh`).
# With no .kernel_cache/*.tgz carried the servers compile for ~4 minutes: that call spends itself compiling (its
# first nr server starts, the measured start then gates the seeds, and its kernels come back). READY_EST=<s> sets
# the start assumed until one is measured; no cold default: 300 s for each of a W's two servers was 735 s owed
# against a deadline of at most 540, so a cold call started nothing, compiled nothing, and was wasted.
# Bring back after each call: tar xzf $files_at/cells.tgz -C $CELLS (the name the call printed) and commit it;
# cat $files_at/wr_fixed_kernels.tgz.part-* > .kernel_cache/wr_fixed_<n>.tgz (the kernels this call compiled);
# the result JSON wr_fixed_slots_kimi48_full.json holds every W whose five pairs are done. The device's .git may
# be stale: COMMIT names the real commit (one for all calls of a cells directory).
set -uo pipefail
CALL_LIMIT=${CALL_LIMIT:-600}
SHAPED_MODEL=0
source scripts/gpu/prelude.sh
check_serve || exit 3
MAX_BATCH=${MAX_BATCH:-32}
HEADROOM=${HEADROOM:-21.27}
OPENING=${OPENING:-lognormal}
# the settings that make a different manifest are in the name (the merge refuses mixed commits: the commit too).
# Tracked (benchmarks/cells/): the tree carries them to every call and a later session resumes them
CELLS=${CELLS:-benchmarks/cells/wr_fixed_kimi48_full_b${MAX_BATCH}_hr${HEADROOM}_c${COMMIT:-HEAD}$([ "$OPENING" = lognormal ] || echo "_$OPENING")}
cells_work "$CELLS"            # sets WORK (prelude.sh)
touch /tmp/wr_fixed.marker
# what is left of the call after the prelude, less the time to stop the last server and pack the results
DEADLINE=$((CALL_LIMIT - ${MARGIN:-60} - SECONDS))
echo "wr_fixed_slots: deadline ${DEADLINE} s, W order ${WMAX:-64,128,512,1024,16}, cells in $CELLS"
timeout $((DEADLINE + 40)) python3 -m benchmarks serve_wr_fixed_slots \
  --model tests/data/kimi-linear-48b-a3b.config.json --load-format dummy --seed 0 \
  --memory-limit-bytes device --memory-headroom-gib "$HEADROOM" --max-batch-size "$MAX_BATCH" \
  --opening-shape "$OPENING" \
  --wmax "${WMAX:-64,128,512,1024,16}" --cells-dir "$WORK" --call-deadline-s "$DEADLINE" \
  ${READY_EST:+--ready-estimate-s "$READY_EST"} --work /tmp/wr_fixed --kernel-cache "$CACHE" \
  --out "$OUT/wr_fixed_slots_kimi48_full.json" ${COMMIT:+--commit "$COMMIT"} "$@"
rc=$?
return_cells wr_fixed /tmp/wr_fixed/servers /tmp/wr_fixed.marker
exit $rc
