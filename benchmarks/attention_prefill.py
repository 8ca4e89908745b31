"""Causal prefill attention kernels side by side on the stacks' shapes: which one the attention layers should use.

At 16k tokens the Kimi-Linear-shaped stack spent 93 of its 311 ms in 7 MLA layers and the Qwen3-Next-shaped
one 130 of 388 ms in 12 gated-attention layers (model_prefill.py, the speed issue's first GPU run):
more than the layers' FLOPs need at the bf16 peak. This times one layer's attention alone, same inputs, per
kernel, in the same run:
  flash       SDPA's flash kernel (values padded to the key dim where they differ; GQA heads as they are)
  ours        attention.py's _attend as the layers call it (from CUDNN_MIN_TOKENS tokens at position 0 in
              bf16: cuDNN on 1024-token length buckets; below: SDPA flash; MLA's values padded to the key dim)
  efficient   SDPA's memory-efficient kernel (values as they are; GQA's key/value heads repeated)
  cudnn       SDPA's cuDNN kernel, timed after its first call (that call builds an execution graph per
              shape: its seconds are reported apart; the layers build theirs when the model loads)
  cudnn_dv    the same with the values at their own dim (no padding: MLA's 128 against 192); an error where
              the build refuses it, recorded like any arm's
  fla         fla's parallel_attn Triton kernel (GQA and a value dim of its own, natively)
The first GPU run of this benchmark (attention_prefill_h200.json) predates cuDNN in _attend: its "ours" arm
is flash there.
Each arm's output is compared with the flash arm's (max abs difference), so a fast wrong arm shows.
Reported: median ms of --reps CUDA-event timings and TFLOP/s for the causal FLOPs T^2/2 x H x 2 x (d_qk + d_v).

    python -m benchmarks attention_prefill [--tokens 4096 16384] [--reps 5] [--commit C] [--out PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
from benchmarks.results_io import provenance, write_result  # noqa: E402

# (name, query heads, key/value heads, query/key dim, value dim): Kimi-Linear-48B's MLA as the prefill
# expands it (nope 128 + rope 64 keys, 128 values, 32 heads), Qwen3-Next-80B's gated attention
SHAPES = [("kimi_mla", 32, 32, 192, 128), ("qwen_gqa", 16, 2, 256, 256)]


def sdpa(q, k, v, backend):
    """q [T, H, E], k/v [T, Hk, *] -> [T, H, Ev] through one SDPA backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    Ev, E = v.shape[-1], q.shape[-1]
    gqa = q.shape[1] != k.shape[1]
    if backend in ("flash", "cudnn") and Ev != E:
        v = F.pad(v, (0, E - Ev))
    backend = "cudnn" if backend == "cudnn_dv" else backend
    if backend == "efficient" and gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        gqa = False
    kind = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    with sdpa_kernel([kind]):
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                             v.transpose(0, 1)[None], is_causal=True, enable_gqa=gqa)
    return out[0].transpose(0, 1)[..., :Ev]


def fla_attn(q, k, v):
    from fla.ops.attn.parallel import parallel_attn
    return parallel_attn(q[None], k[None], v[None], scale=q.shape[-1] ** -0.5)[0]


def ours(q, k, v):
    from trtllm_dasc.model.attention import _attend
    return _attend(q, k, v, 0)


def time_ms(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "attention_prefill.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_prefill: needs a CUDA device", file=sys.stderr)
        return 1
    if args.reps < 1 or any(t < 16 for t in args.tokens):
        print("attention_prefill: need --reps >= 1 and --tokens >= 16", file=sys.stderr)
        return 2
    from trtllm_dasc.model.attention import keep_cudnn_out_of_sdpa
    # flash first: the reference of every other arm's output
    arms = {"flash": lambda q, k, v: sdpa(q, k, v, "flash"), "ours": ours,
            "efficient": lambda q, k, v: sdpa(q, k, v, "efficient"),
            "cudnn": lambda q, k, v: sdpa(q, k, v, "cudnn"), "cudnn_dv": lambda q, k, v: sdpa(q, k, v, "cudnn_dv"),
            "fla": fla_attn}
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, H, Hk, E, Ev in SHAPES:
        for T in args.tokens:
            q = torch.randn(T, H, E, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(T, Hk, E, device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn(T, Hk, Ev, device="cuda", dtype=torch.bfloat16, generator=gen)
            flops = T * T / 2 * H * 2 * (E + Ev)
            row = {"shape": name, "tokens": T, "heads": H, "kv_heads": Hk, "d_qk": E, "d_v": Ev,
                   "tflop": flops / 1e12, "arms": {}}
            ref = None
            for arm, fn in arms.items():
                try:
                    torch.backends.cuda.enable_cudnn_sdp(arm.startswith("cudnn"))
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = fn(q, k, v)
                    torch.cuda.synchronize()
                    first_s = time.perf_counter() - t0
                    times = time_ms(lambda: fn(q, k, v), args.reps)
                except Exception as e:  # noqa: BLE001 - an arm the shapes or the build refuse: recorded
                    row["arms"][arm] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                    continue
                finally:
                    keep_cudnn_out_of_sdpa("cuda")
                ms = statistics.median(times)
                if arm == "flash":
                    ref = out
                entry = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "first_call_s": round(first_s, 3),
                         "reps_ms": [round(t, 3) for t in times]}
                if ref is not None:
                    entry["max_abs_diff_vs_flash"] = float((out.float() - ref.float()).abs().max())
                row["arms"][arm] = entry
            rows.append(row)
            print(f"{name} T={T}: " + ", ".join(
                f"{a} {r['ms']:.2f} ms ({r['tflops']:.0f} TF/s)" if "ms" in r else f"{a} failed ({r['error'][:60]})"
                for a, r in row["arms"].items()), flush=True)
            result = {"benchmark": "attention_prefill",
                      **provenance("benchmarks/attention_prefill.py", argv, args.commit),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name(), "dtype": "bfloat16",
                      "rows": rows}
            paths = [args.out] + ([os.path.join(os.environ["OUT"], os.path.basename(args.out))]
                                  if os.environ.get("OUT") else [])
            for path in paths:
                write_result(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
