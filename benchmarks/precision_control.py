"""Does the horizon order matter? Horizon bands against count-matched shuffled bands after a checkpoint load.

Measured in the state and in the next-token distribution (issue 35: "random band assignment measurably worse").

The quality pilots could not separate the two (horizon minus shuffled within +-0.4 points on three retrieval
tasks), so this measures the effect where it is made. For a random prefix of C tokens each arm writes the
prefix state's kept units through its codecs (the torch references, as benchmarks/precision_error.py does;
omitted units stay exact, so only the codec assignment differs), and every row then runs the same next tokens:

    horizon      each kept unit's codec from its horizon band (--precision, e.g. horizon:128,1024:int4,int8,int8)
    shuffled@S   the same bands permuted among each layer's kept units (--precision ...@S, the quality
                 protocol's count-matched control): the same codec counts per layer, so the same bytes
    int8         every kept unit INT8 (the paper's codec), for scale

Measured per arm, against the exact row:
    state        ||S'_T - S_T|| / ||S_T|| over all kept units at T tokens after the load
    kl           mean KL(p_exact || p_arm) of the next-token distributions over the window (T_prev, T]
    flips        share of those positions whose argmax differs from the exact row's

and the paired comparison per window: per prefix, the log ratio of the shuffled arms' mean to horizon's;
how many prefixes have horizon below the shuffled mean; the exact two-sided sign-test p over prefixes.

    python -m benchmarks precision_control --smoke                   CPU, seconds: tiny paper-profile KDA
    python -m benchmarks precision_control --tiny-profile kda|gdn    the paper's decay profile, random weights
    python -m benchmarks precision_control --model benchmarks/quality_models/kda [--precision ...] [--seeds 5]
        [--prefixes 8] [--prefix 4096] [--tokens 0 16 64 1024 4096] [--out benchmarks/results/precision_control.json]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import torch

from benchmarks.precision_error import (add_model_arguments, band_masks, band_norm, encode_state, load_model,
                                        unit_codecs)
from benchmarks.results_io import provenance, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
LOGIT_CHUNK = 256   # continuation tokens per forward call: bounds the [tokens, vocab] logits held at once


def kl_and_flips(exact: torch.Tensor, other: torch.Tensor) -> tuple[float, float, int]:
    """Summed KL(p_exact || p_other) and argmax disagreements over rows, and the row count."""
    lp, lq = torch.log_softmax(exact.double(), -1), torch.log_softmax(other.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    flips = (exact.argmax(-1) != other.argmax(-1)).double()
    return float(kl.sum()), float(flips.sum()), int(exact.shape[0])


def run_prefix(model, plan, arms: dict, ids: list[int], cont: list[int], points: list[int]) -> dict:
    """One prefix: per arm, the kept-unit state error at each point and KL / flips per window."""
    from trtllm_dasc.model.direct import DirectRunner
    n_units = plan.config.units_per_layer
    names = list(arms)
    # per layer, every band's kept units together
    kept = [torch.stack(layer).any(0) for layer in zip(*band_masks(plan, n_units))]
    r = DirectRunner(model, rows=1 + len(names), max_tokens=len(ids) + max(points) + 1, block_size=16)
    for row in range(1 + len(names)):
        r.run(ids, row=row, logits="none")
    true = r.state.temporal[:, 0].clone()
    for i, name in enumerate(names, 1):
        r.state.temporal[:, i] = encode_state(true, arms[name], n_units)
    state = {n: [] for n in names}
    sums = {n: [[0.0, 0.0, 0] for _ in points] for n in names}     # per window: kl sum, flips, positions
    done = 0
    for w, t in enumerate(points):
        for start in range(done, t, LOGIT_CHUNK):
            piece = cont[start:min(t, start + LOGIT_CHUNK)]
            logits = [r.run(piece, row=row, logits="all").logits for row in range(1 + len(names))]
            for i, name in enumerate(names, 1):
                kl, flips, n = kl_and_flips(logits[0], logits[i])
                acc = sums[name][w]
                acc[0], acc[1], acc[2] = acc[0] + kl, acc[1] + flips, acc[2] + n
        done = t
        s = r.state.temporal
        norm = band_norm(s[:, 0], kept, n_units)
        for i, name in enumerate(names, 1):
            state[name].append(band_norm(s[:, i] - s[:, 0], kept, n_units) / norm if norm > 0 else float("nan"))
    window = {n: {"kl": [a[0] / a[2] if a[2] else None for a in sums[n]],
                  "flips": [a[1] / a[2] if a[2] else None for a in sums[n]]} for n in names}
    return {"state": state, **{k: {n: window[n][k] for n in names} for k in ("kl", "flips")}}


def sign_test_p(wins: int, n: int) -> float:
    """Exact two-sided binomial p of `wins` successes in n fair trials (ties dropped by the caller)."""
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(per_prefix: list[dict], metric: str, shuffled: list[str], points: list[int]) -> list[dict | None]:
    """Per point: horizon against the mean of the shuffled arms, paired over prefixes (None where the
    window is empty, as KL at T = 0)."""
    rows = []
    for j, _ in enumerate(points):
        if any(p[metric]["horizon"][j] is None for p in per_prefix):
            rows.append(None)
            continue
        h = np.array([p[metric]["horizon"][j] for p in per_prefix], dtype=np.float64)
        s = np.array([np.mean([p[metric][a][j] for a in shuffled]) for p in per_prefix], dtype=np.float64)
        wins, ties = int((h < s).sum()), int((h == s).sum())
        both = (h > 0) & (s > 0)
        rows.append({"shuffled_over_horizon_median": float(np.exp(np.median(np.log(s[both] / h[both]))))
                     if both.any() else None,
                     "horizon_lower": wins, "prefixes": len(h), "ties": ties,
                     "sign_test_p": sign_test_p(wins, len(h) - ties)})
    return rows


def median_over_prefixes(per_prefix: list[dict], metric: str, arm: str) -> list[float | None]:
    cols = zip(*(p[metric][arm] for p in per_prefix))
    return [None if any(v is None for v in col) else float(np.median(col)) for col in cols]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--precision", default="horizon:128,1024:int4,int8,int8",
                    help="the horizon bands (default: the 12.35x point's)")
    ap.add_argument("--seeds", type=int, default=5, help="shuffled controls, seeds 1..N")
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=None,
                    help="points after the load (default 0 W 4W 1024 4096)")
    ap.add_argument("--smoke", action="store_true", help="CPU, seconds: prefix 48, two prefixes, T = 0, W, 4W; no JSON")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/precision_control.json; "
                    "none with --smoke)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    from trtllm_dasc.errors import UserError
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    if args.seeds < 1 or args.prefixes < 1:
        raise UserError("--seeds and --prefixes must be at least 1")
    if "@" in args.precision or not args.precision.startswith("horizon"):
        raise UserError(f"--precision must be horizon bands without a seed (the controls add their own), "
                        f"got {args.precision!r}")
    if args.smoke:
        args.prefix, args.prefixes, args.tiny_profile = 48, 2, args.tiny_profile or "kda"
        args.tokens = args.tokens or [0, args.wmax, 4 * args.wmax]
    points = sorted(set(args.tokens or [0, args.wmax, 4 * args.wmax, 1024, 4096]))
    model, vocab = load_model(args)

    def plan_of(precision):
        return plan_from_path(args.model, PlanOptions(wmax=args.wmax, tp=1, placement="off", precision=precision))[0]

    plan = plan_of(args.precision)
    shuffled = [f"shuffled@{s}" for s in range(1, args.seeds + 1)]
    arms = {"horizon": unit_codecs(plan), "int8": [{u: "int8" for u in kept} for kept in plan.retained]}
    for name in shuffled:
        control = plan_of(f"{args.precision}@{name.split('@')[1]}")
        assert control.retained == plan.retained, "a shuffled control must keep the same units"
        arms[name] = unit_codecs(control)
    codecs = plan.options.bands.codecs
    counts = {c: sum(v == c for layer in arms["horizon"] for v in layer.values()) for c in dict.fromkeys(codecs)}
    per_prefix = []
    for p in range(args.prefixes):
        rng = np.random.default_rng([p, args.prefix])
        ids = rng.integers(3, vocab, args.prefix).tolist()
        cont = rng.integers(3, vocab, max(points)).tolist()
        per_prefix.append(run_prefix(model, plan, arms, ids, cont, points))
        print(f"prefix {p + 1}/{args.prefixes} done", file=sys.stderr, flush=True)
    model_name = (f"tiny {args.tiny_profile}, the paper's decay profile (write_tiny_model, seed 0)"
                  if args.tiny_profile else args.model)
    result = {"model": model_name, "wmax": args.wmax, "precision": plan.options.precision, "prefix": args.prefix,
              "prefixes": args.prefixes, "tokens_after_load": points, "dtype": args.dtype,
              "kept_units_by_codec": counts, "arms": list(arms), "per_prefix": per_prefix,
              "median": {m: {a: median_over_prefixes(per_prefix, m, a) for a in arms}
                         for m in ("state", "kl", "flips")},
              "horizon_vs_shuffled": {m: paired(per_prefix, m, shuffled, points) for m in ("state", "kl", "flips")}}
    _print(result)
    out = args.out or (None if args.smoke else os.path.join(HERE, "results", "precision_control.json"))
    if out:
        write_result(out, {**provenance("benchmarks/precision_control.py", argv, args.commit), **result})
    return 0


def _print(result: dict) -> None:
    pts = result["tokens_after_load"]
    print(f"{result['model']}: W_max {result['wmax']}, {result['precision']}, kept units by codec "
          f"{result['kept_units_by_codec']}, prefix {result['prefix']} x {result['prefixes']}")
    for metric, what in (("state", "kept-unit state error at T"), ("kl", "mean KL over (T_prev, T]"),
                         ("flips", "argmax flips over (T_prev, T]")):
        print(f"{what} (median over prefixes)")
        print(f"{'arm':>12} " + " ".join(f"{'T=' + str(t):>10}" for t in pts))
        for arm, row in result["median"][metric].items():
            print(f"{arm:>12} " + " ".join(f"{'-':>10}" if v is None else f"{v:>10.3e}" for v in row))
        cells = []
        for c in result["horizon_vs_shuffled"][metric]:
            if c is None:
                cells.append("-")
                continue
            ratio = c["shuffled_over_horizon_median"]
            cells.append(f"{'-' if ratio is None else f'{ratio:.2f}x'} {c['horizon_lower']}/{c['prefixes']} "
                         f"p{c['sign_test_p']:.3f}")
        print(f"{'shuf/hor':>12} " + " ".join(f"{c:>10}" for c in cells) + "   (median ratio, horizon lower / "
              "prefixes, sign-test p)")


if __name__ == "__main__":
    sys.exit(main())
