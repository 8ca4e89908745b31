"""Do the weight-derived horizons track what the model does? (paper Sec. 3.4, Table 1b, App. A.2)

For each prefix p and linear-attention layer l, across the layer's units u (GDN: value heads; KDA: (head,
key channel) pairs), the Spearman correlation between the static horizon H_s (plan/horizons.py, from the
weights alone) and
  H_e   the empirical horizon, Eq. 4: ln(eps) / mean_t g[p, t, l, u], g the observed log-decay per token;
  M_S   the state magnitude at the prefix's last position: ||S_h||_F (GDN head), ||S_{h,k,:}||_2 (KDA
        channel: row k of the head's K x V state);
  M_R   the final query's readout magnitude: ||q_T^T S_h||_2 (GDN), |q_{T,h,k}| * ||S_{h,k,:}||_2 (KDA:
        per-channel readout activity, not its net share of the summed output, as the paper notes), with
        q_T l2-normalised as the recurrence uses it.
The text of the paper we have lost the body of its Eq. 5; the two magnitudes above are our reading of
its words. Correlations are per (prefix, layer) and summarised by median and IQR, so units of different
layers or prefixes are never pooled as independent observations.

Observations come from the model runtime itself (every prefix run alone from a zero state through
DirectRunner, the torch reference): the recurrence call of each linear layer is wrapped to record the
token-dependent log-decays, the last query and the final state.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from trtllm_dasc.model import linear_attn
from trtllm_dasc.model.direct import DirectRunner
from trtllm_dasc.evals.stats import median_iqr, spearman
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.evals import tasks as T
from trtllm_dasc.evals.vocab import TaskVocab
from trtllm_dasc.model import HybridModel
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.provenance import check_results_commit, git_commit

SIGNALS = ("H_e", "M_S", "M_R")


@dataclass(slots=True)
class LayerObservation:
    kind: str                  # gdn | kda
    g_mean: np.ndarray         # [units] mean observed log-decay over the prefix's tokens
    state_norm: np.ndarray     # [units] M_S
    readout: np.ndarray        # [units] M_R


@contextlib.contextmanager
def _recording(records: list):
    """Wrap the linear layers' recurrence call; each call appends (kind, g, q_last, final state)."""
    inner = linear_attn.run_recurrence

    def recorded(backend, kind, q, k, v, g, beta, h0, cu_seqlens, cuts=None, **gate):
        o, ht, hb = inner(backend, kind, q, k, v, g, beta, h0, cu_seqlens, cuts, **gate)
        records.append((kind, _log_decay(g[0], gate).cpu(), q[0, -1].detach().float().cpu(),
                        ht[0].detach().float().cpu()))
        return o, ht, hb

    linear_attn.run_recurrence = recorded
    try:
        yield
    finally:
        linear_attn.run_recurrence = inner


def _log_decay(g: torch.Tensor, gate: dict) -> torch.Tensor:
    """The per-token log decay the recurrence applied. fla's fused mixer (recurrence/fla.py) passes the raw
    gate projection with A_log / dt_bias and computes the decay in its kernel; the wrapper took no gate
    arguments (a TypeError on a GPU model) and would have recorded the raw projection."""
    g = g.detach().float()
    if "A_log" not in gate:
        return g
    return linear_attn.log_decay(g, gate["A_log"].detach().float(), gate["dt_bias"].detach().float())


