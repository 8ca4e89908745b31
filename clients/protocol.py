"""The paper's matched-HBM serving protocol (App. C.2) against one target (a server, or an engine in-process).

Phases: one per arm's capacity boundary, a block holding Q(W) = ceil(N(W) / 0.85) unique prompts, so the
arm at that boundary can keep 85% of a block's prompts and an arm with fewer slots less. For every phase,
request-order seed and block:
    flush -> untimed streaming fill -> telemetry -> seeded shuffle -> timed streaming replay -> telemetry
with one output token per request at a fixed concurrency. Only replay requests enter the figures.
The fill sends the block's first prompt of each category first, then the rest: otherwise the first wave
of concurrent fills would each prefill the same shared prefix, which is untimed but on a GPU the
largest cost of the whole run; what the fill leaves in the cache is the same.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.workload import Workload, block_size, phase_blocks
from trtllm_dasc.errors import UserError


@dataclass(slots=True)
class ProtocolConfig:
    seeds: tuple[int, ...] = (42, 123, 7)
    output_tokens: int = 1
    blocks_per_phase: int | None = None     # None: every block of the dataset (the paper)
    target_fill: float = 0.85
    # the paper replays the dense-boundary phase six times and ends with one block of the whole dataset;
    # both are opt-in here (a GPU call of 10 minutes does not hold them at the paper's scale)
    dense_repeats: int = 1
    full_phase: bool = False
    # with blocks_per_phase: None picks evenly spread blocks, a seed a seeded subset (the same for every arm)
    block_seed: int | None = None
    # the full-dataset phase within a budget (its one block is every prompt: fill and replay of 12,032 take a
    # 48B server on one H200 ~25 minutes an arm, more than a device session): fill only the fill order's last
    # ``full_fill_last`` prompts (after the category firsts, as the whole fill sends them), which leaves what the
    # whole fill leaves once those prompts alone overflow every arm's cache (LRU: the older ones would all be
    # evicted first); replay only the first ``full_replay_first`` requests of the seeded shuffle, a uniform
    # sample of the block's prompts. None: all of them (the paper). Recorded in the manifest; the figures weigh
    # the sampled replay as the whole one (clients/report.phase_weights).
    full_fill_last: int | None = None
    full_replay_first: int | None = None
    # --full-fill-last auto: each arm fills its own tail, 2 x its slots + the concurrency (full_fill_tail): what
    # one fixed N must give the arm with the most slots (nr512 at the paper's 28x: 7,272 prompts) the others
    # do not need, and the fill is most of a full-dataset cell's time
    full_fill_per_arm: bool = False

    def __post_init__(self):
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UserError(f"seeds must be distinct integers, at least one, got {list(self.seeds)}")
        if self.output_tokens < 1:
            raise UserError(f"output tokens must be >= 1, got {self.output_tokens}")
        if self.blocks_per_phase is not None and self.blocks_per_phase < 1:
            raise UserError(f"blocks per phase must be >= 1, got {self.blocks_per_phase}")
        if not 0 < self.target_fill <= 1:
            raise UserError(f"target fill must be in (0, 1], got {self.target_fill}")
        if self.dense_repeats < 1:
            raise UserError(f"dense repeats must be >= 1, got {self.dense_repeats}")
        if self.full_fill_per_arm and (not self.full_phase or self.full_fill_last is not None):
            raise UserError("--full-fill-last auto needs the full-dataset phase (--full-phase or --paper) and no "
                            "fixed N beside it")
        for name in ("full_fill_last", "full_replay_first"):
            n = getattr(self, name)
            if n is not None and (not self.full_phase or n < 1):
                raise UserError(f"--{name.replace('_', '-')} must be >= 1 and needs the full-dataset phase "
                                f"(--full-phase or --paper), got {n}")


@dataclass(slots=True)
class Phase:
    arms: list[str]          # the arms whose capacity boundary this is
    q: int                   # unique prompts per block
    blocks: list[tuple[int, int]]
    fill_last: int | None = None       # the full-dataset phase's budget (ProtocolConfig.full_fill_last)
    replay_first: int | None = None    # (ProtocolConfig.full_replay_first)
    fill_per_arm: bool = False         # its fill's tail is each arm's own (ProtocolConfig.full_fill_per_arm)

    @property
    def name(self) -> str:
        return f"Q={self.q} ({', '.join(self.arms)})"


def make_phases(slots: dict[str, int], prompts: int, cfg: ProtocolConfig) -> list[Phase]:
    """One phase per distinct Q(W) over the arms, smallest first (the paper: dense, W=16, 64, ...)."""
    by_q: dict[int, list[str]] = {}
    for arm, n in slots.items():
        by_q.setdefault(block_size(n, cfg.target_fill), []).append(arm)
    phases = [Phase(arms, q, phase_blocks(prompts, q, cfg.blocks_per_phase, cfg.block_seed))
              for q, arms in sorted(by_q.items())]
    if cfg.full_phase and (not phases or phases[-1].q < prompts):
        fill = cfg.full_fill_last if cfg.full_fill_last is not None and cfg.full_fill_last < prompts else None
        replay = cfg.full_replay_first if cfg.full_replay_first is not None and cfg.full_replay_first < prompts else None
        phases.append(Phase(["full dataset"], prompts, [(0, prompts)], fill, replay, cfg.full_fill_per_arm))
    return phases


def full_fill_tail(slots: int, concurrency: int) -> int:
    """The fill tail that leaves an arm's cache as the whole fill leaves it (LRU: every older checkpoint is
    evicted first; an older prompt's KV without its checkpoint cannot hit, and goes first when KV runs short):
    twice the arm's slots, and the requests in flight, whose completions reorder the tail's last sends."""
    return 2 * slots + concurrency


def repeats(index: int, cfg: ProtocolConfig) -> int:
    """How many times phase ``index`` is replayed: the first (the dense boundary) dense_repeats times."""
    return cfg.dense_repeats if index == 0 else 1


def requests_per_arm(phases: list[Phase], cfg: ProtocolConfig) -> int:
    """Requests of one arm over every unit; a phase with per-arm fill tails counts its whole fill (the most)."""
    return len(cfg.seeds) * sum(((p.fill_last or p.q) + (p.replay_first or p.q)) * len(p.blocks) * repeats(i, cfg)
                                for i, p in enumerate(phases))


def _delta(after: dict, before: dict) -> dict:
    def ck(s):
        return sum(v for k, v in s["evictions"].items() if k.startswith("checkpoint"))
    d = {k: after[k] - before[k] for k in ("requests", "prompt_tokens", "cached_tokens", "replayed_tokens")}
    d["hit_rate"] = d["cached_tokens"] / d["prompt_tokens"] if d["prompt_tokens"] else 0.0
    d["checkpoint_evictions"] = ck(after) - ck(before)
    # device evictions above (a demotion included); here checkpoints gone from every tier, each once
    d["checkpoints_dropped"] = after.get("checkpoints_dropped", 0) - before.get("checkpoints_dropped", 0)
    d["kv_block_evictions"] = after["evictions"]["kv_blocks"] - before["evictions"]["kv_blocks"]
    d["checkpoint_loads"] = {k: after["checkpoint_loads"][k] - before["checkpoint_loads"][k]
                             for k in after["checkpoint_loads"]}
    return d


def _checked(records, what: str):
    bad = [r for r in records if r.error is not None or r.ttft_s is None]
    if bad:
        raise RuntimeError(f"{len(bad)} {what} request(s) failed; first: {bad[0].error or 'no token came back'}")
    return records


def fill_and_replay_order(cats: list, seed: int, lo: int, fill_last: int | None = None,
                          replay_first: int | None = None) -> tuple[list[list[int]], list[int]]:
    """A block's fill (two parts: each category's first prompt, then the rest in order) and its seeded replay
    order, as positions in the block. ``fill_last``: only the last that many of the rest (the whole fill's
    last sends, in the same order); ``replay_first``: the shuffle's first that many."""
    firsts = sorted({cats.index(c) for c in cats})
    chosen = set(firsts)
    rest = [k for k in range(len(cats)) if k not in chosen]
    if fill_last is not None:
        rest = rest[-fill_last:]
    order = np.random.default_rng([seed, lo]).permutation(len(cats))
    if replay_first is not None:
        order = order[:replay_first]
    return [firsts, rest], [int(k) for k in order]


