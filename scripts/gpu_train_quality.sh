#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~9 minutes): train the two tiny hybrids of the quality issue side by side
# (python -m trtllm_dasc.evals.train: transformers' KimiLinear / Qwen3Next with fla's kernels), then a quick
# dense replay check of each through our engine. Carry as .whl: fla-core and transformers (the version the
# tests use): ../shared/tools/gpu-wheels .whl kernels transformers==5.24.0 huggingface-hub tokenizers
# Pass COMMIT=<hash>. Writes $OUT/models/{kda,gdn}/ (save_pretrained + train_meta.json), logs, and
# $OUT/quick_{kda,gdn}.json. MINUTES (default 8) is each run's training budget.
set -uo pipefail
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
fi
[ "${INSTALL_ONLY:-0}" = 1 ] && exit 0
export PYTHONPATH=$PWD
python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)" || exit 3
for i in 0 1; do
  arch=$([ $i = 0 ] && echo kda || echo gdn)
  CUDA_VISIBLE_DEVICES=$i timeout $(( ${MINUTES:-8} * 60 + 60 )) python3 -m trtllm_dasc.evals.train --arch $arch \
    --out "$OUT/models/$arch" --minutes "${MINUTES:-8}" --device cuda --seed 0 > "$OUT/train_$arch.log" 2>&1 &
done
wait
for i in 0 1; do
  arch=$([ $i = 0 ] && echo kda || echo gdn)
  tail -3 "$OUT/train_$arch.log"
  [ -f "$OUT/models/$arch/model.safetensors" ] || continue
  CUDA_VISIBLE_DEVICES=$i timeout 120 python3 -m trtllm_dasc.evals.run --model "$OUT/models/$arch" --arms dense \
    --lengths 1024 --instances 5 --device cuda --dtype bfloat16 --resamples 100 --out "$OUT/quick_$arch.json" \
    ${COMMIT:+--commit "$COMMIT"} 2>&1 | grep "\[evals\]" &
done
wait
du -sh "$OUT"/models/* 2>/dev/null
