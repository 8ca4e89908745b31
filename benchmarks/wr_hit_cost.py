"""What a dasc-wr hit costs in a batched replay: (wr replay time - nr replay time) / hits, through the engine.

The issue "Prefill and decode speed on the H200" asks for at most 2 ms per hit at W=16 (the paper's separate
replay forward: 67 ms per hit; the engine measured about 11 ms before). benchmarks/wr_cost.py times one hit
at a time on the CPU; this times many hits in flight at once, as a server sees them.

Arms: nr<W> and wr<W> (the same plan: same retained units, same slot size), each in its own Engine on the
same model, same state budget, same workload and seed. The budget holds every checkpoint a pass stores and
the KV cache every block it caches, so nothing is evicted and every replay request hits its document's
checkpoint. One pass of an arm:
  flush -> fill (untimed: every document once, with its first question; this stores the checkpoint at the
  document end) -> timed replay: the remaining questions of every document, all submitted at once, so the
  scheduler runs up to --max-batch of them per step (continuous batching, one output token each: what is
  timed is the prefill a hit costs, TTFT-like). Each replay loads its document's checkpoint (nr: zero-fill
  the omitted units; wr: also replay the last W cached tokens and merge them back), then prefills its
  question.
Every pass starts from a flushed cache and refills it, so every timed pass loads the same checkpoints and
runs the same steps. --warm-passes untimed passes per arm come first (after Engine.warmup()).

Order: the timed passes alternate the arms in ABBA order (nr, wr, wr, nr, nr, wr, ...): alternating makes
slow drift of the machine (clocks, thermals, other tenants) hit both arms alike, and reversing the pair every
repetition also cancels a linear drift and any effect of running first or second within a pair.

Reported: per pass and arm the replay seconds, hits, replayed tokens (from the requests' stats, checked
against the engine's counter), steps and ModelRunner.execute seconds; per arm the median; the headline
  wr cost per hit = (median wr replay s - median nr replay s) / hits per pass
next to the paired per-repetition differences (so the noise is visible), and whether the 2 ms target is met.

    python -m benchmarks wr_hit_cost --model /tmp/kimi48 [--wmax 16] [--max-batch 64] [--reps 7] \\
        [--commit SHA] [--out benchmarks/results/wr_hit_cost.json]
    python -m benchmarks wr_hit_cost --smoke [--out FILE]     # CPU, the embedded tiny Kimi-Linear, tiny workload
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from benchmarks.results_io import provenance, write_result  # noqa: E402

TARGET_MS = 2.0
SMOKE_MODEL = os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear")
# per mode: the defaults of the flags left unset (the smoke run is a tiny version of the GPU one)
DEFAULTS = {
    "gpu": dict(device="cuda", dtype="bfloat16", docs=64, doc_len=1024, question_len=64, questions_per_doc=4,
                max_batch=64, reps=7, warm_passes=1, block_size=16, torch_threads=0, max_num_tokens=16384,
                out=os.path.join(HERE, "results", "wr_hit_cost.json")),
    # doc_len off the block grid: the hits' partial-block copies run too
    "smoke": dict(device="cpu", dtype="float32", docs=4, doc_len=36, question_len=4, questions_per_doc=3,
                  max_batch=4, reps=3, warm_passes=1, block_size=16, torch_threads=1, max_num_tokens=0,
                  out=os.path.join(HERE, "results", "wr_hit_cost_smoke.json")),
}


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value
    return parse


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[-4:]))
    pos1, pos0 = _int_at_least(1), _int_at_least(0)
    ap.add_argument("--model", help="checkpoint directory (the Kimi-Linear-48B-shaped one from "
                                    "benchmarks/shaped_model.py); required unless --smoke")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU smoke run: the embedded tiny Kimi-Linear (trtllm_dasc/assets), fp32, a tiny workload")
    ap.add_argument("--wmax", type=pos1, default=16, help="W_max of both arms (nr<W>, wr<W>; default 16)")
    ap.add_argument("--max-batch", type=pos1, help="requests in flight per step, both arms (default 64; smoke 4)")
    ap.add_argument("--reps", type=pos1, help="timed passes per arm; medians are over these (default 7; smoke 3)")
    ap.add_argument("--warm-passes", type=pos0, help="untimed passes per arm after warmup() (default 1)")
    ap.add_argument("--docs", type=pos1, help="documents (shared prefixes) per pass (default 64; smoke 4)")
    ap.add_argument("--doc-len", type=pos1, help="tokens per document = the cached prefix of a hit (default 1024)")
    ap.add_argument("--question-len", type=pos1, help="new tokens per request after the document (default 64)")
    ap.add_argument("--questions-per-doc", type=_int_at_least(2),
                    help="questions per document: the first fills, the others are the timed replays "
                         "(default 4: 3 replays per document)")
    ap.add_argument("--seed", type=pos0, default=1, help="workload seed, the same for both arms (default 1)")
    ap.add_argument("--block-size", type=pos1, help="KV block size in tokens (default 16)")
    ap.add_argument("--kv-blocks", type=pos1, help="KV blocks per engine (default: what a pass caches, with room "
                                                   "to spare, so nothing is evicted)")
    ap.add_argument("--max-num-tokens", type=pos0,
                    help="cap on the tokens of one step, all requests; 0: no cap (default 16384: it chunks the "
                         "untimed fill, a replay step of the default workload holds 64 x (64 + 16) = 5120; "
                         "smoke 0)")
    ap.add_argument("--device", help="cpu, cuda or cuda:N (default cuda; smoke cpu)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                    help="model dtype (default bfloat16; smoke float32)")
    ap.add_argument("--torch-threads", type=pos0,
                    help="torch CPU threads (default 0: torch's own choice; smoke 1, steadier on a shared CPU)")
    ap.add_argument("--no-warmup", action="store_true", help="skip Engine.warmup() (not for figures)")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD; pass it on a "
                                                   "device machine whose .git may be stale)")
    ap.add_argument("--out", help="result JSON (default benchmarks/results/wr_hit_cost.json; smoke "
                                  "benchmarks/results/wr_hit_cost_smoke.json)")
    args = ap.parse_args(argv)
    mode = "smoke" if args.smoke else "gpu"
    for name, value in DEFAULTS[mode].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.smoke:
        args.model = args.model or SMOKE_MODEL
    elif not args.model:
        ap.error("--model DIR is required (or --smoke for the CPU smoke run)")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}: no config.json there (expected a checkpoint directory, e.g. from "
                 "benchmarks/shaped_model.py)")
    return args


# ---- one pass ----------------------------------------------------------------------------------------------
class StepTimer:
    """Wraps one engine's ModelRunner.execute: steps and seconds spent in it (the rest of a pass's wall time
    is the scheduler and the engine's bookkeeping). On CUDA execute ends in a device sync (sampling), so
    its time includes the device's."""

    def __init__(self, runner):
        self.inner, self.steps, self.seconds = runner.execute, 0, 0.0
        runner.execute = self

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self.inner(*a, **kw)
        finally:
            self.seconds += time.perf_counter() - t0
            self.steps += 1

    def take(self) -> tuple[int, float]:
        out = (self.steps, self.seconds)
        self.steps, self.seconds = 0, 0.0
        return out


