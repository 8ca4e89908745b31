"""Figures of a protocol run: per seed (pooled over its phases and blocks), per phase, per arm; ratios to a
baseline arm within each seed (App. C.2: ratios first, then the mean and sample std over seeds); the table.

Input throughput is sum L_i / sum T_replay and the hit rate sum C_i / sum L_i (Eq. 9), both over replay
requests only; TTFT statistics are over the replay requests themselves.
"""
from __future__ import annotations

import os
import statistics
import sys

import numpy as np

FIGURES = ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "input_tokens_per_s", "hit_rate", "server_hit_rate")


def pooled(blocks: list[dict]) -> dict:
    ttft = np.concatenate([b["replay"]["ttft_ms"] for b in blocks])
    prompt = sum(b["replay"]["prompt_tokens"] for b in blocks)
    seconds = sum(b["replay"]["seconds"] for b in blocks)
    server_prompt = sum(b["server"]["prompt_tokens"] for b in blocks)
    return {"requests": int(ttft.size), "ttft_mean_ms": float(ttft.mean()),
            "ttft_p50_ms": float(np.percentile(ttft, 50)), "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "input_tokens_per_s": prompt / seconds,
            "hit_rate": sum(b["replay"]["cached_tokens"] for b in blocks) / prompt,
            "server_hit_rate": sum(b["server"]["cached_tokens"] for b in blocks) / max(server_prompt, 1),
            "checkpoint_evictions": sum(b["server"]["checkpoint_evictions"] for b in blocks),
            "kv_block_evictions": sum(b["server"]["kv_block_evictions"] for b in blocks)}


