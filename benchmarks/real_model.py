"""A released model at its real size (dummy weights) on one GPU: start to ready, prefill, decode against its
bound, and a warmed first pass against the second, each set against rates measured in the same run.

The engine is what `dasc serve` runs: `dasc-build --load-format dummy` from the released config.json (the
Kimi-Linear one completed with its released expert counts, families/released.py) into a temporary engine
directory, then Engine(engine dir): the memory check, each weight made on the device from (seed, name),
then warmup() (Triton JIT, fla autotuning, cuDNN graphs). Kimi-Linear-48B-A3B at TP1 is ~98 GB of bf16
weights and fits one H200; Qwen3-Next-80B-A3B (~160 GB) needs TP2, which this in-process script does not run
(the memory check refuses it in one line). The MoE layer is whatever model/mlp.py provides.

Measured, in this order (prefill and decode after the passes, so the first pass is a fresh server's):
  rates        a bf16 GEMM (8192^3, device events; CPU: fp32 1024^3) and a device-to-device copy
               (copy_bandwidth.py): the roofs below are divided by these, not by datasheet numbers;
  ready_s      Engine() (weights made on the device) + warmup(): a server's start to ready;
  passes       right after warm-up, one workload (8 prompts of 3000 down to 2321 tokens in one batch, 16
               tokens each) and then the same shapes with other tokens: first / second;
  prefill      one sequence of 4k and 16k tokens through the model (model_prefill.run_once: a warm-up, then
               --reps timed; logits for the last token): tokens/s, and FLOPs counted on the active
               parameters (model_prefill.flops_per_token with the routed experts cut to top-k per layer:
               what one token multiplies with) over time, as a fraction of the GEMM rate;
  decode       B requests of --context tokens each stepped into decode, then timed engine steps
               (decode_step.time_decode) at B = 1, 8, 32, 64, 96, against bound = bytes a step must read /
               copy bandwidth: every weight but the routed experts and the embedding (attention, linear
               attention, dense layers, routers, shared experts, norms, LM head), the routed experts this
               batch's tokens chose (distinct experts per MoE layer, counted from the router's choices on the
               first timed-shape step), B embedding rows, each sequence's recurrent state read and written
               (2 x a dense checkpoint) and its cached KV read.
Targets (issue 32), written before measuring: decode at batch 1 within 2x its bound; prefill at 16k >= 45% of
the GEMM rate; the warmed first pass within 10% of the second.
JSON (command, commit) to benchmarks/results/real_model_<arch>_h200.json (--out to change).

    python -m benchmarks real_model [--config tests/data/kimi-linear-48b-a3b.config.json] --commit C
    python -m benchmarks real_model --smoke        # CPU: a tiny Kimi-shaped MoE, seconds
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

from benchmarks.copy_bandwidth import GIB, copy_bandwidth, device_ms  # noqa: E402
from benchmarks.results_io import provenance, write_result  # noqa: E402

from trtllm_dasc.errors import UserError  # noqa: E402

TARGETS = {"decode_batch1_over_bound_max": 2.0, "prefill_16k_gemm_fraction_min": 0.45,
           "first_over_second_pass_max": 1.10}


def gemm_rate(torch, device: str) -> dict:
    """FLOP/s of one large matmul (bf16 8192^3 on a GPU, fp32 1024^3 on the CPU), device-timed."""
    cuda = device.startswith("cuda")
    n, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    if cuda:
        ms = device_ms(torch, lambda: a @ b, reps=20)
    else:
        a @ b
        t0 = time.perf_counter()
        for _ in range(3):
            a @ b
        ms = 1e3 * (time.perf_counter() - t0) / 3
    del a, b
    if cuda:
        torch.cuda.empty_cache()        # the engine's memory check counts the device's free memory
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "ms": ms, "flops_per_s": 2 * n ** 3 / (ms / 1e3)}


class WeightNames:
    """Every tensor name and shape the loader asks for (recorded through a meta-device load: no memory)."""

    def __init__(self, cfg):
        from trtllm_dasc.model import HybridModel
        from trtllm_dasc.model.footprint import MetaSource
        from trtllm_dasc.model.weights import RandomWeights
        self.shapes = {}
        outer = self

        class Recording(MetaSource):
            def get(self, name, shape):
                outer.shapes[name] = tuple(shape)
                return super().get(name, shape)
        HybridModel.from_source(cfg, Recording(RandomWeights()), dtype="bfloat16", device="meta", backend="torch")


def is_routed_expert(name: str) -> bool:
    return ".experts." in name and ".shared_expert" not in name


def active_shapes(shapes: dict, top_k: int) -> dict:
    """The matmul weights one token multiplies with: routed experts 0..top_k-1 stand for the k it picks."""
    return {n: s for n, s in shapes.items()
            if not is_routed_expert(n) or int(n.split(".experts.")[1].split(".")[0]) < top_k}


def weight_bytes(shapes: dict, model_type: str, dtype_bytes: int) -> dict:
    """Bytes of the weights by role: routed experts (per expert, one MoE layer), the embedding table, the rest
    (kimi's router and the decay tensors are fp32, everything else in the run dtype)."""
    def nbytes(name, shape):
        fp32 = name.endswith(("A_log", "dt_bias", "e_score_correction_bias")) or (
            model_type == "kimi_linear" and name.endswith("block_sparse_moe.gate.weight"))
        return math.prod(shape) * (4 if fp32 else dtype_bytes)
    experts = [n for n in shapes if is_routed_expert(n)]
    one = {}
    for n in experts:
        layer, e = n.split(".layers.")[1].split(".")[0], n.split(".experts.")[1].split(".")[0]
        if e == "0":
            one[layer] = one.get(layer, 0) + nbytes(n, shapes[n])
    embed = shapes["model.embed_tokens.weight"]
    rest = sum(nbytes(n, s) for n, s in shapes.items() if not is_routed_expert(n) and n != "model.embed_tokens.weight")
    return {"other_bytes": rest, "expert_bytes": next(iter(one.values()), 0), "moe_layers": len(one),
            "embed_row_bytes": embed[1] * dtype_bytes, "all_experts_bytes": sum(nbytes(n, shapes[n]) for n in experts)}


class RoutingProbe:
    """Wraps every MoE layer's forward; while armed for batch B it keeps the first B-token input of each layer
    (a decode step's) and counts the distinct experts the router picks for it."""

    def __init__(self, model, torch):
        from trtllm_dasc.model.mlp import DenseMLP
        self.torch, self.spec, self.batch, self.inputs = torch, model.spec, None, {}
        self.layers = [m for _, m, *_ in model.layers if not isinstance(m, DenseMLP)]
        for i, mlp in enumerate(self.layers):
            inner = mlp.forward

            def forward(x, *a, _i=i, _inner=inner, **kw):
                if self.batch is not None and x.shape[0] == self.batch and _i not in self.inputs:
                    self.inputs[_i] = x.detach().clone()
                return _inner(x, *a, **kw)
            mlp.forward = forward

    def arm(self, batch: int) -> None:
        self.batch, self.inputs = batch, {}

    def distinct(self) -> list[int] | None:
        """Distinct experts per MoE layer chosen for the recorded decode step (None: nothing recorded)."""
        self.batch = None
        if len(self.inputs) != len(self.layers):
            return None
        torch, out = self.torch, []
        with torch.inference_mode():
            for i, mlp in enumerate(self.layers):
                x = self.inputs[i]
                if hasattr(mlp, "route"):
                    idx = mlp.route(x)[1]
                else:
                    # qwen3_next: softmax over the router's logits, top-k (model/mlp.py QwenMoE)
                    probs = torch.softmax(x @ mlp.w["router"].T, dim=-1, dtype=torch.float)
                    idx = torch.topk(probs, self.spec.top_k, dim=-1)[1]
                out.append(int(torch.unique(idx).numel()))
        return out


def build_engine_dir(config: str, out_dir: str, args) -> str:
    from build_scripts.dasc_build import main as dasc_build
    flags = ["--model", config, "--output", out_dir, "--force", "--load-format", "dummy", "--seed", "0",
             "--device", args.device, "--dtype", args.dtype, "--max-batch-size", str(args.max_batch),
             "--max-context", str(args.max_context), "--kv-blocks", str(args.kv_blocks), "--block-size", "16",
             "--max-num-tokens", str(args.max_num_tokens), "--prefill-chunk", str(args.prefill_chunk),
             "--wmax", "16"]
    if dasc_build(flags) != 0:
        raise UserError("dasc-build --load-format dummy failed (see above)")
    return out_dir


def time_prefill(model, torch, tokens: int, reps: int, shapes: dict, raw: dict, cfg, rate: float) -> dict:
    from benchmarks.model_prefill import flops_per_token, run_once
    cuda = model.device.type == "cuda"
    ids = torch.randint(0, model.spec.vocab_size, (tokens,), generator=torch.Generator().manual_seed(tokens))
    t0 = time.perf_counter()
    run_once(model, ids, cuda, timed=False)
    warm_s = time.perf_counter() - t0
    runs = [run_once(model, ids, cuda, timed=True) for _ in range(reps)]
    total_ms = statistics.median(t for t, _ in runs)
    split = min(runs, key=lambda r: r[0])[1]
    flops = flops_per_token(raw, cfg, active_shapes(shapes, model.spec.top_k), tokens)
    achieved = flops["total"] * tokens / (total_ms / 1e3)
    return {"tokens": tokens, "ms": total_ms, "reps_ms": [t for t, _ in runs], "warmup_s": warm_s,
            "tokens_per_s": tokens / (total_ms / 1e3), "split_ms": split, "flops_per_token": flops,
            "flops_per_s": achieved, "gemm_fraction": achieved / rate}


class CompileLog:
    """Triton kernels compiled while it is entered (the JIT's in-memory cache misses, fla's autotuning
    included: one entry per config tried): what a slow first pass compiled that warm-up did not. Entries:
    (seconds since entering, kernel, its specialisation key); [] without Triton."""

    def __init__(self):
        self.entries, self._knobs, self._t0 = [], None, 0.0

    def _hook(self, *args, key=None, fn=None, **kw):
        name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or str(fn)
        self.entries.append((round(time.perf_counter() - self._t0, 3), name, str(key)[:400]))
        return False

    def __enter__(self):
        self._t0 = time.perf_counter()
        try:
            import triton
            self._knobs = triton.knobs.runtime
            self._previous = self._knobs.jit_cache_hook
            self._knobs.jit_cache_hook = self._hook
        except (ImportError, AttributeError):
            self._knobs = None
        return self

    def __exit__(self, *exc):
        if self._knobs is not None:
            self._knobs.jit_cache_hook = self._previous

    def summary(self) -> dict:
        kernels: dict[str, int] = {}
        for _, name, _ in self.entries:
            kernels[name] = kernels.get(name, 0) + 1
        return {"compiles": len(self.entries), "by_kernel": kernels, "entries": self.entries[:200]}


class AutotuneLog:
    """Triton autotuner benchmark runs while it is entered: a key the autotuner has not seen (a new shape in
    its key) times every config again without compiling anything, which CompileLog does not see. Entries:
    kernel name -> configs timed. {} without Triton."""

    def __init__(self):
        self.by_kernel: dict[str, int] = {}
        self._cls = None

    def __enter__(self):
        try:
            from triton.runtime.autotuner import Autotuner
        except ImportError:
            return self
        # a private method of Triton's autotuner (3.x): without it the log would record nothing, silently
        assert hasattr(Autotuner, "_bench"), "triton.runtime.autotuner.Autotuner._bench is gone: AutotuneLog needs it"
        self._cls, self._bench = Autotuner, Autotuner._bench
        log = self.by_kernel

        def bench(tuner, *a, **kw):
            name = getattr(tuner.fn, "__name__", None) or getattr(getattr(tuner, "base_fn", None), "__name__", "?")
            log[name] = log.get(name, 0) + 1
            return self._bench(tuner, *a, **kw)
        Autotuner._bench = bench
        return self

    def __exit__(self, *exc):
        if self._cls is not None:
            self._cls._bench = self._bench


class StepTimes:
    """Each runner.execute's seconds (it ends synchronised: sampling copies tokens to the host) and its
    shape (sequences, tokens) while entered: a slow first pass compared step by step with the second says
    which steps (prefill chunks, decode steps, the first of each shape) carry the difference."""

    def __init__(self, engine):
        self.runner, self.steps = engine.runner, []

    def __enter__(self):
        inner = self.inner = self.runner.execute

        def timed(plan, *a, **kw):
            t0 = time.perf_counter()
            out = inner(plan, *a, **kw)
            self.steps.append((round(time.perf_counter() - t0, 6), len(plan.spans),
                               sum(len(s.token_ids) for s in plan.spans)))
            return out
        self.runner.execute = timed
        return self

    def __exit__(self, *exc):
        self.runner.execute = self.inner


def time_pass(engine, seed: int, requests: int, prompt: int, new: int) -> float:
    """Seconds of one workload: `requests` prompts of mixed lengths up to `prompt`, `new` tokens each."""
    from trtllm_dasc.engine.request import GenerationRequest
    rng = random.Random(seed)
    vocab = engine.vocab_size
    batch = [GenerationRequest(("pass", seed, i), [rng.randrange(vocab) for _ in range(max(1, prompt - 97 * i))], new)
             for i in range(requests)]
    t0 = time.perf_counter()
    engine.generate(batch)
    seconds = time.perf_counter() - t0
    engine.flush()
    return seconds


def host_ops(prof, top: int = 40) -> list[dict]:
    """The host operators of a trace by self CPU time (ms, whole trace): where a step that is not busy on
    the device spends its host time."""
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [{"name": e.key[:100], "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
             "cpu_ms": e.cpu_time_total / 1e3} for e in rows]


def decode_row(engine, torch, probe, b: int, args, weights: dict, per_seq: dict, bandwidth: float) -> dict:
    from benchmarks.decode_step import time_decode
    from benchmarks.kernel_profile import print_summary
    probe.arm(b)
    # prefill steps until all b decode, then warmup + reps (decode_step.run's budget)
    steps = -(-b * args.context // (args.max_num_tokens - b)) + 2
    t = time_decode(engine, torch, b, args.context, args.warmup, args.reps, steps + args.warmup + args.reps + 2)
    distinct = probe.distinct()
    if distinct is None and engine.runner.graphs is not None:
        # the timed steps ran as CUDA graphs, whose replays call no Python forward the probe could see: one
        # more batch of b decodes, eagerly (graphs set aside for it), gives the router's own choices
        graphs, engine.runner.graphs = engine.runner.graphs, None
        try:
            probe.arm(b)
            time_decode(engine, torch, b, args.context, 0, 1, steps + 3)
            distinct = probe.distinct()
        finally:
            engine.runner.graphs = graphs
    spec = engine.runner.model.spec
    if distinct is None:
        # not seen (a decode graph ran the MoE layers): the expected count for uniform routing
        per_layer = spec.num_experts * (1 - (1 - spec.top_k / spec.num_experts) ** b) if spec.num_experts else 0
        distinct_src, experts = "expected (uniform routing): no eager decode step was seen", per_layer * weights[
            "moe_layers"]
    else:
        distinct_src, experts = "the router's choices in one decode step", sum(distinct)
    parts = {"weights_other": weights["other_bytes"], "routed_experts": experts * weights["expert_bytes"],
             "embedding_rows": b * weights["embed_row_bytes"], "state": b * per_seq["state_bytes"],
             "kv": b * args.context * per_seq["kv_bytes_per_token"]}
    total = sum(parts.values())
    bound_ms = 1e3 * total / bandwidth
    row = {"batch": b, **t, "distinct_experts_per_layer": distinct, "distinct_experts_from": distinct_src,
           "bytes": parts, "bound_bytes": total, "bound_ms": bound_ms, "ratio": t["step_ms"] / bound_ms,
           "tokens_per_s": b / (t["step_ms"] / 1e3)}
    if b in args.profile:
        # a separate run after the timed one (the profiler slows the steps it traces)
        row["profile"] = time_decode(engine, torch, b, args.context, args.warmup, args.reps,
                                     steps + args.warmup + args.reps + 2, profile=True)["profile"]
        print_summary(f"decode batch {b}", row["profile"], lines=40)
    return row


def run(args, torch, work: str) -> dict:
    from trtllm_dasc.config import DTYPE_BYTES, HybridConfig
    from trtllm_dasc.engine.engine import Engine
    from trtllm_dasc.serve.host import engine_config
    config = args.config
    if args.smoke:
        from trtllm_dasc.plan.synthetic import tiny_moe_config
        config = os.path.join(work, "config.json")
        with open(config, "w") as f:
            json.dump(tiny_moe_config(args.arch, layers=3), f)
    rates = {"gemm": gemm_rate(torch, args.device)}
    rates["copy_bandwidth_Bps"] = copy_bandwidth(args.device, GIB if args.device.startswith("cuda") else 64 << 20)
    print(f"GEMM {rates['gemm']['flops_per_s'] / 1e12:.3g} TFLOP/s, copy {rates['copy_bandwidth_Bps'] / 1e12:.3g} TB/s",
          flush=True)
    t0 = time.perf_counter()
    engine_dir = build_engine_dir(config, os.path.join(work, "engine"), args)
    build_s = time.perf_counter() - t0
    ecfg = engine_config(engine_dir)
    t0 = time.perf_counter()
    engine = Engine(ecfg)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    print(f"weights made in {load_s:.1f} s ({engine.runner.footprint.describe()})", flush=True)
    warm = engine.warmup()
    ready = {"build_s": build_s, "load_s": load_s, "warmup_s": warm["seconds"], "ready_s": load_s + warm["seconds"],
             "warmup": warm, "footprint": {"weights": engine.runner.footprint.weights, "kv": engine.runner.footprint.kv,
                                           "state": engine.runner.footprint.state, "pool": engine.runner.footprint.pool,
                                           "workspace": engine.runner.footprint.workspace}}
    print(f"ready in {ready['ready_s']:.1f} s (weights {load_s:.1f} s + warm-up {warm['seconds']:.1f} s)", flush=True)
    model, raw = engine.runner.model, json.load(open(os.path.join(engine_dir, "model", "config.json")))
    if args.device.startswith("cuda") and not getattr(model.backend, "fused_mixer", False):
        # the torch reference recurrence on a GPU measures nothing a user runs
        from trtllm_dasc.model.recurrence import fla as fla_backend
        raise UserError(f"the GPU run needs fla's kernels: {fla_backend.available()[1]}")
    cfg = HybridConfig.from_dict(raw, conv_dtype=args.dtype)
    shapes = WeightNames(cfg).shapes
    weights = weight_bytes(shapes, raw["model_type"], DTYPE_BYTES[args.dtype])
    kv_token = sum(math.prod(s) for s in model.kv_token_shapes) * DTYPE_BYTES[args.dtype] * len(cfg.full_attention_layers)
    per_seq = {"state_bytes": 2 * cfg.dense_checkpoint_bytes_per_rank(1), "kv_bytes_per_token": kv_token}
    result = {"benchmark": "real_model", **provenance("benchmarks/real_model.py", args.argv, args.commit),
              "torch": torch.__version__, "arch": cfg.arch, "model_type": raw["model_type"], "config": args.config,
              "smoke": args.smoke, "dtype": args.dtype, "weights": "dummy (dasc-build --load-format dummy, seed 0)",
              "backend": getattr(model.backend, "__name__", str(model.backend)),
              "mlp": type(next((m for _, m, *_ in model.layers if type(m).__name__ != "DenseMLP"), None)).__name__,
              "targets": TARGETS, "rates": rates, "ready": ready, "weight_bytes": weights, "per_sequence": per_seq,
              "prefill": [], "decode": [], "passes": None, "complete": False}

    def save():
        paths = [args.out] + ([os.path.join(os.environ["OUT"], os.path.basename(args.out))]
                              if os.environ.get("OUT") else [])
        for path in paths:
            write_result(path, result)

    # the first traffic after warm-up (what a user meets first), then the same shapes again
    with CompileLog() as first_log, AutotuneLog() as first_tuned, StepTimes(engine) as first_steps:
        first = time_pass(engine, 1, args.pass_requests, args.pass_prompt, args.pass_new)
    with CompileLog() as second_log, AutotuneLog() as second_tuned, StepTimes(engine) as second_steps:
        second = time_pass(engine, 2, args.pass_requests, args.pass_prompt, args.pass_new)
    result["passes"] = {"first_s": first, "second_s": second, "ratio": first / second,
                        "requests": args.pass_requests, "longest_prompt": args.pass_prompt, "new_tokens": args.pass_new,
                        "first_compiled": first_log.summary(), "second_compiled": second_log.summary(),
                        "first_autotuned": first_tuned.by_kernel, "second_autotuned": second_tuned.by_kernel,
                        "first_steps": first_steps.steps, "second_steps": second_steps.steps}
    slower = sorted(((a[0] - b[0], i, a[1:]) for i, (a, b) in enumerate(zip(first_steps.steps, second_steps.steps))),
                    reverse=True)[:5]
    if args.profile_pass:
        # a third pass of the same shapes under torch.profiler: device busy against span says whether the
        # engine's prefill steps wait on the host; the top kernels and host operators say on what
        from benchmarks.kernel_profile import kernel_trace, print_summary, summarize
        with kernel_trace(args.device, attribute=True) as prof, StepTimes(engine) as traced_steps:
            time_pass(engine, 3, args.pass_requests, args.pass_prompt, args.pass_new)
        summary = summarize(prof, 1, args.device, top=60)
        summary["host_ops"] = host_ops(prof)
        summary["steps"] = traced_steps.steps
        result["passes"]["profile"] = summary
        print_summary("pass (one, traced)", summary, lines=30)
        for op in summary["host_ops"][:20]:
            print(f"    host {op['self_cpu_ms']:9.1f} ms self  {op['cpu_ms']:9.1f} ms total  x{op['count']:<6d} {op['name']}")
    print(f"passes: autotuned in the first {first_tuned.by_kernel}, in the second {second_tuned.by_kernel}; "
          f"steps {len(first_steps.steps)} / {len(second_steps.steps)}, the first's slowest against the second: "
          + ", ".join(f"step {i} (seqs, tokens {shape}) +{1e3 * d:.1f} ms" for d, i, shape in slower), flush=True)
    print(f"passes: first {first:.2f} s, second {second:.2f} s ({first / second:.3f}x); Triton compiles in the "
          f"first {len(first_log.entries)}: {first_log.summary()['by_kernel']}, in the second {len(second_log.entries)}",
          flush=True)
    save()
    for tokens in args.tokens:
        row = time_prefill(model, torch, tokens, args.reps_prefill, shapes, raw, cfg, rates["gemm"]["flops_per_s"])
        result["prefill"].append(row)
        print(f"prefill {tokens:>6}: {row['ms']:9.1f} ms  {row['tokens_per_s']:10.0f} tok/s  "
              f"{100 * row['gemm_fraction']:5.1f}% of the GEMM rate", flush=True)
        save()
    probe = RoutingProbe(model, torch)
    for b in args.batches:
        row = decode_row(engine, torch, probe, b, args, weights, per_seq, rates["copy_bandwidth_Bps"])
        result["decode"].append(row)
        print(f"decode batch {b:>3}: {row['step_ms']:8.2f} ms  bound {row['bound_ms']:7.2f} ms  "
              f"{row['ratio']:5.2f}x  {row['tokens_per_s']:9.0f} tok/s", flush=True)
        save()
    engine.shutdown()
    result["verdict"] = verdict(result)
    result["complete"] = True
    save()
    print("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" if v is not None else f"{k} not measured"
                                  for k, v in result["verdict"].items()), flush=True)
    return result


def verdict(result: dict) -> dict:
    one = next((r for r in result["decode"] if r["batch"] == 1), None)
    longest = max(result["prefill"], key=lambda r: r["tokens"], default=None)
    return {"decode_batch1": None if one is None else one["ratio"] <= TARGETS["decode_batch1_over_bound_max"],
            "prefill_longest": None if longest is None
            else longest["gemm_fraction"] >= TARGETS["prefill_16k_gemm_fraction_min"],
            "first_pass": None if result["passes"] is None
            else result["passes"]["ratio"] <= TARGETS["first_over_second_pass_max"]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(os.path.dirname(HERE), "tests", "data",
                                                  "kimi-linear-48b-a3b.config.json"),
                    help="a released config.json or a directory holding one (default: the Kimi-Linear-48B-A3B "
                         "reference, tests/data/, a copy of ../shared/reference/)")
    ap.add_argument("--smoke", action="store_true", help="CPU: a tiny MoE of --arch's kind, small sizes")
    ap.add_argument("--arch", default="kda", choices=["kda", "gdn"], help="the tiny model's kind (--smoke)")
    ap.add_argument("--tokens", default=None, help="prefill lengths (4096,16384; smoke 64,128)")
    ap.add_argument("--batches", default=None, help="decode batch sizes (1,8,32,64,96; smoke 1,2)")
    ap.add_argument("--context", type=int, default=None, help="prompt tokens per decoding sequence (512; smoke 16)")
    ap.add_argument("--reps", type=int, default=None, help="timed decode steps per batch (10; smoke 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed decode steps first (3; smoke 1)")
    ap.add_argument("--reps-prefill", type=int, default=None, help="timed prefills per length (3; smoke 1)")
    ap.add_argument("--profile", default="", help="decode batch sizes to trace too (torch.profiler, a separate "
                                                    "run after the timed one): kernels, their time, idle gaps")
    ap.add_argument("--profile-pass", action="store_true",
                    help="trace a third pass of the passes' shapes too (device busy against span, kernels, "
                         "host operators)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/real_model_<arch>_h200.json; "
                                                "smoke: a temporary file)")
    ap.add_argument("--commit", default=None, help="commit to record (a device copy's .git may be stale)")
    args = ap.parse_args(argv)
    args.argv = argv
    smoke = args.smoke
    args.device = "cpu" if smoke else "cuda"
    args.dtype = "float32" if smoke else "bfloat16"
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    try:
        args.tokens = ints(args.tokens or ("64,128" if smoke else "4096,16384"))
        args.batches = ints(args.batches or ("1,2" if smoke else "1,8,32,64,96"))
        args.profile = ints(args.profile) if args.profile else []
    except ValueError:
        raise UserError("--tokens, --batches and --profile are comma-separated integers") from None
    if set(args.profile) - set(args.batches):
        raise UserError(f"--profile {args.profile}: each batch size must be one of --batches {args.batches}")
    for name, full, small in (("context", 512, 16), ("reps", 10, 2), ("warmup", 3, 1), ("reps_prefill", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, small if smoke else full)
    if min(args.tokens + args.batches) < 1 or args.context < 1 or args.reps < 1 or args.warmup < 0:
        raise UserError("--tokens, --batches, --context and --reps must be positive")
    args.max_batch = max(args.batches)
    args.max_num_tokens = 256 if smoke else 8192
    args.prefill_chunk = 64 if smoke else 4096
    args.pass_requests, args.pass_prompt, args.pass_new = (2, 40, 3) if smoke else (8, 3000, 16)
    args.max_context = max(args.context + args.reps + args.warmup + 64, args.pass_prompt + args.pass_new + 16)
    per_seq_blocks = -(-args.max_context // 16)
    args.kv_blocks = 2 * max(args.max_batch, args.pass_requests) * per_seq_blocks + 16
    if args.out is None:
        args.out = (os.path.join(tempfile.mkdtemp(prefix="real-model-out-"), "real_model.json") if smoke else
                    os.path.join(HERE, "results", "real_model_{arch}_h200.json"))
    return args


def main(argv=None) -> int:
    import torch
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse_args(argv)
        if not args.smoke and not torch.cuda.is_available():
            raise UserError("no CUDA device: run with --smoke on the CPU")
        if "{arch}" in args.out:
            from trtllm_dasc.config import HybridConfig
            from trtllm_dasc.families.released import complete_released
            path = args.config if os.path.isfile(args.config) else os.path.join(args.config, "config.json")
            args.out = args.out.format(arch=HybridConfig.from_dict(complete_released(json.load(open(path)))[0]).arch)
        # refused before the model is built: benchmarks/results/ keeps results of a clean commit
        from trtllm_dasc.provenance import check_results_commit
        check_results_commit(args.out, provenance("benchmarks/real_model.py", args.argv, args.commit)["commit"])
        work = tempfile.mkdtemp(prefix="real-model-")
        try:
            run(args, torch, work)
        finally:
            # the engine directory holds a config and a plan only: nothing worth keeping
            shutil.rmtree(work, ignore_errors=True)
    except UserError as e:
        print(f"real_model: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