def run_pass(engine, timer: StepTimer, work, tag, sync) -> dict:
    """flush -> fill (untimed) -> the timed batched replay. Figures are of the replay requests."""
    from trtllm_dasc.engine.request import GenerationRequest
    engine.flush()
    before = engine.stats()          # after the flush: its own evictions are not the pass's
    engine.generate([GenerationRequest((tag, "fill", i), p, 1) for i, p in enumerate(work.fill)])
    reqs = [GenerationRequest((tag, "replay", i), p, 1) for i, p in enumerate(work.replay)]
    gc.collect()
    sync()
    timer.take()
    mid = engine.stats()
    t0 = time.perf_counter()
    engine.generate(reqs)            # all at once: the scheduler keeps up to max_batch in flight
    sync()
    seconds = time.perf_counter() - t0
    steps, execute_s = timer.take()
    after = engine.stats()
    st = [r.stats for r in reqs]
    return {"seconds": seconds, "requests": len(reqs), "hits": sum(s.checkpoint_loaded for s in st),
            "prompt_tokens": sum(s.prompt_tokens for s in st), "cached_tokens": sum(s.cached_tokens for s in st),
            "replayed_tokens": sum(s.replayed_tokens for s in st),
            "replayed_tokens_counter": after["replayed_tokens"] - mid["replayed_tokens"],
            "loads": {k: after["checkpoint_loads"][k] - mid["checkpoint_loads"][k] for k in ("nr", "wr")},
            "steps": steps, "execute_s": execute_s,
            # over fill and replay: any eviction means the budget was too small for "every replay hits"
            "evictions": {k: n - before["evictions"][k] for k, n in after["evictions"].items()}}


