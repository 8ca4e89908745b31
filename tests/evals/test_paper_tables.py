"""The paper-style tables (evals/paper_tables.py): every figure recomputed here independently (plain means, a
brute-force bootstrap with its own generator, Holm by hand), and the transcription of the paper's numbers checked
against values typed from the paper's tables."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trtllm_dasc.evals.paper_tables import _holm_family, main, paper_numbers, tables

TASKS = ["niah_single_1", "cwe"]
LENGTHS = [4096, 8192]
N = 40


def _arm(spec, fn):
    return {"arm": spec, "misses": [], "scores": {t: {str(n): {str(i): {"score": float(fn(t, n, i))} for i in range(N)}
                                                      for n in LENGTHS} for t in TASKS}}


def _result():
    rng = np.random.default_rng(11)
    base = {(t, n, i): float(rng.integers(0, 2)) for t in TASKS for n in LENGTHS for i in range(N)}
    drop = {k: float(rng.random() < 0.2) for k in base}
    arms = [_arm("dense", lambda t, n, i: base[t, n, i]),
            _arm("nr16", lambda t, n, i: base[t, n, i] * (1 - drop[t, n, i])),
            _arm("wr16", lambda t, n, i: base[t, n, i]),
            _arm("nr64", lambda t, n, i: base[t, n, i] * (i % 3 != 0)),
            _arm("nr16+int8", lambda t, n, i: base[t, n, i] * (1 - drop[t, n, i]))]
    for s in (1234, 2027, 3407):
        r = np.random.default_rng(s)
        flip = {k: float(r.random() < 0.5) for k in base}
        arms.append(_arm(f"rand16@{s}", lambda t, n, i: base[t, n, i] * flip[t, n, i]))
        arms.append(_arm(f"rand64@{s}", lambda t, n, i: base[t, n, i] * flip[t, n, i] * (i % 2 == 0)))
    return {"arch": "kda", "model": "/x/kda", "tasks": TASKS, "lengths": LENGTHS, "instances": N, "rounds": 3,
            "arms": arms}, base, drop


def _brute_bootstrap(d, resamples=4000, seed=99):
    """Percentile CI and centered two-sided p, one draw at a time with Python's own generator."""
    gen, n, m = random.Random(seed), len(d), float(np.mean(d))
    means = sorted(sum(d[gen.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    ci = (means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1])
    p = (1 + sum(abs(x - m) >= abs(m) - 1e-12 for x in means)) / (1 + resamples)
    return ci, p


def _hand_holm(p):
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, (len(p) - rank) * p[i])
        out[i] = min(1.0, running)
    return out


def test_table2_cells_and_intervals_match_an_independent_recomputation():
    result, base, drop = _result()
    t = tables(result, resamples=10_000)
    cell = next(r for r in t["table2"] if r["task"] == "niah_single_1" and r["length"] == 4096)
    dense = [base["niah_single_1", 4096, i] for i in range(N)]
    nr = [b * (1 - drop["niah_single_1", 4096, i]) for i, b in enumerate(dense)]
    assert cell["dense"] == pytest.approx(np.mean(dense)) and cell["nr16"] == pytest.approx(np.mean(nr))
    d = [a - b for a, b in zip(nr, dense)]
    ci, p = _brute_bootstrap(d)
    assert cell["nr16_minus_dense_n"] == N and cell["nr16_minus_dense_diff"] == pytest.approx(np.mean(d))
    # two Monte Carlo bootstraps of the same data: agree within their sampling error
    assert np.allclose(cell["nr16_minus_dense_ci"], ci, atol=0.02), (cell["nr16_minus_dense_ci"], ci)
    assert cell["nr16_minus_dense_p"] == pytest.approx(p, abs=0.02)
    avg = next(r for r in t["table2"] if r["task"] == "Avg" and r["length"] == 8192)
    assert avg["nr16_minus_dense_n"] == 2 * N
    # the paper's figures beside ours, from the right cell (Table 6, Kimi-KDA: S1 and CWE dense 1.00 at 4k)
    assert cell["paper_dense"] == 1.0 and avg["paper_dense"] == 0.96 and avg["paper_nr16"] == 0.95


def test_table5_pools_every_w_and_length_into_one_holm_family():
    result, base, _ = _result()
    t = tables(result, resamples=4000)
    rows = t["table5"]
    assert [(r["wmax"], r["length"]) for r in rows] == [(16, 4096), (16, 8192), (64, 4096), (64, 8192)]
    assert all(r["masks"] == 3 for r in rows)
    assert [r["p_holm"] for r in rows] == pytest.approx(_hand_holm([r["p"] for r in rows]))
    # the random arm is the mean of the masks per instance: recompute one row's difference by hand
    arms = {a["arm"]: a for a in result["arms"]}
    d = []
    for task in TASKS:
        for i in range(N):
            masks = [arms[f"rand16@{s}"]["scores"][task]["4096"][str(i)]["score"] for s in (1234, 2027, 3407)]
            d.append(arms["nr16"]["scores"][task]["4096"][str(i)]["score"] - np.mean(masks))
    assert rows[0]["diff"] == pytest.approx(np.mean(d)) and rows[0]["n"] == 2 * N
    # the paper's reference is its Kimi-KDA end-task Table 5 at the same W (none at W=64 is missing: 16/64/128)
    assert [x["benchmark"] for x in rows[0]["paper_end_tasks"]][-1] == "MMLU-Pro"
    wr = t["wr_vs_nr"]
    assert [(r["wmax"], r["length"]) for r in wr] == [(16, 4096), (16, 8192)]
    assert wr[0]["paper_avg_diff"] == pytest.approx(0.0) and wr[1]["paper_avg_diff"] == pytest.approx(0.0)
    assert [r["arm"] for r in t["int8"]] == ["nr16+int8"] * 2 and t["int8"][0]["diff"] == 0.0


def test_holm_by_hand():
    rows = [{"n": 5, "p": p} for p in (0.01, 0.04, 0.03, 0.20)] + [{"n": 0}]
    _holm_family(rows)
    # sorted: 0.01*4 = 0.04; 0.03*3 = 0.09; 0.04*2 = 0.08 -> 0.09 (monotone); 0.20*1 = 0.20
    assert [r.get("p_holm") for r in rows] == pytest.approx([0.04, 0.09, 0.09, 0.20, None])


def test_the_paper_numbers_are_the_papers():
    """Values typed from the paper's tables (by hand, here) against the committed data file."""
    p = paper_numbers()
    kda, gdn = p["ruler"]["kda"], p["ruler"]["gdn"]
    assert kda["dense"]["4k"]["Avg"] == 0.95 and kda["nr16"]["16k"]["QA-H"] == 0.56        # Table 2 / 6
    assert kda["nr1024"]["16k"]["MK1"] == 0.82 and kda["wr512"]["8k"]["MV"] == 0.82         # Table 6
    assert gdn["wr16"]["8k"]["CWE"] == 0.54 and gdn["dense"]["16k"]["VT"] == 0.41           # Table 7
    assert gdn["nr512"]["4k"]["MK3"] == 0.97 and gdn["nr16"]["16k"]["Avg"] == 0.81
    assert p["table1b"]["kda"]["H_e"] == {"median": 0.856, "iqr": [0.843, 0.878]}
    assert p["table1b"]["kda"]["M_S"]["median"] == 0.533 and p["table1b"]["kda"]["M_R"]["median"] == 0.402
    assert p["table1b"]["gdn"]["M_R"] == {"median": 0.537, "iqr": [0.422, 0.63]}
    mmlu16 = next(r for r in p["table5"]["rows"] if r["benchmark"] == "MMLU-Pro" and r["wmax"] == 16)
    assert mmlu16["diff_pp"] == 1.82 and mmlu16["ci_pp"] == [1.58, 2.06] and mmlu16["n"] == 12032
    assert len(p["table5"]["rows"]) == 15 and p["table4"]["rows"]["AIME"]["nr16+int8"] == 0.6219
    assert p["subtasks"]["QA-H"] == "qa_2" and len(p["subtasks"]) == 13


def test_cli_writes_markdown_with_table_1b_and_refuses_bad_input(tmp_path, capsys):
    result, _, _ = _result()
    (tmp_path / "r.json").write_text(json.dumps(result))
    hv = {"spearman": {s: {"median": 0.5, "iqr": [0.4, 0.6], "pairs": 12} for s in ("H_e", "M_S", "M_R")}}
    (tmp_path / "hv.json").write_text(json.dumps(hv))
    assert main([str(tmp_path / "r.json"), "--horizons", f"kda={tmp_path / 'hv.json'}", "--resamples", "300",
                 "--out", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json")]) == 0
    text = (tmp_path / "t.md").read_text()
    assert "Table 2" in text and "Table 5" in text and "| H_e | 0.500 [0.400, 0.600] | 12 | 0.856 [0.843, 0.878] |" in text
    assert json.loads((tmp_path / "t.json").read_text())[0]["table1b"][0]["paper_median"] == 0.856
    assert main([str(tmp_path / "nope.json")]) == 2
    assert main([str(tmp_path / "r.json"), "--horizons", "x=y"]) == 2
    assert capsys.readouterr().err.count("evals.paper_tables: error") == 2


ROOT = Path(__file__).resolve().parents[2]
QUALITY = ROOT / "benchmarks" / "results" / "quality"


def _table1b_rows(text: str, arch: str) -> list[str]:
    section = text.split(f"## {arch.upper()}:")[1].split("\n## ")[0]
    return [line for line in section.split("### Table 1b")[1].splitlines() if line.startswith("| M_") or
            line.startswith("| H_")]


def test_table_1b_of_the_committed_results_sits_beside_the_papers(tmp_path):
    """paper_tables --horizons on the committed quality and horizon-validation files: each model's Table 1b rows
    carry our median [IQR] (from the horizon file) beside the paper's (KDA 0.856 / 0.533 / 0.402)."""
    hv = {a: json.loads((QUALITY / f"horizon_validation_{a}.json").read_text()) for a in ("kda", "gdn")}
    assert main([str(QUALITY / "quality_kda.json"), str(QUALITY / "quality_gdn.json"), "--resamples", "50",
                 "--horizons", ",".join(f"{a}={QUALITY / f'horizon_validation_{a}.json'}" for a in ("kda", "gdn")),
                 "--out", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json")]) == 0
    text = (tmp_path / "t.md").read_text()
    paper = {"kda": {"H_e": "0.856 [0.843, 0.878]", "M_S": "0.533 [0.462, 0.602]", "M_R": "0.402 [0.329, 0.477]"},
             "gdn": {"H_e": "0.801 [0.699, 0.877]", "M_S": "0.632 [0.541, 0.706]", "M_R": "0.537 [0.422, 0.630]"}}
    for arch in ("kda", "gdn"):
        rows = _table1b_rows(text, arch)
        assert len(rows) == 3
        for row, signal in zip(rows, ("H_e", "M_S", "M_R")):
            ours = hv[arch]["spearman"][signal]
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert cells == [signal, f"{ours['median']:.3f} [{ours['iqr'][0]:.3f}, {ours['iqr'][1]:.3f}]",
                             str(ours["pairs"]), paper[arch][signal]]
    figures = {t["arch"]: t["table1b"] for t in json.loads((tmp_path / "t.json").read_text())}
    assert [r["paper_median"] for r in figures["kda"]] == [0.856, 0.533, 0.402]
    assert figures["kda"][0]["median"] == hv["kda"]["spearman"]["H_e"]["median"]


def test_the_report_script_writes_table_1b(tmp_path):
    """scripts/quality_report.sh end to end on the committed results (the horizon validation, minutes on a CPU,
    replaced by a stub that copies the committed file and logs its call): paper_tables.md holds Table 1b."""
    res = tmp_path / "res"
    res.mkdir()
    for arch in ("kda", "gdn"):
        shutil.copy(QUALITY / f"quality_{arch}.json", res)
    log = tmp_path / "calls.log"
    stub = tmp_path / "python"
    stub.write_text(f"""#!/usr/bin/env bash
if [ "$2" = trtllm_dasc.evals.horizon_validation ]; then
  echo "$@" >> {log}
  model=$4; out=$6
  cp {QUALITY}/horizon_validation_$(basename $model).json "$out"
else
  exec {sys.executable} "$@"
fi
""")
    stub.chmod(0o755)
    out = tmp_path / "out"
    subprocess.run(["bash", "scripts/quality_report.sh", str(res), str(out)], cwd=ROOT, check=True, timeout=300,
                   env={**os.environ, "PYTHON": str(stub)}, capture_output=True)
    calls = log.read_text().splitlines()
    assert [c.split()[3] for c in calls] == ["benchmarks/quality_models/kda", "benchmarks/quality_models/gdn"]
    text = (out / "paper_tables.md").read_text()
    assert "| H_e | 0.320 [0.193, 0.497] | 144 | 0.856 [0.843, 0.878] |" in _table1b_rows(text, "kda")
    assert len(_table1b_rows(text, "gdn")) == 3 and (out / "tables.md").exists()
    # the device script's PAPER=1 tables get the horizon validations too
    gpu = (ROOT / "scripts" / "gpu" / "quality_evals.sh").read_text()
    paper_block = gpu.split('if [ "${PAPER:-0}" = 1 ]; then\n  #')[1]
    assert "trtllm_dasc.evals.horizon_validation" in paper_block
    assert '--horizons "$horizons"' in paper_block.split("trtllm_dasc.evals.paper_tables")[1].split("\nfi")[0]


def test_table5_counts_only_the_native_conv_random_masks():
    """A `rand16@s+conv-int8` arm (one conv arm per W is allowed) was counted as a sixth count-matched mask:
    masks 6, diff 0.583 where report.comparisons gives 5 and 0.5. From a review helper."""
    from trtllm_dasc.evals.paper_tables import tables
    from trtllm_dasc.evals.report import comparisons

    def arm(spec, score):
        return {"arm": spec, "scores": {"niah_single_1": {"4096": {str(i): {"score": score} for i in range(6)}}},
                "misses": []}
    seeds = (1234, 2027, 3407, 4519, 5683)
    arms = ([arm("dense", 1.0), arm("nr16", 1.0)] + [arm(f"rand16@{s}", 0.5) for s in seeds]
            + [arm("rand16@1234+conv-int8", 0.0)])
    result = {"arch": "kda", "tasks": ["niah_single_1"], "lengths": [4096], "instances": 6, "arms": arms}
    t5 = tables(result, resamples=200)["table5"][0]
    ref = comparisons(arms, resamples=200)["nr_vs_random"][16]
    assert t5["masks"] == ref["masks"] == 5
    assert t5["diff"] == pytest.approx(ref["diff"]) == pytest.approx(0.5)


def _one_task_arm(spec, scores):
    return {"arm": spec, "misses": [], "scores": {"cwe": {"4096": {str(i): {"score": s} for i, s in enumerate(scores)}}}}


def test_table2_columns_are_over_the_instances_the_difference_pairs():
    """An instance one arm lacks: the dense / nr16 columns were each arm's own mean while the difference beside
    them paired only the common instances (a review helper's case: columns 30.6 points apart next to a
    difference of -29.3). By hand: dense scores 1 on instances 0-2 and 0 on 3; nr16 lacks instance 3."""
    result = {"arch": "kda", "tasks": ["cwe"], "lengths": [4096], "instances": 4,
              "arms": [_one_task_arm("dense", [1.0, 1.0, 1.0, 0.0]), _one_task_arm("nr16", [1.0, 0.0, 1.0])]}
    row = tables(result, resamples=200)["table2"][0]
    assert row["nr16_minus_dense_n"] == 3
    assert (row["dense"], row["nr16"]) == pytest.approx((1.0, 2 / 3))
    assert row["nr16"] - row["dense"] == pytest.approx(row["nr16_minus_dense_diff"])


def test_int8_rows_leave_the_conv_codec_and_horizon_arms_out():
    """`nr16+int8+conv-int8` was compared with nr16 as "INT8's effect", the conv codec's effect mixed in and the
    Holm family enlarged (from a review helper)."""
    result = {"arch": "kda", "tasks": ["cwe"], "lengths": [4096], "instances": 6,
              "arms": [_one_task_arm("dense", [1.0] * 6), _one_task_arm("nr16", [1.0] * 6),
                       _one_task_arm("nr16+int8", [1.0] * 6), _one_task_arm("nr16+int8+conv-int8", [0.0] * 6)]}
    assert [r["arm"] for r in tables(result, resamples=200)["int8"]] == ["nr16+int8"]


def test_the_subtask_average_is_the_mean_of_the_subtask_means_as_the_papers_avg():
    """The paper's Avg column is the mean of its subtask columns. Ours pooled the instances, so a subtask that lost
    instances to misses weighed less: Avg 0.833 / 0.500 / -0.333 where the subtask means give 0.75 / 0.375 /
    -0.375. By hand: cwe has 4 instances, vt 2 (the others missed); dense cwe 1,1,1,1 vt 1,0; nr16 cwe 1,1,1,0
    vt 0,0; wr16 cwe 1,1,1,1 vt 1,0."""
    def arm(spec, cwe, vt):
        return {"arm": spec, "misses": [], "scores": {
            "cwe": {"4096": {str(i): {"score": s} for i, s in enumerate(cwe)}},
            "vt": {"4096": {str(i): {"score": s} for i, s in enumerate(vt)}}}}
    result = {"arch": "kda", "tasks": ["cwe", "vt"], "lengths": [4096], "instances": 4,
              "arms": [arm("dense", [1.0] * 4, [1.0, 0.0]), arm("nr16", [1.0, 1.0, 1.0, 0.0], [0.0, 0.0]),
                       arm("wr16", [1.0] * 4, [1.0, 0.0])]}
    t = tables(result, resamples=500)
    avg = next(r for r in t["table2"] if r["task"] == "Avg")
    assert (avg["dense"], avg["nr16"]) == pytest.approx((0.75, 0.375))
    assert avg["nr16_minus_dense_diff"] == pytest.approx(-0.375) and avg["nr16_minus_dense_n"] == 6
    lo, hi = avg["nr16_minus_dense_ci"]
    assert lo <= -0.375 <= hi
    # a subtask's own row is its plain mean and difference
    vt = next(r for r in t["table2"] if r["task"] == "vt")
    assert (vt["dense"], vt["nr16"], vt["nr16_minus_dense_diff"]) == pytest.approx((0.5, 0.0, -0.5))
    sweep = {r["arm"]: r["ours"] for r in t["sweep"]}
    assert sweep["nr16"] == pytest.approx(0.375) and sweep["wr16"] == pytest.approx(0.75)
    assert t["wr_vs_nr"][0]["diff"] == pytest.approx(0.375) and t["wr_vs_nr"][0]["n"] == 6
