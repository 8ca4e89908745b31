"""`dasc logits`: prefill token ids through the engine and write float32 logits [T, vocab] (.npy).

Both forms run through the serving engine (scheduler, StepPlan, ModelRunner), not a path of their own.
Without --split: one request returning its context logits. With --split K: a first request of the
first K + 1 tokens stores its prompt-end checkpoint at K through the real checkpoint pool (--wmax/--codec
decide what it keeps); a second request of all T tokens hits it: load (omitted units zero-filled;
--policy wr also replays the last W cached tokens and merges them), then computes [K, T) on the cached KV.
The result is the first request's logits of [0, K) followed by the second's of [K, T). With --wmax 0
--codec native it equals the unsplit run; other settings show what compression does to the logits.
"""
from __future__ import annotations

import os
import tempfile

from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import BACKENDS, add_arm_arguments
from trtllm_dasc.parallel.launch import relaunch, under_mpirun
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.parallel.launch import find_mpirun


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--ids", required=True, help="comma-separated token ids, e.g. 1,5,9")
    p.add_argument("--out", required=True, help="output file (written exactly there, NumPy .npy format): "
                                                "float32 [T, vocab]")
    p.add_argument("--split", type=int, default=None,
                   help="prefill K tokens, store the state at K in the checkpoint pool, load it back, continue")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="model dtype (default float32; the logits are written float32 either way)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="kernel backend (dasc-build --help says what each runs)")
    p.add_argument("--block-size", type=int, default=16, help="KV cache block size (tokens)")
    add_arm_arguments(p, ("wmax", "policy", "codec"), engine=True)
    p.add_argument("--replay-window", type=int, default=None, help="wr replay length override (tokens)")
    add_arm_arguments(p, ("tp", "placement"), engine=True)


def _argv(args) -> list[str]:
    """The command line of ``args`` again (each rank parses it the same way)."""
    out = ["-m", "trtllm_dasc.cli", "logits"]
    for name in ("model", "ids", "out", "split", "dtype", "device", "backend", "block_size", "wmax", "policy",
                 "codec", "replay_window", "tp", "placement"):
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def parse_ids(text: str) -> list[int]:
    parts = text.replace(" ", "").split(",")
    if parts and parts[-1] == "":
        parts.pop()          # a trailing comma is harmless
    if not any(parts):
        raise UserError("--ids is empty")
    try:
        return [int(t) for t in parts]
    except ValueError:
        raise UserError(f"--ids must be comma-separated integers without gaps, got {text!r}") from None


def check_output_path(path: str) -> None:
    """Refuse before any work what could not be written afterwards."""
    out_dir = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UserError(f"--out {path!r} is a directory")
    if not os.path.isdir(out_dir):
        raise UserError(f"--out directory {out_dir!r} does not exist")
    # a real probe: permission bits say nothing for root, nor for read-only or pseudo file systems
    try:
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".dasc-probe-"):
            pass
        if os.path.exists(path):
            with open(path, "ab"):
                pass
    except OSError as e:
        raise UserError(f"--out {path!r} is not writable ({e.strerror})") from None


def run(args) -> int:
    import numpy as np

    ids = parse_ids(args.ids)
    check_output_path(args.out)
    from trtllm_dasc.engine_dir import refuse_engine_as_checkpoint
    refuse_engine_as_checkpoint(args.model)
    if args.split is not None and not 0 < args.split < len(ids):
        raise UserError(f"--split must be in 1..{len(ids) - 1} for {len(ids)} tokens, got {args.split}")
    if args.tp < 1:
        raise UserError(f"--tp must be >= 1, got {args.tp}")
    if args.tp > 1 and not under_mpirun():
        # the same command on T ranks; rank 0 writes the file and prints
        from trtllm_dasc.config import HybridConfig
        find_mpirun()
        # what every rank would refuse, refused once here (one line, not T lines and mpirun's report)
        HybridConfig.from_path(args.model).shard(args.tp)
        from trtllm_dasc.parallel.group import check_device
        check_device(args.device)
        code = relaunch(args.tp, _argv(args))
        return code if code in (0, 2) else 1
    logits = engine_logits(args, ids)
    if logits is None:
        return 0        # a worker rank: rank 0 writes
    try:
        with open(args.out, "wb") as f:
            # a file object: np.save would append ".npy" to a bare name
            np.save(f, logits.float().cpu().numpy())
    except OSError as e:
        raise UserError(f"--out {args.out!r} could not be written ({e.strerror})") from None
    print(f"wrote {args.out}: float32 [{len(ids)}, {logits.shape[1]}]"
          + (f" (split at {args.split}, W_max {args.wmax}, {args.policy}, {args.codec})"
             if args.split is not None else ""))
    return 0


def engine_logits(args, ids: list[int]):
    """The logits [T, vocab]; None on a worker rank of a --tp run (rank 0 has them)."""
    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.engine import Engine

    T, split = len(ids), args.split
    dense = HybridConfig.from_path(args.model, conv_dtype=args.dtype).dense_checkpoint_bytes_per_rank(args.tp)
    # blocks: the first request's prompt (kept by the tree), the second's fresh ones and a wr replay's
    # (EngineConfig refuses a bad --block-size with its own message)
    blocks = 3 * -(-(T + 1) // max(1, args.block_size)) + 4
    wmax = args.wmax if split is not None else 0
    cfg = EngineConfig(model=args.model, wmax=wmax, policy=args.policy, codec=args.codec, dtype=args.dtype,
                       device=args.device, backend=args.backend, block_size=args.block_size, max_batch=1,
                       num_kv_blocks=blocks, max_context=T + 1, interval=T + 1, prompt_only=True,
                       replay_window=args.replay_window, state_budget_bytes=3 * dense,
                       tp_size=args.tp, placement=args.placement)
    if args.tp > 1:
        # lazy: torch / numpy load only when this runs (keeps importing this module light)
        from trtllm_dasc.engine.ranks import run_ranks
        return run_ranks(cfg, lambda engine: _logits(engine, ids, split))
    return _logits(Engine(cfg), ids, split)


def _logits(engine, ids: list[int], split: int | None):
    import torch

    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.engine.request import GenerationRequest
    if split is None:
        req = GenerationRequest("logits", ids, 1, return_context_logits=True)
        return _context_logits(engine, req)
    first = GenerationRequest("prefix", ids[:split + 1], 1, return_context_logits=True)
    prefix_logits = _context_logits(engine, first)[:split]
    second = GenerationRequest("rest", ids, 1, return_context_logits=True)
    rest = _context_logits(engine, second)
    if second.stats.cached_tokens != split:
        raise RuntimeError(f"the split checkpoint was not reused ({second.stats.cached_tokens} cached tokens)")
    return torch.cat([prefix_logits, rest])


def _context_logits(engine, req):
    got = {}
    engine.submit(req, lambda out: got.update(out=out) if out.context_logits is not None or out.finished else None)
    engine.run_until_idle()
    out = got.get("out")
    if out is None or out.context_logits is None:
        raise RuntimeError(f"request {req.request_id}: {out.error if out else 'no output'}")
    return out.context_logits