# ---- sizing ------------------------------------------------------------------------------------------------
def checkpoints_bound(work, interval: int) -> int:
    """Checkpoints one pass can store (fill and replay, nothing freed in between): per prompt the interval
    grid, the branch point and the prompt end (cache.checkpoint_positions), at most len // interval + 2."""
    return sum(len(p) // interval + 2 for p in work.fill + work.replay)


def kv_blocks_bound(work, block_size: int, max_batch: int, window: int) -> int:
    """KV blocks one pass can hold: every fill prompt whole, every replay's tokens past the document (plus a
    copied partial block and one to spare), and the replays in flight (their window, a copy, one to spare);
    a quarter more, and a fixed margin."""
    def tail(n: int) -> int:
        return -(-n // block_size) + 2

    need = sum(tail(len(p)) for p in work.fill) + sum(tail(len(p) - work.doc_len) for p in work.replay)
    need += max_batch * tail(window)
    return int(need * 1.25) + 64


# ---- main --------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)

    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.arms import parse_arm
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.engine import Engine
    from trtllm_dasc.engine.runner import engine_plan
    from benchmarks.prefix_reuse import prefix_reuse_workload
    from trtllm_dasc.errors import UserError

    try:
        vocab = HybridConfig.from_path(args.model).schema.network.vocab_size
        if vocab < 4:
            raise UserError(f"model {args.model}: vocabulary of {vocab} is too small for the workload (>= 4)")
        work = prefix_reuse_workload(num_docs=args.docs, doc_len=args.doc_len, question_len=args.question_len,
                                     questions_per_doc=args.questions_per_doc, vocab=vocab, seed=args.seed)
        arms = {"nr": parse_arm(f"nr{args.wmax}"), "wr": parse_arm(f"wr{args.wmax}")}
        max_context = args.doc_len + args.question_len + 8
        common = dict(model=args.model, interval=args.doc_len, block_size=args.block_size,
                      max_batch=args.max_batch, max_context=max_context, prefill_chunk=max(4096, max_context),
                      max_num_tokens=args.max_num_tokens or None, device=args.device, dtype=args.dtype)
        # nr and wr share the plan (same W_max, codec, layout): one slot size, one budget, one slot count
        plan = engine_plan(EngineConfig(**common, **arms["nr"].engine_fields()))
        if not plan.replay_window:
            raise UserError(f"at W_max={args.wmax} this model's plan omits no unit: wr{args.wmax} would replay "
                            "nothing (try a larger --wmax)")
        slots = checkpoints_bound(work, args.doc_len)
        budget = (slots + 1) * plan.bottleneck_slot_bytes()
        kv_blocks = args.kv_blocks or kv_blocks_bound(work, args.block_size, args.max_batch, plan.replay_window)
        engines, timers, meta = {}, {}, {}
        for name, arm in arms.items():
            cfg = EngineConfig(**common, **arm.engine_fields(), state_budget_bytes=budget, num_kv_blocks=kv_blocks)
            t0 = time.perf_counter()
            engine = Engine(cfg)
            load_s = time.perf_counter() - t0
            warm = None if args.no_warmup else engine.warmup()
            engines[name], timers[name] = engine, StepTimer(engine.runner)
            meta[name] = {"spec": arm.spec, "label": arm.label, "engine_arm": cfg.arm, "load_s": load_s,
                          "warmup_s": warm and warm["seconds"], "checkpoint_slots": engine.runner.pool.num_slots,
                          "replay_window": engine.runner.replay_window}
            warm_text = "skipped" if warm is None else f"{warm['seconds']:.1f} s"
            print(f"[wr_hit_cost] {arm.label}: loaded in {load_s:.1f} s, warm-up {warm_text}, "
                  f"{engine.runner.pool.num_slots} checkpoint slots", file=sys.stderr, flush=True)
    except UserError as e:
        print(f"wr_hit_cost: error: {e}", file=sys.stderr)
        return 2

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    warm_passes = {name: [] for name in arms}
    passes = {name: [] for name in arms}
    for i in range(args.warm_passes):
        for name in arms:
            warm_passes[name].append(run_pass(engines[name], timers[name], work, (name, "warm", i), sync))
    orders = []
    for i in range(args.reps):
        order = ("nr", "wr") if i % 2 == 0 else ("wr", "nr")
        orders.append(list(order))
        for name in order:
            passes[name].append(run_pass(engines[name], timers[name], work, (name, i), sync))
        print(f"[wr_hit_cost] pass {i + 1}/{args.reps}: nr {passes['nr'][-1]['seconds']:.4f} s, "
              f"wr {passes['wr'][-1]['seconds']:.4f} s", file=sys.stderr, flush=True)
    for engine in engines.values():
        engine.sanity_check()

    # validity: every timed replay of both arms hit, nothing evicted, the same hits in both arms
    replays = len(work.replay)
    problems = []
    for name in arms:
        for i, p in enumerate(passes[name]):
            if p["hits"] != replays:
                problems.append(f"{name} pass {i + 1}: {p['hits']} of {replays} replays hit a checkpoint")
            if p["evictions"]["checkpoints"] or p["evictions"]["checkpoints_with_kv"]:
                problems.append(f"{name} pass {i + 1}: checkpoints evicted {p['evictions']}")
            if p["replayed_tokens"] != p["replayed_tokens_counter"]:
                problems.append(f"{name} pass {i + 1}: requests replayed {p['replayed_tokens']} tokens, the engine "
                                f"counted {p['replayed_tokens_counter']}")
    if any(p["replayed_tokens"] for p in passes["nr"]):
        problems.append("the nr arm replayed tokens")
    if not all(p["replayed_tokens"] for p in passes["wr"]):
        problems.append("a wr pass replayed no tokens")
    hits = passes["nr"][0]["hits"]

    median = {name: statistics.median(p["seconds"] for p in passes[name]) for name in arms}
    cost_ms = (median["wr"] - median["nr"]) * 1e3 / hits if hits else float("nan")
    paired = [(w["seconds"] - n["seconds"]) * 1e3 / hits if hits else float("nan")
              for n, w in zip(passes["nr"], passes["wr"])]
    per_hit = {name: sum(p["replayed_tokens"] for p in passes[name]) / max(1, sum(p["hits"] for p in passes[name]))
               for name in arms}
    valid = not problems
    met = (cost_ms <= TARGET_MS) if valid else None

    label = "embedded tiny Kimi-Linear (smoke)" if args.smoke else args.model
    print(f"\nwr hit cost, {label}, {args.device} {args.dtype}: W_max={args.wmax} (wr replays "
          f"{meta['wr']['replay_window']} tokens), {args.docs} documents of {args.doc_len} tokens, {replays} "
          f"replays per pass of {args.question_len} new tokens each, batch {args.max_batch}, {args.reps} timed passes "
          f"per arm (ABBA order)")
    print(f"{'pass':>6} {'order':>7} {'nr s':>9} {'wr s':>9} {'nr steps':>9} {'wr steps':>9} {'(wr-nr)/hit ms':>15}")
    for i, (n, w) in enumerate(zip(passes["nr"], passes["wr"])):
        print(f"{i + 1:>6} {','.join(orders[i]):>7} {n['seconds']:>9.4f} {w['seconds']:>9.4f} {n['steps']:>9} "
              f"{w['steps']:>9} {paired[i]:>15.3f}")
    print(f"{'median':>6} {'':>7} {median['nr']:>9.4f} {median['wr']:>9.4f}")
    for name in arms:
        hit_counts = sorted({p["hits"] for p in passes[name]})
        print(f"{name}: hits per pass {'/'.join(map(str, hit_counts))} of {replays}, replayed tokens per hit "
              f"{per_hit[name]:.1f}, execute {statistics.median(p['execute_s'] for p in passes[name]):.4f} s "
              f"(median per pass)")
    print(f"wr cost per hit = (median wr - median nr) / {hits} hits = {cost_ms:.3f} ms "
          f"(paired per pass: median {statistics.median(paired):.3f}, min {min(paired):.3f}, max {max(paired):.3f})")
    if valid:
        print(f"target <= {TARGET_MS:g} ms per hit: {'MET' if met else 'NOT MET'}")
    else:
        print(f"target <= {TARGET_MS:g} ms per hit: NOT MEASURED (the run is invalid: {'; '.join(problems)})")

    result = {"benchmark": "wr_hit_cost", **provenance("benchmarks/wr_hit_cost.py", argv, args.commit),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "smoke": args.smoke,
              "model": args.model if not args.smoke else "trtllm_dasc/assets/tiny-kimi-linear",
              "settings": {"wmax": args.wmax, "device": args.device, "dtype": args.dtype, "docs": args.docs,
                           "doc_len": args.doc_len, "question_len": args.question_len,
                           "questions_per_doc": args.questions_per_doc, "seed": args.seed,
                           "max_batch": args.max_batch, "block_size": args.block_size, "kv_blocks": kv_blocks,
                           "max_num_tokens": args.max_num_tokens or None, "reps": args.reps,
                           "warm_passes": args.warm_passes, "warmup": not args.no_warmup,
                           "budget_bytes": budget, "slot_bytes": plan.bottleneck_slot_bytes(),
                           "checkpoints_needed": slots},
              "replays_per_pass": replays, "hits_per_pass": hits, "order": orders,
              "arms": {name: {**meta[name], "passes": passes[name], "warm_passes": warm_passes[name],
                              "median_s": median[name], "replayed_tokens_per_hit": per_hit[name]}
                       for name in arms},
              "wr_cost_per_hit_ms": cost_ms, "paired_cost_per_hit_ms": paired,
              "cost_definition": "(median wr replay seconds - median nr replay seconds) * 1e3 / hits per pass",
              "target_ms": TARGET_MS, "valid": valid, "problems": problems, "target_met": met}
    write_result(args.out, result)
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