def _observe_layer(kind: str, g: torch.Tensor, q_last: torch.Tensor, state: torch.Tensor) -> LayerObservation:
    """g [T, HV] (gdn) or [T, H, K] (kda); q_last [H, K]; state [HV, K, V]."""
    qn = q_last / q_last.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    if kind == "gdn":
        HV, H = state.shape[0], qn.shape[0]
        q = qn.repeat_interleave(HV // H, dim=0)                        # the value heads' query heads
        readout = torch.einsum("hk,hkv->hv", q, state).norm(dim=-1)
        return LayerObservation(kind, g.mean(0).numpy(), state.flatten(1).norm(dim=-1).numpy(), readout.numpy())
    rows = state.norm(dim=-1)                                           # [H, K]: ||S_{h,k,:}||
    return LayerObservation(kind, g.mean(0).flatten().numpy(), rows.flatten().numpy(),
                            (qn.abs() * rows).flatten().numpy())


def observe(model, prompts: list[list[int]]) -> list[list[LayerObservation]]:
    """Per prompt, per linear layer (in order): the observed signals. Each prompt runs alone from zero."""
    out = []
    for ids in prompts:
        runner = DirectRunner(model, rows=1, max_tokens=len(ids) + 1, block_size=16)
        records: list = []
        with torch.no_grad(), _recording(records):
            runner.run(list(ids), logits="none")
        out.append([_observe_layer(*r) for r in records])
    return out


def correlate(static: list[np.ndarray], observations: list[list[LayerObservation]], eps: float = 1e-3) -> dict:
    """Spearman rho(H_s, signal) per (prefix, layer), then median and IQR per signal. A layer whose static
    horizons are all equal (or infinite everywhere) gives no correlation and is skipped, and counted. Each
    signal's per-pair rhos are kept too (``rhos``: [prefix, layer, rho] rows), so the summary can be
    recomputed from the result file alone."""
    rhos = {s: [] for s in SIGNALS}
    pairs = {s: [] for s in SIGNALS}
    skipped = 0
    for prefix, per_layer in enumerate(observations):
        if len(per_layer) != len(static):
            raise ValueError(f"{len(per_layer)} observed layers for {len(static)} static horizon lists")
        for layer, (hs, ob) in enumerate(zip(static, per_layer)):
            # ranks only: an infinite H_s (a unit that never decays) ranks above every finite one
            hs_rank = np.where(np.isinf(hs), np.finfo(np.float64).max, hs)
            with np.errstate(divide="ignore", invalid="ignore"):
                he = np.where(ob.g_mean < 0, math.log(eps) / ob.g_mean, np.finfo(np.float64).max)
            values = {"H_e": he, "M_S": ob.state_norm, "M_R": ob.readout}
            got = {s: spearman(hs_rank, values[s]) for s in SIGNALS}
            if all(math.isnan(v) for v in got.values()):
                skipped += 1
                continue
            for s in SIGNALS:
                rhos[s].append(got[s])
                pairs[s].append([prefix, layer, None if math.isnan(got[s]) else got[s]])
    summary = {}
    for s in SIGNALS:
        med, q1, q3 = median_iqr(rhos[s])
        summary[s] = {"median": med, "iqr": [q1, q3], "pairs": int(np.sum(~np.isnan(rhos[s]))), "rhos": pairs[s]}
    summary["skipped_pairs"] = skipped
    return summary


def main(argv=None) -> int:
    """python -m trtllm_dasc.evals.horizon_validation --model DIR --out JSON [--prefixes 24 --length 2048]
    Prefixes are task prompts of the evaluation suite (tasks taken in turn, evaluation seeds)."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(description="Table 1b: static horizons against observed decay, state and "
                                             "readout magnitude (Spearman per prefix and layer)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefixes", type=int, default=24)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--eps", type=float, default=1e-3)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if args.prefixes < 1 or args.length < 256:
        print("horizon_validation: error: need --prefixes >= 1 and --length >= 256", file=sys.stderr)
        return 2
    vocab = TaskVocab(HybridConfig.from_path(args.model).schema.network.vocab_size)
    names = list(T.TASKS)
    prompts = [list(T.make(names[i % len(names)], args.length, i // len(names), vocab).model_input)
               for i in range(args.prefixes)]
    _, static = plan_from_path(args.model, PlanOptions(wmax=16, eps=args.eps))
    model = HybridModel.from_pretrained(args.model)
    summary = correlate(static, observe(model, prompts), args.eps)
    result = {"command": " ".join(["python -m trtllm_dasc.evals.horizon_validation",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "commit": args.commit or git_commit(), "model": args.model, "prefixes": args.prefixes,
              "length": args.length, "eps": args.eps, "spearman": summary}
    check_results_commit(args.out, result)         # benchmarks/results/ keeps results of a clean commit
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for s in SIGNALS:
        r = summary[s]
        print(f"rho(H_s, {s}): median {r['median']:+.3f}  IQR [{r['iqr'][0]:+.3f}, {r['iqr'][1]:+.3f}]  "
              f"over {r['pairs']} (prefix, layer) pairs")
    print(f"json: {args.out}")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
