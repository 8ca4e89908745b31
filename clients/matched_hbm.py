"""Matched-HBM serving benchmark (paper App. C.2): several arms at one checkpoint budget, each built with
dasc-build, served by its own tritonserver and driven by the same streaming workload.

    python -m clients.matched_hbm --model CKPT --dense-slots 6 --arms dense,nr16,nr16+int8 --out OUT \\
        [--scale 0.1 --blocks-per-phase 1 --concurrency 8 --device cpu]

Writes OUT/matched_hbm.json (command, commit, every block's figures and the per-arm summaries) and
OUT/matched_hbm.png, and prints the table. Progress goes to stderr.
"""
from __future__ import annotations

import math
import os
import sys
import time

from clients import arms as armlib
from clients.protocol import Phase, ProtocolConfig, make_phases, requests_per_arm, run_protocol
from clients.report import format_table, provenance, ratios, summarize, write_json
from clients.workload import WorkloadConfig, build_workload
from trtllm_dasc.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (config.json + safetensors)")
    p.add_argument("--out", default="matched_hbm_out", help="directory for engines, server logs, JSON and plot")
    p.add_argument("--json", default=None, help="result JSON path (default OUT/matched_hbm.json)")
    p.add_argument("--plot", default=None, help="plot path (default OUT/matched_hbm.png); 'none' for no plot")
    p.add_argument("--arms", default="dense,nr16,nr16+int8", help="comma list: dense, nr<W>, wr<W>, wr-warm<W>, "
                   "rand<W>@<seed>, each optionally +int8 (default dense,nr16,nr16+int8)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--state-budget-bytes", type=int, help="the matched checkpoint budget (bytes per rank)")
    g.add_argument("--dense-slots", type=int, help="budget = (K + 1) dense checkpoints: dense gets K slots "
                   "(slot 0 is reserved; the paper's 128 dense physical slots give 127)")
    g = p.add_argument_group("workload")
    g.add_argument("--prompts", type=int, default=12032, help="dataset size (MMLU-Pro test: 12032)")
    g.add_argument("--scale", type=float, default=1.0, help="multiplies the prefix (1500-2500) and question "
                   "(100-300) token lengths")
    g.add_argument("--workload-seed", type=int, default=0)
    g = p.add_argument_group("protocol")
    g.add_argument("--seeds", default="42,123,7", help="request-order seeds")
    g.add_argument("--concurrency", type=int, default=96)
    g.add_argument("--output-tokens", type=int, default=1)
    g.add_argument("--blocks-per-phase", type=int, default=None, help="an evenly spread subset of each phase's "
                   "blocks (default: all of them, as the paper)")
    g.add_argument("--dense-repeats", type=int, default=1, help="replays of the dense-boundary phase (the "
                   "paper: 6)")
    g.add_argument("--full-phase", action="store_true", help="end with one block of the whole dataset (the "
                   "paper's sixth phase)")
    g.add_argument("--phase-arms", default=None, help="comma list of arms whose capacity boundaries make the "
                   "phases (default: --arms); the same list in two runs gives them the same phases, so arms "
                   "split across runs stay comparable")
    g.add_argument("--target-fill", type=float, default=0.85, help="Q(W) = ceil(N(W) / target fill)")
    g.add_argument("--inprocess", default=None, metavar="ARM", help="also run this arm in-process through "
                   "Engine (no Triton): the serving overhead")
    g.add_argument("--request-timeout", type=float, default=600.0)
    g = p.add_argument_group("engine (passed to dasc-build)")
    g.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: cuda when available)")
    g.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    g.add_argument("--max-batch-size", type=int, default=8)
    g.add_argument("--max-num-tokens", type=int, default=None)
    g.add_argument("--prefill-chunk", type=int, default=2048)
    g.add_argument("--interval", type=int, default=None, help="checkpoint interval (default: longer than any "
                   "prompt, so a prompt takes one slot at its end plus the shared branch points)")
    g.add_argument("--prompt-only", action="store_true", help="checkpoint prompt ends only")
    g.add_argument("--kv-blocks", type=int, default=None, help="default: enough that KV is never evicted")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--kernel-cache", default=None, help="compiled-kernel cache shared by the arms "
                   "(default OUT/kernels)")
    g.add_argument("--ready-timeout", type=float, default=1800.0)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per server (one mpirun each); the "
                   "budget is per rank")
    g.add_argument("--placement", default="hybrid", choices=["off", "storage", "hybrid"],
                   help="TP placement of the dasc arms' units (with --tp > 1)")
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


