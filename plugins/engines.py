"""`dasc-build --tensorrt`: the arm's codec engines, written into ENGINE_DIR/tensorrt/.

    tensorrt/codec.json                 what was built: module and version, per engine its file, I/O
                                        (names, dtypes, shapes; -1 = dynamic) and dynamic-dim ranges
    tensorrt/rank{r}/dasc_store.engine  store: pack (+ INT8 quantize) and the conv state
    tensorrt/rank{r}/dasc_load.engine   load: (dequantize +) unpack with zero-fill, conv state back
    tensorrt/rank{r}/dasc_merge.engine  policies wr and wr-warm: replay merge of the omitted units

The plan's index tables are constants inside each engine, so an engine belongs to its plan and rank.
Engines are built for the machine's TensorRT (full TensorRT where installed, else TensorRT-RTX, which
builds on the CPU but has no Hopper target): building is checked here, executing needs a runtime that
supports the GPU (see README).
"""
from __future__ import annotations

import json
import os
import sys
import time

from trtllm_dasc.errors import UserError


def check_available() -> str:
    """The TensorRT module name that will build, or a UserError saying why none can."""
    from plugins.trt_network import load_tensorrt
    try:
        return load_tensorrt().__name__
    except ImportError as e:
        raise UserError(f"--tensorrt: {e}") from None


def check_supported(codec: str, precision: str, conv_codec: str) -> None:
    """One line refusing what the codec graphs do not implement (plugins/codec.py: CODECS, one codec for every
    unit, CONV_CODECS), before TensorRT is looked for: a graph built for another codec would store raw floats."""
    from plugins.codec import CODECS, CONV_CODECS
    from trtllm_dasc.spec import DEFAULT_PRECISION
    bad = ([f"--codec {codec}"] if codec not in CODECS else []) + \
          ([f"--precision {precision}"] if precision != DEFAULT_PRECISION else []) + \
          ([f"--conv-codec {conv_codec}"] if conv_codec not in CONV_CODECS else [])
    if bad:
        raise UserError(f"--tensorrt builds codec engines for --codec {'|'.join(CODECS)}, --precision "
                        f"{DEFAULT_PRECISION} and --conv-codec {'|'.join(CONV_CODECS)} only, not {', '.join(bad)}: "
                        "leave out --tensorrt (the PyTorch engine runs every codec)")


def rank_layouts(plan) -> list:
    """Each rank's StateLayout; a placement that moves units between ranks has no per-rank codec engine
    (its pool is the all-to-all of parallel/storage.py)."""
    from trtllm_dasc.state.layout import LayoutError, StateLayout
    try:
        return [StateLayout.from_plan(plan, r) for r in range(plan.options.tp)]
    except LayoutError as e:
        raise UserError(f"--tensorrt: {e}; build with --placement off (or hybrid where it moves no unit)") from None


def write_codec_engines(engine_dir: str, plan, policy: str, max_batch: int, conv_dtype: str,
                        prefill_chunk: int = 2048, interval: int = 256) -> dict:
    """Build and write every rank's codec engines; returns what codec.json holds."""
    from plugins.codec import codec_graphs
    from plugins.trt_network import build_engine, load_tensorrt, network_io
    trt = load_tensorrt()
    layouts = rank_layouts(plan)
    # the runner's active state: two rows per running request (its own and a wr replay's scratch)
    max_rows = 2 * max_batch
    # a step stores up to one capture per checkpoint interval of each running request's chunk, plus its end
    max_captures = max_batch * (-(-prefill_chunk // interval) + 1)
    root = os.path.join(engine_dir, "tensorrt")
    info = {"module": trt.__name__, "version": getattr(trt, "__version__", None), "policy": policy,
            "max_batch": max_batch, "max_rows": max_rows, "max_captures": max_captures, "engines": []}
    t0 = time.time()
    for rank, layout in enumerate(layouts):
        os.makedirs(os.path.join(root, f"rank{rank}"), exist_ok=True)
        for graph in codec_graphs(layout, policy, max_batch, max_rows, max_captures, conv_dtype):
            blob = build_engine(graph, trt)
            rel = os.path.join(f"rank{rank}", graph.name + ".engine")
            with open(os.path.join(root, rel), "wb") as f:
                f.write(blob)
            info["engines"].append({"rank": rank, "name": graph.name, "file": rel, "bytes": len(blob),
                                    "dims": {k: list(v) for k, v in graph.dims.items()},
                                    "io": network_io(graph, trt)})
            print(f"[dasc-build] TensorRT ({trt.__name__}) rank {rank + 1}/{len(layouts)} {graph.name}: "
                  f"{len(blob) / 2**20:.1f} MiB ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
    with open(os.path.join(root, "codec.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info