def run_block(target, work: Workload, lo: int, hi: int, seed: int, cfg: ProtocolConfig, progress=None,
              fill_last: int | None = None, replay_first: int | None = None) -> dict:
    """One block: flush, fill, shuffle, timed replay. Returns its figures (replay requests only).
    ``fill_last`` / ``replay_first``: the full-dataset phase's budget (ProtocolConfig)."""
    flushed = target.control("flush")
    prompts = [work.prompt(i) for i in range(lo, hi)]
    cats = work.categories[lo:hi]
    parts, order = fill_and_replay_order(cats, seed, lo, fill_last, replay_first)
    fill_s = 0.0
    for part in parts:
        recs, seconds = target.run([prompts[k] for k in part], cfg.output_tokens, progress)
        _checked(recs, "fill")
        fill_s += seconds
    filled = target.control("stats")
    recs, seconds = target.run([prompts[k] for k in order], cfg.output_tokens, progress)
    _checked(recs, "replay")
    after = target.control("stats")
    prompt_tokens = sum(r.prompt_tokens for r in recs)
    cached = sum(r.cached_tokens for r in recs)
    return {
        "seed": seed, "prompts": [lo, hi], "categories": sorted(set(cats)),
        "fill": {"requests": sum(map(len, parts)), "seconds": fill_s, "checkpoints_cached": filled["checkpoints_cached"],
                 "checkpoint_evictions": _delta(filled, flushed)["checkpoint_evictions"]},
        "replay": {"requests": len(recs), "seconds": seconds, "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                   "hit_rate": cached / prompt_tokens, "input_tokens_per_s": prompt_tokens / seconds,
                   "replayed_tokens": sum(r.replayed_tokens for r in recs),
                   "output_tokens": sum(r.output_tokens for r in recs),
                   # per request, in replay order: prompt index, L_i, C_i, TTFT and end-to-end (ms)
                   "order": [lo + k for k in order], "prompt_len": [r.prompt_tokens for r in recs],
                   "cached": [r.cached_tokens for r in recs],
                   "ttft_ms": [round(r.ttft_s * 1e3, 3) for r in recs],
                   "e2e_ms": [round(r.e2e_s * 1e3, 3) for r in recs]},
        # the engine's own counters over the replay (cache_stats): an independent count of Eq. 9
        "server": _delta(after, filled),
    }


