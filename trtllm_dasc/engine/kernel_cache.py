"""The engine's Triton kernel cache, seeded with the autotune records we ship.

fla's Triton kernels autotune on their first call: every candidate config is compiled and timed, and the
winner is written to Triton's cache as <hash>/<kernel>.autotune.json (fla turns on Triton's cache_results).
The hash covers the Triton build, the GPU target, the kernel's source, the tuning key and the candidates, so
a record is found only by the same kernel on the same kind of GPU under the same Triton. On a fresh H200 those
autotunes were most of a cold start: 177 of the 252 kernel variants a Kimi-Linear-48B server compiled before
it was ready were the candidates of 14 autotunes (dense server ready after 337 s, 38 s with a warm cache).

trtllm_dasc/assets/autotune/ holds such records, returned by H200 calls (its README says which). Seeding a
kernel cache with them makes Triton take the recorded winner and compile only that one. Elsewhere (another
GPU, Triton or fla) no record matches and nothing changes; a record already in the cache (a machine's own
tuning) is never replaced.

    python -m trtllm_dasc.engine.kernel_cache collect CACHE_DIR   # add a call's records to the assets
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "assets" / "autotune"
SUFFIX = ".autotune.json"


def records(root: Path = RECORDS) -> list[Path]:
    """The records under root, as <hash>/<kernel>.autotune.json."""
    return sorted(root.glob(f"*/*{SUFFIX}"))


def _copy_missing(src_root: Path, dst_root: Path) -> list[Path]:
    """src_root's records copied into dst_root where it has none at their path (the new paths). Each lands by
    an atomic rename, so a rank compiling beside this one never reads half a file."""
    new = []
    for src in records(src_root):
        dst = dst_root / src.parent.name / src.name
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        new.append(dst)
    return new


def seed(cache_dir: str | os.PathLike, root: Path = RECORDS) -> int:
    """Copy root's records into cache_dir where it has none; returns how many were copied."""
    return len(_copy_missing(root, Path(cache_dir)))


def use_kernel_cache(cfg) -> None:
    """Point Triton at cfg.kernel_cache_dir (read when it compiles: compiled kernels outlive the process, an
    engine directory keeps them) and, on a GPU, seed it. Every rank's runner calls this before its first
    compile (the runner warms kernels while it loads)."""
    if not cfg.kernel_cache_dir:
        return
    os.makedirs(cfg.kernel_cache_dir, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = os.path.abspath(cfg.kernel_cache_dir)
    if str(cfg.device).startswith("cuda"):
        n = seed(cfg.kernel_cache_dir)
        if n:
            print(f"dasc: kernel cache {cfg.kernel_cache_dir}: {n} autotune records seeded from {RECORDS} "
                  "(used where the GPU, Triton and fla match the machine that tuned them)",
                  file=sys.stderr, flush=True)


def collect(cache_dir: str | os.PathLike, root: Path = RECORDS) -> list[Path]:
    """Copy the autotune records of a Triton cache into root (those it lacks); returns the new ones."""
    return _copy_missing(Path(cache_dir), root)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dasc.engine.kernel_cache",
                                description="Add a Triton cache's autotune records to trtllm_dasc/assets/autotune.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="copy CACHE_DIR's <hash>/<kernel>.autotune.json files into the assets")
    c.add_argument("cache_dir")
    args = p.parse_args(argv)
    if not os.path.isdir(args.cache_dir):
        p.error(f"{args.cache_dir}: not a directory")
    new = collect(args.cache_dir)
    print(f"{len(new)} new autotune records in {RECORDS} ({len(records())} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
