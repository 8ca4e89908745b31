#!/usr/bin/env bash
# nvidia-h200-x2, one device call (about MINUTES + 2 minutes): train the two tiny hybrids of the quality issue side
# by side (python -m trtllm_dasc.evals.train: transformers' KimiLinear / Qwen3Next with fla's kernels), KDA on
# GPU 0 and GDN on GPU 1; then a short dense + nr16 replay check of each (evals.run) so a call tells whether
# the models learned. The protocol runs proper are a later call.
# Carry as .whl (the device's numpy 2.x is replaced by the serving wheels' 1.26, and huggingface-hub 2.x needs
# httpx2): ../shared/tools/gpu-wheels .whl kernels transformers==5.24.0 huggingface-hub tokenizers "numpy>=2.1,<2.4"
#   httpx2 httpcore2 hf-xet anyio idna truststore h11 click typing-extensions
# RESUME=1 continues from .stage/{kda,gdn}_stage.pt (carry .stage: the *_stage.pt files a previous call returned,
# weights + curriculum progress). MINUTES (default 7) is each run's wall budget, compiles included. TASKS (a
# comma-separated list, default all) narrows the training mixture, e.g. to the single-needle tasks first.
# Compiled kernels: .kernel_cache/train_kernels*.tgz is unpacked into the Triton cache when carried (the first
# KDA step compiled and autotuned for 245 s on a bare machine), and the kernels this call compiled come back
# as train_kernels.tgz (keep each call's under a new name in .kernel_cache/: they add up).
# Writes (a call returns at most 8 files of 16 MiB): $OUT/{kda,gdn}_model.tgz (save_pretrained + train_meta.json),
# $OUT/{kda,gdn}_stage.pt (fp32 weights to resume from), $OUT/train_{kda,gdn}.log, $OUT/quick.log,
# $OUT/train_kernels.tgz.
set -uo pipefail
SHAPED_MODEL=0 source scripts/gpu_prelude.sh          # wheels, PYTHONPATH, the kernel cache in $CACHE
export PYTHONUNBUFFERED=1
# a warm machine keeps /tmp: never return (or resume from) an earlier call's models
rm -rf /tmp/models /tmp/stage /tmp/quick_*
sleep 1; touch /tmp/kernels_before_training   # only kernels compiled from here on go back (16 MiB a file)
python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)" || exit 3
for i in 0 1; do
  arch=$([ $i = 0 ] && echo kda || echo gdn)
  resume=""
  if [ "${RESUME:-0}" = 1 ]; then
    [ -f .stage/${arch}_stage.pt ] || { echo "RESUME=1 but no .stage/${arch}_stage.pt was carried"; exit 2; }
    resume="--resume .stage/${arch}_stage.pt"
  fi
  # the run keeps its own wall budget (compiles included) and saves on SIGTERM; timeout is the backstop
  CUDA_VISIBLE_DEVICES=$i timeout $(( ${MINUTES:-7} * 60 + 60 )) python3 -m trtllm_dasc.evals.train --arch $arch \
    --out /tmp/models/$arch --stage /tmp/stage/$arch --minutes "${MINUTES:-7}" --device cuda --seed 0 $resume \
    ${TASKS:+--tasks "$TASKS"} \
    > "$OUT/train_$arch.log" 2>&1 &
done
wait
# the compiled kernels first: what a cut call must not lose
tar czf /tmp/train_kernels.tgz --newer-mtime="@$(stat -c %Y /tmp/kernels_before_training)" \
  --transform "s,^$(basename $CACHE),train_kernels," -C "$(dirname $CACHE)" "$(basename $CACHE)"
if [ "$(stat -c %s /tmp/train_kernels.tgz)" -lt 16000000 ]; then cp /tmp/train_kernels.tgz "$OUT/"
else echo "kernel cache $(stat -c %s /tmp/train_kernels.tgz) B: over a returned file's 16 MiB, not returned"; fi
for arch in kda gdn; do
  tail -n 2 "$OUT/train_$arch.log"
  [ -f /tmp/models/$arch/config.json ] || continue
  tar czf "$OUT/${arch}_model.tgz" -C /tmp/models $arch
  cp /tmp/stage/$arch/train_state.pt "$OUT/${arch}_stage.pt"
done
for i in 0 1; do
  arch=$([ $i = 0 ] && echo kda || echo gdn)
  [ -f /tmp/models/$arch/config.json ] && CUDA_VISIBLE_DEVICES=$i timeout "${QUICK_LIMIT:-60}" python3 -m trtllm_dasc.evals.run \
    --model /tmp/models/$arch --out /tmp/quick_$arch.json --arms dense,nr16 --lengths 2048 --instances 4 \
    --device cuda --dtype bfloat16 --resamples 200 > /tmp/quick_$arch.log 2>&1 &
done
wait
grep -h "\[evals\]" /tmp/quick_*.log | tee "$OUT/quick.log"
