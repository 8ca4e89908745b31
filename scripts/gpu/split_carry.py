"""Split files too large for one device call into carry folders, one folder a call.

A device call carries the tree plus the named ignored folders, 64 MiB in all; the tree is ~35 MB (12-05), so a
large training stage (37 MB) cannot travel whole. This puts the files' bytes, in order, into FOLDER_1 (the first
call's room, which also carries the wheels), FOLDER_2, ... (the room of each later call); a file that crosses a
folder's end is cut into NAME.part-aa, NAME.part-ab, ... (name order is byte order, as `split` names them), and a
file that fits whole in one folder is still named NAME.part-aa so every stage arrives the same way.
scripts/gpu/train_quality.sh moves the parts it is carried out of the tree and joins them when the training call
comes (RESUME=1); the calls before it run with INSTALL_ONLY=1.

    python3 scripts/gpu/split_carry.py --first-bytes 7800000 --rest-bytes 30800000 --prefix .stage_ \\
        kda_stage.pt gdn_stage.pt
"""
from __future__ import annotations

import argparse
import itertools
import os
import string
import sys


def _suffixes():
    """aa, ab, ..., zz: split's default, so `ls | sort` and `cat` put the parts back in order."""
    for a, b in itertools.product(string.ascii_lowercase, repeat=2):
        yield a + b


def plan_parts(sizes: list[int], first_bytes: int, rest_bytes: int) -> list[tuple[int, int, int, int]]:
    """[(folder number from 1, file index, offset, length)]: the files' bytes in order, each folder filled to its
    room before the next begins."""
    parts, folder, room = [], 1, first_bytes
    for index, size in enumerate(sizes):
        offset = 0
        while offset < size:
            if room == 0:
                folder, room = folder + 1, rest_bytes
            length = min(room, size - offset)
            parts.append((folder, index, offset, length))
            offset, room = offset + length, room - length
    return parts


def split_into_folders(files: list[str], first_bytes: int, rest_bytes: int, prefix: str) -> list[tuple[str, int]]:
    """Write the parts; return [(folder, bytes in it)] in call order. Everything is checked before a byte is
    written: a half-written set of folders would be carried as if it were whole."""
    if first_bytes <= 0 or rest_bytes <= 0:
        raise ValueError("--first-bytes and --rest-bytes must be positive")
    names = [os.path.basename(f) for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"two files share a name: {names}")
    sizes = [os.path.getsize(f) for f in files]
    for name, size in zip(names, sizes):
        if size == 0:
            raise ValueError(f"{name} is empty: nothing to carry (a stage is never empty)")
    parts = plan_parts(sizes, first_bytes, rest_bytes)
    for index, name in enumerate(names):
        count = sum(1 for p in parts if p[1] == index)
        if count > 26 * 26:
            raise ValueError(f"{name} would take {count} parts, more than split's names aa..zz: raise the rooms")
    folders = sorted({p[0] for p in parts})
    for k in folders:
        folder = f"{prefix}{k}"
        if os.path.exists(folder) and os.listdir(folder):
            raise ValueError(f"{folder} exists and is not empty: a stale part would be joined into the stage")
    suffixes = [_suffixes() for _ in files]
    for k, index, offset, length in parts:
        folder = f"{prefix}{k}"
        os.makedirs(folder, exist_ok=True)
        with open(files[index], "rb") as src, \
                open(os.path.join(folder, f"{names[index]}.part-{next(suffixes[index])}"), "wb") as dst:
            src.seek(offset)
            dst.write(src.read(length))
    return [(f"{prefix}{k}", sum(p[3] for p in parts if p[0] == k)) for k in folders]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="files to carry (e.g. the stages of quality-stages)")
    ap.add_argument("--first-bytes", type=int, required=True,
                    help="room in the first call: 64 MiB less the tree, the wheels and a margin")
    ap.add_argument("--rest-bytes", type=int, required=True, help="room in each later call")
    ap.add_argument("--prefix", default=".stage_", help="folder name prefix (.stage_ is git-ignored)")
    args = ap.parse_args(argv)
    try:
        folders = split_into_folders(args.files, args.first_bytes, args.rest_bytes, args.prefix)
    except (OSError, ValueError) as e:
        print(f"split_carry: {e}", file=sys.stderr)
        return 2
    for k, (folder, used) in enumerate(folders, 1):
        last = k == len(folders)
        print(f"call {k}: carry {folder} ({used:,} B){'' if last else ', INSTALL_ONLY=1'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