def _over_seeds(per_seed: dict, keys=FIGURES) -> dict:
    out = {}
    for key in keys:
        values = [f[key] for f in per_seed.values()]
        out[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return out


def summarize(blocks: list[dict]) -> dict:
    """{'per_seed': {seed: figures}, 'seeds': {figure: {mean, std}}, 'phases': {phase: the same}}."""
    def by_seed(bs):
        return {s: pooled([b for b in bs if b["seed"] == s]) for s in dict.fromkeys(b["seed"] for b in bs)}
    per_seed = by_seed(blocks)
    phases = {}
    for name in dict.fromkeys(b["phase"] for b in blocks):
        ps = by_seed([b for b in blocks if b["phase"] == name])
        phases[name] = {"per_seed": ps, "seeds": _over_seeds(ps)}
    return {"per_seed": per_seed, "seeds": _over_seeds(per_seed), "phases": phases}


# the figures a phase-weighted summary has: a weighted percentile would need every request's weight kept
WEIGHTED_FIGURES = ("ttft_mean_ms", "input_tokens_per_s", "hit_rate")


def phase_weights(phases: list[dict]) -> dict[str, float] | None:
    """Each phase's weight where a run measures a seeded subset of its blocks (``--blocks-per-phase``): the
    blocks the phase has in the dataset over the blocks measured. App. C.2 replays every block of every phase,
    so each phase carries about the whole dataset's requests (the dense boundary six times); one block a phase,
    pooled as measured, would weigh each phase by its one block's Q instead (Q=150 x 6 = 900 requests against
    the full dataset's 12,032). A full-dataset phase replaying a sample of its one block (``replay_first``,
    clients/protocol.ProtocolConfig) counts it as the whole replay: Q over the sample. None when every phase
    runs all its blocks and requests (pooled as measured is the figure)."""
    w = {p["name"]: p["blocks_in_dataset"] / len(p["blocks"]) * p["q"] / (p.get("replay_first") or p["q"])
         for p in phases if p.get("blocks_in_dataset") and p.get("blocks")}
    return w if any(v != 1 for v in w.values()) else None


def sampled_strata(phases: list[dict], head: int | None) -> dict[str, tuple[int, float]]:
    """Per phase replaying a sample (``replay_first`` R of its Q prompts): (P, tail weight) for its requests.
    Every hit of such a phase (the full dataset, past every arm's capacity) lands in the first P = slots +
    concurrency replay positions: the cache holds the fill's last ``slots`` prompts, which the first misses
    evict, and all of them are inside the sample. Weighing the whole sample Q / R counted those hits (and the
    early requests' shorter TTFT) 3.6 times at R = 3,300 of 12,032; positions below P are the whole run's own
    (weight 1), the rest stand for the Q - P others. ``head``: P, None or P >= R: no strata (Q / R for all)."""
    out = {}
    for p in phases:
        r, q = p.get("replay_first"), p["q"]
        if r and head is not None and head < r < q and len(p.get("blocks") or [1]) == p.get("blocks_in_dataset", 1):
            out[p["name"]] = (head, (q - head) / (r - head))
    return out


def _request_weights(block: dict, w: float, strata: dict) -> np.ndarray:
    n = len(block["replay"]["ttft_ms"])
    if block["phase"] not in strata:
        return np.full(n, w)
    head, tail = strata[block["phase"]]
    return np.where(np.arange(n) < head, 1.0, tail)


def weighted_pooled(blocks: list[dict], weights: dict[str, float], strata: dict | None = None) -> dict:
    """``pooled``'s mean TTFT, Eq. 9 input throughput and hit rate with each block counted ``weights[phase]``
    times: a stratified estimate of what the run would measure over every block. ``strata`` (sampled_strata):
    per-request weights in a sampled phase for the per-request figures (TTFT, hit rate); throughput takes the
    phase's weight on its prompt tokens and seconds alike."""
    strata = strata or {}
    w = [weights.get(b["phase"], 1.0) for b in blocks]
    rw = [_request_weights(b, wi, strata) for wi, b in zip(w, blocks)]
    requests = sum(float(x.sum()) for x in rw)
    prompt = sum(wi * b["replay"]["prompt_tokens"] for wi, b in zip(w, blocks))
    # Eq. 9's tokens: a block's totals times its weight, or per request in a stratified phase
    cached = sum(float(np.dot(x, b["replay"]["cached"])) if b["phase"] in strata else wi * b["replay"]["cached_tokens"]
                 for wi, x, b in zip(w, rw, blocks))
    lengths = sum(float(np.dot(x, b["replay"]["prompt_len"])) if b["phase"] in strata else wi * b["replay"]["prompt_tokens"]
                  for wi, x, b in zip(w, rw, blocks))
    return {"requests": requests,
            "ttft_mean_ms": sum(float(np.dot(x, b["replay"]["ttft_ms"])) for x, b in zip(rw, blocks)) / requests,
            "input_tokens_per_s": prompt / sum(wi * b["replay"]["seconds"] for wi, b in zip(w, blocks)),
            "hit_rate": cached / lengths}


def weighted_summary(blocks: list[dict], weights: dict[str, float], strata: dict | None = None) -> dict:
    """``summarize``'s per-seed figures and their mean / std over seeds, phase-weighted (WEIGHTED_FIGURES)."""
    per_seed = {s: weighted_pooled([b for b in blocks if b["seed"] == s], weights, strata)
                for s in dict.fromkeys(b["seed"] for b in blocks)}
    return {"per_seed": per_seed, "seeds": _over_seeds(per_seed, WEIGHTED_FIGURES)}


def ratios(arm: dict, base: dict) -> dict:
    """Per seed arm / base (mean TTFT, input throughput), then the mean and sample std over seeds; the
    per-seed ratios themselves under 'per_seed'."""
    out = {}
    for key in ("ttft_mean_ms", "input_tokens_per_s"):
        per = {s: arm["summary"]["per_seed"][s][key] / base["summary"]["per_seed"][s][key]
               for s in arm["summary"]["per_seed"]}
        r = list(per.values())
        out[key] = {"mean": statistics.fmean(r), "std": statistics.stdev(r) if len(r) > 1 else 0.0, "per_seed": per}
    return out


def format_table(arms: list[dict]) -> str:
    # the name column and each phase's column as wide as their longest entry: an arm such as
    # "dasc-nr W=16 + horizon + conv INT8" would otherwise push its row out of line
    w = max(24, *(len(a["label"]) for a in arms))
    rows = [f"{'arm':{w}} {'slots':>5} {'ckpt B':>9} {'mean TTFT ms':>15} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'input tok/s':>15} {'hit rate':>9}"]
    for a in arms:
        s = a["summary"]["seeds"]
        rows.append(f"{a['label']:{w}} {a['slots']:>5} {a['checkpoint_bytes']:>9,} "
                    f"{s['ttft_mean_ms']['mean']:>8.1f} ±{s['ttft_mean_ms']['std']:>5.1f} "
                    f"{s['ttft_p50_ms']['mean']:>8.1f} {s['ttft_p99_ms']['mean']:>8.1f} "
                    f"{s['input_tokens_per_s']['mean']:>8.0f} ±{s['input_tokens_per_s']['std']:>5.0f} "
                    f"{s['hit_rate']['mean']:>9.1%}")
    phases = list(arms[0]["summary"]["phases"])
    widths = [max(24, len(p)) for p in phases]
    rows.append("")
    rows.append(f"{'hit rate | mean TTFT ms':{w}} " + " ".join(f"{p:>{pw}}" for p, pw in zip(phases, widths)))
    for a in arms:
        cells = []
        for p, pw in zip(phases, widths):
            s = a["summary"]["phases"][p]["seeds"]
            cells.append(f"{s['hit_rate']['mean']:>{pw - 11}.1%} | {s['ttft_mean_ms']['mean']:>8.1f}")
        rows.append(f"{a['label']:{w}} " + " ".join(cells))
    return "\n".join(rows)


def provenance(argv: list[str], commit: str | None = None) -> dict:
    """The exact command and the commit (with a mark when the tree has uncommitted changes)."""
    from trtllm_dasc.provenance import git_commit
    if commit is None:
        commit = git_commit(os.path.dirname(os.path.abspath(__file__)))
    return {"command": " ".join(["python", *argv]), "commit": commit, "python": sys.version.split()[0],
            "cpus": os.cpu_count()}


def write_json(path: str, result: dict) -> None:
    """Whole or not at all; refused (UserError) inside the repository's benchmarks/results/ unless the result
    names a clean commit (trtllm_dasc/provenance.py: check_results_commit)."""
    from trtllm_dasc.provenance import check_results_commit
    check_results_commit(path, result)
    from clients.compact_json import write
    write(path, result)     # per-request lists on one line each