def unit_key(phase: int, block: int, seed: int) -> str:
    return f"p{phase}-b{block}-s{seed}"


def unit_phase(unit: str) -> int:
    """The phase index of a unit_key."""
    return int(unit.split("-")[0][1:])


# a budgeted full-dataset phase's entries in a manifest phase (matched_hbm.make_manifest writes them, the result
# and --plan-only show them): the fill's tail, its requests with the category firsts, the replay's sample
BUDGET_KEYS = ("fill_last", "fill_requests", "fill_last_by_arm", "fill_requests_by_arm", "replay_first")


def phase_budget(phase: dict) -> dict:
    """The BUDGET_KEYS a manifest phase has ({} for every phase run whole)."""
    return {k: phase[k] for k in BUDGET_KEYS if k in phase}


def _arm_spec(manifest: dict, arm: str | None) -> str | None:
    """An arm's spec from its manifest key or spec (an in-process twin's key names its arm's spec)."""
    for a in manifest["arms"]:
        if arm in (a["key"], a["spec"]):
            return a["spec"]
    return None


def unit_fill_last(manifest: dict, unit: str, arm: str) -> int | None:
    """The fill tail of ``arm``'s cell of ``unit`` (None: the whole fill, or the phase's fixed tail)."""
    phase = manifest["phases"][unit_phase(unit)]
    by_arm = phase.get("fill_last_by_arm")
    if by_arm is None:
        return phase.get("fill_last")
    spec = _arm_spec(manifest, arm)
    if spec not in by_arm:
        raise ValueError(f"the manifest's phase {phase['name']} has no fill tail for arm {arm!r}")
    return by_arm[spec]


