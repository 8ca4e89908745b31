"""`dasc-build`: a Hugging Face checkpoint -> a self-contained engine directory, like `trtllm-build`.

    ENGINE_DIR/
      config.json     every option (the EngineConfig, serving options) and the model's config.json
      plan.json       the dasc plan (`dasc plan --json`): what each checkpoint keeps, the wr window, bytes
      model/          the checkpoint's files (config, safetensors, tokenizer), copied (hard-linked when it can);
                      with --load-format dummy only config.json and dummy_weights.json (the seed): each rank
                      makes its weights on its device at load time, nothing of their size is ever written
      kernels/        Triton's compiled-kernel cache, filled by the server's warm-up and reused afterwards
      model_repo/     the filled Triton model repository: tensorrt_llm, dasc_hybrid (its earlier name, forwarding
                      to it) (+ preprocessing, postprocessing, tensorrt_llm_bls and
                      ensemble when the checkpoint has a tokenizer); serve it with `dasc serve ENGINE_DIR`

Every option is checked before anything is written; a bad one is a one-line error and exit code 2.
"""
from __future__ import annotations

import filecmp
import json
import os
import shutil
import sys
import time
import uuid

from build_scripts.engine_output import check_output, staged_output
from trtllm_dasc import engine_dir
from trtllm_dasc.errors import UserError
from trtllm_dasc.spec import (BACKENDS, DEFAULT_EVICTION, DTYPES, EVICTIONS, LOAD_FORMATS, add_arm_arguments,
                              build_placement, plan_fields)
from trtllm_dasc.spec import DEFAULT_HOST_WRITE_POLICY, DEFAULT_TP_TIMEOUT_S, HOST_WRITE_POLICIES
from trtllm_dasc.spec import DEFAULT_OUT_OF_VOCAB_INPUTS, OUT_OF_VOCAB_INPUTS

DUMMY_NOTE = ("DUMMY WEIGHTS: random values made at load time (dasc-build --load-format dummy); outputs are "
              "meaningless, speeds and memory are those of the real model")
# the checkpoint files an engine directory keeps
MAX_QUEUE_DELAY_US = 3_600_000_000
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "model.safetensors.index.json")