def check(args) -> tuple[list, ProtocolConfig, WorkloadConfig]:
    """Every option checked before anything is built; returns the arms and the two configs."""
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise UserError(f"--model {args.model!r} is not a checkpoint directory (no config.json)")
    arms = armlib.parse_arms(args.arms)
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
    for name in ("state_budget_bytes", "dense_slots", "kv_blocks", "interval", "max_num_tokens", "torch_threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.request_timeout <= 0 or args.ready_timeout <= 0:
        raise UserError("--request-timeout and --ready-timeout must be > 0")
    proto = ProtocolConfig(seeds=_ints(args.seeds, "--seeds"), output_tokens=args.output_tokens,
                           blocks_per_phase=args.blocks_per_phase, target_fill=args.target_fill,
                           dense_repeats=args.dense_repeats, full_phase=args.full_phase)
    from trtllm_dasc.config import HybridConfig
    vocab = HybridConfig.from_path(args.model).schema.network.vocab_size
    work = WorkloadConfig(vocab=vocab, prompts=args.prompts, scale=args.scale, seed=args.workload_seed)
    return arms, proto, work


def engine_flags(args, work: WorkloadConfig, phases: list[Phase], output_tokens: int) -> list[str]:
    """dasc-build flags shared by every arm (the runtime must be the same; only the arm differs)."""
    per_request = work.max_prompt_tokens + output_tokens
    blocks_per_request = math.ceil(per_request / args.block_size)
    # KV for every prompt of the largest block plus the running requests: KV never decides a hit
    kv = args.kv_blocks or (max(p.q for p in phases) + args.max_batch_size) * blocks_per_request
    flags = ["--tp", args.tp, "--placement", args.placement if args.tp > 1 else "off",
             "--device", args.device, "--dtype", args.dtype, "--max-batch-size", args.max_batch_size,
             "--prefill-chunk", args.prefill_chunk, "--interval", args.interval or per_request, "--kv-blocks", kv,
             "--block-size", args.block_size, "--max-context", blocks_per_request * args.block_size]
    if args.max_num_tokens:
        flags += ["--max-num-tokens", args.max_num_tokens]
    if args.prompt_only:
        flags.append("--prompt-only")
    return [str(f) for f in flags]


def run_arm(target_factory, work, phases, proto, progress_label: str) -> dict:
    """The protocol against one target (made here, closed afterwards); its blocks and summary."""
    from clients.progress import Progress
    target = target_factory()
    try:
        bar = Progress(requests_per_arm(phases, proto), progress_label)
        before = target.control("stats")
        t0 = time.perf_counter()
        blocks = run_protocol(target, work, phases, proto, bar)
        bar.close()
        after = target.control("stats")
    finally:
        target.close()
    return {"blocks": blocks, "engine_slots": after["checkpoint_slots"], "seconds": time.perf_counter() - t0,
            "engine_slot_bytes_per_rank": after.get("checkpoint_slot_bytes_per_rank"),
            "exchange": exchange_delta(before.get("exchange"), after.get("exchange")), "summary": summarize(blocks)}


def exchange_delta(before: dict | None, after: dict | None) -> dict | None:
    """The storage balance's all-to-all over the protocol (rank 0's clock): per store and load, the calls of
    the checkpoint op, its collective calls, bytes this rank sent and milliseconds per op. None: the arm's
    placement moves nothing (no exchange)."""
    if not after:
        return None
    out = {}
    for op, a in after.items():
        b = (before or {}).get(op) or {"ops": 0, "calls": 0, "seconds": 0.0, "bytes_sent": 0}
        ops = a["ops"] - b["ops"]
        seconds = a["seconds"] - b["seconds"]
        out[op] = {"ops": ops, "calls": a["calls"] - b["calls"], "bytes_sent": a["bytes_sent"] - b["bytes_sent"],
                   "ms_per_op": 1e3 * seconds / ops if ops else None}
    return out


def run(args, argv=None, extra: dict | None = None) -> dict:
    """Build, serve and measure every arm; the result (also written to the JSON after each arm).
    ``argv``: the command to record (default: this module's); ``extra``: more top-level fields."""
    arms, proto, wcfg = check(args)
    if args.device == "auto":
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    dense_bytes = armlib.dense_checkpoint_bytes(args.model, args.dtype, args.tp)
    budget = args.state_budget_bytes or (args.dense_slots + 1) * dense_bytes
    phase_arms = armlib.parse_arms(args.phase_arms) if args.phase_arms else arms
    caps = {a.spec: armlib.capacity(args.model, a, budget, args.dtype, args.tp, args.placement)
            for a in [*arms, *phase_arms]}
    for spec, c in caps.items():
        if c["slots"] < 1:
            raise UserError(f"arm {spec}: a budget of {budget:,} B holds no checkpoint "
                            f"({c['checkpoint_bytes']:,} B each, slot 0 reserved): raise it")
    work = build_workload(wcfg)
    phases = make_phases({a.spec: caps[a.spec]["slots"] for a in phase_arms}, len(work), proto)
    flags = engine_flags(args, wcfg, phases, proto.output_tokens)
    out_dir = os.path.abspath(args.out)
    json_path = args.json or os.path.join(out_dir, "matched_hbm.json")
    result = {**provenance(argv if argv is not None else ["-m", "clients.matched_hbm", *sys.argv[1:]], args.commit),
              "protocol": "paper App. C.2: flush -> untimed fill -> seeded shuffle -> timed streaming replay",
              "model": os.path.abspath(args.model), "device": args.device, "dtype": args.dtype,
              "torch_threads": args.torch_threads, "tp": args.tp,
              "placement": args.placement if args.tp > 1 else "off",
              "budget_bytes": budget, "dense_checkpoint_bytes": dense_bytes, "build_flags": flags,
              "workload": {"prompts": len(work), "scale": wcfg.scale, "seed": wcfg.seed,
                           "prefix_tokens": wcfg.scaled(wcfg.prefix_tokens),
                           "question_tokens": wcfg.scaled(wcfg.question_tokens)},
              "seeds": list(proto.seeds), "concurrency": args.concurrency, "output_tokens": proto.output_tokens,
              "target_fill": proto.target_fill, "dense_repeats": proto.dense_repeats,
              "full_phase": proto.full_phase,
              "phases": [{"name": p.name, "q": p.q, "arms": p.arms, "blocks": p.blocks} for p in phases],
              **(extra or {}), "arms": []}
    print(f"[matched-hbm] budget {budget:,} B per rank ({budget / dense_bytes:.2f} dense checkpoints of "
          f"{dense_bytes:,} B); {len(work)} prompts, prefix {wcfg.scaled(wcfg.prefix_tokens)} + question "
          f"{wcfg.scaled(wcfg.question_tokens)} tokens", file=sys.stderr)
    for a in arms:
        print(f"[matched-hbm]   {a.label:24} {caps[a.spec]['slots']:>6} slots of {caps[a.spec]['checkpoint_bytes']:,} B",
              file=sys.stderr)
    print("[matched-hbm] phases: " + "; ".join(f"{p.name}: {len(p.blocks)} block(s)" for p in phases), file=sys.stderr)
    kernels = args.kernel_cache or os.path.join(out_dir, "kernels")
    engines = {}
    for a in arms:
        engine = armlib.build_engine(args.model, a, os.path.join(out_dir, "engines", a.spec), budget, flags)
        armlib.share_kernels(engine, kernels)
        engines[a.spec] = engine
    for a in arms:
        try:
            entry = _served_arm(a, engines[a.spec], caps[a.spec], args, out_dir, work, phases, proto,
                                result["placement"])
        except RuntimeError as e:
            if not args.keep_going:
                raise
            # one arm's failure (its server, its requests, its accounting) is recorded and the grid goes on
            print(f"[matched-hbm] arm {a.spec} failed: {e}", file=sys.stderr, flush=True)
            result.setdefault("failed_arms", []).append({"spec": a.spec, "error": str(e)})
            write_json(json_path, result)
            continue
        result["arms"].append(entry)
        write_json(json_path, result)
    if args.inprocess:
        from clients.inprocess import EngineTarget
        a = next(x for x in arms if x.spec == args.inprocess)
        res = run_arm(lambda: EngineTarget(engines[a.spec], args.concurrency, args.request_timeout, args.torch_threads),
                      work, phases, proto, f"{a.spec:>10} (in-process)")
        entry = _arm_entry(a, caps[a.spec], "in-process", res, None, None, result["placement"])
        served = next(x for x in result["arms"] if x["spec"] == a.spec)
        entry["label"] = a.label + " (in-process)"
        entry["triton_over_inprocess"] = ratios(served, entry)
        result["arms"].append(entry)
    base = result["arms"][0]
    for entry in result["arms"][1:]:
        entry[f"vs_{base['spec']}"] = ratios(entry, base)
    write_json(json_path, result)
    result["json_path"] = json_path
    return result


def _served_arm(a, engine: str, cap: dict, args, out_dir: str, work, phases, proto, placement: str) -> dict:
    """One arm through its own tritonserver: serve, run the protocol, stop; its JSON entry."""
    from clients.client import GrpcTarget
    t0 = time.perf_counter()
    server = armlib.serve(engine, os.path.join(out_dir, "servers", a.spec), args.ready_timeout, args.torch_threads,
                          args.tp)
    ready_s = time.perf_counter() - t0
    try:
        res = run_arm(lambda: GrpcTarget(server.grpc_url, args.concurrency, timeout=args.request_timeout),
                      work, phases, proto, f"{a.spec:>10} (triton)")
    except RuntimeError as e:
        # failed requests are usually the server itself gone: say so, with its log
        if server.proc.poll() is not None:
            raise RuntimeError(f"arm {a.spec}: tritonserver exited with code {server.proc.returncode} during "
                               f"the protocol (log: {server.log_path}); the client saw: {e}") from None
        raise RuntimeError(f"arm {a.spec}: {e} (server log: {server.log_path})") from None
    finally:
        server.stop()
    return _arm_entry(a, cap, "triton", res, ready_s, server.log_path, placement)


def _arm_entry(arm, cap: dict, target: str, res: dict, ready_s, log_path, placement: str) -> dict:
    """The arm's JSON entry, after checking the engine against the planner (what `dasc plan` prints): its
    slot count and its most loaded rank's slot bytes."""
    per_rank = res.get("engine_slot_bytes_per_rank") or []
    worst = max(per_rank) if per_rank and None not in per_rank else None
    if res["engine_slots"] != cap["slots"]:
        raise RuntimeError(f"arm {arm.spec}: the engine has {res['engine_slots']} slots, the plan said {cap['slots']}")
    if worst is not None and worst != cap["checkpoint_bytes"]:
        raise RuntimeError(f"arm {arm.spec}: the engine's most loaded rank holds {worst:,} B a checkpoint, the plan "
                           f"said {cap['checkpoint_bytes']:,}")
    return {"spec": arm.spec, "label": arm.label, "target": target, "wmax": arm.wmax, "policy": arm.policy,
            "codec": arm.codec, "placement": arm.placement or placement, **cap,
            "engine_slot_bytes_per_rank": per_rank,
            # what `dasc plan` predicts against what the ranks allocated (equal, or the arm raised above)
            "plan_check": {"plan_slots": cap["slots"], "engine_slots": res["engine_slots"],
                           "plan_worst_rank_bytes": cap["checkpoint_bytes"], "engine_worst_rank_bytes": worst},
            "exchange": res.get("exchange"), "ready_s": ready_s, "protocol_s": res["seconds"], "server_log": log_path,
            "summary": res["summary"], "blocks": res["blocks"]}


def report(result: dict, plot_path: str | None, title: str) -> None:
    print(format_table(result["arms"]))
    for entry in result["arms"]:
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
        plot_arms(plot_path, result["arms"], title)
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
        result = run(args, [f"benchmarks/{prog}.py", *argv], {**extra, "clients_flags": flags})
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    report(result, os.path.splitext(args.json)[0] + ".png", title(result))
    return 1 if result.get("failed_arms") else 0


def main(argv=None) -> int:
    from trtllm_dasc.cli import run_command

    def command(args):
        result = run(args, ["-m", "clients.matched_hbm", *(sys.argv[1:] if argv is None else argv)])
        plot = None if args.plot == "none" else (args.plot or os.path.join(os.path.abspath(args.out), "matched_hbm.png"))
        report(result, plot, args.title or f"matched-HBM serving, {os.path.basename(os.path.abspath(args.model))}, "
               f"budget {result['budget_bytes']:,} B, {args.device}")
        return 1 if result.get("failed_arms") else 0
    return run_command("matched_hbm", __doc__.splitlines()[0], add_arguments, command, argv)


if __name__ == "__main__":
    sys.exit(main())
