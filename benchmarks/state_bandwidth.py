"""Effective bandwidth of checkpoint store / load (Triton kernels) next to the device's copy bandwidth.

One TP8 rank of Kimi-Linear-48B (kda channel units) and of Qwen3-Next-80B (gdn head units), W_max 0, 16
and 128, the codecs of --codecs (native and int8 unless told), batch 1 and 64. Bytes = what the kernels read +
write (load writes whole active rows: retained units and the zero-filled omitted ones; packed widths and row
scales per codec: benchmarks/state_codec_arms.py says how each is counted), timed with
triton.testing.do_bench (median, L2 flushed between reps). Batch-64 arms also time a device copy of their own
bytes under the same protocol and both again with the L2 emptied by a read instead of do_bench's zeroing, all
as CUDA-graph replays (flush_study: the zeroing's dirty lines are written back inside the timed call, a fixed
cost that a 1 GiB copy hides and a small store cannot).

Codecs, --codecs (comma-separated): native, int8, fp8 (e4m3), int4 (two values a byte per row), and mixed
(horizon precision, --precision: each kept unit in its horizon band's codec, one ragged segment per codec,
timed as the engine's MixedPool store / load, every segment's launch together; its masks are the planner's
horizon plan, the busiest rank by own bytes; not with --layout padded or --plan). --conv-codec native,int8
times each arm with the conv state copied in its dtype and / or in 8 bits (state/conv8_*).

Target (issue 35 item 1), written before any GPU run: every batch-64 store and load arm of a codec at >= 80%
of a same-size copy's bandwidth on the H200, both timed as CUDA-graph replays after do_bench's zeroing flush
(pct_of_same_size_copy_graph). The result's 'codec_verdicts' gives each codec (and codec+conv8) its weakest
arm and met / not met on that yardstick, with the read-flush one beside it; 'target' keeps the weakest arm
of all under every yardstick, as before.

Masks (which units of the rank a checkpoint keeps), --masks:
  plan (default)  the planner's plan. Each model's real config.json (tests/data/, the repository's copies
                  of shared/reference/) with decay weights A_log / dt_bias following the paper's profile
                  (plan/synthetic.py, seed 0: real weights are out of reach, and the planner reads nothing
                  else) is planned by plan_from_path at TP8 with hybrid placement (the default of dasc-build
                  and dasc plan at --tp > 1). With --layout padded, a plan whose storage balance would move
                  units is planned with placement off instead: the run time exchanges units for the ragged
                  layout only, and dasc-build refuses such a padded engine. The rank timed is the most loaded
                  one (the largest own slot width), since the checkpoint capacity is bound by it.
  random          round(f * L * n) units uniformly at random over (layer, unit), f the fraction KEEP gives
                  for the W_max (the earlier synthetic masks, kept as a control)
  --plan FILE     one rank's lists from JSON with 'model' (a key of MODELS), 'wmax' and 'retained_local'
                  (per-layer sorted local unit ids); replaces the grid
Every row records where its masks came from (masks, mask_rank, placement) and the rank's retained units
(retained_per_layer, retained_sum, retained_max); the result's 'masks' lists every mask set once.

Usage:
  python -m benchmarks state_bandwidth [--masks plan|random] [--layout ragged|padded] [--plan plan.json]
                                       [--codecs native,int8,fp8,int4,mixed] [--conv-codec native,int8]
                                       [--precision horizon] [--quick] [--sweep] [--reference-dir DIR] [--smoke]
Without CUDA it builds and prints the masks only (the plan part) and times nothing. --smoke: every arm of
--codecs / --conv-codec on tiny shapes (SMOKE_MODELS) in Triton's interpreter on CPU, timed by the host
clock (seconds; checks the arms run and count their bytes, its GB/s mean nothing); writes --out only if given.
Writes benchmarks/results/state_bandwidth.json (and $OUT/state_bandwidth.json when $OUT is set).

The GPU run of issue 35 item 1 (one H200, about 3 minutes; benchmarks/results/README.md):
  python -m benchmarks state_bandwidth --quick --codecs native,int8,fp8,int4,mixed --conv-codec native,int8 \
      --commit SHA --out benchmarks/results/state_bandwidth_codecs_h200_SHORT.json
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from benchmarks import state_bandwidth_report as report
from benchmarks import state_codec_arms as arms_mod
from benchmarks.state_codec_arms import MIXED
from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import CONV_CODECS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one TP8 rank: L linear layers, n units per layer, E elements per unit, R = E // V rows, conv per layer
MODELS = {
    "kimi-linear-48b": dict(arch="kda", L=20, n=4 * 128, V=128, R=1, conv_dim=1536, conv_width=3),
    "qwen3-next-80b": dict(arch="gdn", L=36, n=4, V=128, R=128, conv_dim=1024, conv_width=3),
}
# fraction of units kept per W_max (--masks random only; close to the paper's profiles)
KEEP = {"kda": {0: 1.0, 16: 0.36, 128: 0.10}, "gdn": {0: 1.0, 16: 0.90, 128: 0.60}}
WMAXES = (0, 16, 128)
TP = 8
# the released models' config.json files (identical to shared/reference/, and tracked, so they travel
# with the tree to the GPU machine)
REFERENCE_DIR = os.path.join(ROOT, "tests", "data")
REFERENCE = {"kimi-linear-48b": "kimi-linear-48b-a3b.config.json",
             "qwen3-next-80b": "qwen3-next-80b-a3b.config.json"}
DECAY_SEED = 0
# every shape a Masks may name: the timed models and the CPU smoke run's
SHAPES = {**MODELS, **arms_mod.SMOKE_MODELS}


@dataclass
class Masks:
    """One timed rank's retained local units per linear layer, and where they came from."""

    model: str
    wmax: int
    source: str                       # plan | random | plan-file
    lists: list[list[int]]
    rank: int | None = None           # the TP rank of the lists (None: random masks belong to no rank)
    placement: str | None = None
    plan: object = field(default=None, repr=False)   # the DascPlan (source plan), for checks and the record
    # horizon precision (the mixed arm): each listed unit's codec, the segments' codec order, the conv's segment
    codecs: list[list[str]] | None = None
    segments: tuple[str, ...] = ()
    conv_segment: int = 0

    def record(self) -> dict:
        """What every result row carries, so a reader can tell which masks were timed."""
        counts = [len(k) for k in self.lists]
        out = {"masks": self.source, "mask_rank": self.rank, "placement": self.placement,
               "retained_per_layer": counts, "retained_sum": sum(counts), "retained_max": max(counts, default=0)}
        if self.codecs is not None:
            flat = [c for row in self.codecs for c in row]
            out["retained_per_codec"] = {c: flat.count(c) for c in self.segments}
            out["precision"] = self.plan.options.precision if self.plan is not None else "smoke"
        return out

    def summary(self) -> dict:
        out = {"model": self.model, "wmax": self.wmax, **self.record()}
        if self.plan is not None:
            out.update(tp=TP, layout=self.plan.options.layout, retained_units_per_rank=self.plan.rank_units(),
                       rank_widths=self.plan.rank_widths(), moved_units=self.plan.moved_units,
                       decay_summary=self.plan.decay_summary, reference=REFERENCE[self.model], decay_seed=DECAY_SEED)
        return out


