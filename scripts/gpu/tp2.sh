#!/usr/bin/env bash
# nvidia-h200-x2: tensor parallelism over MPI with NCCL, in one device call (~9 minutes):
#   1. TP2 logits = TP1 logits on the Kimi-Linear-48B-shaped checkpoint (bf16), dense and a W=16 split
#      through the checkpoint pool with placement hybrid;
#   2. per-checkpoint store/load latency, placement off / storage / hybrid, batch 1 and 64;
#   3. the matched-memory serving protocol at TP2 for dense and dasc-nr W=16 (needs the serving wheels).
# Carry: ../shared/tools/gpu-wheels .whl serve numpy==1.26.4 (73 MB: two calls, the first INSTALL_ONLY=1
# with nvidia_pytriton alone in .whl). Pass COMMIT=<hash> (the device's .git may be stale).
# PARTS (default "logits storage serve") picks the parts, LOGITS_DTYPES (default "bfloat16 float32") the dtypes.
# Writes $OUT/tp2_logits.json, $OUT/tp_storage_h200x2.json, $OUT/serve_matched_hbm_tp2.json (+ .png).
set -uo pipefail
source scripts/gpu/prelude.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi --query-gpu=name,memory.used --format=csv
PARTS=" ${PARTS:-logits storage serve} "
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(3, 32000)) for _ in range(300)))")
if [[ $PARTS == *" logits "* ]]; then
# bf16 (what serving runs) and fp32 (where TP1 and TP2 must agree to rounding: the all-reduce only
# reorders sums), dense and a W=16 split through the checkpoint pool with placement hybrid
for dtype in ${LOGITS_DTYPES:-bfloat16 float32}; do
  for tp in 1 2; do
    python3 -m trtllm_dasc.cli logits --model /tmp/kimi48 --ids "$IDS" --out /tmp/logits_${dtype}_tp$tp.npy --tp $tp \
      --device cuda --dtype $dtype || exit 4
    python3 -m trtllm_dasc.cli logits --model /tmp/kimi48 --ids "$IDS" --out /tmp/logits_${dtype}_split_tp$tp.npy \
      --tp $tp --device cuda --dtype $dtype --split 200 --wmax 16 --placement hybrid || exit 4
  done
done
python3 - "$OUT/tp2_logits.json" "${COMMIT:-}" <<'PY'
import json, os, sys
import numpy as np
out = {"command": "PARTS=logits bash scripts/gpu/tp2.sh (dasc logits --tp 1/2, bf16 and fp32, 300 tokens)",
       "commit": sys.argv[2] or None, "note": "TP2 against TP1 of the same dtype; fp32 is the exactness check, "
       "bf16 adds the rounding of partial sums reduced in bf16; *_vs_fp32: each bf16 run against the fp32 TP1"}
ref = np.load("/tmp/logits_float32_tp1.npy") if os.path.exists("/tmp/logits_float32_tp1.npy") else None
for dtype in ("bfloat16", "float32"):
    for name in ("", "split_"):
        if not os.path.exists(f"/tmp/logits_{dtype}_{name}tp2.npy"):
            continue
        a, b = np.load(f"/tmp/logits_{dtype}_{name}tp1.npy"), np.load(f"/tmp/logits_{dtype}_{name}tp2.npy")
        key = f"{dtype}_{name}"
        out[key + "max_abs_diff"] = float(np.abs(a - b).max())
        out[key + "max_abs_logit"] = float(np.abs(a).max())
        out[key + "argmax_agree"] = float((a.argmax(-1) == b.argmax(-1)).mean())
        if dtype == "bfloat16" and not name and ref is not None:
            out["bfloat16_tp1_vs_fp32_max_abs_diff"] = float(np.abs(a - ref).max())
            out["bfloat16_tp2_vs_fp32_max_abs_diff"] = float(np.abs(b - ref).max())
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
fi
[[ $PARTS == *" storage "* ]] && timeout 200 python3 -m benchmarks tp_storage --tp 2 --device cuda --batches 1,64 --reps 20 \
  --out "$OUT/tp_storage_h200x2.json" ${COMMIT:+--commit "$COMMIT"}
[[ $PARTS == *" serve "* ]] && timeout "${SERVE_LIMIT:-300}" python3 -m clients.matched_hbm --model /tmp/kimi48 --out /tmp/tp2_serve --tp 2 \
  --kernel-cache "$CACHE" \
  --placement hybrid --arms dense,nr16 --dense-slots 8 --blocks-per-phase 1 --seeds 42,123,7 --concurrency 96 \
  --max-batch-size 64 --max-num-tokens 8192 --device cuda --dtype bfloat16 --prompt-only \
  --json "$OUT/serve_matched_hbm_tp2.json" --plot "$OUT/serve_matched_hbm_tp2.png" ${COMMIT:+--commit "$COMMIT"}
