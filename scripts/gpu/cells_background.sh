#!/usr/bin/env bash
# H200: a cells script (matched_cells.sh, wr_fixed_slots.sh) as a detached job that outlives the call which starts
# it. The device keeps a process that began its own session (setsid) running until the machine goes back, so one
# job can span several calls: a unit may take longer than a 10-minute call, and the servers are started once per
# arm instead of once per arm per call. The calls that follow only wait and bring back what is done.
#   start: BG_LIMIT=<s> COMMIT=<sha> CALL_ARMS=nr16 BLOCKS=1 bash scripts/gpu/cells_background.sh start \
#              scripts/gpu/matched_cells.sh [WAIT_S]
#          (BG_LIMIT becomes the job's CALL_LIMIT: its units are planned to end before it, counted from the start;
#           keep it under the session's device time left, less a poll's transfer. SCRIPT_ARGS: words added to the
#           script's command line, e.g. SCRIPT_ARGS="--request-estimate-s 0.07" for a commit whose runner does not
#           yet plan a unit at its phase's measured rate)
#   poll:  bash scripts/gpu/cells_background.sh poll [WAIT_S]
# Both wait up to WAIT_S (default 540) or until the job ends, then put every cells directory under /tmp/cells in
# $OUT/cells_all.tgz (each under its own name: unpack it aside and copy the one you resume) and the log's tail
# on stdout; once the job has ended, its own $OUT files (the compiled kernels, the server logs) come back too.
# The job runs in the repository root itself, not in a snapshot of it: the cells' manifest records the model
# config's absolute path, and a job run elsewhere is refused as another manifest (seen 12-05). The later calls
# copy the same tree over it (seen 12-05: a 17-minute job over two calls ran on through the second call's copy).
# The next call must come within the machine's idle window (30 s) or the machine, and the job, are gone: the
# cells of every finished unit are in the last poll's tarball either way.
set -uo pipefail
BG=${BG_DIR:-/tmp/bg}
CELLS_ROOT=${CELLS_ROOT:-/tmp/cells}

poll() {
  local wait=${1:-540} i
  # a fresh machine (the last call came more than 30 s late): no job to wait for; say so at once
  [ -f "$BG/started" ] || { echo "cells_background: no job on this machine (it went cold): the cells since the last poll are lost; start again"; exit 3; }
  for ((i = 0; i < wait; i++)); do [ -f "$BG/rc" ] && break; sleep 1; done
  # the client's progress lines only; the server's own log lines are long and come back with the files
  grep -v "^|\|^+\|^I[0-9]\|^W[0-9]" "$BG/log" 2>/dev/null | tail -n "${TAIL:-25}"
  mkdir -p "$CELLS_ROOT"
  # packed under another name, then renamed: a poll killed mid-tar (the call's limit) brings back what is under
  # $OUT, and a truncated cells_all.tgz unpacks its last cell half-written. tar's 1 is a whole archive with a
  # file the running job replaced as it read (a cell's atomic write): kept
  tar czf "$OUT/cells_all.tgz.partial" --exclude="*.tmp[0-9]*" -C "$CELLS_ROOT" .
  [ $? -le 1 ] && mv "$OUT/cells_all.tgz.partial" "$OUT/cells_all.tgz"
  if [ -f "$BG/rc" ]; then
    echo "cells_background: the job ended, exit code $(cat "$BG/rc")"
    cp -r "$BG/out/." "$OUT/" 2>/dev/null
    # a failed job fails the call (it read as a call that passed, rc 0, until 12-07): 1, whatever the job's
    # code (printed above), which could otherwise read as this script's own 3 or the device's 124
    [ "$(cat "$BG/rc")" = 0 ] || return 1
  else
    echo "cells_background: the job is still running ($(( $(date +%s) - $(cat "$BG/started") )) s so far): poll again within 30 s"
  fi
}

case "${1:-}" in
  start)
    script=${2:?usage: cells_background.sh start SCRIPT [WAIT_S]}
    [ -f "$script" ] || { echo "cells_background: no script $script"; exit 2; }
    [ -n "${BG_LIMIT:-}" ] || { echo "cells_background: set BG_LIMIT (the job's seconds, under the device time left)"; exit 2; }
    if [ -f "$BG/started" ] && [ ! -f "$BG/rc" ]; then
      echo "cells_background: a job is already running (poll it)"; exit 2
    fi
    rm -rf "$BG" && mkdir -p "$BG/out"
    date +%s > "$BG/started"
    # its own session, so the call's end does not kill it; its $OUT is its own (the call's is emptied each call)
    # rc written under another name, then renamed: a poll reading it as it is created saw it empty
    setsid nohup bash -c 'OUT="$1/out" CALL_LIMIT="$2" bash "$3" $4; echo $? > "$1/rc.tmp"; mv "$1/rc.tmp" "$1/rc"' \
      _ "$BG" "$BG_LIMIT" "$script" \
      "${SCRIPT_ARGS:-}" \
      > "$BG/log" 2>&1 < /dev/null &
    echo "cells_background: started $script (pid $!, limit $BG_LIMIT s)"
    poll "${3:-540}"; exit $? ;;
  poll) poll "${2:-540}"; exit $? ;;
  *) echo "usage: cells_background.sh start SCRIPT [WAIT_S] | poll [WAIT_S]"; exit 2 ;;
esac
