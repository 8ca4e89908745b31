"""Which codec can a horizon band afford? The checkpoint codec's error in the state after a load and after
the next T tokens, per codec and horizon band (issue 35, item 3).

For a random prefix of C tokens (exact prefill: S_C), each arm writes S_C's kept units through a codec
(their torch references: state/naive.py int8, state/codec_naive.py fp8 / int4; omitted units stay exact so
only the codec's error is measured) into a second row with the same KV, then both rows run the same next
tokens. At T = 0, W, 4W, 1024, 4096 tokens after the load, per band of the plan's horizon thresholds:

    rel_error   ||S'_T - S_T|| / ||S_T|| over the band's units
    retention   ||S'_T - S_T|| / ||S'_0 - S_0||: how much of the written error is left
    bound       the paper's static decay for the band's slowest unit, eps^(T / H_max) (Eq. 3: a unit of
                horizon H keeps eps = 1e-3 of what it held H tokens ago; a = -0.3 stands for the input)

Arms: uniform int8 / fp8 / int4 (every kept unit), conv8 (temporal exact, the 8-bit conv state), and
horizon (each band its own codec, --precision). The error of one band leaks into the others through the
delta rule and the next layers' inputs, so a band's error after T mixes its own decay and that leakage.

    python -m benchmarks precision_error --smoke                  CPU, seconds: the tiny paper-profile model
    python -m benchmarks precision_error --tiny-profile gdn      the same study on a tiny Qwen3-Next (paper profile)
    python -m benchmarks precision_error --model DIR --device cuda [--wmax 16] [--prefix 4096] [--prefixes 4]
        [--precision horizon:1024,8192:int4,int8,native] [--out benchmarks/results/precision_error.json]
DIR: a checkpoint, e.g. one written by benchmarks/shaped_model.py (released shapes, paper decay profile).
Random weights: the numbers say how errors decay under the model's gates, not what a trained model's
quality does (the quality protocol on trained models is that test).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from benchmarks.results_io import provenance, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

EPS = 1e-3
ARMS = ("int8", "fp8", "int4", "conv8", "horizon")


def codec_round_trip(x: torch.Tensor, codec: str) -> torch.Tensor:
    """Rows [..., V] through a temporal codec's torch reference and back (fp32)."""
    from trtllm_dasc.state import codec_naive, naive
    if codec == "native":
        return x.float()
    if codec == "int8":
        return naive.dequantize_int8(*naive.quantize_int8(x))
    return codec_naive.DEQUANTIZE[codec](*codec_naive.QUANTIZE[codec](x))


def unit_view(t: torch.Tensor, n_units: int) -> torch.Tensor:
    """One row's temporal state [HV, K, V] -> [n_units, R, V] (gdn: a value head; kda: a (head, k) channel)."""
    return t.reshape(n_units, -1, t.shape[-1])


def encode_state(true: torch.Tensor, unit_codec: list[dict], n_units: int) -> torch.Tensor:
    """The loaded state of one row [L, HV, K, V]: kept unit u of layer l through unit_codec[l][u], the rest
    exact (only the codec's error is measured here, not the omission's)."""
    out = true.clone()
    for l, codecs in enumerate(unit_codec):
        units, dst = unit_view(true[l], n_units), unit_view(out[l], n_units)
        for codec in set(codecs.values()):
            idx = torch.tensor([u for u, c in codecs.items() if c == codec], dtype=torch.long, device=true.device)
            dst[idx] = codec_round_trip(units[idx], codec).to(true.dtype)
    return out


def unit_codecs(plan) -> list[dict]:
    """Per layer {kept unit: its band's codec} from a plan's band assignment (horizon, or shuffled with a seed)."""
    codecs = plan.options.bands.codecs
    return [{u: codecs[b] for u, b in zip(kept, bands)} for kept, bands in zip(plan.retained, plan.retained_bands)]


