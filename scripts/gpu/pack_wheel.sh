#!/usr/bin/env bash
# CPU side, once: a big wheel as an xz tar of its unpacked files (WHEEL.whl -> DIR/WHEEL.whl.tar.xz); on the device
# prelude.sh zips it back into WHEEL.whl and installs it. nvidia-pytriton 0.7.0's 55 MB wheel
# packs to 34 MB (its tritonserver libraries are deflated in the wheel, xz takes a third more off), so beside the
# ~30 MB tree it fits one call's 64 MiB: a fresh machine stages in two calls (first_call.sh's header), not three.
#   bash scripts/gpu/pack_wheel.sh /tmp/w/nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl .whl_a
# Once the tree grows past ~33 MB (the committed cells and results grow it) the packed wheel no longer fits beside
# it: name two or more folders and it is split into as many parts, WHEEL.whl.tar.xz.part-K-of-N, one a folder, each
# carried by its own call (call A0 carry [".whl_a"], call A carry [".whl_b", ...], within 30 s); the prelude keeps
# the parts it has seen under /tmp and installs the wheel once all N are there:
#   bash scripts/gpu/pack_wheel.sh /tmp/w/nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl .whl_a .whl_b
# With the tree at ~35 MB: FIRST_PART_BYTES=$((64 * 1048576 - <tree bytes> - 1000000)) and two folders: call A0 carries
# the big first part (INSTALL_ONLY=1), the cells call carries the small second with .whl_c (matched_cells.sh's header)
set -euo pipefail
[ $# -ge 2 ] && [ -f "$1" ] && [[ "$1" == *.whl ]] || { echo "usage: pack_wheel.sh WHEEL.whl DEST_DIR [DEST_DIR ...]"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the files with their modes (tritonserver must stay executable; zipfile's own extract drops them)
python3 - "$1" "$tmp" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for info in wheel.infolist():
        path = wheel.extract(info, sys.argv[2])
        if info.external_attr >> 16 & 0o777:
            os.chmod(path, info.external_attr >> 16 & 0o777)
PY
name=$(basename "$1").tar.xz
tar cf - -C "$tmp" . | xz -9e -T0 > "$tmp.xz"
trap 'rm -rf "$tmp" "$tmp.xz" "$tmp".part-*' EXIT
shift
if [ $# -eq 1 ]; then
  mkdir -p "$1" && mv "$tmp.xz" "$1/$name" && ls -l "$1/$name"
  exit 0
fi
# N parts of (nearly) equal size, part K into the K-th folder; FIRST_PART_BYTES=<b> with two folders: the first part
# that many bytes, the second the rest (a call's 64 MiB less the tree for the first, so the second is small enough
# to travel beside .whl_c in the first cells call: two calls stage a fresh machine instead of three)
n=$#
if [ -n "${FIRST_PART_BYTES:-}" ]; then
  [ "$n" -eq 2 ] || { echo "FIRST_PART_BYTES needs exactly two folders"; exit 2; }
  size=$(stat -c %s "$tmp.xz")
  [ "$FIRST_PART_BYTES" -gt 0 ] && [ "$FIRST_PART_BYTES" -lt "$size" ] ||
    { echo "FIRST_PART_BYTES must be between 0 and the packed size ($size B), got $FIRST_PART_BYTES"; exit 2; }
  head -c "$FIRST_PART_BYTES" "$tmp.xz" > "$tmp.part-000"
  tail -c +"$((FIRST_PART_BYTES + 1))" "$tmp.xz" > "$tmp.part-001"
else
  split -n "$n" -d -a 3 "$tmp.xz" "$tmp.part-"
fi
k=1
for dest in "$@"; do
  mkdir -p "$dest"
  mv "$tmp.part-$(printf %03d $((k - 1)))" "$dest/$name.part-$k-of-$n"
  ls -l "$dest/$name.part-$k-of-$n"
  k=$((k + 1))
done
