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


def split_into_folders(files: list[str], first_bytes: int, rest_bytes: int, prefix: str) -> list[tuple[str, int]]:
    """Write the parts; return [(folder, bytes in it)] in call order."""
    if first_bytes <= 0 or rest_bytes <= 0:
        raise ValueError("--first-bytes and --rest-bytes must be positive")
    names = [os.path.basename(f) for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"two files share a name: {names}")
    folders: list[tuple[str, int]] = []
    room = 0

    def next_folder():
        nonlocal room
        folder = f"{prefix}{len(folders) + 1}"
        if os.path.exists(folder) and os.listdir(folder):
            raise ValueError(f"{folder} exists and is not empty: a stale part would be joined into the stage")
        os.makedirs(folder, exist_ok=True)
        room = first_bytes if not folders else rest_bytes
        folders.append((folder, 0))

    next_folder()
    for path, name in zip(files, names):
        suffixes = _suffixes()
        with open(path, "rb") as src:
            while True:
                if room == 0:
                    next_folder()
                chunk = src.read(room)
                if not chunk:
                    break
                folder, used = folders[-1]
                with open(os.path.join(folder, f"{name}.part-{next(suffixes)}"), "wb") as dst:
                    dst.write(chunk)
                folders[-1] = (folder, used + len(chunk))
                room -= len(chunk)
    return [(f, n) for f, n in folders if n > 0]


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
