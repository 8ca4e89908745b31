"""Stage 1 of TP balancing: a load-time permutation of head bundles across TP ranks (paper Sec. 4.3).

Each linear layer has B head bundles (gdn: a key head with its value heads; kda: a head). Rank r computes
bundle positions [r*B/T, (r+1)*B/T) of every layer. We choose, per layer, which original bundle sits at
each position so that the worst rank's retained-unit count max_r U_r is as small as we can make it.
Every rank still computes B/T bundles per layer, so compute stays balanced and the reindexing is exact
once applied to every coupled weight.

Problem: assign items (layer, bundle, load) to T ranks with exactly B/T items of each layer per rank,
minimising the largest rank sum. Greedy (largest load first onto the lightest rank with room) plus
pairwise swaps gets close; a depth-first branch and bound then proves or improves it within a node
budget. The result says whether it is proven optimal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class BundlePermutation:
    bundle_order: list[list[int]]   # per layer: position p holds original bundle bundle_order[l][p]
    rank_loads: list[int]           # retained units per rank after the permutation
    optimal: bool                   # max(rank_loads) is proven minimal


def rank_loads(loads: list[list[int]], order: list[list[int]], tp: int) -> list[int]:
    """Retained units per rank when layer l's position p holds bundle order[l][p]."""
    out = [0] * tp
    for layer_loads, layer_order in zip(loads, order):
        per_rank = len(layer_order) // tp
        for p, b in enumerate(layer_order):
            out[p // per_rank] += layer_loads[b]
    return out


def identity_order(num_layers: int, num_bundles: int) -> list[list[int]]:
    return [list(range(num_bundles)) for _ in range(num_layers)]


def _greedy(loads, tp):
    per_rank = len(loads[0]) // tp
    items = sorted(((load, l, b) for l, row in enumerate(loads) for b, load in enumerate(row)),
                   key=lambda t: (-t[0], t[1], t[2]))
    totals = [0] * tp
    room = [[per_rank] * tp for _ in loads]
    assign = [[[] for _ in range(tp)] for _ in loads]     # layer -> rank -> bundles
    for load, l, b in items:
        r = min((r for r in range(tp) if room[l][r]), key=lambda r: (totals[r], r))
        room[l][r] -= 1
        totals[r] += load
        assign[l][r].append(b)
    return assign, totals


def _improve_by_swaps(loads, assign, totals):
    """Swap one bundle of the heaviest rank with one of another rank in the same layer while it helps."""
    tp = len(totals)
    improved = True
    while improved:
        improved = False
        heavy = max(range(tp), key=lambda r: (totals[r], -r))
        for l, row in enumerate(loads):
            for i, bh in enumerate(assign[l][heavy]):
                for other in range(tp):
                    if other == heavy:
                        continue
                    for j, bo in enumerate(assign[l][other]):
                        delta = row[bh] - row[bo]
                        # the pair's larger total must drop below the heavy rank's total
                        if delta > 0 and totals[other] + delta < totals[heavy]:
                            assign[l][heavy][i], assign[l][other][j] = bo, bh
                            totals[heavy] -= delta
                            totals[other] += delta
                            improved = True
                            break
                    if improved:
                        break
                if improved:
                    break
            if improved:
                break
    return assign, totals


def _branch_and_bound(loads, tp, best_max, node_budget):
    """Exact search below best_max. Returns (assignment or None if nothing better, finished)."""
    per_rank = len(loads[0]) // tp
    items = sorted(((load, l, b) for l, row in enumerate(loads) for b, load in enumerate(row)),
                   key=lambda t: (-t[0], t[1], t[2]))
    lower = math.ceil(sum(sum(r) for r in loads) / tp)
    totals = [0] * tp
    room = [[per_rank] * tp for _ in loads]
    chosen = [0] * len(items)
    best = {"max": best_max, "assign": None}
    nodes = [0]

    def dfs(i):
        nodes[0] += 1
        if nodes[0] > node_budget or best["max"] <= lower:
            return
        if i == len(items):
            best["max"] = max(totals)
            best["assign"] = list(chosen)
            return
        load, l, _ = items[i]
        seen = set()
        for r in sorted(range(tp), key=lambda r: totals[r]):
            if not room[l][r] or totals[r] + load >= best["max"]:
                continue
            # ranks with the same total and the same room in every layer are interchangeable
            key = (totals[r], tuple(room[x][r] for x in range(len(loads))))
            if key in seen:
                continue
            seen.add(key)
            room[l][r] -= 1
            totals[r] += load
            chosen[i] = r
            dfs(i + 1)
            room[l][r] += 1
            totals[r] -= load

    dfs(0)
    finished = nodes[0] <= node_budget or best["max"] <= lower
    if best["assign"] is None:
        return None, finished
    assign = [[[] for _ in range(tp)] for _ in loads]
    for (load, l, b), r in zip(items, best["assign"]):
        assign[l][r].append(b)
    return assign, finished


def balance_bundles(loads: list[list[int]], tp: int, node_budget: int = 200_000) -> BundlePermutation:
    """loads[l][b]: retained units of bundle b in linear layer l. B must be divisible by tp."""
    if not loads:
        return BundlePermutation([], [0] * tp, True)
    num_bundles = len(loads[0])
    if tp == 1:
        order = identity_order(len(loads), num_bundles)
        return BundlePermutation(order, rank_loads(loads, order, tp), True)
    assign, totals = _improve_by_swaps(loads, *_greedy(loads, tp))
    lower = math.ceil(sum(sum(r) for r in loads) / tp)
    optimal = max(totals) <= lower
    if not optimal:
        better, finished = _branch_and_bound(loads, tp, max(totals), node_budget)
        if better is not None:
            assign = better
        optimal = finished
    # within a rank keep bundles in their original order: the least surprising layout to debug
    order = [[b for r in range(tp) for b in sorted(layer[r])] for layer in assign]
    return BundlePermutation(order, rank_loads(loads, order, tp), optimal)
