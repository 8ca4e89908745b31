"""Matched-HBM serving benchmark (paper App. C.2): several arms at one checkpoint budget, each built with
dasc-build, served by its own tritonserver and driven by the same streaming workload.

    python -m clients.matched_hbm --model CKPT --dense-slots 6 --arms dense,nr16,nr16+int8 --out OUT \\
        [--scale 0.1 --blocks-per-phase 1 --concurrency 8 --device cpu]
    python -m clients.matched_hbm --model CKPT --paper --arms dense,nr16,... --cells-dir DIR \\
        [--call-arms dense,nr16 --max-units 20]          # the paper's protocol, one resumable call

--paper: the protocol as App. C.2 states it: 127 deployable dense slots (128 dense physical slots, Eq. 8),
six phases (the dense, W=16, 64, 128, 512 capacity boundaries of dasc-nr and the full dataset), the
dense-boundary phase replayed six times, concurrency 96 (a server batch of 96), chunked prefill 8192, one output
token, seeds 42/123/7, TTFT over HTTP to the first SSE chunk of generate_stream, checkpoints at prompt ends only (the
paper's SGLang keeps a recurrent state only where a prefill ends; --branch-checkpoints keeps the engine's
branch points too). Each flag it sets can still be given; the checkpoint setting is in the manifest's build
flags and the result's "checkpoints", so cells of the two settings never merge.

The unit of work is a cell (arm, phase, block, seed); the manifest (DIR/manifest.json) fixes every cell
before the first runs. With --cells-dir a call runs the cells not yet done there (at most --max-units
(phase, block, seed) units, the baseline dense beside each arm) and writes each cell as it ends; without
it every cell runs in this call. Either way OUT/matched_hbm.json (or --json) gets the result of all the
cells done so far (command, commit, every block's figures, the per-arm summaries) and OUT/matched_hbm.png
the plot of the arms whose cells are all done; benchmarks/merge_matched_hbm.py --cells DIR... joins cell
directories of one measurement. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from clients import arms as armlib
from clients import kv_sizing
from clients import runner
from clients.protocol import Phase, ProtocolConfig, make_phases, phase_budget, repeats
from clients.report import format_table, provenance, write_json
from clients.runner import add_estimate_arguments
from clients.workload import WorkloadConfig, build_workload
from trtllm_dasc.errors import UserError
from trtllm_dasc.provenance import check_results_commit
from trtllm_dasc.spec import DTYPES, LOAD_FORMATS, add_arm_arguments, build_placement


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (config.json + safetensors); "
                   "with --load-format dummy a released config.json or a directory holding only one")
    p.add_argument("--out", default="matched_hbm_out", help="directory for engines, server logs, JSON and plot")
    p.add_argument("--json", default=None, help="result JSON path (default OUT/matched_hbm.json)")
    p.add_argument("--plot", default=None, help="plot path (default OUT/matched_hbm.png); 'none' for no plot")
    p.add_argument("--arms", default="dense,nr16,nr16+int8", help="comma list: dense, nr<W>, wr<W>, wr-warm<W>, "
                   "rand<W>@<seed>, each optionally +int8 / +fp8 / +int4 / +horizon[@seed] (default dense,nr16,nr16+int8)")
    p.add_argument("--paper", action="store_true", help="the paper's App. C.2 protocol: 127 dense slots, six "
                   "phases (dense, nr16, nr64, nr128, nr512 boundaries + the full dataset), dense phase x6, concurrency "
                   "96 (max batch 96), chunked prefill 8192, HTTP SSE, checkpoints at prompt ends only (each can still be set; "
                   "--branch-checkpoints for the engine's branch points)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--state-budget-bytes", type=int, help="the matched checkpoint budget (bytes per rank)")
    g.add_argument("--dense-slots", type=int, help="budget = (K + 1) dense checkpoints: dense gets K slots "
                   "(slot 0 is reserved; the paper's 128 dense physical slots give 127)")
    g = p.add_argument_group("workload")
    g.add_argument("--prompts", type=int, default=12032, help="dataset size (MMLU-Pro test: 12032)")
    g.add_argument("--scale", type=float, default=1.0, help="multiplies the prefix (1500-2500) and question "
                   "(100-300) token lengths")
    g.add_argument("--workload-seed", type=int, default=0, help="seed of the synthetic prompt set (default 0)")
    g = p.add_argument_group("protocol")
    g.add_argument("--seeds", default="42,123,7", help="request-order seeds")
    g.add_argument("--concurrency", type=int, default=96, help="requests in flight at once (default 96, the paper's)")
    g.add_argument("--output-tokens", type=int, default=1, help="tokens generated per request (default 1)")
    g.add_argument("--blocks-per-phase", type=int, default=None, help="an evenly spread subset of each phase's "
                   "blocks (default: all of them, as the paper)")
    g.add_argument("--block-seed", type=int, default=None, help="with --blocks-per-phase: a seeded sample of each "
                   "phase's blocks (the same for every arm) instead of evenly spread ones (--paper: 0)")
    g.add_argument("--dense-repeats", type=int, default=None, help="replays of the dense-boundary phase (default "
                   "1; the paper and --paper: 6)")
    g.add_argument("--full-phase", action="store_true", default=None, help="end with one block of the whole dataset (the "
                   "paper's sixth phase)")
    g.add_argument("--full-fill-last", type=_fill_last, default=None, metavar="N|auto", help="the full-dataset phase "
                   "within a budget: fill only the last N prompts of its fill order (what the whole fill leaves, once N "
                   "overflows every arm's checkpoints: N >= 2 x the most slots + --concurrency); auto: each arm its own "
                   "tail, 2 x its slots + --concurrency (recorded per arm in the manifest); default: all, as the paper")
    g.add_argument("--full-replay-first", type=int, default=None, metavar="R", help="the full-dataset phase within a "
                   "budget: replay only the seeded shuffle's first R requests, weighted as the whole replay in the "
                   "phase-weighted figures (default: all, as the paper)")
    g.add_argument("--phase-arms", default=None, help="comma list of arms whose capacity boundaries make the "
                   "phases (default: --arms); the same list in two runs gives them the same phases, so arms "
                   "split across runs stay comparable")
    g.add_argument("--target-fill", type=float, default=0.85, help="Q(W) = ceil(N(W) / target fill)")
    g.add_argument("--inprocess", default=None, metavar="ARM", help="also run this arm in-process through "
                   "Engine (no Triton): the serving overhead")
    g.add_argument("--request-timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    g.add_argument("--transport", choices=["http", "grpc"], default="http", help="http (default, the paper's): "
                   "POST generate_stream, TTFT to the first SSE chunk; grpc: tritonclient stream, TTFT to the first "
                   "response")
    g = p.add_argument_group("resumable runs")
    g.add_argument("--cells-dir", default=None, help="cells directory: run the cells not yet done there, keep "
                   "the rest (default: OUT/cells, emptied first)")
    g.add_argument("--call-arms", default=None, help="comma list: the arms this call runs (default: all of "
                   "--arms); dense is added to run beside the others")
    g.add_argument("--max-units", type=int, default=None, help="at most this many (phase, block, seed) units "
                   "in this call (a 10-minute device call)")
    g.add_argument("--call-deadline-s", type=float, default=None, help="wall-clock seconds this call may take "
                   "(from its start): a unit is started only when it, the later arms' server starts and their cells "
                   "of it fit, estimated from this call's own units and starts; an arm's first unit runs unless "
                   "it does not fit and a fresh call could do it (GPU; priors below), and always on a CPU")
    add_estimate_arguments(g)
    g.add_argument("--plan-only", action="store_true", help="print the manifest's phases, units and cells (and "
                   "what is done in --cells-dir) and exit: nothing is built or started")
    g = p.add_argument_group("engine (passed to dasc-build)")
    g.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: cuda when available)")
    g.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="model dtype (default bfloat16)")
    add_weight_arguments(g)
    g.add_argument("--max-batch-size", type=int, default=None, help="sequences the server runs at once "
                   "(default 8; --paper 96, its concurrency: a smaller batch would queue the paper's requests "
                   "inside the server and time the queue)")
    g.add_argument("--max-num-tokens", type=int, default=None, help="tokens of one engine step, all requests "
                   "(default: uncapped; --paper 8192)")
    g.add_argument("--prefill-chunk", type=int, default=None, help="prefill tokens of one request per step "
                   "(default 2048; --paper 8192)")
    g.add_argument("--interval", type=int, default=None, help="checkpoint interval (default: longer than any "
                   "prompt, so a prompt takes one slot at its end plus the shared branch points)")
    ck = g.add_mutually_exclusive_group()
    ck.add_argument("--prompt-only", action="store_const", const=True, default=None, help="checkpoint prompt ends "
                    "only, as the paper's SGLang (its hybrid radix cache keeps a recurrent state only where a "
                    "request's prefill ends); --paper sets it")
    ck.add_argument("--branch-checkpoints", dest="prompt_only", action="store_const", const=False, help="also "
                    "checkpoint the radix tree's branch points (shared prefixes then hit for every arm, dense "
                    "too): the engine's default, and --paper's opt-out")
    g.add_argument("--kv-blocks", type=int, default=None, help="default: enough that KV is never evicted (every "
                   "prompt of the largest boundary block at its longest + the running requests), with "
                   "--memory-limit-bytes at most what fits beside the weights (clients/kv_sizing.py)")
    kv_sizing.add_memory_arguments(g)
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    g.add_argument("--step-delay-ms", type=float, default=0.0, help="ablation (issue 33): every arm's engine holds "
                   "each step's results this many ms more once ready (dasc-build --ablation-step-delay-ms): does a "
                   "figure depend on the engine's speed? In the manifest: another cells directory (default 0: off)")
    g.add_argument("--step-slowdown", type=float, default=1.0, help="ablation: every arm's engine at 1/X of its "
                   "speed (dasc-build --ablation-step-slowdown; default 1: off)")
    g.add_argument("--kernel-cache", default=None, help="compiled-kernel cache shared by the arms "
                   "(default OUT/kernels)")
    g.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds a server may take to become "
                   "ready (default 1800)")
    add_arm_arguments(g, ("tp", "placement"))
    g.add_argument("--torch-threads", type=int, default=None, help="the server's OMP_NUM_THREADS (default: "
                   "torch's choice; 1 on a small shared CPU)")
    p.add_argument("--keep-going", action="store_true", help="an arm that fails (its server, its requests, its "
                   "slots against the plan) is recorded under failed_arms and the next arm runs; the exit code is 1")
    p.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--title", default=None, help="plot title")


def _ints(text: str, name: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UserError(f"{name} must be a comma list of integers, got {text!r}") from None


# the paper's App. C.2 settings (--paper); a flag the user gives wins
PAPER = {"dense_slots": 127, "dense_repeats": 6, "full_phase": True, "prefill_chunk": 8192, "max_num_tokens": 8192,
         "block_seed": 0, "max_batch_size": 96}
PAPER_PHASE_ARMS = ("dense", "nr16", "nr64", "nr128", "nr512")


def paper_defaults(args) -> None:
    """Fill the flags left unset: the paper's values with --paper, else the earlier defaults."""
    if getattr(args, "_defaults_done", False):
        return
    args._defaults_done = True
    paper = args.paper
    if args.state_budget_bytes is None and args.dense_slots is None:
        if not paper:
            raise UserError("one of --state-budget-bytes / --dense-slots is required (or --paper: 127 dense slots)")
        args.dense_slots = PAPER["dense_slots"]
    if args.dense_repeats is None:
        args.dense_repeats = PAPER["dense_repeats"] if paper else 1
    if args.full_phase is None:
        args.full_phase = paper
    if args.prefill_chunk is None:
        args.prefill_chunk = PAPER["prefill_chunk"] if paper else 2048
    if args.max_batch_size is None:
        # the paper's 96 concurrent requests all run in the server, none wait in a queue of its own
        args.max_batch_size = PAPER["max_batch_size"] if paper else 8
    if getattr(args, "prompt_only", None) is None:
        # the paper's SGLang checkpoints where a prefill ends; the engine's branch points would let shared
        # few-shot prefixes hit for every arm (the first full-size call's dense hit 97.9% of tokens)
        args.prompt_only = paper
    if paper:
        if args.max_num_tokens is None:
            args.max_num_tokens = PAPER["max_num_tokens"]
        if args.block_seed is None and args.blocks_per_phase is not None:
            args.block_seed = PAPER["block_seed"]
        if args.phase_arms is None:
            # the capacity boundaries of the paper's phases, at the no-TP-balancing capacity ("live N_off")
            suffix = ":off" if args.tp > 1 else ""
            args.phase_arms = ",".join(a if a == "dense" else a + suffix for a in PAPER_PHASE_ARMS)


