"""`dasc-build`: a Hugging Face checkpoint -> a self-contained engine directory, like `trtllm-build`.

    ENGINE_DIR/
      config.json     every option (the EngineConfig, serving options) and the model's config.json
      plan.json       the dasc plan (`dasc plan --json`): what each checkpoint keeps, the wr window, bytes
      model/          the checkpoint's files (config, safetensors, tokenizer), copied (hard-linked when it can)
      kernels/        Triton's compiled-kernel cache, filled by the server's warm-up and reused afterwards
      model_repo/     the filled Triton model repository: dasc_hybrid (+ preprocessing, postprocessing and
                      ensemble when the checkpoint has a tokenizer); serve it with `dasc serve ENGINE_DIR`

Every option is checked before anything is written; a bad one is a one-line error and exit code 2.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

from build_scripts.engine_output import check_output, staged_output
from trtllm_dasc.errors import UserError

ENGINE_VERSION = 1
# the checkpoint files an engine directory keeps
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "model.safetensors.index.json")


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--output", required=True, help="engine directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing engine directory (only a dasc engine)")
    p.add_argument("--skip-finite-check", action="store_true", help="do not read every weight for NaN / Inf "
                   "before building (names, shapes and dtypes are still checked; recorded in the engine)")
    g = p.add_argument_group("dasc")
    g.add_argument("--wmax", type=int, default=16, help="W_max: units with a static horizon <= W_max are "
                   "omitted from checkpoints (0: dense, keep everything)")
    g.add_argument("--selection", default="decay", choices=["decay", "random"], help="decay (dasc) or random: "
                   "as many units per layer, drawn uniformly (the paper's count-matched control; needs --mask-seed)")
    g.add_argument("--mask-seed", type=int, default=None, help="seed of --selection random")
    g.add_argument("--policy", default="nr", choices=["nr", "wr", "wr-warm"],
                   help="load policy for omitted units (wr-warm, experimental: the replay starts from the checkpoint's "
                        "retained units; equal to wr on both the single-needle and the 13-task trained models, "
                        "benchmarks/results/quality)")
    g.add_argument("--codec", default="native", choices=["native", "int8"], help="checkpoint temporal codec")
    g.add_argument("--layout", default="ragged", choices=["ragged", "padded"], help="checkpoint slot layout")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    g.add_argument("--placement", default="hybrid", choices=["off", "storage", "hybrid"],
                   help="TP placement of checkpoint units (with --tp > 1)")
    g.add_argument("--state-budget-bytes", type=int, default=None,
                   help="checkpoint pool bytes per rank (default: 64 dense checkpoints' worth)")
    g = p.add_argument_group("runtime")
    g.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    g.add_argument("--backend", default="auto", choices=["auto", "torch", "fla", "fla-unfused"],
                   help="kernel backend: fla (recurrence, mixers and decode attention in GPU kernels), "
                        "fla-unfused (fla's recurrence only), torch (the reference), auto (fla on a GPU)")
    g.add_argument("--max-batch-size", type=int, default=8, help="requests running at once")
    g.add_argument("--max-num-tokens", type=int, default=None, help="tokens of one step, all requests")
    g.add_argument("--max-context", type=int, default=4096, help="prompt + output tokens of a request")
    g.add_argument("--kv-blocks", type=int, default=2048, help="full-attention KV cache blocks")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--interval", type=int, default=256, help="store a checkpoint every INTERVAL prompt tokens")
    g.add_argument("--prefill-chunk", type=int, default=2048, help="prefill tokens of one request per step")
    g.add_argument("--prompt-only", action="store_true", help="checkpoint prompt ends only")
    g.add_argument("--tensorrt", action="store_true", help="also build the checkpoint codec (store, load, "
                   "wr merge) as TensorRT engines into tensorrt/ (needs tensorrt or tensorrt-rtx)")
    g = p.add_argument_group("serving")
    g.add_argument("--no-decoupled", action="store_true",
                   help="one response per request (for clients using plain infer; no streaming)")
    g.add_argument("--exclude-input-in-output", action="store_true",
                   help="default for requests that do not say: outputs hold only generated tokens")
    g.add_argument("--max-queue-delay-microseconds", type=int, default=0, help="Triton dynamic batching delay")


def engine_options(args) -> dict:
    """The EngineConfig fields, validated now (EngineConfig checks types and ranges)."""
    from trtllm_dasc.engine.config import EngineConfig
    opts = dict(model="model", wmax=args.wmax, policy=args.policy, selection=args.selection,
                mask_seed=args.mask_seed, codec=args.codec, layout=args.layout,
                state_budget_bytes=args.state_budget_bytes, dtype=args.dtype, device=args.device,
                backend=args.backend, max_batch=args.max_batch_size, max_num_tokens=args.max_num_tokens,
                max_context=args.max_context, block_size=args.block_size, num_kv_blocks=args.kv_blocks,
                interval=args.interval, prefill_chunk=args.prefill_chunk, prompt_only=args.prompt_only,
                plan_path="plan.json", kernel_cache_dir="kernels", tp_size=args.tp,
                placement=args.placement if args.tp > 1 else "off", rank_weights="weights" if args.tp > 1 else None)
    EngineConfig(**opts)
    return opts


def check_args(args) -> None:
    if isinstance(args.tp, bool) or not isinstance(args.tp, int) or args.tp < 1:
        raise UserError(f"--tp must be a positive integer, got {args.tp!r}")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise UserError(f"--model {args.model!r} is not a checkpoint directory (no config.json)")
    if args.max_queue_delay_microseconds < 0:
        raise UserError(f"--max-queue-delay-microseconds must be >= 0, got {args.max_queue_delay_microseconds}")
    out = os.path.abspath(args.output)
    if os.path.abspath(args.model) == out or out.startswith(os.path.abspath(args.model) + os.sep):
        raise UserError("--output must not be the checkpoint directory or inside it")
    check_output(args.output, args.force)


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors") or name == "model.safetensors.index.json"


def copy_model(src: str, dst: str, weights: bool = True) -> int:
    """The checkpoint's files into dst (hard links where the file system allows: no copy of big shards);
    weights=False keeps config and tokenizer only (a TP engine has per-rank weight files instead)."""
    files = [f for f in sorted(os.listdir(src))
             if (f in MODEL_FILES or f.endswith(".safetensors")) and (weights or not _is_weights(f))]
    total = sum(os.path.getsize(os.path.join(src, f)) for f in files)
    os.makedirs(dst)
    done, t0 = 0, time.time()
    for f in files:
        a, b = os.path.join(src, f), os.path.join(dst, f)
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
        done += os.path.getsize(a)
        # a live progress line on a terminal; a log gets the last one only
        if sys.stderr.isatty() or done == total:
            print(f"\r[dasc-build] model files {done / 2**20:8.1f} / {total / 2**20:.1f} MiB "
                  f"({100 * done / max(total, 1):3.0f}%, {time.time() - t0:.1f} s)", end="", file=sys.stderr)
    print(file=sys.stderr)
    return total


def check_weights(args) -> dict:
    """The whole checkpoint checked before anything is written (checkpoint_check.py); what was checked."""
    if getattr(args, "load_format", None) == "dummy":
        return {"skipped": "dummy weights"}
    from build_scripts.checkpoint_check import check_checkpoint
    checked = check_checkpoint(args.model, args.dtype, finite=not getattr(args, "skip_finite_check", False))
    print(f"[dasc-build] checkpoint: {checked['tensors']} tensors, {checked['bytes'] / 2**20:.1f} MiB checked (names, "
          f"shapes, dtypes, vocabulary{', finite values' if checked['finite_checked'] else '; finite check skipped'}, "
          f"{checked['seconds']:.1f} s)", file=sys.stderr)
    return checked


def build(args) -> str:
    """Write the engine directory; returns its path."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.serve.repository import fill_model
    from trtllm_dasc.serve.tokenizer import text_model_values

    check_args(args)
    opts = engine_options(args)
    if getattr(args, "tensorrt", False):
        from plugins.engines import check_available
        check_available()
    # plan first: a checkpoint that cannot be planned fails before anything is written
    t0 = time.time()
    plan, _ = plan_from_path(args.model, PlanOptions(wmax=args.wmax, tp=opts["tp_size"], placement=opts["placement"],
                                                     codec=args.codec, layout=args.layout, selection=args.selection,
                                                     mask_seed=args.mask_seed), conv_dtype=args.dtype)
    if args.tp > 1 and plan.moved_units and args.layout != "ragged":
        raise UserError(f"--placement {args.placement} moves checkpoint units between ranks, which the run time "
                        "does for the ragged layout only: use --layout ragged or --placement off")
    report = plan.report(args.state_budget_bytes)
    kept = sum(map(len, plan.retained)) / (plan.config.units_per_layer * plan.config.num_linear_layers)
    print(f"[dasc-build] plan: W_max {args.wmax}, {kept:.1%} of the units kept, {report['bottleneck_slot_bytes']:,} B "
          f"per checkpoint ({report['compression_ckpt']:.2f}x smaller than dense, {time.time() - t0:.1f} s)",
          file=sys.stderr)
    checked = check_weights(args)
    with open(os.path.join(args.model, "config.json")) as f:
        model_config = json.load(f)
    out = os.path.abspath(args.output)
    with staged_output(out, args.force) as tmp:
        copy_model(args.model, os.path.join(tmp, "model"), weights=args.tp == 1)
        HybridConfig.from_path(os.path.join(tmp, "model"))     # the copy is complete and parses
        if args.tp > 1:
            from trtllm_dasc.model.rank_weights import write_rank_weights
            t1 = time.time()

            def progress(rank, size):
                print(f"[dasc-build] rank {rank + 1}/{args.tp} weights: {size / 2**20:.1f} MiB "
                      f"({time.time() - t1:.1f} s)", file=sys.stderr, flush=True)
            write_rank_weights(args.model, os.path.join(tmp, "weights"), args.tp, plan.bundle_order, progress)
        os.makedirs(os.path.join(tmp, "kernels"))
        if getattr(args, "tensorrt", False):
            from plugins.engines import write_codec_engines
            write_codec_engines(tmp, plan, args.policy, args.max_batch_size, args.dtype, args.prefill_chunk,
                                args.interval)
        with open(os.path.join(tmp, "plan.json"), "w") as f:
            json.dump({**plan.to_dict(), **{k: v for k, v in report.items() if k not in plan.to_dict()}}, f, indent=1)
        serving = {"decoupled": not args.no_decoupled, "exclude_input_in_output": args.exclude_input_in_output,
                   "max_batch_size": args.max_batch_size,
                   "max_queue_delay_microseconds": args.max_queue_delay_microseconds}
        meta = {"dasc_engine_version": ENGINE_VERSION, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "source": os.path.abspath(args.model), "engine": opts, "serving": serving,
                "checkpoint_check": checked, "model_config": model_config}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(meta, f, indent=1)
        repo = os.path.join(tmp, "model_repo")
        values = {"max_batch_size": args.max_batch_size, "decoupled_mode": str(not args.no_decoupled).lower(),
                  "max_queue_delay_microseconds": args.max_queue_delay_microseconds,
                  # relative to the model's directory: the engine directory can move
                  "engine_dir": "../..", "exclude_input_in_output": str(args.exclude_input_in_output).lower()}
        fill_model("dasc_hybrid", repo, values)
        extra = {}
        if os.path.isfile(os.path.join(tmp, "model", "tokenizer.json")):
            # text in, text out: the checkpoint's own tokenizer, found relative to each model's directory
            extra = text_model_values(os.path.join(tmp, "model"), max_batch_size=args.max_batch_size)
            for name in ("preprocessing", "postprocessing"):
                extra[name]["tokenizer_dir"] = "../../model"
        for name, model_values in extra.items():
            fill_model(name, repo, model_values)
    print(f"[dasc-build] wrote {out}: models {', '.join(['dasc_hybrid', *extra])}", file=sys.stderr)
    return out


def run(args) -> int:
    build(args)
    return 0


def main(argv=None) -> int:
    from trtllm_dasc.cli import run_command
    return run_command("dasc-build", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
