# Sourced by the scripts/gpu/*.sh device scripts (bash, the repository root as the working directory): install the
# carried wheels (.whl: into the interpreter's own site-packages, where the Triton server is looked up;
# .whl_*/*.whl.tar.xz: packed by scripts/gpu/pack_wheel.sh), stop there when INSTALL_ONLY=1 (a first call that
# carries only the big wheel), put the repository on PYTHONPATH, fill one Triton kernel cache ($CACHE) from the
# carried .kernel_cache/*.tgz and .kernel_cache_train*/*.tgz and .kernel_cache_speed*/*.tgz (compiled kernels of
# earlier runs: the engine's kernels/, the quality training's train_kernels/ and the speed benchmarks' big-shape
# fla kernels with their autotune results, kept apart so a call carries only what it runs within the 64 MiB;
# minutes of first compiles saved; a stale one is only unused) and write the Kimi-Linear-48B-shaped checkpoint
# once per machine (SHAPED_MODEL=0: a script that does not use it). Sets GPUS (the GPU count).
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl || exit 3
fi
# packed wheels (scripts/gpu/pack_wheel.sh: NAME.whl.tar.xz in any carried .whl_*/): zipped back into NAME.whl
# and installed, once a machine (a later call finds the folder still there and the marker beside it)
PACKED=${PACKED_DIR:-/tmp/packed}
# a wheel packed in parts (pack_wheel.sh with several folders), each carried by its own call: the parts seen so
# far are kept under $PACKED/parts, and the whole is installed by the call that brings the last one
mkdir -p "$PACKED/parts"
for part in .whl_*/*.whl.tar.xz.part-*-of-*; do
  [ -f "$part" ] && cp "$part" "$PACKED/parts/"
done
for part in "$PACKED"/parts/*.whl.tar.xz.part-*-of-*; do
  [ -f "$part" ] || continue
  name=$(basename "$part"); n=${name##*-of-}; name=${name%.part-*-of-*}
  # once a wheel: installed already, or joined by an earlier part of this loop
  [ -f "$PACKED/${name%.tar.xz}.installed" ] || [ -f "$PACKED/$name" ] && continue
  have=0
  for ((k = 1; k <= n; k++)); do [ -f "$PACKED/parts/$name.part-$k-of-$n" ] && have=$((have + 1)); done
  if [ "$have" -lt "$n" ]; then
    echo "prelude: $have of $n parts of $name are here; carry the others in the next call (within 30 s)"
    continue
  fi
  for ((k = 1; k <= n; k++)); do cat "$PACKED/parts/$name.part-$k-of-$n"; done > "$PACKED/$name" || exit 3
done
for packed in .whl_*/*.whl.tar.xz "$PACKED"/*.whl.tar.xz; do
  [ -f "$packed" ] || continue
  name=$(basename "$packed" .tar.xz)
  [ -f "$PACKED/$name.installed" ] && continue
  files="$PACKED/${name%.whl}"
  rm -rf "$files" && mkdir -p "$files" && tar xJf "$packed" -C "$files" || exit 3
  (cd "$files" && python3 -m zipfile -c "$PACKED/$name" $(ls -A)) || exit 3
  python3 -m pip install -q --no-index --no-deps --no-compile "$PACKED/$name" || exit 3
  rm -rf "$files" "$PACKED/$name" "$PACKED/$name.tar.xz" && touch "$PACKED/$name.installed"
  echo "prelude: installed $name from $packed"
done
CACHE=/tmp/triton_cache
mkdir -p $CACHE
for t in .kernel_cache/*.tgz .kernel_cache_train*/*.tgz .kernel_cache_speed*/*.tgz; do
  [ -f "$t" ] && tar xzf "$t" -C /tmp
done
for d in /tmp/kernels /tmp/train_kernels; do
  [ -d $d ] && cp -rn $d/. $CACHE/ 2>/dev/null
done
[ "${INSTALL_ONLY:-0}" = 1 ] && { echo "prelude: kernel cache $(find $CACHE -type f | wc -l) files"; exit 0; }
# whole GPUs (MIG instances would add lines to nvidia-smi -L); scripts place jobs on GPU i mod $GPUS
GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
[ "$GPUS" -ge 1 ] || { echo "no GPU visible to nvidia-smi"; exit 5; }
# the machine is ours alone: a process still on the GPU is a server an earlier call left (a client killed by
# `timeout` before it could stop it held 112 GiB, and every later server died out of memory): end it
left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
if [ -n "$left" ]; then
  echo "prelude: ending the processes an earlier call left on the GPU: $(echo $left)"
  kill -9 $left 2>/dev/null; sleep 3
fi
export PYTHONPATH=$PWD
export TRITON_CACHE_DIR=$CACHE
# return_new_kernels NAME DIR MARKER: the kernels compiled into $CACHE since MARKER's mtime, as DIR/ inside
# $OUT/NAME.tgz.part-* (parts of 15 MB: a returned file's limit is 16 MiB; `cat` joins them into one .tgz
# for .kernel_cache/ or .kernel_cache_train/, which this prelude unpacks next time)
return_new_kernels() {
  tar czf /tmp/$1.tgz --newer-mtime="@$(stat -c %Y "$3")" --transform "s,^$(basename $CACHE),$2," \
    -C "$(dirname $CACHE)" "$(basename $CACHE)"
  if [ "$(stat -c %s /tmp/$1.tgz)" -le 30000000 ]; then split -b 15000000 /tmp/$1.tgz "$OUT/$1.tgz.part-"
  else echo "kernel cache $(stat -c %s /tmp/$1.tgz) B: over two returned files, not returned"; fi
}
if [ "${SHAPED_MODEL:-1}" = 1 ] && [ ! -f /tmp/kimi48/model.safetensors ]; then
  python3 -m benchmarks shaped_model /tmp/kimi48 --device cuda || exit 4
fi
# check_serve: the serving scripts' wheels are in (tritonserver from nvidia-pytriton, numpy 1.x for its Python stub)
check_serve() {
  python3 - <<'PY'
import sys
import numpy
from trtllm_dasc.serve.tritonserver import find_server
find_server()
if int(numpy.__version__.split(".")[0]) >= 2:
    sys.exit(f"numpy {numpy.__version__}: the Triton Python backend stub needs numpy<2 (carry numpy==1.26.4)")
PY
}
# cells_work DIR: sets WORK=/tmp/cells/<name of DIR>, seeded with DIR's committed cells. A call works in /tmp (a
# warm machine's next call finds its cells there before they are committed here); a cell is a file named by
# its unit and call, so the union is the merge
cells_work() {
  WORK=/tmp/cells/$(basename "$1")
  mkdir -p "$WORK"
  [ -d "$1" ] && cp -rn "$1/." "$WORK/"
  return 0
}
# return_cells NAME SERVERS MARKER: a cells call's results into $OUT: the cells of $WORK (cells.tgz), the kernels
# compiled since MARKER (NAME_kernels.tgz.part-*) and every arm's server log under SERVERS/<arm>/, named by its
# arm (one name for all would keep only the last server's)
return_cells() {
  # packed under another name, then renamed: a call killed mid-tar brings back what is under $OUT, and a
  # truncated cells.tgz unpacks its last cell half-written (tar's 1: a file replaced as it read, still whole)
  tar czf "$OUT/cells.tgz.partial" --exclude="*.tmp[0-9]*" -C "$WORK" .
  [ $? -le 1 ] && mv "$OUT/cells.tgz.partial" "$OUT/cells.tgz"
  return_new_kernels "$1_kernels" kernels "$3"
  ls -l "$OUT/$1_kernels.tgz.part-"* 2>/dev/null || echo "$1: no new kernels"
  echo "$1: cells dir ${CELLS:-$WORK}"
  for d in "$2"/*/; do
    for f in "$d"*.log; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$d")_$(basename "$f")"; done
  done
  return 0
}