# ---- masks from the planner ---------------------------------------------------------------------------
def reference_config(model: str, ref_dir: str = REFERENCE_DIR):
    from trtllm_dasc.config import HybridConfig
    return HybridConfig.from_path(os.path.join(ref_dir, REFERENCE[model]))


def decay_weights(cfg, seed: int = DECAY_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(A_log [L, heads], dt_bias [L, units]) following the paper's decay profile, in float32 as a
    checkpoint stores them (the planner then sees exactly these values)."""
    from trtllm_dasc.plan.synthetic import decay_tensors, synthetic_decay
    per_head = cfg.units_per_layer // cfg.num_value_heads
    alpha = synthetic_decay(cfg.arch, cfg.num_linear_layers, cfg.num_value_heads, per_head, seed)
    A_log, dt_bias = decay_tensors(alpha, per_head, seed)
    return A_log.astype(np.float32), dt_bias.astype(np.float32)


def write_decay_checkpoint(out_dir: str, model: str, ref_dir: str = REFERENCE_DIR) -> str:
    """The reference config.json plus a safetensors file holding only A_log / dt_bias under the released
    names: all plan_from_path reads, so the plan is the one `dasc plan` would make of such weights."""
    from safetensors.numpy import save_file
    cfg = reference_config(model, ref_dir)
    A_log, dt_bias = decay_weights(cfg)
    fam, tensors = cfg.family, {}
    for i, layer in enumerate(cfg.linear_layers):
        prefix = f"model.layers.{layer}.{fam.linear_prefix}"
        tensors[prefix + "A_log"] = A_log[i].reshape(fam.a_log_view)
        tensors[prefix + "dt_bias"] = dt_bias[i]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(ref_dir, REFERENCE[model])) as src, open(os.path.join(out_dir, "config.json"), "w") as dst:
        dst.write(src.read())
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    return out_dir


def engine_plan(path: str, wmax: int, layout: str, precision: str = "uniform"):
    """The plan an engine built with dasc-build --tp 8 --layout LAYOUT [--precision P] would run."""
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    plan, _ = plan_from_path(path, PlanOptions(wmax=wmax, tp=TP, placement="hybrid", layout=layout,
                                               precision=precision))
    # units move between ranks at run time for the ragged layout only (parallel.storage); dasc-build refuses a
    # padded engine whose plan would move any, so such an engine runs without placement
    if layout == "padded" and plan.moved_units:
        plan, _ = plan_from_path(path, PlanOptions(wmax=wmax, tp=TP, placement="off", layout=layout))
    return plan


def busiest_rank(plan) -> int:
    """The rank whose own units need the widest slot (ragged: U_r, padded: L * max_l r_l; horizon precision:
    the most bytes); lowest on ties. Its kernels encode all its units even when storage balance ships some
    away afterwards."""
    if plan.options.bands is not None:
        unit = {c: plan.config.unit_bytes(c) for c in plan.codec_segments}
        widths = [sum(unit[c] * n for c, n in zip(plan.codec_segments, col)) for col in zip(*plan.rank_codec_counts())]
        return widths.index(max(widths))
    per_rank = list(zip(*plan.rank_layer_counts()))
    if plan.options.layout == "ragged":
        widths = [sum(c) for c in per_rank]
    else:
        widths = [len(c) * max(c) for c in per_rank]
    return widths.index(max(widths))


def check_shapes(model: str, cfg) -> None:
    """The kernels are timed on MODELS' shapes: they must be the reference config's TP8 rank."""
    spec, shard = MODELS[model], cfg.shard(TP)
    got = {"arch": cfg.arch, "L": cfg.num_linear_layers, "n": shard.units, "V": cfg.value_head_dim,
           "R": cfg.scales_per_unit, "conv_dim": shard.conv_dim, "conv_width": cfg.conv_kernel - 1}
    if got != {k: spec[k] for k in got}:
        raise SystemExit(f"state_bandwidth: MODELS[{model!r}] = {spec} disagrees with {REFERENCE[model]}: {got}")


def plan_masks(model: str, wmaxes, layout: str = "ragged", ref_dir: str = REFERENCE_DIR,
               precision: str = "uniform") -> list[Masks]:
    """The busiest TP8 rank's retained units under the planner's plan, one Masks per W_max (a horizon
    precision: with each unit's codec, for the mixed arm)."""
    check_shapes(model, reference_config(model, ref_dir))
    out = []
    with tempfile.TemporaryDirectory(prefix="state-bw-") as tmp:
        path = write_decay_checkpoint(os.path.join(tmp, model), model, ref_dir)
        for W in wmaxes:
            plan = engine_plan(path, W, layout, precision)
            rank = busiest_rank(plan)
            m = Masks(model, W, "plan", plan.local_retained(rank), rank, plan.options.placement, plan)
            if plan.options.bands is not None:
                m.codecs, m.segments = plan.local_codecs(rank), tuple(plan.codec_segments)
                m.conv_segment = plan.conv_segment
            out.append(m)
    return out


# ---- other mask sources -------------------------------------------------------------------------------
def random_masks(model: str, W: int) -> Masks:
    """Exactly round(frac * L * n) units, chosen uniformly at random over (layer, unit)."""
    spec = MODELS[model]
    L, n = spec["L"], spec["n"]
    cells = [(l, u) for l in range(L) for u in range(n)]
    kept = sorted(random.Random(W + 7).sample(cells, round(KEEP[spec["arch"]][W] * len(cells))))
    lists = [[] for _ in range(L)]
    for l, u in kept:
        lists[l].append(u)
    return Masks(model, W, "random", lists)


def file_masks(path: str) -> Masks:
    with open(path) as f:
        d = json.load(f)
    if d.get("model") not in MODELS:
        raise SystemExit(f"state_bandwidth: --plan {path}: 'model' must be one of {', '.join(MODELS)}")
    return Masks(d["model"], d["wmax"], "plan-file", [sorted(u) for u in d["retained_local"]], d.get("rank"))


def smoke_masks() -> list[Masks]:
    """The --smoke run's masks: half of each tiny layer, a codec per unit for the mixed arm."""
    out = []
    for i, name in enumerate(arms_mod.SMOKE_MODELS):
        lists, codecs = arms_mod.smoke_lists(SHAPES[name], seed=i)
        out.append(Masks(name, 0, "smoke", lists, codecs=codecs, segments=arms_mod.SMOKE_SEGMENTS))
    return out


def mask_grid(args) -> list[Masks]:
    if args.smoke:
        return smoke_masks()
    if args.plan:
        return [file_masks(args.plan)]
    wmaxes = (16,) if args.quick else WMAXES
    if args.masks == "random":
        return [random_masks(m, W) for m in MODELS for W in wmaxes]
    return [m for name in MODELS for m in plan_masks(name, wmaxes, args.layout, args.reference_dir)]


def mixed_grid(args) -> list[Masks]:
    """The mixed arm's masks (its own horizon plan per model and W_max); none where it cannot run."""
    if MIXED not in args.codecs or args.smoke:
        return []
    if args.plan or args.layout != "ragged" or args.masks != "plan":
        print("state_bandwidth: the mixed arm needs the planner's masks and --layout ragged: skipped")
        return []
    wmaxes = (16,) if args.quick else WMAXES
    return [m for name in MODELS for m in plan_masks(name, wmaxes, "ragged", args.reference_dir, args.precision)]


def print_masks(grid: list[Masks]) -> None:
    print(f"{'model':16} {'W':>4} {'masks':9} {'rank':>4} {'placement':9} {'kept':>6} {'of':>6} {'max/layer':>9}")
    for m in grid:
        r = m.record()
        total = SHAPES[m.model]["L"] * SHAPES[m.model]["n"]
        mixed = f"  {r['retained_per_codec']}" if "retained_per_codec" in r else ""
        print(f"{m.model:16} {m.wmax:>4} {m.source:9} {m.rank!s:>4} {m.placement!s:9} "
              f"{r['retained_sum']:>6} {total:>6} {r['retained_max']:>9}{mixed}")


# ---- timing (CUDA only) -------------------------------------------------------------------------------
bytes_moved = arms_mod.bytes_moved
TARGET_PCT = report.TARGET_PCT


def measure(masks: Masks, codec: str, layout: str, B: int, do_bench, with_conv: bool = True,
            conv_codec: str = "native", device: str = "cuda") -> list[dict]:
    """Store and load of B checkpoints under these masks in one codec (state_codec_arms.build); with_conv
    False: the temporal units alone (the conv copy that the same launch carries left out, so its share of a
    small store's time shows). device cpu (--smoke): the interpreter, timed by do_bench = cpu_ms, no graphs."""
    spec = SHAPES[masks.model]
    arm = arms_mod.build(masks, spec, codec, conv_codec, layout, B, device, with_conv)
    # a smoke run times by the host clock (cpu_ms) wherever its kernels run: on the GPU machine its kernels
    # were compiled for the GPU before --smoke could turn the interpreter on, so its tensors live there
    gpu = device == "cuda" and do_bench is not cpu_ms
    if device == "cuda" and not gpu:
        do_bench = functools.partial(_synced, do_bench)
    out = []
    for op in ("store", "load"):
        fn = getattr(arm, op)
        if gpu:
            fn()
            torch.cuda.synchronize()
        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
        # the smoke run has no graphs: its graph columns repeat the eager time
        host_us = host_time(fn) if gpu else ms * 1e3
        ms_graph = do_bench(capture(fn).replay, warmup=25, rep=100, return_mode="median") if gpu else ms
        nread, nwritten = arm.traffic[op]
        nbytes = nread + nwritten
        flush = {}
        if B >= 64 or not gpu:
            flush = flush_study(fn, nbytes, do_bench) if gpu else smoke_copy(nbytes, do_bench)
        out.append({"model": masks.model, "arch": spec["arch"], "wmax": masks.wmax,
                    "kept_fraction": round(arm.kept / (spec["L"] * spec["n"]), 4), "codec": codec,
                    "conv_codec": conv_codec if with_conv else None, "layout": "ragged" if codec == MIXED else layout,
                    "op": op, "batch": B, "us": ms * 1e3, "us_per_checkpoint": ms * 1e3 / B, "host_us": host_us,
                    "us_graph": ms_graph * 1e3, "us_per_checkpoint_graph": ms_graph * 1e3 / B, "bytes": nbytes,
                    "bytes_read": nread, "bytes_written": nwritten, "GBps": nbytes / ms / 1e6,
                    "GBps_graph": nbytes / ms_graph / 1e6, "slot_bytes": arm.slot_bytes, "with_conv": with_conv,
                    **arm.record, **flush, **masks.record()})
    del arm
    if gpu:
        torch.cuda.empty_cache()
    return out


def cpu_ms(fn, warmup=None, rep=None, return_mode: str = "median") -> float:
    """do_bench's stand-in for the smoke run: host milliseconds of one call (an interpreted call takes
    longer than do_bench's millisecond budgets, and the smoke run's times mean nothing)."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _synced(bench, fn, **kw) -> float:
    """cpu_ms of a smoke call whose kernels run on the GPU: the call and its kernels, not its launch alone."""
    def call():
        fn()
        torch.cuda.synchronize()
    return bench(call, **kw)


def smoke_device() -> str:
    """Where the smoke run's tensors live: the CPU when our Triton kernels are interpreted, else the GPU
    (pytest on a GPU machine imports them compiled before --smoke can set TRITON_INTERPRET)."""
    from trtllm_dasc.state import codec_kernels
    interpreted = type(codec_kernels._fp8_encode).__name__ == "InterpretedFunction"
    return "cpu" if interpreted or not torch.cuda.is_available() else "cuda"


def smoke_copy(nbytes: int, bench) -> dict:
    """The smoke run's same-size copy (host memory, host clock), so its verdict takes the GPU run's path."""
    src = torch.ones(max(1, nbytes // 2), dtype=torch.uint8)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return {"same_size_copy_bytes": 2 * src.numel(), "same_size_copy_us_graph": ms * 1e3,
            "same_size_copy_GBps_graph": 2 * src.numel() / ms / 1e6}


FLUSH_BYTES = 256 << 20      # what triton's do_bench zeroes between reps to empty the L2 (50 MB on the H200)


def clean_flush_ms(fn, reps: int = 100) -> float:
    """Median ms of fn() between two events, the L2 emptied before each call by READING 256 MB (do_bench
    writes them: its flush leaves up to an L2 of dirty lines that the timed call then writes back to HBM,
    a fixed few us that a 1 GiB copy hides and a 90 MB store cannot)."""
    buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    sink = torch.empty((), dtype=torch.float32, device="cuda")
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for _ in range(5):
        fn()
    for a, b in zip(start, end):
        torch.amax(buf, dim=0, out=sink)
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) for a, b in zip(start, end)]))


def flush_study(fn, nbytes: int, do_bench) -> dict:
    """The arm beside a plain device copy of the same bytes (nbytes / 2 read, nbytes / 2 written), both as
    CUDA-graph replays (an eager call whose host work outlasts the flush kernel starts late inside the timed
    span: a slower host moved the Kimi W=128 stores' eager figures by 15-25 us), under do_bench's flush
    (zeroing: the dirty L2 it leaves is written back inside the timed call) and under a read flush
    (clean_flush_ms): how far a small store's fraction of the 1 GiB copy bandwidth is the kernel's own and
    how far it is the size's and the timing protocol's."""
    # whole 2 MiB pages: copies of byte counts off a coarse alignment (an odd number of 256-byte lines) ran at
    # ~60% of an aligned copy's speed on the H200 (state_bandwidth_h200_37bd60c_stream.json); the figures
    # below are the copy's own bytes per second, so the rounding (< 2 MiB of >= 40) does not skew them
    half = max(1, nbytes // (4 << 20)) * (2 << 20)
    src = torch.ones(half, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    arm, copy = capture(fn).replay, capture(lambda: dst.copy_(src)).replay
    copy_ms = do_bench(copy, warmup=25, rep=100, return_mode="median")
    clean_ms, copy_clean_ms = clean_flush_ms(arm), clean_flush_ms(copy)
    return {"same_size_copy_bytes": 2 * half, "same_size_copy_us_graph": copy_ms * 1e3,
            "same_size_copy_GBps_graph": 2 * half / copy_ms / 1e6, "us_graph_read_flush": clean_ms * 1e3,
            "GBps_graph_read_flush": nbytes / clean_ms / 1e6, "same_size_copy_us_graph_read_flush": copy_clean_ms * 1e3,
            "same_size_copy_GBps_graph_read_flush": 2 * half / copy_clean_ms / 1e6}


def capture(fn) -> "torch.cuda.CUDAGraph":
    """fn recorded in a CUDA graph: replays cost the kernels alone, no python or launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def host_time(fn, n: int = 200) -> float:
    """Microseconds of python + launch per call (calls queued back to back, one sync at the end): when
    it exceeds the kernel time, small checkpoints are launch-bound (CUDA graphs would hide it)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def tile_sweep(masks_w: list[Masks], layout: str, do_bench, copy_gbps: float, tiles=(2048, 4096, 8192),
               warps_list=(4, 8), conv_tiles=(None,), codecs=("native", "int8")) -> list[dict]:
    """Batch-64 arms of the given masks under other tile sizes / warp counts / conv copy tiles (None: the
    tile size; defaults restored after)."""
    from trtllm_dasc.state import triton_ops
    saved, rows = (triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS, triton_ops.CONV_TILE_ELEMS), []
    try:
        for tile, warps, conv_tile in itertools.product(tiles, warps_list, conv_tiles):
            triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS, triton_ops.CONV_TILE_ELEMS = tile, warps, conv_tile
            for masks in masks_w:
                for codec in codecs:
                    for a in measure(masks, codec, layout, 64, do_bench):
                        rows.append({"tile": tile, "warps": warps, "conv_tile": conv_tile or tile, **a,
                                     "pct_of_copy_graph": 100 * a["GBps_graph"] / copy_gbps})
                        print(f"sweep tile {tile:5} warps {warps} conv {conv_tile or tile:5} {masks.model:16} "
                              f"W {masks.wmax:>3} {codec:6} {a['op']:5} graph {a['GBps_graph']:6.0f} GB/s "
                              f"{rows[-1]['pct_of_copy_graph']:5.1f}%")
    finally:
        triton_ops.TILE_ELEMS, triton_ops.NUM_WARPS, triton_ops.CONV_TILE_ELEMS = saved
    return rows


def sweep_masks(args, grid: list[Masks]) -> list[Masks]:
    """The --sweep-w masks of every model from the run's source (the grid's own where it has them)."""
    out = []
    for w in args.sweep_w:
        have = {m.model: m for m in grid if m.wmax == w}
        for name in MODELS:
            if name not in have:
                have[name] = (random_masks(name, w) if args.masks == "random"
                              else plan_masks(name, (w,), args.layout, args.reference_dir)[0])
        out.extend(have[name] for name in MODELS)
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--masks", choices=["plan", "random"], default=None,
                    help="plan (default): the busiest TP8 rank's units under the planner's plan; random: uniformly "
                         "random units at the KEEP fraction of each W_max")
    ap.add_argument("--layout", choices=["ragged", "padded"], default="ragged")
    ap.add_argument("--plan", help="JSON with 'model' (a key of MODELS), 'wmax' and 'retained_local' "
                                   "(one rank's per-layer sorted local unit ids); replaces the grid")
    ap.add_argument("--reference-dir", default=REFERENCE_DIR,
                    help="directory holding the released config.json files (names as in REFERENCE)")
    ap.add_argument("--quick", action="store_true", help="batch 64 only, W_max 16 only")
    ap.add_argument("--sweep", action="store_true", help="also time tile sizes and warps on batch-64 arms")
    ap.add_argument("--sweep-w", default="16", help="comma-separated W_max values whose masks --sweep times (16)")
    ap.add_argument("--sweep-tiles", default="2048,4096,8192", help="tile sizes (elements per program) to sweep")
    ap.add_argument("--sweep-warps", default="4,8", help="warp counts to sweep")
    ap.add_argument("--sweep-conv-tiles", default="0", help="conv copy tiles to sweep (0: the tile size)")
    ap.add_argument("--codecs", default="native,int8",
                    help=f"comma-separated arms of {','.join(arms_mod.ARM_CODECS)} (native,int8)")
    ap.add_argument("--conv-codec", default="native", help="comma-separated conv codecs each arm runs with: "
                    "native (the conv state in its dtype), int8 (8-bit, one scale per layer)")
    ap.add_argument("--precision", default="horizon", help="the mixed arm's horizon bands (dasc plan --precision)")
    ap.add_argument("--smoke", action="store_true", help="every arm on tiny shapes in Triton's interpreter on CPU "
                    "(seconds; checks the arms, times nothing meaningful)")
    ap.add_argument("--split-conv", action="store_true",
                    help="also time every batch-64 arm without its conv copy (the temporal units alone)")
    ap.add_argument("--out", default=None, help="result JSON (benchmarks/results/state_bandwidth.json; --smoke: none)")
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    args = ap.parse_args(argv)
    if args.plan and args.masks:
        ap.error("--plan gives the masks; leave out --masks")
    args.masks = args.masks or "plan"
    try:
        args.codecs = arms_mod.parse_list(args.codecs, arms_mod.ARM_CODECS, "--codecs")
        args.conv_codec = arms_mod.parse_list(args.conv_codec, CONV_CODECS, "--conv-codec")
        from trtllm_dasc.plan.precision import parse_precision
        if parse_precision(args.precision) is None:
            raise ValueError("--precision: the mixed arm needs a horizon spec (horizon[:H1,..[:c0,..]])")
    except (ValueError, UserError) as e:
        ap.error(str(e))
    if args.out is None and not args.smoke:
        args.out = os.path.join(ROOT, "benchmarks", "results", "state_bandwidth.json")
    try:
        args.sweep_w, args.sweep_tiles, args.sweep_warps, args.sweep_conv_tiles = (
            [int(x) for x in v.split(",")] for v in (args.sweep_w, args.sweep_tiles, args.sweep_warps,
                                                     args.sweep_conv_tiles))
    except ValueError:
        ap.error("--sweep-w, --sweep-tiles, --sweep-warps and --sweep-conv-tiles take comma-separated integers")
    args.sweep_conv_tiles = [t or None for t in args.sweep_conv_tiles]
    return args


def run_arms(args, grid: list[Masks], mixed: list[Masks], bench, device: str, errors: list) -> list[dict]:
    """Every codec arm of --codecs x --conv-codec over the grid (mixed: over its own horizon-plan masks). On
    the GPU an arm that fails (a kernel's first compile there) is recorded in errors and the others run on."""
    batches = (2,) if args.smoke else (64,) if args.quick else (1, 64)
    plan = [(m, c, cc, B, True) for m in grid for c in args.codecs if c != MIXED
            for cc in args.conv_codec for B in batches]
    plan += [(m, c, "native", 64, False) for m in grid for c in args.codecs if c != MIXED and args.split_conv]
    plan += [(m, MIXED, cc, B, True) for m in mixed for cc in args.conv_codec for B in batches]
    out = []
    for masks, codec, conv_codec, B, with_conv in plan:
        try:
            out.extend(measure(masks, codec, "ragged" if codec == MIXED else args.layout, B, bench, with_conv,
                               conv_codec, device))
        except Exception as e:          # noqa: BLE001 (the GPU run goes on; the smoke run raises)
            if args.smoke:
                raise
            errors.append({"model": masks.model, "wmax": masks.wmax, "codec": codec, "conv_codec": conv_codec,
                           "batch": B, "error": f"{type(e).__name__}: {e}"})
            print(f"state_bandwidth: {masks.model} W={masks.wmax} {codec} conv {conv_codec} B={B} failed: "
                  f"{errors[-1]['error']}")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        # read when a kernel is decorated: before the lazy imports of the state kernels below
        os.environ.setdefault("TRITON_INTERPRET", "1")
    grid = mask_grid(args)
    mixed = (grid if args.smoke else mixed_grid(args)) if MIXED in args.codecs else []
    print_masks(grid + ([] if args.smoke else mixed))
    gpu = torch.cuda.is_available() and not args.smoke
    if not gpu and not args.smoke:
        print("state_bandwidth: no CUDA device here, masks built, timing skipped (run it on the GPU machine)")
        return 0
    import triton
    from benchmarks.results_io import provenance, write_result

    from trtllm_dasc.state import triton_ops
    from benchmarks.copy_bandwidth import copy_bandwidth
    if gpu:
        from triton.testing import do_bench
    else:
        do_bench = cpu_ms
    copy_gbps = copy_bandwidth("cuda") / 1e9 if gpu else copy_bandwidth("cpu", 16 << 20, 3) / 1e9
    errors = []
    arms = run_arms(args, grid, mixed, do_bench, "cuda" if gpu else smoke_device(), errors)
    uniform = [c for c in args.codecs if c != MIXED]
    sweep = (tile_sweep(sweep_masks(args, grid), args.layout, do_bench, copy_gbps, args.sweep_tiles, args.sweep_warps,
                        args.sweep_conv_tiles, uniform) if args.sweep and gpu else [])
    report.add_fractions(arms, copy_gbps)
    print(f"device {torch.cuda.get_device_name() if gpu else 'cpu (Triton interpreter)'}  torch {torch.__version__}  "
          f"triton {triton.__version__}")
    print(f"copy bandwidth (torch copy_, {'1 GiB' if gpu else '16 MiB'}): {copy_gbps:.0f} GB/s")
    print("us: eager call (python + launch + kernel); graph: CUDA-graph replay (kernel only); host: python+launch")
    report.print_arms(arms)
    report.print_flush(arms)
    target = report.target_summary(arms)
    verdicts = report.codec_verdicts(arms, report.TARGET_PCT)
    result = {**provenance("benchmarks/state_bandwidth.py", argv, args.commit), "torch": torch.__version__,
              "triton": triton.__version__, "copy_GBps": copy_gbps, "layout": args.layout, "mask_source": args.masks
              if not args.plan else "plan-file", "masks": [m.summary() for m in grid + ([] if args.smoke else mixed)],
              "tile_elems": triton_ops.TILE_ELEMS, "num_warps": triton_ops.NUM_WARPS,
              "conv_tile_elems": triton_ops.CONV_TILE_ELEMS or triton_ops.TILE_ELEMS, "arms": arms, "sweep": sweep,
              "target": target, "codecs": args.codecs, "conv_codecs": args.conv_codec, "precision": args.precision,
              "codec_verdicts": verdicts, "errors": errors, "smoke": args.smoke}
    paths = ([args.out] if args.out else []) + (
        [os.path.join(os.environ["OUT"], "state_bandwidth.json")] if os.environ.get("OUT") and gpu else [])
    for p in paths:
        write_result(p, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
