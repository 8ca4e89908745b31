"""What benchmarks/state_bandwidth.py prints and records of its arms: fractions of the copy bandwidth, the
tables, the target's weakest arm by yardstick and each codec's verdict (the target: state_bandwidth's
module docstring)."""
from __future__ import annotations


def label(a: dict) -> str:
    """An arm's codec as printed and as its verdict's key: the temporal codec, +c8 with the 8-bit conv."""
    return a["codec"] + ("+c8" if a.get("conv_codec") == "int8" else "")


def target_rows(arms: list[dict]) -> list[dict]:
    """The arms a target judges: the largest batch timed (64 on the GPU), with their conv copy as the engine
    stores."""
    rows = [a for a in arms if a.get("with_conv", True)]
    top = max((a["batch"] for a in rows), default=0)
    return [a for a in rows if a["batch"] == top]


# the target's yardstick (module docstring of state_bandwidth.py), then the ones printed beside it
VERDICT_KEYS = ("pct_of_same_size_copy_graph", "pct_of_same_size_copy_graph_read_flush", "pct_of_copy_graph")


def codec_verdicts(arms: list[dict], target_pct: float) -> dict:
    """Per codec label: each yardstick's weakest arm, and met (the first yardstick: every store and load arm
    of the codec at >= target_pct). Printed and returned."""
    groups: dict[str, list[dict]] = {}
    for a in target_rows(arms):
        groups.setdefault(label(a), []).append(a)
    out = {}
    if groups:
        print(f"\nper codec: store and load at >= {target_pct:.0f}% of a same-size copy (graph, zeroing flush)")
    for name, rows in groups.items():
        v = {"arms": len(rows), "batch": rows[0]["batch"], "target_pct": target_pct}
        for key in VERDICT_KEYS:
            have = [a for a in rows if key in a]
            if have:
                worst = min(have, key=lambda a: a[key])
                v[key] = {"min_pct": round(worst[key], 1), "arm": f"{worst['model']} W={worst['wmax']} {worst['op']}",
                          "arms_below": sum(a[key] < target_pct for a in have)}
        first = v.get(VERDICT_KEYS[0])
        v["met"] = None if first is None else first["arms_below"] == 0
        out[name] = v
        shown = f"{first['min_pct']:6.1f}%  {first['arm']:28}" if first else "  (no same-size copy timed)"
        print(f"  {name:9} {shown} {'met' if v['met'] else 'NOT met' if v['met'] is False else '-'}")
    return out


def _op_label(a: dict) -> str:
    """store / load, "-" appended for an arm timed without its conv copy (--split-conv)."""
    return a["op"] if a.get("with_conv", True) else a["op"] + "-"


def _print_table(hdr: str, arms: list[dict], line) -> None:
    """A header, a rule under it, then line(arm, its op label) for each arm."""
    print(hdr)
    print("-" * len(hdr))
    for a in arms:
        print(line(a, _op_label(a)))


def print_arms(arms: list[dict]) -> None:
    _print_table(
        f"{'model':16} {'W':>4} {'kept':>5} {'codec':9} {'op':6} {'B':>3} {'us':>8} {'us/ckpt':>8} {'graph':>7} "
        f"{'g/ckpt':>7} {'host':>6} {'GB/s':>6} {'%copy':>6} {'g%copy':>6}", arms,
        lambda a, op: (f"{a['model']:16} {a['wmax']:>4} {a['kept_fraction']:>5.2f} {label(a):9} {op:6} {a['batch']:>3} "
                       f"{a['us']:>8.1f} {a['us_per_checkpoint']:>8.1f} {a['us_graph']:>7.1f} "
                       f"{a['us_per_checkpoint_graph']:>7.2f} {a['host_us']:>6.1f} {a['GBps']:>6.0f} "
                       f"{a['pct_of_copy']:>6.1f} {a['pct_of_copy_graph']:>6.1f}"))


