#!/usr/bin/env bash
# CPU side, once: a big wheel as an xz tar of its unpacked files (WHEEL.whl -> DIR/WHEEL.whl.tar.xz); on the device
# prelude.sh zips it back into WHEEL.whl and installs it. nvidia-pytriton 0.7.0's 55 MB wheel
# packs to 34 MB (its tritonserver libraries are deflated in the wheel, xz takes a third more off), so beside the
# ~30 MB tree it fits one call's 64 MiB: a fresh machine stages in two calls (first_call.sh's header), not three.
#   bash scripts/gpu/pack_wheel.sh /tmp/w/nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl .whl_a
set -euo pipefail
[ $# -eq 2 ] && [ -f "$1" ] && [[ "$1" == *.whl ]] || { echo "usage: pack_wheel.sh WHEEL.whl DEST_DIR"; exit 2; }
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
mkdir -p "$2"
tar cf - -C "$tmp" . | xz -9e -T0 > "$2/$(basename "$1").tar.xz"
ls -l "$2/$(basename "$1").tar.xz"
