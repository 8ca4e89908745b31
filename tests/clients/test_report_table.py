"""clients.report.format_table: every row of both tables lines up with its header, however long an arm's label
or a phase's name is (a long label once pushed its row's figures out of their columns)."""
from clients.report import format_table


def _arm(label: str, phases: list[str]) -> dict:
    fig = {k: {"mean": 1.0, "std": 0.0} for k in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms",
                                                   "input_tokens_per_s", "hit_rate")}
    return {"label": label, "slots": 53, "checkpoint_bytes": 11960,
            "summary": {"seeds": fig, "phases": {p: {"seeds": fig} for p in phases}}}


def test_rows_line_up_with_their_headers_for_long_labels_and_phase_names():
    phases = ["Q=8 (dense)", "Q=63 (nr16+horizon+conv-int8)"]
    lines = format_table([_arm("dense", phases), _arm("dasc-nr W=16 + horizon + conv INT8", phases)]).split("\n")
    blank = lines.index("")
    top, bottom = lines[:blank], lines[blank + 1:]
    assert len({len(r) for r in top}) == 1, top          # the figures end where the header's last column does
    assert len({len(r) for r in bottom}) == 1, bottom
    # each phase's "|" sits at the same place in every arm's row
    bars = {tuple(i for i, c in enumerate(r) if c == "|") for r in bottom[1:]}
    assert len(bars) == 1 and len(next(iter(bars))) == len(phases)
    # and each phase's cell ends where its name does in the header
    for p in phases:
        end = bottom[0].index(p) + len(p)
        assert all(r[end - 1] != " " and (end == len(r) or r[end] == " ") for r in bottom[1:])