def band_masks(plan, n_units: int) -> list[list[torch.Tensor]]:
    """[band][layer]: bool over the layer's units, the kept units of that band."""
    nb = len(plan.options.bands.codecs)
    masks = [[torch.zeros(n_units, dtype=torch.bool) for _ in plan.retained] for _ in range(nb)]
    for l, (kept, bands) in enumerate(zip(plan.retained, plan.retained_bands)):
        for u, b in zip(kept, bands):
            masks[b][l][u] = True
    return masks


def band_norm(x: torch.Tensor, masks: list[torch.Tensor], n_units: int) -> float:
    return float(sum(unit_view(x[l], n_units)[m.to(x.device)].double().pow(2).sum() for l, m in enumerate(masks)) ** 0.5)


def run_prefix(model, plan, horizons, ids: list[int], cont: list[int], points: list[int], device) -> dict:
    """One prefix: per arm, per band, the error norms at each point (and the state norms)."""
    from trtllm_dasc.model.direct import DirectRunner
    n_units = plan.config.units_per_layer
    bands = plan.options.bands
    arms = {a: ([{u: a for u in kept} for kept in plan.retained] if a in ("int8", "fp8", "int4") else
                unit_codecs(plan) if a == "horizon" else [{} for _ in plan.retained]) for a in ARMS}
    r = DirectRunner(model, rows=1 + len(ARMS), max_tokens=len(ids) + max(points) + 1, block_size=16)
    for row in range(1 + len(ARMS)):
        r.run(ids, row=row, logits="none")
    true = r.state.temporal[:, 0].clone()
    for i, arm in enumerate(ARMS, 1):
        r.state.temporal[:, i] = encode_state(true, arms[arm], n_units)
        if arm == "conv8":
            from trtllm_dasc.state import conv8_naive
            c = r.state.conv[:, i]
            r.state.conv[:, i] = conv8_naive.decode(conv8_naive.encode(c), c.shape[-2], c.shape[-1], c.dtype)
    masks = band_masks(plan, n_units)
    out = {a: [[] for _ in masks] for a in ARMS}
    norms = [[] for _ in masks]
    done = 0
    for t in points:
        for row in range(1 + len(ARMS)):
            if t > done:
                r.run(cont[done:t], row=row, logits="none")
        done = t
        s = r.state.temporal
        for b, m in enumerate(masks):
            norms[b].append(band_norm(s[:, 0], m, n_units))
            for i, arm in enumerate(ARMS, 1):
                out[arm][b].append(band_norm(s[:, i] - s[:, 0], m, n_units))
    return {"errors": out, "norms": norms}


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """The flags that pick the model and where it runs (this study and precision_control share them)."""
    ap.add_argument("--model", default=os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear"))
    ap.add_argument("--tiny-profile", choices=["kda", "gdn"], default=None,
                    help="instead of --model: a tiny random-weight model of this architecture whose decays follow "
                         "the paper's profile (plan/synthetic.write_tiny_model, seed 0), made in a temporary "
                         "directory (gdn: the Qwen3-Next profile, which no committed model carries)")
    ap.add_argument("--wmax", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])