def add_arguments(p, groups=None) -> None:
    """The build options on `p`; their sections (dasc, weights, runtime, ...) on `groups` (default `p`): a caller
    that puts the first options in an argument group passes its parser, since argparse's help leaves out a group
    made inside a group."""
    groups = p if groups is None else groups
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (config.json + safetensors); "
                   "with --load-format dummy a bare config.json or a directory holding only one")
    p.add_argument("--output", required=True, help="engine directory to create")
    p.add_argument("--force", action="store_true", help="replace an existing engine directory (only a dasc engine)")
    p.add_argument("--allow-unused-tensors", action="store_true", help="build although the checkpoint holds "
                   "tensors no part of the model loads (refused by default: config.json may not describe the weights)")
    p.add_argument("--skip-finite-check", action="store_true", help="do not read every weight for NaN / Inf "
                   "before building (names, shapes and dtypes are still checked; recorded in the engine)")
    g = groups.add_argument_group("dasc")
    add_arm_arguments(g, ("wmax", "selection", "mask_seed", "policy", "codec", "precision", "conv_codec", "layout", "tp", "placement"))
    g.add_argument("--state-budget-bytes", type=int, default=None,
                   help="checkpoint pool bytes per rank (default: 64 dense checkpoints' worth)")
    g.add_argument("--host-cache-bytes", type=int, default=0,
                   help="host memory per rank (pinned on a GPU) for checkpoints evicted from the device: demoted "
                        "there instead of dropped, promoted back on a hit (default 0: off)")
    g.add_argument("--eviction", default=DEFAULT_EVICTION, choices=EVICTIONS,
                   help="checkpoint eviction in both tiers: lru, or cost (prefill FLOPs saved per byte, aged by "
                        f"recency: Marconi's rule); default {DEFAULT_EVICTION}")
    g.add_argument("--host-write-policy", default=DEFAULT_HOST_WRITE_POLICY, choices=HOST_WRITE_POLICIES,
                   help="when a checkpoint reaches the host tier: write-back (copied when the device evicts it) "
                        "or write-through (copied when it is stored, so an eviction copies nothing); default "
                        f"{DEFAULT_HOST_WRITE_POLICY}")
    g.add_argument("--host-kv-blocks", type=int, default=0,
                   help="host KV blocks per rank (pinned on a GPU, --block-size tokens each): a cached prefix "
                        "evicted from the device KV moves there with its checkpoint instead of being dropped, "
                        "and a hit copies it back (default 0: off)")
    g = groups.add_argument_group("weights")
    g.add_argument("--load-format", default="auto", choices=LOAD_FORMATS,
                   help="safetensors: the checkpoint's weights; dummy: random weights of the config's full size, "
                        "made on each rank's device at load time (nothing but the config is written; the decay "
                        "tensors follow the planner's paper-shaped profile), as vLLM's --load-format dummy; "
                        "auto: safetensors (dummy for a dummy engine's model)")
    g.add_argument("--seed", type=int, default=None, help="seed of --load-format dummy (default: the seed a dummy "
                   "engine's model directory records, else 0)")
    g.add_argument("--memory-limit-bytes", type=int, default=None,
                   help="device memory one rank may take (weights + KV cache + state rows + checkpoint pool); "
                        "checked at build and before loading (default: the device's free memory at load time)")
    g = groups.add_argument_group("runtime")
    g.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="model dtype (default bfloat16)")
    g.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default cuda)")
    g.add_argument("--backend", default="auto", choices=BACKENDS,
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
    g.add_argument("--max-step-captures", type=int, default=None, help="checkpoints one step captures (default: "
                   "as many as its chunks meet); a chunk past it stops before the capture, the next step takes it. "
                   "Bounds the step's tensors in the memory check")
    g.add_argument("--tp-timeout-s", type=float, default=DEFAULT_TP_TIMEOUT_S, help="how long a TP rank waits in "
                   "a collective for the others, and the longest a step may run at TP, before every rank aborts (a "
                   "hung rank holds the server that long; default %(default)g)")
    g.add_argument("--tensorrt", action="store_true", help="also build the checkpoint codec (store, load, "
                   "wr merge) as TensorRT engines into tensorrt/ (needs tensorrt or tensorrt-rtx; --codec native|int8, "
                   "--precision uniform and --conv-codec native only)")
    g = groups.add_argument_group("ablation (measurements only: makes the engine slower on purpose)")
    g.add_argument("--ablation-step-delay-ms", type=float, default=0.0,
                   help="hold each step's results this many ms more once the engine is ready, as a slower "
                        "engine's would be (does a serving figure depend on the engine's speed?); default 0: off")
    g.add_argument("--ablation-step-slowdown", type=float, default=1.0,
                   help="hold each step's results (X - 1) x the step's own time more: the engine at 1/X of "
                        "its speed; default 1: off")
    g = groups.add_argument_group("serving")
    g.add_argument("--no-decoupled", action="store_true",
                   help="one response per request (for clients using plain infer; no streaming)")
    g.add_argument("--exclude-input-in-output", action="store_true",
                   help="default for requests that do not say: outputs hold only generated tokens")
    g.add_argument("--max-queue-delay-microseconds", type=int, default=0, help="Triton dynamic batching delay")
    g.add_argument("--out-of-vocab-inputs", default=DEFAULT_OUT_OF_VOCAB_INPUTS, choices=OUT_OF_VOCAB_INPUTS,
                   help="a prompt token id outside the vocabulary: zero (embedded as a zero vector, as "
                        "TensorRT-LLM's lookup does; its benchmark_core_model.py sends random ids) or refuse "
                        "(the request fails naming the id); default %(default)s")


def warn_replay_cap(opts: dict, plan_window: int) -> None:
    """A step cap that cannot hold a wr hit's replay beside the other requests' decode tokens: such a hit runs
    only once those decodes have ended, and the FIFO queue behind it waits too (engine/scheduler.py: a replay
    runs whole in its admission step; a held host-tier hit the same). A warning, not a refusal: a small cap
    may be deliberate."""
    from trtllm_dasc.engine.config import replay_tokens
    window = replay_tokens(opts["policy"], plan_window, opts["max_context"], opts.get("replay_window"))
    cap, batch = opts.get("max_num_tokens"), opts["max_batch"]
    if window and cap is not None and cap < batch - 1 + window:
        print(f"[dasc-build] warning: --max-num-tokens {cap} is less than --max-batch-size {batch} - 1 decode tokens "
              f"+ the {window}-token replay window: a cached hit waits for the running decodes to end (and the queue "
              f"behind it too); give --max-num-tokens >= {batch - 1 + window}", file=sys.stderr)


def warn_kv_context(opts: dict, plan_window: int) -> None:
    """A KV cache that cannot hold one sequence of --max-context (with a wr hit's replay blocks: the scheduler's
    worst_case_blocks): a request is then served with its output cut to what the cache holds (serve/host.py)
    and a prompt longer than that is refused, so the context the engine advertises is not the one it serves.
    A warning, not a refusal: a small cache may be deliberate."""
    from trtllm_dasc.engine.config import replay_tokens
    from trtllm_dasc.engine.scheduler import worst_case_blocks
    ctx, bs, blocks = opts["max_context"], opts["block_size"], opts["num_kv_blocks"]
    window = replay_tokens(opts["policy"], plan_window, ctx, opts.get("replay_window"))
    # the worst sequence of the context: a prompt of ctx - 1 tokens (the longest replay) and one output token
    need = worst_case_blocks(ctx - 1, 1, bs, window)
    if blocks < need:
        print(f"[dasc-build] warning: --kv-blocks {blocks} of --block-size {bs} cannot hold a sequence of "
              f"--max-context {ctx}" + (f" with a {window}-token replay" if window else "") + ": longer sequences "
              f"are refused and outputs cut to what the cache holds; give --kv-blocks >= {need} for the whole "
              "context", file=sys.stderr)


def engine_options(args) -> dict:
    """The EngineConfig fields, validated now (EngineConfig checks types and ranges)."""
    from trtllm_dasc.engine.config import EngineConfig
    opts = dict(model=engine_dir.MODEL, wmax=args.wmax, policy=args.policy, selection=args.selection,
                mask_seed=args.mask_seed, codec=args.codec, layout=args.layout,
                precision=getattr(args, "precision", "uniform"), conv_codec=getattr(args, "conv_codec", "native"),
                state_budget_bytes=args.state_budget_bytes, dtype=args.dtype, device=args.device,
                backend=args.backend, max_batch=args.max_batch_size, max_num_tokens=args.max_num_tokens,
                max_context=args.max_context, block_size=args.block_size, num_kv_blocks=args.kv_blocks,
                interval=args.interval, prefill_chunk=args.prefill_chunk, prompt_only=args.prompt_only,
                max_step_captures=getattr(args, "max_step_captures", None),
                tp_timeout_s=getattr(args, "tp_timeout_s", DEFAULT_TP_TIMEOUT_S),
                out_of_vocab_inputs=getattr(args, "out_of_vocab_inputs", DEFAULT_OUT_OF_VOCAB_INPUTS),
                plan_path=engine_dir.PLAN, kernel_cache_dir=engine_dir.KERNELS, tp_size=args.tp,
                placement=build_placement(args.placement, args.tp),
                rank_weights=engine_dir.RANK_WEIGHTS if args.tp > 1 and not dummy(args) else None,
                rank_weights_id=uuid.uuid4().hex if args.tp > 1 and not dummy(args) else None,
                load_format="dummy" if dummy(args) else "safetensors",
                memory_limit_bytes=getattr(args, "memory_limit_bytes", None),
                host_cache_bytes=getattr(args, "host_cache_bytes", 0), eviction=getattr(args, "eviction", "lru"),
                host_write_policy=getattr(args, "host_write_policy", DEFAULT_HOST_WRITE_POLICY),
                host_kv_blocks=getattr(args, "host_kv_blocks", 0),
                step_delay_s=getattr(args, "ablation_step_delay_ms", 0.0) / 1000.0,
                step_slowdown=getattr(args, "ablation_step_slowdown", 1.0))
    # the normalised spec (thresholds and codecs spelled out) is what the engine records
    opts["precision"] = EngineConfig(**opts).precision
    return opts


def dummy(args) -> bool:
    """Whether the engine gets dummy weights: --load-format dummy, or auto on a dummy engine's model."""
    fmt = getattr(args, "load_format", "auto")
    if fmt == "auto" and os.path.isdir(args.model):
        from trtllm_dasc.checkpoint_files import DUMMY_MARKER
        return os.path.isfile(os.path.join(args.model, DUMMY_MARKER))
    return fmt == "dummy"


def resolve_seed(args) -> int:
    """--seed, else the seed a dummy engine's model directory records (its weights are remade the same), else 0."""
    seed = getattr(args, "seed", None)
    if seed is None and os.path.isdir(args.model):
        from trtllm_dasc.checkpoint_files import dummy_marker
        seed = (dummy_marker(args.model) or {}).get("seed")
    return 0 if seed is None else seed


def resolve_profile(args) -> str:
    """The decay profile of dummy weights: the one a dummy engine's model directory records (its weights are
    remade the same), else the current default."""
    from trtllm_dasc.checkpoint_files import dummy_marker
    from trtllm_dasc.plan.synthetic import profile_of_record
    return profile_of_record(dummy_marker(args.model) if os.path.isdir(args.model) else None)


def model_config_file(args) -> str:
    """--model's config.json (a bare file is accepted for dummy weights only)."""
    if dummy(args) and os.path.isfile(args.model):
        return args.model
    return os.path.join(args.model, "config.json")


def check_args(args) -> None:
    from trtllm_dasc.plan.precision import check_device_runs, parse_precision
    bands = parse_precision(getattr(args, "precision", "uniform"), args.wmax if isinstance(args.wmax, int) else None)
    check_device_runs(bands, args.codec)
    if isinstance(args.tp, bool) or not isinstance(args.tp, int) or args.tp < 1:
        raise UserError(f"--tp must be a positive integer, got {args.tp!r}")
    if getattr(args, "load_format", "auto") not in LOAD_FORMATS:
        raise UserError(f"--load-format must be one of {'|'.join(LOAD_FORMATS)}, got {args.load_format!r}")
    engine_dir.refuse_engine_as_checkpoint(args.model)
    if getattr(args, "seed", None) is not None and os.path.exists(args.model) and not dummy(args):
        # it would be accepted and do nothing: real weights have no seed
        raise UserError(f"--seed {args.seed} is for --load-format dummy (random weights); these weights are the "
                        "checkpoint's")
    seed = args.seed = resolve_seed(args)
    # read once here, as the seed: the plan, the memory check and the weights record all use it
    args.decay_profile = resolve_profile(args)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise UserError(f"--seed must be a non-negative integer, got {seed!r}")
    if not os.path.isfile(model_config_file(args)):
        what = "a config.json or a directory holding one" if dummy(args) else "a checkpoint directory"
        raise UserError(f"--model {args.model!r} is not {what} (no config.json)")
    if (not dummy(args) and getattr(args, "load_format", "auto") == "safetensors"
            and not os.path.isfile(os.path.join(args.model, "model.safetensors.index.json"))
            and not any(f.endswith(".safetensors") for f in os.listdir(args.model))):
        raise UserError(f"--model {args.model!r} holds no safetensors weights: pass --load-format dummy for "
                        "random weights of its config")
    # config.pbtxt holds it as a uint64, and past an hour it is no batching delay but a stall; a value over
    # uint64 wrote a repository tritonserver could not parse ("Value out of range")
    if not 0 <= args.max_queue_delay_microseconds <= MAX_QUEUE_DELAY_US:
        raise UserError(f"--max-queue-delay-microseconds must be in [0, {MAX_QUEUE_DELAY_US}] (one hour), got "
                        f"{args.max_queue_delay_microseconds}")
    out = os.path.abspath(args.output)
    if os.path.abspath(args.model) == out or out.startswith(os.path.abspath(args.model) + os.sep):
        raise UserError("--output must not be the checkpoint directory or inside it")
    check_output(args.output, args.force)


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors") or name == "model.safetensors.index.json"


def _index_shards(src: str) -> set[str]:
    """The shard files model.safetensors.index.json names (any file name: the runtime reads what it names)."""
    try:
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            weight_map = json.load(f).get("weight_map") or {}
        return {str(v) for v in weight_map.values() if os.path.basename(str(v)) == str(v)}
    except (OSError, ValueError, AttributeError):
        return set()


def copy_model(src: str, dst: str, weights: bool = True) -> int:
    """The checkpoint's files into dst: shards as hard links where the file system allows (no copy of big
    files), the small JSON files copied (a hard-linked config.json edited in place in the source checkpoint
    after the build changed the engine's model); every shard the index names, whatever its name.
    weights=False keeps config and tokenizer only (a TP engine has per-rank weight files instead)."""
    shards = _index_shards(src)
    files = [f for f in sorted(os.listdir(src))
             if (f in MODEL_FILES or f.endswith(".safetensors") or f in shards)
             and (weights or not (_is_weights(f) or f in shards))]
    total = sum(os.path.getsize(os.path.join(src, f)) for f in files)
    os.makedirs(dst)
    done, t0 = 0, time.time()
    for f in files:
        a, b = os.path.join(src, f), os.path.join(dst, f)
        try:
            if f in MODEL_FILES:
                raise OSError("copied, not linked")
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


def check_weights(args, is_dummy: bool) -> dict:
    """The whole checkpoint checked before anything is written (checkpoint_check.py); what was checked."""
    if is_dummy:
        return {"skipped": "dummy weights"}
    from build_scripts.checkpoint_check import check_checkpoint
    checked = check_checkpoint(args.model, args.dtype, finite=not getattr(args, "skip_finite_check", False),
                               allow_unused=getattr(args, "allow_unused_tensors", False))
    print(f"[dasc-build] checkpoint: {checked['tensors']} tensors, {checked['bytes'] / 2**20:.1f} MiB checked (names, "
          f"shapes, dtypes, vocabulary{', finite values' if checked['finite_checked'] else '; finite check skipped'}, "
          f"{checked['seconds']:.1f} s)" + (f"; {checked['unused_tensors']} tensor(s) nothing loads, left out "
                                            "(--allow-unused-tensors)" if checked["unused_tensors"] else ""),
          file=sys.stderr)
    return checked


def build(args) -> str:
    """Write the engine directory; returns its path."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.plan.plan import plan_from_params
    from trtllm_dasc.plan.synthetic import profile_decay_params
    from trtllm_dasc.serve.repository import (ENGINE_MODEL, add_alias, add_parameters, cache_policy, fill_model,
                                              rename_model)
    from trtllm_dasc.serve.tokenizer import text_model_values

    # a namespace made by hand (tests, dasc serve's older callers) may lack the weights options
    for name, default in (("load_format", "auto"), ("seed", None), ("memory_limit_bytes", None)):
        if not hasattr(args, name):
            setattr(args, name, default)
    check_args(args)
    opts = engine_options(args)
    if getattr(args, "tensorrt", False):
        from plugins.engines import check_available, check_supported
        # what the codec graphs implement first: a refusal that holds whether or not TensorRT is installed
        check_supported(opts["codec"], opts["precision"], opts["conv_codec"])
        check_available()
    is_dummy = dummy(args)
    # config.json is parsed here, once: the planner, the copy check and the engine's records use this
    raw_config, model_config, completed = read_model_config(args, is_dummy)
    cfg = HybridConfig.from_dict(model_config, conv_dtype=args.dtype)
    # the linear-attention heads first (the planner's own message), then the network and its experts
    cfg.shard(args.tp)
    check_network(cfg, args.tp, require=is_dummy)
    # plan first: a checkpoint that cannot be planned fails before anything is written
    t0 = time.time()
    options = PlanOptions(**plan_fields(opts))
    if is_dummy:
        # the decay tensors the dummy loader will make: the planner's paper-shaped profile of this seed
        plan, _ = plan_from_params(cfg, profile_decay_params(cfg, args.seed, args.decay_profile), options)
    else:
        plan, _ = plan_from_path(args.model, options, cfg=cfg)
    if args.tp > 1 and plan.moved_units and args.layout != "ragged":
        raise UserError(f"--placement {args.placement} moves checkpoint units between ranks, which the run time "
                        "does for the ragged layout only: use --layout ragged or --placement off")
    footprint = check_build_memory(args, opts, cfg, plan, is_dummy)
    warn_replay_cap(opts, plan.replay_window)
    warn_kv_context(opts, plan.replay_window)
    from trtllm_dasc.serve.tritonserver import whitespace_in
    if whitespace_in(args.output):
        # dasc serve refuses such a path (serve/tritonserver.py): said now, not after the build
        print(f"[dasc-build] warning: the output path {whitespace_in(args.output)!r} contains whitespace, which "
              "Triton's Python backend cannot serve from: dasc serve will refuse it until it is moved",
              file=sys.stderr)
    trained = model_config.get("max_position_embeddings")
    if isinstance(trained, int) and not isinstance(trained, bool) and args.max_context > trained:
        # a warning, not a refusal: a user may extend the context on purpose (NoPE attention, a RoPE the model
        # extrapolates), but positions past the trained length give outputs nobody measured
        print(f"[dasc-build] warning: --max-context {args.max_context} exceeds the model's max_position_embeddings "
              f"{trained}: positions past it were not trained", file=sys.stderr)
    report = plan.report(args.state_budget_bytes)
    kept = sum(map(len, plan.retained)) / (plan.config.units_per_layer * plan.config.num_linear_layers)
    print(f"[dasc-build] plan: W_max {args.wmax}, {kept:.1%} of the units kept, {report['bottleneck_slot_bytes']:,} B "
          f"per checkpoint ({report['compression_ckpt']:.2f}x smaller than dense, {time.time() - t0:.1f} s)",
          file=sys.stderr)
    checked = check_weights(args, is_dummy)
    if is_dummy:
        print(f"[dasc-build] {DUMMY_NOTE}; seed {args.seed}"
              + (f"; released router fields added to the config: {', '.join(completed)}" if completed else ""),
              file=sys.stderr)
    out = os.path.abspath(args.output)
    with staged_output(out, args.force) as tmp:
        if is_dummy:
            write_dummy_model(args, os.path.join(tmp, engine_dir.MODEL), model_config, completed, raw_config)
        else:
            copy_model(args.model, os.path.join(tmp, engine_dir.MODEL), weights=args.tp == 1)
            # the copy is complete: the config the plan was made from, byte for byte
            if not filecmp.cmp(model_config_file(args), os.path.join(tmp, engine_dir.MODEL, "config.json"),
                               shallow=False):
                raise UserError(f"the copy of {model_config_file(args)} differs from it: was --model changed "
                                "during the build?")
        if args.tp > 1 and not is_dummy:
            from trtllm_dasc.model.rank_weights import write_rank_weights
            t1 = time.time()

            def progress(rank, size):
                print(f"[dasc-build] rank {rank + 1}/{args.tp} weights: {size / 2**20:.1f} MiB "
                      f"({time.time() - t1:.1f} s)", file=sys.stderr, flush=True)
            write_rank_weights(args.model, os.path.join(tmp, engine_dir.RANK_WEIGHTS), args.tp, plan.bundle_order,
                               progress, build_id=opts["rank_weights_id"])
        os.makedirs(os.path.join(tmp, engine_dir.KERNELS))
        if getattr(args, "tensorrt", False):
            from plugins.engines import write_codec_engines
            write_codec_engines(tmp, plan, args.policy, args.max_batch_size, args.dtype, args.prefill_chunk,
                                args.interval)
        with open(os.path.join(tmp, engine_dir.PLAN), "w") as f:
            json.dump({**plan.to_dict(), **{k: v for k, v in report.items() if k not in plan.to_dict()}}, f, indent=1)
        opts["plan_digest"] = plan.digest()
        serving = {"decoupled": not args.no_decoupled, "exclude_input_in_output": args.exclude_input_in_output,
                   "max_batch_size": args.max_batch_size,
                   "max_queue_delay_microseconds": args.max_queue_delay_microseconds}
        engine_dir.write(tmp, engine=opts, serving=serving, source=os.path.abspath(args.model),
                         checkpoint_check=checked, model_config=model_config,
                         weights=weights_record(args, is_dummy, completed, raw_config),
                         memory_per_rank=None if footprint is None else {
                             "weights": footprint.weights, "kv_cache": footprint.kv, "state_rows": footprint.state,
                             "checkpoint_pool": footprint.pool, "total": footprint.total})
        repo = os.path.join(tmp, engine_dir.REPOSITORY)
        # the engine's own model is decoupled in both modes: it batches every request it holds in flight
        values = {"max_batch_size": args.max_batch_size, "decoupled_mode": "true",
                  "max_queue_delay_microseconds": args.max_queue_delay_microseconds,
                  # relative to the model's directory: the engine directory can move
                  "engine_dir": "../..", "exclude_input_in_output": str(args.exclude_input_in_output).lower()}
        add_parameters(fill_model("tensorrt_llm", repo, values), {
            "load_format": "dummy" if is_dummy else "safetensors",
            "weights": f"{DUMMY_NOTE}; seed {args.seed}" if is_dummy else "checkpoint weights (safetensors)",
            "dasc_policy": cache_policy(opts["wmax"], opts["policy"], opts["codec"], opts["precision"],
                                        opts["conv_codec"])})
        if args.no_decoupled:
            # plain infer (one response per request) with in-flight batching: the engine loads once as
            # the decoupled tensorrt_llm_engine; tensorrt_llm and dasc_hybrid are non-decoupled forwarders
            # with one instance per batch slot (each blocks on one request's stream), so requests of
            # several clients share the engine's batch, and a stop or cancellation reaches it by id
            rename_model(repo, "tensorrt_llm", ENGINE_MODEL)
            for name in ("tensorrt_llm", "dasc_hybrid"):
                add_alias(repo, name, ENGINE_MODEL, template="dasc_hybrid", decoupled=False,
                          instances=args.max_batch_size)
            models = [ENGINE_MODEL, "tensorrt_llm", "dasc_hybrid"]
        else:
            # the earlier name: a BLS forwarder to tensorrt_llm (one engine), for clients that still use it
            add_alias(repo, "dasc_hybrid", "tensorrt_llm")
            models = ["tensorrt_llm", "dasc_hybrid"]
        extra = {}
        if os.path.isfile(os.path.join(tmp, engine_dir.MODEL, "tokenizer.json")):
            # text in, text out: the checkpoint's own tokenizer, found relative to each model's directory.
            # With --no-decoupled the ensemble is plain too, over the plain tensorrt_llm (TensorRT-LLM's tools
            # call client.infer("ensemble", ...) on such a repository; a decoupled ensemble refused them)
            extra = text_model_values(os.path.join(tmp, engine_dir.MODEL), max_batch_size=args.max_batch_size,
                                      core_model="tensorrt_llm", written_as="../../model",
                                      decoupled=not args.no_decoupled)
            extra["tensorrt_llm_bls"] = {"max_batch_size": args.max_batch_size,
                                         "decoupled_mode": str(not args.no_decoupled).lower()}
        for name, model_values in extra.items():
            fill_model(name, repo, model_values)
    print(f"[dasc-build] wrote {out}: models {', '.join([*models, *extra])}", file=sys.stderr)
    return out


# --no-decoupled: the internal (decoupled) model holding the engine


def read_model_config(args, is_dummy: bool) -> tuple[dict, dict, list[str]]:
    """--model's config.json, and for dummy weights the released router fields it lacks (families/released.py):
    (config as read, config completed, the fields added)."""
    from trtllm_dasc.checkpoint_files import read_json
    from trtllm_dasc.families import ConfigError
    raw = read_json(model_config_file(args), ConfigError)
    if not isinstance(raw, dict):
        raise UserError(f"{model_config_file(args)} must hold a JSON object")
    if not is_dummy:
        return raw, raw, []
    from trtllm_dasc.families.released import complete_released
    return (raw, *complete_released(raw))


def check_network(cfg, tp: int, require: bool) -> None:
    """The network part of the config (required for dummy weights: they are made from it) and how the TP
    degree splits the experts: each expert's intermediate channels (and the shared expert's) must split
    evenly, or the layer would be replicated on every rank unnoticed."""
    schema = cfg.schema
    net = schema.require_network() if require else schema.network
    if net is None or "moe" not in net.mlp_types:
        return
    for what, width in (("routed expert", net.moe_intermediate_size), ("shared expert", net.shared_intermediate_size)):
        if width and width % tp:
            raise UserError(f"--tp {tp} splits each {what}'s {width} intermediate channels unevenly: use a TP "
                            f"degree that divides {width}")


def check_build_memory(args, opts: dict, cfg, plan, is_dummy: bool):
    """With --memory-limit-bytes: rank 0's footprint, refused in one line when over the limit (the runner
    checks again, against the device, before loading). Returns the footprint (None without a limit)."""
    if getattr(args, "memory_limit_bytes", None) is None:
        return None
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.loading import check_memory
    from trtllm_dasc.engine.runner import DENSE_SLOTS_DEFAULT, replay_window
    from trtllm_dasc.model.weights import CheckpointReader, DummyWeights
    source = DummyWeights(cfg, args.seed, profile=args.decay_profile) if is_dummy else CheckpointReader(args.model)
    budget = args.state_budget_bytes or (DENSE_SLOTS_DEFAULT + 1) * cfg.dense_checkpoint_bytes_per_rank(args.tp)
    engine_cfg = EngineConfig(**opts)
    # the runner's own check, with its replay spans (a wr engine's step is larger: model/workspace.py)
    return check_memory(engine_cfg, cfg, source, 0, plan.bundle_order, 2 * args.max_batch_size, budget,
                        replay_window(engine_cfg, plan.replay_window))


def write_dummy_model(args, dst: str, model_config: dict, completed: list[str], raw: dict) -> None:
    """model/ of a dummy engine: the (completed) config.json, the dummy record, the tokenizer files if --model
    has them; no weights."""
    from trtllm_dasc.checkpoint_files import DUMMY_MARKER
    if os.path.isdir(args.model):
        copy_model(args.model, dst, weights=False)
    else:
        os.makedirs(dst)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(model_config, f, indent=1)
    with open(os.path.join(dst, DUMMY_MARKER), "w") as f:
        json.dump(weights_record(args, True, completed, raw), f, indent=1)


def weights_record(args, is_dummy: bool, completed: list[str], raw: dict) -> dict:
    """The engine's weights record; ``raw``: --model's config.json as read (before completion)."""
    if not is_dummy:
        return {"load_format": "safetensors"}
    from trtllm_dasc.families.released import released_name
    return {"load_format": "dummy", "seed": args.seed, "note": DUMMY_NOTE,
            "decay_profile": args.decay_profile,
            "released_shapes": released_name(raw), "completed_fields": completed}


def run(args) -> int:
    build(args)
    return 0


def main(argv=None) -> int:
    from trtllm_dasc.cli import run_command
    return run_command("dasc-build", __doc__.splitlines()[0], add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
