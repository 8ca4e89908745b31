"""Decode step time at batch 1, 8, 32 and 64 against the weight-bandwidth bound.

A decode step gives each of B running sequences one new token. Whatever the batch, it has to read every
weight it multiplies with (all layers' projections, norms, MLP, the LM head) and B rows of the embedding
table; at small B little else is read, so the step cannot beat weight bytes / memory bandwidth. That
bound is counted here from the checkpoint's safetensors headers (shapes and dtypes, independently of the
model code) and divided by the device's copy bandwidth measured in the same run (a device-to-device copy
of >= 1 GiB on GPU, bytes read + written over time). The target of the issue "Prefill and decode speed
on the H200": batch 1 within 2x of the bound.

The step runs through the engine's real path: B requests with distinct random prompts of --context
tokens are submitted to one Engine and stepped (Engine.step: scheduler -> ModelRunner.execute -> sampling
-> bookkeeping) until all B are in decode; then --warmup and --reps more steps are timed, each checked
to be a pure decode plan (B one-token spans, no loads, no replays). Reported per batch: the median wall
time of Engine.step (device synchronised), of ModelRunner.execute alone, the bound, step / bound and
tokens/s. The recurrent state each sequence reads and writes per step (2x a dense checkpoint: temporal
fp32 + conv) is recorded beside it, because at large B it is as large as the weights; KV reads are not
counted anywhere. With --compare-eager each batch runs three times in the same run: as configured (on a GPU
with the fla backend: CUDA graphs of the decode step, model/decode_graphs.py), without the graphs (the
batched paged attention launched eagerly) and with attention one sequence at a time as well.

    python -m benchmarks decode_step --model /tmp/kimi48 [--batches 1,8,32,64] [--context 1024] [--compare-eager]
                                     [--commit C]
    python -m benchmarks decode_step --smoke      # CPU, a tiny dense checkpoint written here
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

from benchmarks.copy_bandwidth import GIB, copy_bandwidth, device_ms  # noqa: E402
from benchmarks.kernel_profile import kernel_trace, print_summary, summarize  # noqa: E402
from benchmarks.results_io import provenance, write_result  # noqa: E402

from trtllm_dasc.errors import UserError  # noqa: E402

TARGET_RATIO = 2.0
EMBED = "model.embed_tokens.weight"
# routed experts: a step reads only the experts its tokens pick, so "every weight" would be a loose bound
ROUTED_EXPERT = re.compile(r"\.experts\.\d+\.")


def weight_bytes(model_dir: str) -> dict:
    """Bytes a decode step must read from the weights, from the safetensors headers alone:
    ``matmul_bytes`` (every stored tensor but the embedding table; a tied LM head keeps the table in)
    plus ``embed_row_bytes`` per sequence of the batch (its token's row)."""
    from trtllm_dasc.checkpoint_files import SafetensorsCheckpoint
    files = SafetensorsCheckpoint(model_dir)
    experts = [n for n in files.weight_map if ROUTED_EXPERT.search(n)]
    if experts:
        raise UserError(f"{model_dir} has routed experts ({experts[0]}, ...): this bound counts every weight, "
                        "so use a dense-MLP checkpoint (benchmarks/shaped_model.py)")
    infos = {n: files.info(n) for n in files.weight_map}
    if EMBED not in infos:
        raise UserError(f"{model_dir} has no {EMBED}")
    embed = infos[EMBED]
    # no LM head of its own: the head multiplies with the whole embedding table
    tied = "lm_head.weight" not in infos
    by_dtype: dict[str, int] = {}
    for info in infos.values():
        by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + info.nbytes
    total = sum(by_dtype.values())
    return {"matmul_bytes": total - (0 if tied else embed.nbytes), "embed_row_bytes": embed.nbytes // embed.shape[0],
            "checkpoint_bytes": total, "tied_lm_head": bool(tied), "stored_bytes_by_dtype": by_dtype}


def write_tiny_model(out_dir: str) -> str:
    """A small dense Kimi-Linear-shaped checkpoint (3 KDA + 1 MLA layer, dense MLP, fp32), written the way
    shaped_model.py writes the full-size one: our loader's tensor names, RandomWeights' values."""
    import torch
    from safetensors.torch import save_file
    from benchmarks.shaped_model import Recorder, shaped_config
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model import HybridModel
    raw = shaped_config("kda", vocab=512)
    raw.update(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
               num_key_value_heads=2, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
               mlp_layer_types=["dense"] * 4, first_k_dense_replace=4,
               linear_attn_config={"head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4,
                                   "kda_layers": [1, 2, 3], "full_attn_layers": [4]})
    rec = Recorder("cpu")
    HybridModel.from_source(HybridConfig.from_dict(raw), rec, dtype="float32", device="cpu")
    os.makedirs(out_dir, exist_ok=True)
    save_file({k: v.to(torch.float32).contiguous() for k, v in rec.tensors.items()},
              os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw, f, indent=1)
    return out_dir


def time_decode(engine, torch, batch: int, context: int, warmup: int, reps: int, max_new: int,
                profile: bool = False) -> dict:
    """Put ``batch`` requests into decode, then time ``warmup + reps`` engine steps; medians of the reps.
    profile: the reps run under torch.profiler and "profile" holds the kernel summary (kernel_profile.py)."""
    from trtllm_dasc.engine.request import GenerationRequest
    runner, device = engine.runner, engine.cfg.device
    sync = (lambda: torch.cuda.synchronize(device)) if device.startswith("cuda") else (lambda: None)
    rng = random.Random(batch)
    ended = []
    for i in range(batch):
        prompt = [rng.randrange(engine.vocab_size) for _ in range(context)]
        engine.submit(GenerationRequest(("decode", batch, i), prompt, max_new, use_cache=False),
                      lambda out: ended.append(out) if out.finished else None)
    running = engine.scheduler.running
    # prefill (not timed): until every request is admitted and has its first token
    while len(running) < batch or any(s.in_prefill for s in running):
        if ended or not engine.step():
            raise RuntimeError(f"batch {batch}: a request ended before decode: {ended[:1] or 'nothing to run'}")
    plans, execute_s = [], []
    inner = runner.execute

    def timed_execute(plan, *a, **kw):
        t0 = time.perf_counter()
        out = inner(plan, *a, **kw)        # ends synchronised: sampling copies tokens to the host
        execute_s.append(time.perf_counter() - t0)
        plans.append(plan)
        return out
    runner.execute, step_s = timed_execute, []
    trace = None
    try:
        for i in range(warmup + reps):
            if profile and i == warmup:
                trace = kernel_trace(device, attribute=True)
                prof = trace.__enter__()
            sync()
            t0 = time.perf_counter()
            engine.step()
            sync()
            step_s.append(time.perf_counter() - t0)
    finally:
        runner.execute = inner
        if trace is not None:
            trace.__exit__(None, None, None)
    for plan in plans:
        # only a pure decode step is what this measures
        if (len(plan.spans) != batch or any(len(s.token_ids) != 1 for s in plan.spans) or plan.loads
                or plan.replays or plan.resets):
            raise RuntimeError(f"batch {batch}: step {plan.step} is not a pure decode step")
    if ended:
        raise RuntimeError(f"batch {batch}: a request ended while timing: {ended[0]}")
    for i in range(batch):
        engine.abort(("decode", batch, i))
    engine.run_until_idle()
    engine.flush()
    step_s, execute_s = step_s[warmup:], execute_s[warmup:]
    out = {"step_ms": 1e3 * statistics.median(step_s), "step_ms_min": 1e3 * min(step_s),
           "step_ms_max": 1e3 * max(step_s), "execute_ms": 1e3 * statistics.median(execute_s)}
    if trace is not None:
        out["profile"] = summarize(prof, reps, device)
    return out


def time_replay(graphs, torch, batch: int, reps: int) -> dict | None:
    """The decode graph of batch's bucket alone, every entry padding (the reserved state row and KV block, so
    no request's state moves): ``replay_ms`` the median wall time of replay + synchronize (the graph's launch
    and its device time), ``replay_device_ms`` back-to-back replays timed by device events (the device time,
    launch gaps between its kernels included). Against step_ms they split a step into the graph and the
    host work around it (inputs in, logits out, sampling, scheduling)."""
    if graphs is None or not graphs.use_graphs:
        return None
    b = graphs.bucket(batch)
    if b not in graphs.graphs:
        return None
    graphs._pad(0, b)
    graph = graphs.graphs[b][0]
    walls = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    return {"replay_ms": 1e3 * statistics.median(walls), "replay_device_ms": device_ms(torch, graph.replay, reps)}


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(x) for x in text.split(",")]
    except ValueError:
        raise UserError(f"--batches must be comma-separated integers, got {text!r}") from None
    if any(b < 1 for b in batches):
        raise UserError(f"--batches: every batch size must be >= 1, got {text!r}")
    return batches