def unit_requests(manifest: dict, unit: str, arm: str | None = None) -> int:
    """Requests of one arm's cell of ``unit`` in a manifest (clients.cells): fill and replay of the phase's Q
    prompts, as often as the phase is replayed (a budgeted full-dataset phase: its cut fill with the category
    firsts, and its replay sample). With per-arm fill tails, ``arm``'s (key or spec); no arm: the most of any."""
    phase = manifest["phases"][unit_phase(unit)]
    by_arm = phase.get("fill_requests_by_arm")
    if by_arm:
        spec = _arm_spec(manifest, arm)
        fill = by_arm[spec] if spec in by_arm else max(by_arm.values())
    else:
        fill = phase.get("fill_requests") or phase["q"]
    return (fill + (phase.get("replay_first") or phase["q"])) * phase["repeats"]


def units(phases: list[Phase], cfg: ProtocolConfig) -> list[tuple[int, int, int]]:
    """Every (phase, block, seed) cell of one arm, in run order: phase, then seed, then block. ``block`` is
    the block's index in the dataset (lo // q), so a subset names the same blocks in every run."""
    return [(i, lo // p.q, seed) for i, p in enumerate(phases) for seed in cfg.seeds for lo, _ in p.blocks]


def run_cell(target, work: Workload, phases: list[Phase], unit: tuple[int, int, int], cfg: ProtocolConfig,
             progress=None, fill_last: int | None = None) -> list[dict]:
    """One cell: its block replayed repeats(phase) times, each flush -> fill -> shuffle -> timed replay.
    ``fill_last``: the arm's own fill tail (a phase with per-arm tails; unit_fill_last), else the phase's."""
    i, b, seed = unit
    phase = phases[i]
    if phase.fill_per_arm and fill_last is None:
        raise ValueError(f"phase {phase.name} fills a tail per arm: run_cell needs the arm's fill_last")
    fill_last = fill_last if phase.fill_per_arm else phase.fill_last
    lo, hi = b * phase.q, (b + 1) * phase.q
    out = []
    for rep in range(repeats(i, cfg)):
        if progress is not None:
            progress.update(0, note=f"{phase.name} seed {seed}")
        rec = run_block(target, work, lo, hi, seed, cfg, progress, fill_last, phase.replay_first)
        out.append({"phase": phase.name, "q": phase.q, "block": b, "repeat": rep, **rec})
    return out


def run_protocol(target, work: Workload, phases: list[Phase], cfg: ProtocolConfig, progress=None) -> list[dict]:
    """Every phase, seed and block against one target; a list of block records."""
    if any(p.fill_per_arm for p in phases):
        raise ValueError("a phase fills a tail per arm: run it by cells (run_cell with the arm's fill_last)")
    out = []
    for i, phase in enumerate(phases):
        for seed in cfg.seeds:
            for rep in range(repeats(i, cfg)):
                for b, (lo, hi) in enumerate(phase.blocks):
                    if progress is not None:
                        progress.update(0, note=f"{phase.name} seed {seed}")
                    rec = run_block(target, work, lo, hi, seed, cfg, progress, phase.fill_last, phase.replay_first)
                    out.append({"phase": phase.name, "q": phase.q, "block": b, "repeat": rep, **rec})
    return out
