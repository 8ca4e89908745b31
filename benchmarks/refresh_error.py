"""How close does a refresh bring the omitted units to the true state? nr vs wr vs wr-warm, per layer.

For a prefix of C tokens and a plan at W_max, the true recurrent state S_C (exact prefill) against what a
hit would hold in the omitted units:
  nr       zeros
  wr       a replay of the last W tokens from a zero scratch state (temporal and conv)
  wr-warm  the same replay from a scratch holding S_C's retained units (omitted ones and conv zero)
W is the plan's replay window. The error is ||S_hit - S_C|| over the omitted units of a layer divided by
||S_C|| of the whole layer (the paper's eps = 1e-3 is what a unit's horizon promises for its own decay).
Like the engine, the replay runs the whole model over the window with every linear layer's scratch
state, on the exact KV of the tokens before it (model/direct.py's DirectRunner, the torch reference).

    python -m benchmarks refresh_error [--model trtllm_dasc/assets/tiny-kimi-linear] [--wmax 16 64]
        [--prefix 1024] [--prefixes 4]
The default model has random weights and the paper's KDA decay profile: only the arms' relative errors
mean something; the quality protocol on trained models (trtllm_dasc/evals) is the real test.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from benchmarks.results_io import provenance, write_result  # noqa: E402


def _masks(plan, state) -> list[torch.Tensor]:
    """Per linear layer, a bool mask over the layer state [HV, K, V] of the RETAINED units, from the
    layout's own table (unit = value head for gdn, (head, key channel) for kda)."""
    from trtllm_dasc.state.layout import StateLayout
    lay = StateLayout.from_plan(plan)
    kept = (lay.index("cpu").pos_of_unit >= 0).view(lay.num_layers, -1)           # [L, units]
    shape = state.temporal.shape[2:]                                                # [HV, K, V]
    unit_dims = 1 if plan.config.arch == "gdn" else 2
    return [k.view(*shape[:unit_dims], *[1] * (3 - unit_dims)).expand(shape) for k in kept]


def refresh_errors(model, plan, ids: list[int], window: int) -> dict:
    """Per arm, per layer: ||omitted error|| / ||S_C||."""
    from trtllm_dasc.model.direct import DirectRunner
    C = len(ids)
    r = DirectRunner(model, rows=3, max_tokens=C + 1, block_size=16)
    r.run(ids, row=0, logits="none")
    true = r.state.temporal[:, 0].clone()                        # [L, HV, K, V]
    kept = _masks(plan, r.state)
    out = {"nr": [], "wr": [], "wr-warm": []}
    for row, arm in ((1, "wr"), (2, "wr-warm")):
        r.run(ids[:C - window], row=row, logits="none")          # the exact KV before the window
        r.state.temporal[:, row] = 0
        r.state.conv[:, row] = 0
        if arm == "wr-warm":
            for l, m in enumerate(kept):
                r.state.temporal[l, row] = torch.where(m, true[l], torch.zeros_like(true[l]))
        r.run(ids[C - window:], row=row, logits="none")
    for l, m in enumerate(kept):
        norm = true[l].norm().item()
        omit = ~m
        out["nr"].append(true[l][omit].norm().item() / norm)
        for row, arm in ((1, "wr"), (2, "wr-warm")):
            out[arm].append((r.state.temporal[l, row][omit] - true[l][omit]).norm().item() / norm)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "trtllm_dasc", "assets", "tiny-kimi-linear"))
    ap.add_argument("--wmax", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "refresh_error.json"))
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model = HybridModel.from_pretrained(args.model)
    vocab = HybridConfig.from_path(args.model).schema.network.vocab_size
    rows = []
    for w in args.wmax:
        plan, _ = plan_from_path(args.model, PlanOptions(wmax=w, placement="off"))
        per = {"nr": [], "wr": [], "wr-warm": []}
        for p in range(args.prefixes):
            ids = np.random.default_rng([p, args.prefix]).integers(3, vocab, args.prefix).tolist()
            for arm, errs in refresh_errors(model, plan, ids, plan.replay_window).items():
                per[arm].append(errs)
        row = {"wmax": w, "window": plan.replay_window, "retained_fraction":
               sum(map(len, plan.retained)) / (plan.config.units_per_layer * plan.config.num_linear_layers)}
        for arm, errs in per.items():
            e = np.array(errs)                                          # [prefixes, layers]
            row[arm] = {"median": float(np.median(e)), "max": float(e.max()),
                        "per_layer_median": np.median(e, axis=0).round(6).tolist()}
        rows.append(row)
        print(f"W_max {w:4} window {plan.replay_window:4}: omitted-unit error / state norm, median over layers and "
              f"prefixes: nr {row['nr']['median']:.2e}, wr {row['wr']['median']:.2e}, "
              f"wr-warm {row['wr-warm']['median']:.2e} (max {row['nr']['max']:.2e} / {row['wr']['max']:.2e} / "
              f"{row['wr-warm']['max']:.2e})")
    write_result(args.out, {**provenance("benchmarks/refresh_error.py", argv, args.commit), "model": args.model,
                            "prefix_tokens": args.prefix, "prefixes": args.prefixes, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