def _fill_last(text: str):
    """--full-fill-last: a count of prompts, or auto (each arm's own tail)."""
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of prompts or auto, got {text!r}") from None


def check(args) -> tuple[list, ProtocolConfig, WorkloadConfig]:
    """Every option checked before anything is built; returns the arms and the two configs."""
    paper_defaults(args)
    check_weights(args)
    arms = armlib.parse_arms(args.arms)
    if not arms:
        # an empty list ("", ",") left run() with no capacity to take the phases from: a ValueError traceback
        raise UserError(f"--arms names no arm, got {args.arms!r} (e.g. dense,nr16)")
    # --phase-arms "" is the default (--arms); a list that names no arm (",") is refused as --arms is
    if args.phase_arms and not armlib.parse_arms(args.phase_arms):
        raise UserError(f"--phase-arms names no arm, got {args.phase_arms!r} (leave it out for --arms)")
    if args.inprocess in ("", "none"):
        args.inprocess = None
    if args.inprocess is not None and args.inprocess not in {a.spec for a in arms}:
        raise UserError(f"--inprocess {args.inprocess!r} is not one of --arms ({args.arms})")
    if args.tp < 1:
        raise UserError(f"--tp must be >= 1, got {args.tp}")
    if args.inprocess is not None and args.tp > 1:
        raise UserError("--inprocess runs the engine in this process, at TP1 only: leave it out with --tp > 1")
    if args.tp == 1 and any(a.placement not in (None, "off") for a in arms):
        raise UserError("an arm's :storage / :hybrid placement needs --tp > 1 (one rank has nothing to balance)")
    for name in ("concurrency", "max_batch_size", "block_size", "prefill_chunk"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("state_budget_bytes", "dense_slots", "kv_blocks", "interval", "max_num_tokens", "torch_threads",
                 "max_units"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    kv_sizing.check_memory_arguments(args)
    if getattr(args, "call_deadline_s", None) is not None and not args.call_deadline_s > 0:
        raise UserError(f"--call-deadline-s must be > 0, got {args.call_deadline_s}")
    # "not > 0" refuses nan too (it compares false with everything)
    if not (args.request_timeout > 0 and args.ready_timeout > 0):
        raise UserError("--request-timeout and --ready-timeout must be > 0")
    from trtllm_dasc.engine.config import MAX_STEP_DELAY_S, MAX_STEP_SLOWDOWN
    if not 0 <= args.step_delay_ms <= MAX_STEP_DELAY_S * 1000:
        raise UserError(f"--step-delay-ms must be from 0 to {MAX_STEP_DELAY_S * 1000:g}, got {args.step_delay_ms}")
    if not 1 <= args.step_slowdown <= MAX_STEP_SLOWDOWN:
        raise UserError(f"--step-slowdown must be from 1 to {MAX_STEP_SLOWDOWN:g}, got {args.step_slowdown}")
    if args.full_fill_last is not None and not args.prompt_only:
        # the cut fill leaves what the whole fill leaves only where checkpoints sit at prompt ends: the engine's
        # branch points of shared prefixes, stored by older prompts the cut fill never sends, still hit
        # (a review helper: cached replay tokens 280 cut against 351 whole for dense)
        raise UserError("--full-fill-last cuts the full phase's fill, which is exact with prompt-end checkpoints "
                        "only (--prompt-only, the --paper default): leave out --branch-checkpoints")
    seeds = _ints(args.seeds, "--seeds")
    # numpy's seeded generators (request order, prompt set, block sample) take no negative seed: a request-order
    # seed failed with a ValueError traceback only once the first arm's server was serving
    for name, values in (("--seeds", seeds), ("--workload-seed", (args.workload_seed,)),
                         ("--block-seed", () if args.block_seed is None else (args.block_seed,))):
        if any(v < 0 for v in values):
            raise UserError(f"{name} must be non-negative integers, got {min(values)}")
    proto = ProtocolConfig(seeds=seeds, output_tokens=args.output_tokens,
                           blocks_per_phase=args.blocks_per_phase, target_fill=args.target_fill,
                           dense_repeats=args.dense_repeats, full_phase=args.full_phase, block_seed=args.block_seed,
                           full_fill_last=None if args.full_fill_last == "auto" else args.full_fill_last,
                           full_fill_per_arm=args.full_fill_last == "auto", full_replay_first=args.full_replay_first)
    vocab = model_config(args).schema.network.vocab_size
    work = WorkloadConfig(vocab=vocab, prompts=args.prompts, scale=args.scale, seed=args.workload_seed)
    return arms, proto, work


def add_weight_arguments(group) -> None:
    """--load-format and --seed, as every client that builds engines of a model takes them (this one, benchmarks
    serve_wr_fixed_slots); check_weights checks them against --model."""
    group.add_argument("--load-format", default="auto", choices=LOAD_FORMATS, help="dummy: random weights of the "
                       "config's full size made at load time (dasc-build --load-format dummy: nothing of their size "
                       "is written; a released model at its real size on a small disk); auto: the checkpoint's "
                       "safetensors, or dummy for a dummy engine's model")
    group.add_argument("--seed", "--weights-seed", dest="weights_seed", type=int, default=None,
                       help="seed of --load-format dummy (default 0)")


def check_weights(args) -> None:
    """Where the weights come from, checked before anything is built: sets args.model_config (the config.json),
    args.dummy and args.weights_seed (the seed of dummy weights, None for a checkpoint's)."""
    from trtllm_dasc.checkpoint_files import DUMMY_MARKER, dummy_marker, has_weights
    model, fmt = args.model, getattr(args, "load_format", "auto")
    is_dir = os.path.isdir(model)
    config = os.path.join(model, "config.json") if is_dir else model
    if not os.path.isfile(config) or (not is_dir and fmt != "dummy"):
        what = "a config.json or a directory holding one" if fmt == "dummy" else "a checkpoint directory"
        raise UserError(f"--model {model!r} is not {what} (no config.json)"
                        + ("" if fmt == "dummy" or is_dir else ": pass --load-format dummy for random weights of a "
                           "bare config.json"))
    weights = is_dir and has_weights(model)
    marked = is_dir and os.path.isfile(os.path.join(model, DUMMY_MARKER))
    if fmt == "dummy" and weights:
        raise UserError(f"--load-format dummy with --model {model!r}, which holds safetensors weights: serve them "
                        "(leave --load-format out) or give dummy weights a bare config.json")
    dummy = fmt == "dummy" or (fmt == "auto" and marked and not weights)
    if not dummy and not weights:
        raise UserError(f"--model {model!r} holds no safetensors weights: pass --load-format dummy for random "
                        "weights of its config")
    seed = getattr(args, "weights_seed", None)
    if seed is not None and not dummy:
        raise UserError("--seed is the seed of dummy weights: it needs --load-format dummy")
    if dummy and seed is None:
        seed = ((dummy_marker(model) if marked else None) or {}).get("seed", 0)
    if dummy and not 0 <= seed < 2 ** 63:
        raise UserError(f"--seed must be a non-negative integer, got {seed}")
    args.model_config, args.dummy, args.weights_seed = config, dummy, seed if dummy else None


def model_config(args):
    """The HybridConfig the engines are built from: for dummy weights with the released router fields a bare
    released config.json lacks added, as dasc-build adds them (families/released.py)."""
    from trtllm_dasc.checkpoint_files import read_json
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.families import ConfigError
    raw = read_json(args.model_config, ConfigError)
    if args.dummy and isinstance(raw, dict):
        from trtllm_dasc.families.released import complete_released
        raw = complete_released(raw)[0]
    cfg = HybridConfig.from_dict(raw)
    if cfg.schema.network is None:
        raise UserError(f"{args.model_config} has no network fields (vocabulary, MLP): the workload needs its "
                        "vocabulary size")
    return cfg


def weights_record(args) -> dict:
    """What the result says of the weights (nothing for a checkpoint's: older manifests keep their id)."""
    if not args.dummy:
        return {}
    return {"load_format": "dummy", "weights_seed": args.weights_seed,
            "weights": f"DUMMY WEIGHTS (dasc-build --load-format dummy, seed {args.weights_seed}): outputs are "
                       "meaningless, speeds and memory are those of the real model"}


def engine_flags(args, work: WorkloadConfig, phases: list[Phase], output_tokens: int) -> list[str]:
    """dasc-build flags shared by every arm (the runtime must be the same; only the arm differs)."""
    per_request = work.max_prompt_tokens + output_tokens
    blocks_per_request = math.ceil(per_request / args.block_size)
    # KV for every prompt of the largest boundary block plus the running requests: KV never decides a hit
    # there (the full-dataset phase is past every arm's capacity by design; its KV is bounded like the rest)
    bounded = [p.q for p in phases if p.arms != ["full dataset"]] or [p.q for p in phases]
    kv = args.kv_blocks or (max(bounded) + args.max_batch_size) * blocks_per_request
    sized = getattr(args, "kv_plan", None)
    if sized is not None and not args.kv_blocks:
        kv = sized["blocks"]
    flags = ["--tp", args.tp, "--placement", build_placement(args.placement, args.tp),
             "--device", args.device, "--dtype", args.dtype, "--max-batch-size", args.max_batch_size,
             "--prefill-chunk", args.prefill_chunk, "--interval", args.interval or per_request, "--kv-blocks", kv,
             "--block-size", args.block_size, "--max-context", blocks_per_request * args.block_size]
    if args.max_num_tokens:
        flags += ["--max-num-tokens", args.max_num_tokens]
    if args.prompt_only:
        flags.append("--prompt-only")
    if getattr(args, "dummy", False):
        flags += ["--load-format", "dummy", "--seed", args.weights_seed]
    if sized is not None:
        flags += ["--memory-limit-bytes", sized["limit_bytes"]]
    # the ablation knobs only when set: an unset one leaves the manifest (and every cells directory) as before
    if getattr(args, "step_delay_ms", 0.0):
        flags += ["--ablation-step-delay-ms", args.step_delay_ms]
    if getattr(args, "step_slowdown", 1.0) != 1.0:
        flags += ["--ablation-step-slowdown", args.step_slowdown]
    return [str(f) for f in flags]


def exchange_delta(before: dict | None, after: dict | None) -> dict | None:
    """The storage balance's all-to-all over the protocol (rank 0's clock): per store and load, the calls of
    the checkpoint op, its collective calls, bytes this rank sent and milliseconds per op. None: the arm's
    placement moves nothing (no exchange)."""
    from clients.runner import exchange_seconds
    out = exchange_seconds(before, after)
    for v in (out or {}).values():
        v.pop("seconds")
    return out


def size_kv(args, arms, budget: int, work: WorkloadConfig, phases: list[Phase], output_tokens: int) -> dict | None:
    """With --memory-limit-bytes: the KV cache that fits beside the weights (clients/kv_sizing.py), stored as
    args.kv_plan for engine_flags; None without a limit (the earlier default, unchanged)."""
    limit = getattr(args, "memory_limit_bytes", None)
    if limit is None:
        return None
    # the engine's own count includes its largest step's tensors (model/workspace.py): the device limit leaves
    # out only the headroom, and the fixed bytes below carry the step
    device = limit == "device"
    if device:
        limit = kv_sizing.device_limit(args.device, args.memory_headroom_gib)
    from trtllm_dasc.model.weights import CheckpointReader, DummyWeights
    from trtllm_dasc.engine.config import replay_tokens
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    cfg = model_config(args)
    source = DummyWeights(cfg, args.weights_seed) if args.dummy else CheckpointReader(args.model)
    plans = [plan_from_path(args.model, PlanOptions(**a.plan_fields(args.tp, args.placement)),
                            conv_dtype=args.dtype, dummy_seed=args.weights_seed)[0] for a in arms]
    # the largest step of any arm's engine: a wr arm's replays add spans (model/workspace.py step_shape)
    context = math.ceil((work.max_prompt_tokens + output_tokens) / args.block_size) * args.block_size
    window = max(replay_tokens(a.policy, p.replay_window, context) for a, p in zip(arms, plans))
    step, workspace = step_workspace(args, work, output_tokens, window)
    fixed, per_block, seen = 0, 0, set()
    # every arm's engine holds the same weights, rows and pool; its plan's bundle order can change how the
    # weights are cut at TP > 1, so the largest count of the arms' distinct orders
    for plan in plans:
        order = repr(plan.bundle_order)
        if order in seen:
            continue
        seen.add(order)
        fx, pb = kv_sizing.engine_fixed_and_block_bytes(cfg, source, dtype=args.dtype, tp=args.tp,
                                                        bundle_order=plan.bundle_order,
                                                        max_batch=args.max_batch_size, block_size=args.block_size,
                                                        budget=budget, step=step)
        fixed, per_block = max(fixed, fx), max(per_block, pb)
    bpr = math.ceil((work.max_prompt_tokens + output_tokens) / args.block_size)
    kv = kv_sizing.plan_kv(phases, max_batch=args.max_batch_size, blocks_per_request=bpr, limit=limit,
                           fixed=fixed, per_block=per_block)
    if kv["blocks"] < 1 or (args.kv_blocks and fixed + (args.kv_blocks + 1) * per_block > limit):
        raise UserError(f"the engine does not fit --memory-limit-bytes {limit:,}: weights, state rows, pool and the "
                        f"step workspace ({workspace['total']:,} B) take {fixed:,} B, a KV block {per_block:,} B"
                        + (f", --kv-blocks {args.kv_blocks} {args.kv_blocks * per_block:,} B" if args.kv_blocks else ""))
    kv.update(step_workspace_bytes=workspace, step_captures_counted=step.captures)
    if device:
        kv.update(headroom_bytes=int(math.ceil(args.memory_headroom_gib * (1 << 30))))
    args.kv_plan = kv
    return kv


def step_workspace(args, work: WorkloadConfig, output_tokens: int, replay_window: int = 0):
    """(the engine's largest step, its transient tensors: model/workspace.py) for the flags engine_flags passes:
    --max-num-tokens tokens (uncapped: every running request's prefill chunk) over --max-batch-size sequences,
    and as many captures as the scheduler can take in one step (natural_captures: the engine is not capped, so
    a burst of hits that all end in one step is not held back and the measurement sees the engine as served),
    with the replay spans of a wr arm's `replay_window` (engine/runner.replay_window)."""
    import torch
    from trtllm_dasc.model.workspace import step_shape, workspace_of
    context = math.ceil((work.max_prompt_tokens + output_tokens) / args.block_size) * args.block_size
    # the fields engine_flags builds the engine with: the engine computes the same step from them
    step = step_shape(max_num_tokens=args.max_num_tokens, max_batch=args.max_batch_size,
                      prefill_chunk=args.prefill_chunk, max_context=context,
                      interval=args.interval or work.max_prompt_tokens + output_tokens,
                      prompt_only=bool(args.prompt_only), replay_window=replay_window)
    return step, workspace_of(model_config(args).schema, step, getattr(torch, args.dtype).itemsize, args.tp)


def fill_requests(work, phase: Phase, fill_last: int | None = None) -> int:
    """The requests of a cut full-dataset fill: its tail (the phase's, or ``fill_last``) and the category
    firsts sent before it."""
    from clients.protocol import fill_and_replay_order
    lo, hi = phase.blocks[0]
    parts, _ = fill_and_replay_order(work.categories[lo:hi], 0, lo, fill_last or phase.fill_last)
    return sum(map(len, parts))


def per_arm_fill(work, phase: Phase, slots: dict[str, int], concurrency: int) -> dict:
    """A phase with per-arm fill tails (--full-fill-last auto): each arm's tail and its fill's requests, for the
    manifest (fixed before any cell runs, so every call of a directory fills the same)."""
    from clients.protocol import full_fill_tail
    tails = {spec: full_fill_tail(n, concurrency) for spec, n in slots.items()}
    return {"fill_last_by_arm": tails,
            "fill_requests_by_arm": {spec: fill_requests(work, phase, t) for spec, t in tails.items()}}


def check_fill_tail(phases: list[Phase], most_slots: int, concurrency: int) -> None:
    """A full-dataset fill cut to its tail leaves the cache the whole fill leaves only where the tail alone
    overflows every arm's checkpoints (LRU: every older checkpoint is evicted first; an older prompt's KV
    without its checkpoint cannot hit, and goes first when KV runs short): twice the most slots of any arm, and
    the requests in flight, whose completions reorder the tail's last sends."""
    from clients.protocol import full_fill_tail
    need = full_fill_tail(most_slots, concurrency)
    for p in phases:
        if p.fill_last is not None and p.fill_last < need:
            raise UserError(f"--full-fill-last {p.fill_last} does not overflow every arm's checkpoints: it needs "
                            f">= 2 x {most_slots} slots + {concurrency} in flight = {need} (or leave it out: all "
                            f"{p.q} prompts)")


def make_manifest(args, arms, proto, wcfg, work, caps, phases, flags, budget, dense_bytes) -> dict:
    """Everything the figures depend on, fixed before any cell runs: the arms (with their planned slots),
    the phases with the blocks each uses, the seeds, and the engine, workload and client settings."""
    import hashlib
    from clients.protocol import repeats, unit_key, units
    with open(args.model_config, "rb") as f:
        model_sha = hashlib.sha256(f.read()).hexdigest()[:16]
    placement = args.placement if args.tp > 1 else "off"
    keys = [{"key": a.spec, "spec": a.spec, "label": a.label, "target": "triton", "wmax": a.wmax, "policy": a.policy,
             "codec": a.codec, "placement": a.placement or placement, **stored_precision(a), **caps[a.spec]}
            for a in arms]
    if args.inprocess:
        a = next(x for x in arms if x.spec == args.inprocess)
        keys.append({**next(k for k in keys if k["spec"] == a.spec), "key": f"{a.spec}@in-process",
                     "label": a.label + " (in-process)", "target": "in-process"})
    nblocks = {p.q: len(work) // p.q for p in phases}
    selection = ("all" if proto.blocks_per_phase is None else
                 {"blocks_per_phase": proto.blocks_per_phase, "seed": proto.block_seed,
                  "how": "seeded sample" if proto.block_seed is not None else "evenly spread"})
    return {
        "kind": "matched_hbm", "protocol": "paper App. C.2: flush -> untimed fill -> telemetry -> seeded shuffle "
        "-> timed streaming replay -> telemetry, per phase, block and seed",
        "baseline": "dense" if any(a.spec == "dense" for a in arms) else None,
        "arms": keys,
        # a budgeted full-dataset phase says so (absent otherwise: earlier manifests, and their cells, unchanged)
        "phases": [{"name": p.name, "q": p.q, "arms": p.arms, "repeats": repeats(i, proto),
                    "blocks_in_dataset": nblocks[p.q], "blocks": p.blocks,
                    **({"fill_last": p.fill_last, "fill_requests": fill_requests(work, p)} if p.fill_last else {}),
                    **(per_arm_fill(work, p, {a.spec: caps[a.spec]["slots"] for a in arms}, args.concurrency)
                       if p.fill_per_arm else {}),
                    **({"replay_first": p.replay_first} if p.replay_first else {})} for i, p in enumerate(phases)],
        "block_selection": selection,
        "seeds": list(proto.seeds),
        "units": [unit_key(*u) for u in units(phases, proto)],
        "config": {"model": os.path.abspath(args.model), "model_config_sha256": model_sha, "device": args.device,
                   "dtype": args.dtype, "torch_threads": args.torch_threads, "tp": args.tp, "placement": placement,
                   "budget_bytes": budget, "dense_checkpoint_bytes": dense_bytes, "build_flags": flags,
                   "workload": {"prompts": len(work), "scale": wcfg.scale, "seed": wcfg.seed,
                                "prefix_tokens": wcfg.scaled(wcfg.prefix_tokens),
                                "question_tokens": wcfg.scaled(wcfg.question_tokens)},
                   "seeds": list(proto.seeds), "concurrency": args.concurrency, "output_tokens": proto.output_tokens,
                   "target_fill": proto.target_fill, "dense_repeats": proto.dense_repeats,
                   "full_phase": proto.full_phase, "transport": args.transport, **weights_record(args),
                   **({"kv_cache": args.kv_plan} if getattr(args, "kv_plan", None) else {})}}


def stored_precision(arm) -> dict:
    """The arm's precision (normalised: its bands spelled out) and conv codec where they are not the defaults
    (uniform, native): an arm without them keeps the manifest of earlier calls, whose cells then still resume."""
    from trtllm_dasc.plan.precision import parse_precision
    from trtllm_dasc.spec import DEFAULT_CONV_CODEC, DEFAULT_PRECISION
    out = {}
    if arm.precision != DEFAULT_PRECISION:
        out["precision"] = parse_precision(arm.precision, arm.wmax).spec()
    if arm.conv_codec != DEFAULT_CONV_CODEC:
        out["conv_codec"] = arm.conv_codec
    return out


class _Context:
    """What a call's cells share: the parsed flags, the workload, phases, units and the output folder."""

    def __init__(self, args, work, phases, proto, out_dir):
        from clients.protocol import units
        self.args, self.work, self.phases, self.proto, self.out_dir = args, work, phases, proto, out_dir
        self.units = units(phases, proto)


def result_of(manifest: dict, calls: list[dict], cells: list[dict], prov: dict, extra: dict | None = None) -> dict:
    """The result JSON of a measurement from its cells (a run, a resumed run and a merge all write this)."""
    from clients.assemble import assemble
    from clients.targets import TARGET, verdict
    cfg = manifest["config"]
    failed = [{"spec": f["spec"], "error": f["error"]} for c in calls for f in c.get("failed_arms", [])]
    failed += [{"spec": a["key"], "error": a["failed"]} for c in calls for a in c.get("arms", []) if "failed" in a]
    out = {**prov, **cfg, "protocol": manifest["protocol"],
           "phases": [{"name": p["name"], "q": p["q"], "arms": p["arms"], "repeats": p["repeats"],
                       "blocks": p["blocks"], **phase_budget(p)} for p in manifest["phases"]],
           "manifest": {"id": manifest["id"], "units": len(manifest["units"]), "arms": [a["key"] for a in manifest["arms"]],
                        "block_selection": manifest["block_selection"],
                        "blocks_per_phase": {p["name"]: f"{len(p['blocks'])} of {p['blocks_in_dataset']}"
                                             for p in manifest["phases"]}},
           "checkpoints": ("prompt ends" if "--prompt-only" in cfg.get("build_flags", []) else
                           "prompt ends and branch points"),
           "calls": [{k: c.get(k) for k in ("call", "command", "commit", "gpu", "started", "max_units")} for c in calls],
           **(extra or {}), **assemble(manifest, calls, cells)}
    out["target"] = TARGET
    out["target_verdict"] = verdict(out["arms"], cfg.get("model"))
    if not out.get("complete", True):
        from clients.cells_estimate import estimate
        from clients.runner import GPU_REQUEST_ESTIMATE_S
        have = {(c.get("arm"), c.get("unit")) for c in cells}
        out["device_time_left"] = estimate(manifest, cells, lambda key, unit: (key, unit) in have,
                                           GPU_REQUEST_ESTIMATE_S)
    if failed and out.get("complete", True):
        # every cell is done: the failures were an earlier call's, and a later call ran those cells again. Kept
        # as history, not as failed_arms, which says the measurement still misses them (and makes the exit 1)
        out["recovered_failures"] = failed
    elif failed:
        out["failed_arms"] = failed
    return out


def plan_summary(manifest: dict, cells_dir: str | None) -> dict:
    """What --plan-only prints: per phase Q, blocks used and repeats; units and cells, done and to do."""
    from clients.cells import manifest_id
    from clients.cells_estimate import estimate
    from clients.protocol import unit_requests
    from clients.runner import GPU_REQUEST_ESTIMATE_S, plan_units
    done = 0
    if cells_dir and os.path.exists(os.path.join(cells_dir, "manifest.json")):
        from clients.cells import CellStore
        store = CellStore(cells_dir, manifest)
        done = sum(store.done(a["key"], u) for a in manifest["arms"] for u in manifest["units"])
        pending = len(plan_units(store, store.manifest, [a["key"] for a in manifest["arms"]], None))
        left = estimate(store.manifest, store.cells(), store.done, GPU_REQUEST_ESTIMATE_S)
    else:
        pending = len(manifest["units"])
        left = estimate(manifest, [], lambda key, unit: False, GPU_REQUEST_ESTIMATE_S)
    out = {"manifest_id": manifest_id(manifest), "arms": [a["key"] for a in manifest["arms"]],
           "slots": {a["key"]: a["slots"] for a in manifest["arms"]},
           "phases": [{"name": p["name"], "q": p["q"], "blocks": f"{len(p['blocks'])} of {p['blocks_in_dataset']}",
                       "repeats": p["repeats"], **phase_budget(p)} for p in manifest["phases"]],
           **({"kv_cache": manifest["config"]["kv_cache"]} if "kv_cache" in manifest["config"] else {}),
           "units": len(manifest["units"]), "cells": len(manifest["units"]) * len(manifest["arms"]),
           "cells_done": done, "units_pending": pending,
           "requests_per_arm": sum(unit_requests(manifest, u) for u in manifest["units"]),   # the most of any arm
           "requests_by_arm": {a["key"]: sum(unit_requests(manifest, u, a["key"]) for u in manifest["units"])
                               for a in manifest["arms"]},
           # seconds of device time for the cells left (clients/cells_estimate.py: two schedules)
           "device_time_left": left}
    print(json.dumps(out, indent=1))
    return {**out, "plan_only": True}


def gpu_name(device: str) -> str | None:
    """The card a call ran on (every call's record names it: cells of one directory may come from several
    machines, and ratios pair cells of one call), None on the CPU."""
    if not str(device).startswith("cuda"):
        return None
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def run(args, argv=None, extra: dict | None = None) -> dict:
    """One call: the cells of --arms not yet done in the cells directory (all of them without --cells-dir),
    then the result of every cell there, written to the JSON. ``argv``: the command to record (default:
    this module's); ``extra``: more top-level fields."""
    from clients.cells import CellStore, new_call_id
    args.call_t0 = time.monotonic()
    arms, proto, wcfg = check(args)
    if args.device == "auto":
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    dense_bytes = armlib.dense_checkpoint_bytes(args.model_config, args.dtype, args.tp)
    budget = args.state_budget_bytes or (args.dense_slots + 1) * dense_bytes
    phase_arms = armlib.parse_arms(args.phase_arms) if args.phase_arms else arms
    caps = {a.spec: armlib.capacity(args.model, a, budget, args.dtype, args.tp, args.placement, args.weights_seed)
            for a in [*arms, *phase_arms]}
    for spec, c in caps.items():
        if c["slots"] < 1:
            raise UserError(f"arm {spec}: a budget of {budget:,} B holds no checkpoint "
                            f"({c['checkpoint_bytes']:,} B each, slot 0 reserved): raise it")
    work = build_workload(wcfg)
    phases = make_phases({a.spec: caps[a.spec]["slots"] for a in phase_arms}, len(work), proto)
    check_fill_tail(phases, max(c["slots"] for c in caps.values()), args.concurrency)
    kv = size_kv(args, [*arms, *phase_arms], budget, wcfg, phases, proto.output_tokens)
    if kv is not None:
        GIB = 1 << 30
        print(f"[matched-hbm] KV cache: {kv['blocks']:,} blocks of {kv['block_bytes']:,} B ({kv['need']:,} to never "
              f"evict, {kv['fit']:,} fit in {kv['limit_bytes'] / GIB:.2f} GiB beside {kv['fixed_bytes'] / GIB:.2f} GiB)"
              + (f"; phases not covered: {', '.join(kv['not_covered'])}" if kv["not_covered"] else ""),
              file=sys.stderr)
    flags = engine_flags(args, wcfg, phases, proto.output_tokens)
    out_dir = os.path.abspath(args.out)
    json_path = args.json or os.path.join(out_dir, "matched_hbm.json")
    manifest = make_manifest(args, arms, proto, wcfg, work, caps, phases, flags, budget, dense_bytes)
    keys = [a["key"] for a in manifest["arms"]]
    call_keys = keys
    if args.call_arms:
        wanted = [x.strip() for x in args.call_arms.split(",")]
        bad = [w for w in wanted if w not in {a.spec for a in arms}]
        if bad:
            raise UserError(f"--call-arms {bad[0]!r} is not one of --arms ({args.arms})")
        # the baseline runs beside every arm it is compared with; the in-process twin beside its arm
        wanted = [*(["dense"] if manifest["baseline"] and wanted != ["dense"] else []), *wanted]
        call_keys = [a["key"] for a in manifest["arms"] if a["spec"] in wanted]
    if args.plan_only:
        return plan_summary(manifest, args.cells_dir)
    prov = provenance(argv if argv is not None else ["-m", "clients.matched_hbm", *sys.argv[1:]], args.commit)
    # refused before any cell runs, not after them: benchmarks/results/ keeps results of a clean commit
    check_results_commit(json_path, prov["commit"])
    # where the results go, checked before anything is built: --out or --cells-dir under a file was a
    # NotADirectoryError traceback, an unwritable --json one after the whole measurement
    _writable_dir(out_dir, "--out")
    _writable_dir(args.cells_dir or os.path.join(out_dir, "cells"), "--cells-dir" if args.cells_dir else "--out")
    _writable_dir(os.path.dirname(os.path.abspath(json_path)), "--json" if args.json else "--out")
    if os.path.isdir(json_path):
        raise UserError(f"--json {json_path!r} is a directory: name the result file")
    store = CellStore(args.cells_dir or os.path.join(out_dir, "cells"), manifest, fresh=not args.cells_dir)
    call = new_call_id()
    store.begin_call(call, {"command": prov["command"], "commit": prov["commit"], "started": time.time(),
                            "gpu": (extra or {}).get("gpu") or gpu_name(args.device), "max_units": args.max_units,
                            "call_keys": call_keys})
    # the target line before anything is measured (clients/targets.py)
    from clients.targets import TARGET_LINE
    print(f"[matched-hbm] {TARGET_LINE}", file=sys.stderr)
    print(f"[matched-hbm] budget {budget:,} B per rank ({budget / dense_bytes:.2f} dense checkpoints of "
          f"{dense_bytes:,} B); {len(work)} prompts, prefix {wcfg.scaled(wcfg.prefix_tokens)} + question "
          f"{wcfg.scaled(wcfg.question_tokens)} tokens; cells in {store.root} (manifest {store.manifest['id']})",
          file=sys.stderr)
    for a in arms:
        print(f"[matched-hbm]   {a.label:24} {caps[a.spec]['slots']:>6} slots of {caps[a.spec]['checkpoint_bytes']:,} B",
              file=sys.stderr)
    print("[matched-hbm] phases: " + "; ".join(f"{p.name}: {len(p.blocks)} of {len(work) // p.q} block(s)"
                                                + (f" x{r}" if (r := repeats(i, proto)) > 1 else "")
                                                for i, p in enumerate(phases)), file=sys.stderr)
    failed = None
    try:
        runner.run_call(store, _Context(args, work, phases, proto, out_dir), call, prov["commit"], call_keys,
                        args.max_units, args.keep_going)
    except runner.ArmFailed as e:
        failed = e
    finally:
        result = result_of(store.manifest, store.calls(), store.cells(), prov, extra)
        result["cells_dir"] = store.root
        write_json(json_path, result)
    result["json_path"] = json_path
    if failed is not None:
        # without --keep-going a failed arm (a server gone mid-cell) ends the call: one line, not a traceback
        raise runner.ArmFailed(failure_line(result, failed)) from None
    return result


def failure_line(result: dict, error: Exception) -> str:
    """The one line of a call stopped by a failed arm: what failed, what is kept and how to go on."""
    cells = result.get("cells_dir")
    return (f"{error}; {result.get('cells_done', 0)} of {result.get('cells_total', '?')} cells done, kept in "
            f"{cells} (the same command with --cells-dir {cells} runs the rest; --keep-going runs the other arms)")


def _writable_dir(path: str, flag: str) -> None:
    """``path`` made (if missing) and writable, else a UserError naming ``flag``."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"{flag}: cannot make the directory {path!r} ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{flag}: the directory {path!r} is not writable")


def report(result: dict, plot_path: str | None, title: str) -> None:
    from clients.targets import describe
    whole = [a for a in result["arms"] if not a.get("pending")]
    if result.get("target_verdict"):
        print(describe(result["target_verdict"]))
    if not result.get("complete", True):
        started = [a["key"] for a in result["arms"] if a.get("pending")]
        # arms without a cell yet have no entry in result["arms"]: named from the manifest
        unstarted = [k for k in result.get("manifest", {}).get("arms", []) if k not in {a["key"] for a in result["arms"]}]
        print(f"cells: {result['cells_done']} of {result['cells_total']} done; arms with cells to run: "
              + (", ".join(started) or "none") + (f"; not started: {', '.join(unstarted)}" if unstarted else ""))
        if result.get("device_time_left"):
            left = result["device_time_left"]
            print(f"device time left: {left['shared_s'] / 3600:.1f} h with every arm of a unit in one call (the "
                  f"baseline once a unit), {left['arm_by_arm_s'] / 3600:.1f} h one arm a call; at the measured "
                  f"seconds a request, server starts not counted")
    if not whole:
        print(f"json: {result['json_path']}")
        return
    print(format_table(whole))
    for entry in whole:
        ex = entry.get("exchange")
        if ex:
            print(f"{entry['spec']}: all-to-all " + ", ".join(
                f"{op} {v['ms_per_op']:.3f} ms per op ({v['ops']} ops, {v['bytes_sent']:,} B sent)"
                for op, v in ex.items() if v["ms_per_op"] is not None))
    for failed in result.get("failed_arms", []):
        print(f"FAILED {failed['spec']}: {failed['error']}")
    for entry in result["arms"]:
        if "triton_over_inprocess" in entry:
            r = entry["triton_over_inprocess"]
            print(f"Triton over in-process ({entry['spec']}): mean TTFT x{r['ttft_mean_ms']['mean']:.2f}, "
                  f"input throughput x{r['input_tokens_per_s']['mean']:.2f}")
    if plot_path:
        from clients.plot import plot_arms
        plot_arms(plot_path, whole, title)
        print(f"plot: {plot_path}")
    print(f"json: {result['json_path']}")


def drive(prog: str, flags: list[str], argv: list[str], extra: dict, title) -> int:
    """A benchmark script's run of this protocol with the flags it composed (its own, then the user's, then
    --commit): parse, run, report (the plot beside --json); ``title(result)`` is the plot's title. Returns the
    exit code: 2 on a refused option, 1 when an arm failed under --keep-going, else 0."""
    from trtllm_dasc.cli import _Parser
    from trtllm_dasc.errors import UserError
    parser = _Parser(prog=prog)
    add_arguments(parser)
    args = parser.parse_args(flags)
    try:
        result = run(args, ["-m", "benchmarks", prog, *argv], {**extra, "clients_flags": flags})
        if result.get("plan_only"):
            return 0
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except runner.ArmFailed as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    report(result, os.path.splitext(args.json)[0] + ".png", title(result))
    return 1 if result.get("failed_arms") else 0


def main(argv=None) -> int:
    from trtllm_dasc.cli import run_command

    def command(args):
        try:
            result = run(args, ["-m", "clients.matched_hbm", *(sys.argv[1:] if argv is None else argv)])
        except runner.ArmFailed as e:
            # exit 1 as an arm failed under --keep-going: the options were fine, the measurement failed
            print(f"matched_hbm: error: {e}", file=sys.stderr)
            return 1
        if result.get("plan_only"):
            return 0
        plot = None if args.plot == "none" else (args.plot or os.path.join(os.path.abspath(args.out), "matched_hbm.png"))
        report(result, plot, args.title or f"matched-HBM serving, {os.path.basename(os.path.abspath(args.model))}, "
               f"budget {result['budget_bytes']:,} B, {args.device}")
        return 1 if result.get("failed_arms") else 0
    return run_command("matched_hbm", __doc__.splitlines()[0], add_arguments, command, argv)


if __name__ == "__main__":
    sys.exit(main())