def print_flush(arms: list[dict]) -> None:
    """The batch-64 arms beside a copy of their own bytes (graph replays), L2 flushed by do_bench's zeroing
    and by a read."""
    rows = [a for a in arms if "us_graph_read_flush" in a]
    if not rows:
        return
    print("\nCUDA-graph replays beside a copy of the same bytes (torch copy_), L2 flushed by zeroing (do_bench) "
          "/ by reading 256 MB; %1GiB: of the 1 GiB copy bandwidth, %same: of the same-size copy's:")
    _print_table(
        f"{'model':16} {'W':>4} {'codec':9} {'op':6} {'us':>7} {'copy us':>7} {'copy%1GiB':>9} {'%same':>6} "
        f"{'us rd':>7} {'copy rd':>7} {'%1GiB rd':>8} {'%same rd':>8}", rows,
        lambda a, op: (f"{a['model']:16} {a['wmax']:>4} {label(a):9} {op:6} {a['us_graph']:>7.1f} "
                       f"{a['same_size_copy_us_graph']:>7.1f} {a['same_size_copy_pct_of_copy']:>9.1f} "
                       f"{a['pct_of_same_size_copy_graph']:>6.1f} {a['us_graph_read_flush']:>7.1f} "
                       f"{a['same_size_copy_us_graph_read_flush']:>7.1f} {a['pct_of_copy_graph_read_flush']:>8.1f} "
                       f"{a['pct_of_same_size_copy_graph_read_flush']:>8.1f}"))


TARGET_PCT = 80.0        # the speed issue's target: every batch-64 arm at >= 80% of copy bandwidth


def target_summary(arms: list[dict]) -> dict:
    """The weakest batch-64 arm (with its conv copy, as the engine stores) under each yardstick: eager and
    graph times after do_bench's zeroing flush against the 1 GiB copy, the graph after a read flush against
    it, and the graph against a copy of the arm's own bytes timed the same way. Printed and returned."""
    rows = target_rows(arms)
    keys = {"eager, zeroing flush, of the 1 GiB copy": "pct_of_copy",
            "graph, zeroing flush, of the 1 GiB copy": "pct_of_copy_graph",
            "graph, read flush, of the 1 GiB copy": "pct_of_copy_graph_read_flush",
            "graph, zeroing flush, of a copy of the same bytes": "pct_of_same_size_copy_graph",
            "graph, read flush, of a copy of the same bytes": "pct_of_same_size_copy_graph_read_flush"}
    out = {}
    if rows:
        print(f"\ntarget: every batch-{rows[0]['batch']} arm at >= {TARGET_PCT:.0f}% of copy bandwidth; "
              "the weakest arm by yardstick:")
    for yardstick, key in keys.items():
        have = [a for a in rows if key in a]
        if not have:
            continue
        worst = min(have, key=lambda a: a[key])
        name = f"{worst['model']} W={worst['wmax']} {label(worst)} {worst['op']}"
        below = sum(a[key] < TARGET_PCT for a in have)
        out[key] = {"yardstick": yardstick, "min_pct": round(worst[key], 1), "arm": name, "arms_below": below,
                    "met": below == 0}
        print(f"  {yardstick:52} {worst[key]:6.1f}%  {name:36} {'met' if below == 0 else f'{below} arm(s) below'}")
    return out


def add_fractions(arms: list[dict], copy_gbps: float) -> None:
    for a in arms:
        a["pct_of_copy"] = 100.0 * a["GBps"] / copy_gbps
        a["pct_of_copy_graph"] = 100.0 * a["GBps_graph"] / copy_gbps
        if "same_size_copy_GBps_graph" in a:
            a["pct_of_same_size_copy_graph"] = 100.0 * a["GBps_graph"] / a["same_size_copy_GBps_graph"]
            a["same_size_copy_pct_of_copy"] = 100.0 * a["same_size_copy_GBps_graph"] / copy_gbps
        if "us_graph_read_flush" in a:
            a["pct_of_copy_graph_read_flush"] = 100.0 * a["GBps_graph_read_flush"] / copy_gbps
            a["pct_of_same_size_copy_graph_read_flush"] = (100.0 * a["GBps_graph_read_flush"]
                                                           / a["same_size_copy_GBps_graph_read_flush"])
