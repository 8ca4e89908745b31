#!/usr/bin/env bash
# nvidia-h200 or nvidia-h200-x2, one device call (about MINUTES + 2 minutes): train the tiny hybrids of the quality
# issue side by side (python -m trtllm_dasc.evals.train: transformers' KimiLinear / Qwen3Next with fla's kernels),
# one process per variant, variant i on GPU i mod (the machine's GPUs): the tiny models leave most of an H200
# idle, so several variants share one; then a short dense + nr16 replay check of each (evals.run) so a call
# tells whether the models learned. The protocol runs proper are a later call.
# SIZE (default large): the model preset (evals/train.py SIZES: tiny | medium | large); medium and large train at
# the paper's operating point (--freeze-decay: A_log / dt_bias held at the planner's paper-shaped profile) on
# 1k-8k tokens, and stage bf16 weights (--stage-dtype bfloat16). A large stage is about 35 MB, a medium one 19 MB:
# files over 15 MiB come back split (NAME_stage.pt.part-aa, -ab, ...; RESUME=1 joins the carried parts), and a call
# carries 64 MiB with the tree, so with SIZE=large train one variant per call (VARIANTS="kda kda", then "gdn gdn").
# Longer training = several calls: RESUME=1 MINUTES=8 with the returned stage, repeated. FORK="kdadrill=kda" lets a
# variant with no stage yet resume from a copy of another's (an experiment trained beside the main run).
# VARIANTS: ";"-separated "NAME ARCH [train args...]", default "kda kda;gdn gdn", e.g.
#   VARIANTS="kda kda;kda_def kda --decay-init default;gdn gdn;gdn_def gdn --decay-init default"
# Carry as .whl (the device's numpy 2.x is replaced by the serving wheels' 1.26, and huggingface-hub 2.x needs
# httpx2): ../shared/tools/gpu-wheels .whl kernels transformers==5.24.0 huggingface-hub tokenizers "numpy>=2.1,<2.4"
#   httpx2 httpcore2 hf-xet anyio idna truststore h11 click typing-extensions
# On a fresh machine (no serving call before) leave the numpy wheel out: the device's own numpy 2.x serves, and the
# other wheels (23 MB) fit beside the 36 MB tree in one call; the numpy wheel alone is 17 MB
# A call carries at most 64 MiB and the tree alone is about 35 MB (12-05): when .whl, .stage
# and .kernel_cache_train do not fit together, send .whl first with INSTALL_ONLY=1 and the rest (no .whl) in a
# second call under 30 s later, while the machine is still warm with the wheels installed.
# RESUME=1 continues each variant from its stage (weights + curriculum progress; none stops the call before
# training). A call moves the stages it carries out of the tree into $KEPT (KEPT=/tmp/stage_keep), where every
# call also leaves the stage it trained, so a warm machine's next call (under 30 s later) resumes from the newest
# one without carrying it, and never from an older one the device's tree still held. What a call carries:
#   .stage/NAME_stage.pt, or its parts in any .stage*/ folder (NAME_stage.pt.part-aa, -ab, ... as returned, or as
#   scripts/gpu/split_carry.py cuts them): a large stage (37 MB) and the tree (35 MB) exceed one call's carry, so
#   a fresh machine takes them over several calls, each with INSTALL_ONLY=1 but the last, which has RESUME=1 and
#   trains. The training call joins the parts in name order and checks the result is a whole stage (a zip whose
#   every member's CRC holds) before any variant starts; parts in a call with neither RESUME=1 nor INSTALL_ONLY=1
#   are refused and removed (a later call would join them over the newer stage this one trains).
# MINUTES (default 7) is each run's wall budget, compiles included. TASKS (a comma-separated list, default all)
# narrows the training mixture, e.g. to the single-needle tasks first; the quick check uses the same tasks
# (QUICK_LENGTH, default 2048; QUICK=0 skips it). TRAIN_ARGS go to every variant (e.g. --restart-curriculum).
# Compiled kernels: .kernel_cache_train/train_kernels*.tgz is unpacked into the Triton cache when carried (the first
# KDA step compiled and autotuned for 245 s on a bare machine), and the kernels this call compiled come back
# as train_kernels.tgz.part-* (join them under a new name in .kernel_cache_train/ each call: they add up; carry
# .kernel_cache_train, and where it and the tree pass the 64 MiB carry, split the tarballs over .kernel_cache_train2/
# and so on, each carried in a call of its own: every .kernel_cache_train*/ is unpacked; the quick check runs the engine, whose kernels are in .kernel_cache: carry it too when
# QUICK=1 and the carry allows, or its first compile may not fit QUICK_LIMIT). Back-to-back
# calls (under 30 s apart) find the machine warm with its Triton cache in /tmp.
# Writes (a call returns files of at most 16 MiB, 64 MiB in all: past that, files were left out, seen 12-06):
# $OUT/train_kernels.tgz.part-* (one or two), $OUT/logs.tgz (train_NAME.log, quick_NAME.log), $OUT/quick.log,
# then $OUT/NAME_stage.pt (or its .part-* files) per variant while the call's returns stay under RETURN_BYTES
# (weights to resume from; `python -m trtllm_dasc.evals.train --export STAGE --out DIR` writes the bf16 model).
# Two large stages (2 x 37 MB) do not come back in one call: the one that does not fit stays kept on the machine,
# and the next call, under 30 s later, brings it back alone: RETURN_ONLY=1 VARIANTS="gdn gdn" (no training).
set -uo pipefail
KEPT=${KEPT:-/tmp/stage_keep}   # the newest stage of each variant on this machine (RESUME=1)
mkdir -p "$KEPT/parts"
IFS=';' read -ra VARIANT_LIST <<< "${VARIANTS:-kda kda;gdn gdn}"
if compgen -G ".stage*/*_stage.pt.part-*" >/dev/null && [ "${RESUME:-0}" != 1 ] && [ "${INSTALL_ONLY:-0}" != 1 ]; then
  echo "stage parts carried ($(ls .stage*/*_stage.pt.part-* | tr '\n' ' ')) in a call with neither RESUME=1 nor" \
       "INSTALL_ONLY=1: refused and removed (a later call would join them over a newer stage); carry them again"
  rm -f .stage*/*_stage.pt.part-*
  exit 2
fi
# moved, not copied: the device keeps ignored folders between calls, and a stage left in the tree would be
# resumed again by the next call instead of the newer one this call trains
for f in .stage*/*_stage.pt; do [ -f "$f" ] && mv "$f" "$KEPT/" && echo "stage carried: $f"; done
for f in .stage*/*_stage.pt.part-*; do
  [ -f "$f" ] || continue
  # a part this machine already joined (a staging folder carried again): dropped, or it would stay unjoinable
  # and refuse every later RESUME call, or join over the newer stage trained since
  if grep -qx "$(md5sum < "$f" | cut -d' ' -f1)" "$KEPT/parts/joined.md5" 2>/dev/null; then
    rm -f "$f"; echo "stage part carried again, already joined: ignored: $f"; continue
  fi
  mv "$f" "$KEPT/parts/" && echo "stage part carried: $f"
done
# return_stage NAME: the kept stage of NAME into $OUT (15 MiB parts when larger) if the call's returns stay under
# RETURN_BYTES with it; else it says so and leaves it kept for a RETURN_ONLY=1 call
return_stage() {
  local src="$KEPT/$1_stage.pt" size returned
  [ -f "$src" ] || { echo "$1: no stage kept on this machine"; return 1; }
  size=$(stat -c %s "$src"); returned=$(du -sb "$OUT" | cut -f1)
  if [ $((returned + size)) -gt "${RETURN_BYTES:-62000000}" ]; then
    echo "$1: stage not returned ($size B past what this call brings back): it stays kept on this machine;" \
         "within 30 s: RETURN_ONLY=1 VARIANTS=\"$1 ...\" bash scripts/gpu/train_quality.sh"
    return 1
  fi
  if [ "$size" -gt $((15 * 1024 * 1024)) ]; then split -b 15m "$src" "$OUT/$1_stage.pt.part-"
  else cp "$src" "$OUT/$1_stage.pt"; fi
  echo "$1: stage returned ($size B)"
}
if [ "${RETURN_ONLY:-0}" = 1 ]; then
  rc=0
  for variant in "${VARIANT_LIST[@]}"; do read -r name _ <<< "$variant"; return_stage "$name" || rc=4; done
  exit $rc
fi
SHAPED_MODEL=0 source scripts/gpu/prelude.sh          # wheels, PYTHONPATH, the kernel cache in $CACHE
export PYTHONUNBUFFERED=1
# BENCH_ONLY=1: no training, the step benchmark instead (benchmarks/train_step.py: the short convolution by
# transformers' torch fallback vs fla's kernel, both models, a profile of each): a call of its own on the warm
# machine, e.g. the one that carries .kernel_cache_train; COMMIT names the clean commit it runs (BENCH_ARGS more flags)
if [ "${BENCH_ONLY:-0}" = 1 ]; then
  sleep 1; touch /tmp/kernels_before_bench
  timeout "${BENCH_LIMIT:-420}" python3 -m benchmarks train_step ${COMMIT:+--commit "$COMMIT"} \
    --out "$OUT/train_step.json" ${BENCH_ARGS:-}
  rc=$?
  # the kernels it compiled (fla's convolution at the training's widths): join them into .kernel_cache_train/
  return_new_kernels train_kernels train_kernels /tmp/kernels_before_bench
  exit $rc
fi
# a warm machine keeps /tmp: never return (or resume from) an earlier call's models
W=${TRAIN_TMP:-/tmp}   # this call's models, stages and logs (a test points it elsewhere)
rm -rf $W/models $W/stage $W/quick_* $W/train_logs
mkdir -p $W/train_logs
sleep 1; touch $W/kernels_before_training   # only kernels compiled from here on go back (16 MiB a file)
python3 -c "import transformers, fla; print('transformers', transformers.__version__, 'fla', fla.__version__)" || exit 3
# every variant's stage before any starts: a refusal after one had started would leave it running unsaved
declare -A RESUME_FROM
for variant in "${VARIANT_LIST[@]}"; do
  read -r name _ <<< "$variant"
  RESUME_FROM[$name]=""
  [ "${RESUME:-0}" = 1 ] || continue
  # never a silent fresh start: it would spend the call and return a stage that overwrites the good one
  parts=$(ls "$KEPT/parts/${name}_stage.pt.part-"* 2>/dev/null | sort)
  if [ -n "$parts" ]; then
    # carried parts are the newest stage: joined aside, checked whole, then kept (a part missing, say the machine
    # went cold between the calls that carried them, must not replace a good kept stage with a broken one)
    cat $parts > "$KEPT/${name}_stage.pt.joining" || exit 3
    if ! python3 -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" \
        "$KEPT/${name}_stage.pt.joining" 2>/dev/null; then
      echo "variant $name: the carried parts ($(echo $parts | xargs -n1 basename | tr '\n' ' ')) do not join into a" \
           "whole stage (one missing?): refused before training; they stay here for a call that brings the rest"
      rm -f "$KEPT/${name}_stage.pt.joining"; exit 2
    fi
    mv "$KEPT/${name}_stage.pt.joining" "$KEPT/${name}_stage.pt"
    echo "variant $name: joined $(echo "$parts" | wc -l) carried parts"; md5sum $parts | cut -d' ' -f1 >> "$KEPT/parts/joined.md5"; rm -f $parts
  fi
  # FORK="new=old[,new2=old2]": a variant with no stage of its own starts from a copy of another's (an experiment
  # beside the main run, e.g. kdadrill=kda; list the source variant first, so its carried parts are joined already)
  fork_from=$(tr ',' '\n' <<< "${FORK:-}" | sed -n "s/^$name=//p" | head -1)
  if [ ! -f "$KEPT/${name}_stage.pt" ] && [ -n "$fork_from" ] && [ -f "$KEPT/${fork_from}_stage.pt" ]; then
    cp "$KEPT/${fork_from}_stage.pt" "$KEPT/${name}_stage.pt" && echo "variant $name: starts from a copy of ${fork_from}'s stage"
  fi
  [ -f "$KEPT/${name}_stage.pt" ] || { echo "RESUME=1 but no stage of $name was carried, nor kept here by an earlier call"; exit 2; }
  RESUME_FROM[$name]="--resume $KEPT/${name}_stage.pt"
done
i=0
for variant in "${VARIANT_LIST[@]}"; do
  read -r name arch args <<< "$variant"
  resume=${RESUME_FROM[$name]}
  echo "variant $name: --arch $arch $args $resume (GPU $((i % GPUS)))"
  # the run keeps its own wall budget (compiles included) and saves on SIGTERM; timeout is the backstop
  CUDA_VISIBLE_DEVICES=$((i % GPUS)) timeout "$(awk "BEGIN { print int(${MINUTES:-7} * 60 + 60) }")" python3 -m trtllm_dasc.evals.train \
    --arch $arch --size "${SIZE:-large}" --stage-dtype bfloat16 --out $W/models/$name --stage $W/stage/$name \
    --minutes "${MINUTES:-7}" --device cuda --seed 0 \
    $resume ${TASKS:+--tasks "$TASKS"} ${TRAIN_ARGS:-} $args > $W/train_logs/train_$name.log 2>&1 &
  i=$((i + 1))
done
wait
# the compiled kernels first: what a cut call must not lose
return_new_kernels train_kernels train_kernels $W/kernels_before_training
tar czf "$OUT/logs.tgz" -C $W train_logs      # now, so a call cut in the quick check keeps them
i=0
for variant in "${VARIANT_LIST[@]}"; do
  read -r name arch args <<< "$variant"
  tail -n 3 $W/train_logs/train_$name.log | sed "s/^/$name: /"
  if [ -f $W/stage/$name/train_state.pt ]; then
    cp $W/stage/$name/train_state.pt "$KEPT/${name}_stage.pt" && return_stage "$name"
  fi
  [ -f $W/models/$name/config.json ] && [ "${QUICK:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=$((i % GPUS)) timeout "${QUICK_LIMIT:-60}" \
    python3 -m trtllm_dasc.evals.run --model $W/models/$name --out $W/quick_$name.json --arms dense,nr16 \
    --lengths "${QUICK_LENGTH:-2048}" --instances 4 ${TASKS:+--tasks "$TASKS"} --device cuda --dtype bfloat16 \
    --resamples 200 > $W/train_logs/quick_$name.log 2>&1 &
  i=$((i + 1))
done
wait
for variant in "${VARIANT_LIST[@]}"; do
  read -r name arch args <<< "$variant"
  grep -h "\[evals\]" $W/train_logs/quick_$name.log | sed "s/^/$name /"
done | tee "$OUT/quick.log"
tar czf "$OUT/logs.tgz" -C $W train_logs      # again, with the quick checks' logs
