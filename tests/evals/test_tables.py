"""The markdown tables of a quality result: every figure recomputed here from the per-instance scores."""
from __future__ import annotations

import json

import numpy as np

from trtllm_dasc.evals.report import comparisons
from trtllm_dasc.evals.tables import main, markdown


def _arm(spec, scores, misses=()):
    return {"arm": spec, "misses": [list(m) for m in misses],
            "scores": {"t": {"100": {str(i): {"score": float(s)} for i, s in enumerate(scores)}}}}


def _result():
    rng = np.random.default_rng(4)
    n = 80
    dense = rng.integers(0, 2, n)
    arms = [_arm("dense", dense), _arm("nr16", dense * rng.integers(0, 2, n)), _arm("wr16", dense),
            _arm("nr16+int8", dense, misses=[("t", 100, 99)])]
    arms += [_arm(f"rand16@{s}", np.zeros(n)) for s in (1, 2)] + [_arm("rand16@3", dense * (np.arange(n) < 8))]
    result = {"model": "/x/kda", "commit": "abc", "tasks": ["t"], "lengths": [100], "instances": n, "arms": arms}
    result["comparisons"] = json.loads(json.dumps(comparisons(arms, resamples=2000)))   # as the JSON stores it
    return result, arms


def test_accuracy_row_and_comparisons_match_the_scores():
    result, arms = _result()
    text = markdown(result, "kda")
    mean = {a["arm"]: 100 * np.mean([v["score"] for v in a["scores"]["t"]["100"].values()]) for a in arms}
    rand = [mean[f"rand16@{s}"] for s in (1, 2, 3)]
    row = next(line for line in text.splitlines() if line.startswith("| 16 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["16", f"{mean['dense']:.1f}", f"{mean['nr16']:.1f}", f"{mean['wr16']:.1f}", "-",
                     f"{mean['nr16+int8']:.1f}", f"{np.mean(rand):.1f} ({np.std(rand, ddof=1):.1f}, 3)"]
    assert "1 misses excluded" in text
    # nr lost about half of dense's right answers: Holm-significant, negative
    nr_row = next(line for line in text.splitlines() if line.startswith("| dasc-nr minus dense | 16 |"))
    c = result["comparisons"]["nr_vs_dense"]["16"]
    assert f"{100 * c['diff']:+.2f}" in nr_row and nr_row.endswith("* |") and c["diff"] < 0
    assert "dasc-wr-warm minus dasc-wr" not in text                  # no wr-warm arm: no row


def test_cli_writes_markdown_and_refuses_a_bad_file(tmp_path, capsys):
    result, _ = _result()
    (tmp_path / "r.json").write_text(json.dumps(result))
    assert main([str(tmp_path / "r.json"), "--out", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text().startswith("### kda")
    (tmp_path / "bad.json").write_text("{")
    assert main([str(tmp_path / "bad.json")]) == 2 and "evals.tables: error" in capsys.readouterr().err


def test_horizon_arms_have_their_own_rows_and_comparisons():
    """issue 35 item 4: dasc-nr + horizon against dense, against + INT8 and against the mean of its shuffled-band
    controls, paired per instance (recomputed here); the horizon arms stay out of the nr / random rows."""
    rng = np.random.default_rng(9)
    n = 80
    dense = rng.integers(0, 2, n)
    horizon = dense * (np.arange(n) >= 4)                       # loses 4 of dense's instances where dense is right
    shuffled = [dense * rng.integers(0, 2, n) for _ in range(3)]
    arms = [_arm("dense", dense), _arm("nr16", np.zeros(n)), _arm("nr16+int8", dense), _arm("nr16+horizon", horizon)]
    arms += [_arm(f"nr16+horizon@{s}", x) for s, x in zip((1, 2, 3), shuffled)]
    arms += [_arm(f"rand16@{s}", np.ones(n)) for s in (1, 2)]
    comp = comparisons(arms, resamples=2000)
    # a horizon arm named like nr16 (policy nr, codec native) must not stand in for it
    assert comp["nr_vs_dense"][16]["diff"] == -np.mean(dense)
    assert comp["horizon_vs_dense"][16]["diff"] == np.mean(horizon - dense)
    assert comp["horizon_vs_int8"][16]["diff"] == np.mean(horizon - dense)
    sh = comp["horizon_vs_shuffled"][16]
    assert np.isclose(sh["diff"], np.mean(horizon - np.mean(shuffled, axis=0))) and sh["masks"] == 3
    assert sh["ci"][0] < sh["diff"] < sh["ci"][1]
    # the random masks' mean is over rand16@*, not the shuffled-band arms
    assert comp["nr_vs_random"][16]["diff"] == -1.0
    result = {"model": "/x/kda", "commit": "abc", "tasks": ["t"], "lengths": [100], "instances": n, "arms": arms,
              "comparisons": json.loads(json.dumps(comp))}
    text = markdown(result, "kda")
    pct = [100 * np.mean(x) for x in shuffled]
    lines = text.splitlines()
    row = next(line for line in lines[lines.index("Horizon-aware precision (%):"):] if line.startswith("| 16 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["16", f"{100 * np.mean(dense):.1f}", "0.0", f"{100 * np.mean(dense):.1f}",
                     f"{100 * np.mean(horizon):.1f}", f"{np.mean(pct):.1f} ({np.std(pct, ddof=1):.1f}, 3)"]
    assert "dasc-nr + horizon minus its bands shuffled" in text


def test_an_8bit_conv_arm_is_paired_with_dense_and_its_native_conv_twin():
    """+conv-int8 (issue 35's 12x point): the arm against dense and against the same spec with the native conv
    state, paired per instance (recomputed here); it stands in for neither dense nor the horizon arm."""
    rng = np.random.default_rng(11)
    n = 80
    dense = rng.integers(0, 2, n)
    horizon = dense * (np.arange(n) >= 2)                       # loses 2 of dense's instances
    conv = horizon * (np.arange(n) % 10 != 3)                   # and a few more with the 8-bit conv state
    spec = "nr16+horizon/128/1024/int4/int8/int8"
    # dense + conv-int8 after dense, the conv arm before its twin: the order that would hide a conv arm taken
    # for dense or for the horizon arm
    arms = [_arm("dense", dense), _arm("dense+conv-int8", np.zeros(n)), _arm("nr16+int8", dense),
            _arm(spec + "+conv-int8", conv), _arm(spec, horizon)]
    comp = comparisons(arms, resamples=2000)
    assert comp["horizon_vs_dense"][16]["diff"] == np.mean(horizon - dense)   # the twin, not the conv arm
    assert comp["conv8_vs_dense"][16]["diff"] == np.mean(conv - dense)
    assert comp["conv8_vs_native_conv"][16]["diff"] == np.mean(conv - horizon)
    assert comp["conv8_vs_dense"][0]["diff"] == -np.mean(dense)                # dense + conv-int8 against dense
    result = {"model": "/x/kda", "commit": "abc", "tasks": ["t"], "lengths": [100], "instances": n, "arms": arms,
              "comparisons": json.loads(json.dumps(comp))}
    text = markdown(result, "kda")
    lines = text.splitlines()
    row = next(line for line in lines[lines.index("The 8-bit conv state (%):"):] if f"`{spec}+conv-int8`" in line)
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "16", f"`{spec}+conv-int8`", f"{100 * np.mean(conv):.1f}", f"{100 * np.mean(horizon):.1f}"]
    prec = next(line for line in lines[lines.index("Horizon-aware precision (%):"):] if line.startswith("| 16 |"))
    assert prec.split("|")[2].strip() == f"{100 * np.mean(dense):.1f}"        # dense, not dense + conv-int8
    assert "| the 8-bit conv arm minus its native-conv twin | 16 |" in text


def test_two_conv_arms_at_one_window_are_refused_in_one_line(capsys):
    from trtllm_dasc.evals import run
    rc = run.main(["--model", "unused", "--out", "/tmp/unused.json",
                   "--arms", "dense,nr16+conv-int8,nr16+int8+conv-int8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "change the conv codec" in err[0]


def test_int8_random_masks_are_not_averaged_with_the_native_ones():
    """`rand16@s+int8` arms were put in the "random masks" cell beside the native ones (25.0 (26.4, 10) where the
    five native masks give 50.0 (0.0, 5)); report.comparisons keeps the codecs apart. From a review helper."""
    from trtllm_dasc.evals.tables import accuracy_rows

    def arm(spec, score):
        return {"arm": spec, "scores": {"niah_single_1": {"1024": {str(i): {"score": score} for i in range(4)}}},
                "misses": []}
    seeds = (1234, 2027, 3407, 4519, 5683)
    result = {"arms": [arm("dense", 1.0), arm("nr16", 0.9), arm("nr16+int8", 0.9)]
              + [arm(f"rand16@{s}", 0.5) for s in seeds] + [arm(f"rand16@{s}+int8", 0.0) for s in seeds]}
    row = accuracy_rows(result)[-1]
    assert row.endswith("| 50.0 (0.0, 5) |"), row


def test_the_header_counts_replays_not_instances():
    """With three replay rounds an instance is three replays: the header said "4 replays scored, 0 misses" for two
    arms of two instances each, where 11 replays loaded and 1 missed (instance 1 of nr16 kept 2 of its rounds)."""
    def arm(spec, rounds, round_misses):
        cell = {str(i): {"score": float(np.mean(r)), "rounds": r} for i, r in enumerate(rounds)}
        return {"arm": spec, "misses": [], "round_misses": round_misses, "scores": {"t": {"100": cell}}}
    result = {"model": "/x/kda", "commit": "abc", "tasks": ["t"], "lengths": [100], "instances": 2, "rounds": 3,
              "arms": [arm("dense", [[1.0] * 3, [0.0] * 3], []),
                       arm("nr16", [[1.0] * 3, [1.0, 0.0]], [["t", 100, 1, 2]])]}
    assert "11 replays scored, 1 misses excluded" in markdown(result, "kda")