def load_model(args):
    """(model, vocab size) for add_model_arguments' flags; --tiny-profile writes its model to a temporary
    directory first and points args.model there."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model import HybridModel
    if args.tiny_profile:
        import tempfile

        from trtllm_dasc.plan.synthetic import write_tiny_model
        args.model = write_tiny_model(os.path.join(tempfile.mkdtemp(prefix="precision-"), args.tiny_profile),
                                      args.tiny_profile, seed=0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = HybridModel.from_pretrained(args.model, dtype=args.dtype, device=args.device)
    return model, HybridConfig.from_path(args.model).schema.network.vocab_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(ap)
    ap.add_argument("--precision", default="horizon:1024,8192:int4,int8,native")
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--tokens", type=int, nargs="+", default=None,
                    help="tokens after the load to measure at (default 0, W, 4W, 1024, 4096)")
    ap.add_argument("--smoke", action="store_true", help="CPU, seconds: prefix 48, one prefix, T = 0, W, 4W; no JSON")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/precision_error.json; "
                                                "--smoke writes none unless given)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    if args.smoke:
        args.prefix, args.prefixes = 48, 1
        args.tokens = args.tokens or [0, args.wmax, 4 * args.wmax]
    points = sorted(set(args.tokens or [0, args.wmax, 4 * args.wmax, 1024, 4096]))
    model, vocab = load_model(args)
    plan, horizons = plan_from_path(args.model, PlanOptions(wmax=args.wmax, tp=1, placement="off",
                                                            precision=args.precision))
    bands = plan.options.bands
    ranges = bands.ranges(args.wmax)
    h_max = []
    for b in range(len(bands.codecs)):
        hs = [float(horizons[l][u]) for l, (kept, bb) in enumerate(zip(plan.retained, plan.retained_bands))
              for u, x in zip(kept, bb) if x == b]
        h_max.append(max(hs) if hs else None)
    runs = []
    for p in range(args.prefixes):
        rng = np.random.default_rng([p, args.prefix])
        ids = rng.integers(3, vocab, args.prefix).tolist()
        cont = rng.integers(3, vocab, max(points)).tolist()
        runs.append(run_prefix(model, plan, horizons, ids, cont, points, args.device))
    model_name = (f"tiny {args.tiny_profile}, the paper's decay profile (write_tiny_model, seed 0)"
                  if args.tiny_profile else args.model)
    result = {"model": model_name, "wmax": args.wmax, "precision": plan.options.precision, "prefix": args.prefix,
              "prefixes": args.prefixes, "tokens_after_load": points, "eps": EPS, "dtype": args.dtype, "bands": []}
    for b, ((lo, hi), codec) in enumerate(zip(ranges, bands.codecs)):
        units = sum(x == b for bb in plan.retained_bands for x in bb)
        row = {"band": b, "horizon_from": lo, "horizon_below": None if hi == float("inf") else hi,
               "horizon_codec": codec, "units": int(units), "max_horizon": h_max[b],
               "bound": [EPS ** (t / h_max[b]) if h_max[b] else None for t in points], "arms": {}}
        for arm in ARMS:
            err = np.array([run["errors"][arm][b] for run in runs])          # [prefixes, points]
            norm = np.array([run["norms"][b] for run in runs])
            rel = err / np.where(norm > 0, norm, np.nan)
            keep = err[:, :1] > 0
            retention = np.where(keep, err / np.where(keep, err[:, :1], 1.0), np.nan)
            row["arms"][arm] = {"rel_error": np.nanmedian(rel, 0).tolist() if units else None,
                                "retention": np.nanmedian(retention, 0).tolist() if units and keep.any() else None}
        result["bands"].append(row)
    _print(result)
    out = args.out or (None if args.smoke else os.path.join(HERE, "results", "precision_error.json"))
    if out:
        write_result(out, {**provenance("benchmarks/precision_error.py", argv, args.commit), **result})
    return 0


def _print(result: dict) -> None:
    pts = result["tokens_after_load"]
    print(f"{result['model']}: W_max {result['wmax']}, {result['precision']}, prefix {result['prefix']} x "
          f"{result['prefixes']}; relative error of each band's units T tokens after the load (retention / bound)")
    print(f"{'band':>16} {'units':>6} {'arm':>8} " + " ".join(f"{'T=' + str(t):>22}" for t in pts))
    for row in result["bands"]:
        hi = row["horizon_below"]
        name = f"[{row['horizon_from']:g},{'inf' if hi is None else f'{hi:g}'})"
        for arm, v in row["arms"].items():
            if v["rel_error"] is None:
                continue
            cells = []
            for i, _ in enumerate(pts):
                ret = v["retention"][i] if v["retention"] else float("nan")
                bound = row["bound"][i]
                cells.append(f"{v['rel_error'][i]:.2e} ({ret:.2f}/{bound if bound is None else f'{bound:.2f}'})")
            print(f"{name:>16} {row['units']:>6} {arm:>8} " + " ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