def check_args(args, torch) -> None:
    for name, lo in (("context", 1), ("reps", 1), ("warmup", 0)):
        if getattr(args, name) < lo:
            raise UserError(f"--{name} must be >= {lo}, got {getattr(args, name)}")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise UserError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {args.device}: CUDA is not available here (use --device cpu or --smoke)")
    if args.smoke and args.model:
        raise UserError("--smoke writes its own tiny checkpoint: drop --model")
    if not args.smoke and not args.model:
        raise UserError("--model DIR is required (or --smoke)")
    if not args.smoke and not os.path.isfile(os.path.join(args.model, "config.json")):
        raise UserError(f"--model {args.model}: no config.json there")


def run(args, torch, model: str, batches: list[int], save=None, profile: tuple = ()) -> dict:
    """Time every batch; ``save(result)`` is called after each one too (a run cut by a time limit keeps
    the batches it finished, marked "complete": false)."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.engine import Engine
    weights = weight_bytes(model)
    run_code = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[args.dtype]
    stored = max(weights["stored_bytes_by_dtype"], key=weights["stored_bytes_by_dtype"].get)
    if stored != run_code:
        print(f"note: the checkpoint stores most weights as {stored}, the run holds them as {args.dtype}; "
              "the bound counts stored bytes", file=sys.stderr)
    # per sequence and step: its recurrent state read once and written once (temporal fp32 + conv)
    state_bytes = 2 * HybridConfig.from_path(model, conv_dtype=args.dtype).dense_checkpoint_bytes_per_rank(1)
    if ":" in args.device:
        torch.cuda.set_device(args.device)      # the copy's events and the synchronize calls use it
    bmax = max(batches)
    # one step's forward tokens: bounds the prefill's activations (64 x 1024 tokens would be one forward)
    max_tokens = max(8192, 2 * bmax)
    # the first requests to finish prefill decode while the others still prefill (decode tokens come first
    # in a step's budget): room for those tokens, then warmup + reps
    prefill_steps = -(-bmax * args.context // (max_tokens - bmax)) + 2
    max_new = prefill_steps + args.warmup + args.reps + 2
    block = 16
    cfg = EngineConfig(model=model, device=args.device, dtype=args.dtype, max_batch=bmax,
                       max_context=args.context + max_new, block_size=block, max_num_tokens=max_tokens,
                       prefill_chunk=min(args.context, max_tokens), interval=args.context,
                       # twice what the running batch needs: warmup()'s hit round keeps its cold prefixes cached
                       num_kv_blocks=2 * bmax * -(-(args.context + max_new) // block) + 16)
    engine = Engine(cfg)
    warm = engine.warmup() if args.device.startswith("cuda") else None
    copy_bytes = GIB if args.device.startswith("cuda") else 64 << 20
    bandwidth = copy_bandwidth(args.device, copy_bytes)
    rows = []

    def summary(complete: bool) -> dict:
        one = next((r for r in rows if r["batch"] == 1), None)
        return {"model": os.path.abspath(model), "torch_device": args.device, "dtype": args.dtype,
                "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "context": args.context,
                "reps": args.reps, "warmup": args.warmup, "engine_warmup_s": warm and warm["seconds"],
                "copy_bytes": copy_bytes, "copy_bandwidth_Bps": bandwidth, "weights": weights,
                "state_bytes_per_sequence": state_bytes, "target": f"batch 1 step <= {TARGET_RATIO:g}x bound",
                "target_met": None if one is None else one["ratio"] <= TARGET_RATIO, "rows": rows,
                "complete": complete}
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s ({copy_bytes >> 20} MiB, {args.device}); weights read per "
          f"step {weights['matmul_bytes'] / 1e6:.2f} MB + {weights['embed_row_bytes']} B per sequence")
    print(f"{'batch':>5} {'step ms':>9} {'exec ms':>9} {'bound ms':>9} {'step/bound':>10} {'tokens/s':>10} "
          f"{'w+state ms':>10}")
    model_obj = engine.runner.model
    for b in batches:
        t = time_decode(engine, torch, b, args.context, args.warmup, args.reps, max_new)
        replay = time_replay(engine.runner.graphs, torch, b, args.reps)
        if replay:
            t.update(replay)
            print(f"  batch {b}: graph replay alone {replay['replay_ms']:.3f} ms wall, "
                  f"{replay['replay_device_ms']:.3f} ms device (back to back)", flush=True)
        if args.compare_eager:
            # the same batch without the CUDA graphs (the batched attention kernel launched eagerly), then
            # also with attention one sequence at a time (the path before the batched kernel)
            graphs, engine.runner.graphs = engine.runner.graphs, None
            try:
                t["no_graphs"] = time_decode(engine, torch, b, args.context, args.warmup, args.reps, max_new)
                model_obj.paged_attention = False
                t["eager_attention"] = time_decode(engine, torch, b, args.context, args.warmup, args.reps, max_new)
            finally:
                engine.runner.graphs, model_obj.paged_attention = graphs, None
            t["graphs"] = graphs is not None
            t["speedup_over_eager"] = t["eager_attention"]["step_ms"] / t["step_ms"]
        if b in profile:
            # separate runs (the profiler slows the steps): as configured, and without the graphs
            t["profile"] = time_decode(engine, torch, b, args.context, args.warmup, args.reps, max_new, True)["profile"]
            graphs, engine.runner.graphs = engine.runner.graphs, None
            try:
                if graphs is not None:
                    t["profile_no_graphs"] = time_decode(engine, torch, b, args.context, args.warmup, args.reps,
                                                         max_new, True)["profile"]
            finally:
                engine.runner.graphs = graphs
        wb = weights["matmul_bytes"] + b * weights["embed_row_bytes"]
        bound_ms = 1e3 * wb / bandwidth
        row = {"batch": b, **t, "weight_bytes": wb, "bound_ms": bound_ms, "ratio": t["step_ms"] / bound_ms,
               "tokens_per_s": b / (t["step_ms"] / 1e3), "state_bytes": b * state_bytes,
               "bound_with_state_ms": 1e3 * (wb + b * state_bytes) / bandwidth}
        rows.append(row)
        print(f"{b:>5} {row['step_ms']:>9.3f} {row['execute_ms']:>9.3f} {bound_ms:>9.3f} {row['ratio']:>10.2f} "
              f"{row['tokens_per_s']:>10.1f} {row['bound_with_state_ms']:>10.3f}"
              + (f"  (no graphs {t['no_graphs']['step_ms']:.3f} ms, eager attention "
                 f"{t['eager_attention']['step_ms']:.3f} ms)" if "eager_attention" in t else ""),
              flush=True)
        for key, label in (("profile", "as configured"), ("profile_no_graphs", "without graphs")):
            if key in t:
                print_summary(f"batch {b} {label}", t[key])
        if save is not None:
            save(summary(False))
    engine.sanity_check()
    engine.shutdown()
    one = next((r for r in rows if r["batch"] == 1), None)
    met = None if one is None else one["ratio"] <= TARGET_RATIO
    print(f"target: batch 1 within {TARGET_RATIO:g}x of the bound: "
          + ("not measured (no batch 1)" if one is None else f"{'met' if met else 'NOT met'} ({one['ratio']:.2f}x)"))
    return summary(True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint directory (benchmarks/shaped_model.py OUT --arch kda)")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens per sequence (1024; smoke 32)")
    ap.add_argument("--reps", type=int, default=None, help="timed decode steps per batch (20; smoke 5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed decode steps first (5; smoke 2)")
    ap.add_argument("--device", default=None, help="cuda when available, else cpu")
    ap.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                    help="bfloat16 on GPU, float32 on CPU")
    ap.add_argument("--out", default=None, help="default benchmarks/results/decode_step.json (smoke: a temp dir)")
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    ap.add_argument("--torch-threads", type=int, default=None, help="CPU threads (torch's default; smoke 1)")
    ap.add_argument("--compare-eager", action="store_true",
                    help="also time each batch without CUDA graphs, and without graphs and with the attention "
                         "of one sequence at a time, in the same run")
    ap.add_argument("--profile", default="",
                    help="comma-separated batch sizes to profile too (torch.profiler, separate runs: as configured "
                         "and without graphs): kernels per step, device-busy time, the top kernels")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny dense checkpoint, a tiny scale")
    args = ap.parse_args(argv)
    import torch
    smoke = args.smoke
    args.context = args.context if args.context is not None else (32 if smoke else 1024)
    args.reps = args.reps if args.reps is not None else (5 if smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if smoke else 5)
    args.device = args.device or ("cpu" if smoke or not torch.cuda.is_available() else "cuda")
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    # one thread: on a small shared CPU, tiny ops across threads cost more in waiting than they gain
    threads = args.torch_threads if args.torch_threads is not None else (1 if smoke else None)
    before = torch.get_num_threads()
    try:
        batches = parse_batches(args.batches)
        check_args(args, torch)
        if threads is not None:
            if threads < 1:
                raise UserError(f"--torch-threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        # a smoke result must never land on the GPU figure's path
        out = args.out or (os.path.join(tempfile.mkdtemp(prefix="decode_step_"), "decode_step_smoke.json") if smoke
                           else os.path.join(HERE, "results", "decode_step.json"))
        model = write_tiny_model(os.path.splitext(out)[0] + "_model") if smoke else args.model
        profile = tuple(parse_batches(args.profile)) if args.profile else ()
        result = run(args, torch, model, batches, save=lambda partial: write_result(
            out, {**provenance("benchmarks/decode_step.py", argv, args.commit), **partial}), profile=profile)
    except UserError as e:
        print(f"decode_step: error: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(before)      # main() may run inside another process (the test)
    result = {**provenance("benchmarks/decode_step.py", argv, args.commit), **result}
    write_result(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
