#!/usr/bin/env bash
# nvidia-h200-x2, one device call (~9 minutes): train the two tiny hybrids of the quality issue side by side
# (python -m trtllm_dasc.evals.train: transformers' KimiLinear / Qwen3Next with fla's kernels); the protocol
# runs (python -m trtllm_dasc.evals.run) are the next call. Carry as .whl: fla-core and transformers (the version the
# tests use): ../shared/tools/gpu-wheels .whl kernels transformers==5.24.0 huggingface-hub tokenizers
# Writes $OUT/models/{kda,gdn}/ (save_pretrained + train_meta.json) and the logs. MINUTES (default 8) is
# each run's training budget.
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
for arch in kda gdn; do tail -3 "$OUT/train_$arch.log"; done
du -sh "$OUT"/models/* 2>/dev/null
