"""CPU benchmark: what a dasc-wr hit costs, against prefilling the same number of tokens.

The paper replays W tokens in a separate forward (67 ms per hit at W=16, App. F.1). Our engine replays
them inside the hit's own prefill pass, so a wr hit should cost about what W more prompt tokens cost.
Arms, all in one run on the same model and the same cached prefix (c tokens), n new tokens per request:
  nr(n)        hit, zero-fill, prefill n tokens
  wr(n, W)     hit, replay W cached tokens in the same pass, prefill n tokens
  nr(n + W)    hit, prefill n + W tokens (the "same number of tokens")
  separate(W)  a separate forward of the last W cached tokens from a zero state over the cached KV (the
               paper's way, emulated: what a wr hit adds to nr(n) without our fusion)
Reported: per-hit wr cost = wr(n, W) - nr(n) next to nr(n + W) - nr(n), medians over repeats.

    python -m benchmarks wr_cost [--prefix 512] [--new 32] [--windows 16 64 128] [--reps 15]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from benchmarks.results_io import provenance, write_result  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def build_checkpoint(path: str) -> None:
    """A small Kimi-Linear-shaped model (3 KDA layers + 1 MLA) saved by transformers."""
    from transformers import KimiLinearConfig, KimiLinearForCausalLM
    torch.manual_seed(0)
    cfg = KimiLinearConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64,
                           q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                           linear_head_dim=64, linear_num_heads=4, linear_conv_kernel_dim=4, num_local_experts=4,
                           num_experts_per_tok=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           mlp_layer_types=["dense"] * 4,
                           layer_types=["linear_attention", "linear_attention", "full_attention",
                                        "linear_attention"])
    model = KimiLinearForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.0, generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-6.0, 1.0, generator=g))
    model.save_pretrained(path)


def make_engine(path, prefix, policy, window):
    from trtllm_dasc.engine.config import EngineConfig
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.engine import Engine
    engine = Engine(EngineConfig(model=path, wmax=16, policy=policy, replay_window=window or None,
                                 max_context=4096, block_size=16, num_kv_blocks=4096, interval=10**6,
                                 prefill_chunk=4096, max_batch=2))
    # the warm request's prompt-end checkpoint (at len - 1) sits exactly at the prefix end
    engine.generate([GenerationRequest("warm", prefix + [5], 1)])
    return engine


def time_arms(arms: dict, prefix, reps: int, seed: int) -> dict:
    """Median ms per request of every arm, the arms interleaved request by request so that drift in the
    machine's speed hits them all alike. arms: name -> (engine, new tokens)."""
    from trtllm_dasc.engine.request import GenerationRequest
    gen = torch.Generator().manual_seed(seed)
    times = {name: [] for name in arms}
    for i in range(reps + 2):
        for name, (engine, new) in arms.items():
            prompt = prefix + torch.randint(3, 1000, (new,), generator=gen).tolist()
            t0 = time.perf_counter()
            engine.generate([GenerationRequest((name, i), prompt, 1)])
            if i >= 2:                      # the first two warm the allocator and caches
                times[name].append((time.perf_counter() - t0) * 1e3)
    for name, (engine, _) in arms.items():
        loads = engine.stats()["checkpoint_loads"]
        assert sum(loads.values()) >= reps + 2, (name, loads)
    return {name: statistics.median(t) for name, t in times.items()}


def separate_replay_ms(path, prefix, window, reps) -> float:
    """The paper's separate replay: one more forward of the last W cached tokens from a zero state,
    attending to the cached KV before them, timed alone (what a wr hit would add without our fusion)."""
    from trtllm_dasc.model import HybridModel, SeqInput
    model = HybridModel.from_pretrained(path)
    start = len(prefix) - window
    bs, n = 16, -(-len(prefix) // 16)
    # row 0 holds the prefix's KV in blocks [0, n); each fork shares the full blocks before start and
    # writes its replay into blocks of its own (a copy of the partial block at start, then fresh ones)
    state, kv = model.new_state(2), model.new_kv_cache(2 * n + 2, bs)
    model.forward([SeqInput(prefix[:start], 0, list(range(n)))], state, kv, logits="none")
    fork = list(range(start // bs)) + list(range(n, n + n - start // bs))
    times = []
    for i in range(reps + 2):
        if start % bs:
            kv.copy_blocks([(start // bs, fork[start // bs])])
        state.reset([1])
        t0 = time.perf_counter()
        model.forward([SeqInput(prefix[start:], 1, fork, start)], state, kv, logits="none")
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[2:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--windows", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "wr_cost.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    with tempfile.TemporaryDirectory() as path:
        build_checkpoint(path)
        prefix = torch.randint(3, 1000, (args.prefix,), generator=torch.Generator().manual_seed(9)).tolist()
        rows = []
        for W in args.windows:
            arms = {"nr": (make_engine(path, prefix, "nr", 0), args.new),
                    "wr": (make_engine(path, prefix, "wr", W), args.new),
                    "nr+W": (make_engine(path, prefix, "nr", 0), args.new + W)}
            ms = time_arms(arms, prefix, args.reps, seed=W)
            replayed = arms["wr"][0].stats()["replayed_tokens"] / (args.reps + 2)
            sep = separate_replay_ms(path, prefix, W, args.reps)
            rows.append({"window": W, "replayed_per_hit": replayed, "nr_ms": ms["nr"], "wr_ms": ms["wr"],
                         "nr_plus_W_ms": ms["nr+W"], "wr_cost_per_hit_ms": ms["wr"] - ms["nr"],
                         "prefill_W_tokens_ms": ms["nr+W"] - ms["nr"], "separate_replay_ms": sep})
    print(f"prefix {args.prefix} cached tokens, {args.new} new tokens per request, median of {args.reps}")
    print(f"{'W':>5} {'nr ms':>8} {'wr ms':>8} {'nr+W ms':>8} {'wr cost':>8} {'W-token prefill':>16} "
          f"{'separate fwd':>13}")
    for r in rows:
        print(f"{r['window']:>5} {r['nr_ms']:>8.2f} {r['wr_ms']:>8.2f} {r['nr_plus_W_ms']:>8.2f} "
              f"{r['wr_cost_per_hit_ms']:>8.2f} {r['prefill_W_tokens_ms']:>16.2f} {r['separate_replay_ms']:>13.2f}")
    result = {"benchmark": "wr_cost", **provenance("benchmarks/wr_cost.py", argv), "threads": torch.get_num_threads(), "prefix": args.prefix, "new": args.new,
              "reps": args.reps, "model": "kimi_linear 4 layers (3 KDA 4x64, 1 MLA), hidden 256", "rows": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
