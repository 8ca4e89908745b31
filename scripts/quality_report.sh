#!/usr/bin/env bash
# CPU, after scripts/gpu/quality_evals.sh: the quality issue's report files for both trained models.
#   bash scripts/quality_report.sh RESULTS_DIR [OUT_DIR]
# RESULTS_DIR holds quality_{kda,gdn}.json (+ .png) from the device call; MODELS (default
# benchmarks/quality_models) holds the models. Writes into OUT_DIR (default benchmarks/results/quality):
# the results and plots, horizon_validation_{kda,gdn}.json (Table 1b on task prompts, 24 prefixes of 2048
# tokens; one already in RESULTS_DIR, the device call's with PAPER=1, is used as it is), decay_profile_{kda,gdn}.png
# (dasc plan --plot: the horizons training left), tables.md (accuracy per arm and W_max, the paired comparisons)
# and paper_tables.md / .json (evals.paper_tables: Tables 2 and 5, wr vs nr, INT8, and Table 1b from the horizon
# validation, each beside the paper's figure); the written summary goes in OUT_DIR/README.md by hand.
set -euo pipefail
RES=${1:?usage: quality_report.sh RESULTS_DIR [OUT_DIR]}
OUTDIR=${2:-benchmarks/results/quality}
MODELS=${MODELS:-benchmarks/quality_models}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUTDIR"
for arch in kda gdn; do
  [ -f "$RES/quality_$arch.json" ] || { echo "no $RES/quality_$arch.json"; exit 2; }
  [ "$RES/quality_$arch.json" -ef "$OUTDIR/quality_$arch.json" ] || cp "$RES/quality_$arch.json" "$OUTDIR/"
  [ ! -f "$RES/quality_$arch.png" ] || [ "$RES/quality_$arch.png" -ef "$OUTDIR/quality_$arch.png" ] ||
    cp "$RES/quality_$arch.png" "$OUTDIR/"
  if [ -f "$RES/horizon_validation_$arch.json" ]; then
    [ "$RES/horizon_validation_$arch.json" -ef "$OUTDIR/horizon_validation_$arch.json" ] ||
      cp "$RES/horizon_validation_$arch.json" "$OUTDIR/"
  else
    # the committed models through the committed code: HEAD, though this script has just copied new results
    # into the tree (which makes the checkout's own commit read "+ uncommitted changes")
    $PY -m trtllm_dasc.evals.horizon_validation --model "$MODELS/$arch" --out "$OUTDIR/horizon_validation_$arch.json" \
      --commit "${COMMIT:-$(git rev-parse HEAD)}"
  fi
  $PY -m trtllm_dasc.cli plan --model "$MODELS/$arch" --wmax 16,64,128,512 --plot "$OUTDIR/decay_profile_$arch.png" > "$OUTDIR/plan_$arch.txt"
done
$PY -m trtllm_dasc.evals.tables "$OUTDIR/quality_kda.json" "$OUTDIR/quality_gdn.json" --out "$OUTDIR/tables.md"
# Table 1b beside Tables 2 / 5 (docs/quality.md): the horizon validations above as --horizons
$PY -m trtllm_dasc.evals.paper_tables "$OUTDIR/quality_kda.json" "$OUTDIR/quality_gdn.json" \
  --horizons "kda=$OUTDIR/horizon_validation_kda.json,gdn=$OUTDIR/horizon_validation_gdn.json" \
  --out "$OUTDIR/paper_tables.md" --json "$OUTDIR/paper_tables.json"
