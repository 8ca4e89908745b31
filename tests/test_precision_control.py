"""The horizon-vs-shuffled control study (benchmarks/precision_control.py): its measures against independent
recomputations (a brute-force sign test, torch's kl_div, a fake-quant INT8 written here), and the control
really differs from the horizon arm on a model whose decays follow the paper's profile."""
from __future__ import annotations

import itertools
import json
import os

import pytest
import torch

from benchmarks import precision_control as pc


@pytest.mark.parametrize("wins,n", [(0, 1), (1, 1), (3, 8), (8, 8), (0, 8), (5, 9), (4, 9), (0, 0)])
def test_sign_test_p_is_the_exact_binomial_by_enumeration(wins, n):
    if n == 0:
        assert pc.sign_test_p(wins, n) == 1.0
        return
    # every outcome of n fair coins at least as far from n/2 as the observed count
    far = sum(1 for o in itertools.product((0, 1), repeat=n) if abs(sum(o) - n / 2) >= abs(wins - n / 2))
    assert pc.sign_test_p(wins, n) == pytest.approx(far / 2 ** n, rel=1e-12)


def test_kl_and_flips_match_torch_kl_div_and_argmax():
    g = torch.Generator().manual_seed(0)
    exact, other = torch.randn(7, 33, generator=g), torch.randn(7, 33, generator=g)
    other[2] = exact[2]                                   # one row identical: no flip, no divergence
    kl, flips, n = pc.kl_and_flips(exact, other)
    ref = torch.nn.functional.kl_div(torch.log_softmax(other.double(), -1), torch.log_softmax(exact.double(), -1),
                                     reduction="sum", log_target=True)
    assert n == 7 and kl == pytest.approx(float(ref), rel=1e-9)
    assert flips == sum(int(exact[i].argmax() != other[i].argmax()) for i in range(7))


def test_paired_counts_wins_ties_and_the_median_ratio():
    # three prefixes, one point; shuffled arms' mean vs horizon: 4 vs 1 (lower), 2 vs 2 (tie), 1 vs 3 (higher)
    per_prefix = [{"m": {"horizon": [1.0], "shuffled@1": [3.0], "shuffled@2": [5.0]}},
                  {"m": {"horizon": [2.0], "shuffled@1": [2.0], "shuffled@2": [2.0]}},
                  {"m": {"horizon": [3.0], "shuffled@1": [1.0], "shuffled@2": [1.0]}}]
    row, = pc.paired(per_prefix, "m", ["shuffled@1", "shuffled@2"], [16])
    assert (row["horizon_lower"], row["ties"], row["prefixes"]) == (1, 1, 3)
    assert row["shuffled_over_horizon_median"] == pytest.approx(1.0)        # ratios 4, 1, 1/3: median 1
    assert row["sign_test_p"] == 1.0                                      # 1 of 2 untied
    empty, = pc.paired([{"m": {"horizon": [None], "shuffled@1": [None]}}], "m", ["shuffled@1"], [0])
    assert empty is None


def fake_int8(rows: torch.Tensor) -> torch.Tensor:
    """INT8 with one symmetric scale per row over d_v, written independently of trtllm_dasc.state."""
    scale = rows.abs().amax(-1, keepdim=True) / 127
    return torch.where(scale > 0, torch.round(rows / torch.where(scale > 0, scale, 1)) * scale, rows)


@pytest.fixture(scope="module")
def tiny_kda(tmp_path_factory):
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    from trtllm_dasc.plan.synthetic import write_tiny_model
    path = write_tiny_model(str(tmp_path_factory.mktemp("pc") / "kda"), "kda", seed=0)
    model = HybridModel.from_pretrained(path, dtype="float32", device="cpu")
    plan = plan_from_path(path, PlanOptions(wmax=16, tp=1, placement="off",
                                            precision="horizon:128,1024:int4,int8,int8"))[0]
    return path, model, plan


def test_state_error_at_the_load_equals_a_fake_quant_recomputation(tiny_kda):
    from trtllm_dasc.model.direct import DirectRunner
    _, model, plan = tiny_kda
    ids = torch.randint(3, 500, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    arms = {"native": [{u: "native" for u in kept} for kept in plan.retained],
            "int8": [{u: "int8" for u in kept} for kept in plan.retained]}
    got = pc.run_prefix(model, plan, arms, ids, [5] * 8, [0, 8])
    assert got["state"]["native"] == [0.0, 0.0] and got["kl"]["native"][1] == 0.0   # exact rows stay exact
    assert got["kl"]["int8"][0] is None                                               # no positions before T=0
    # the exact state, recomputed, and the int8 arm's error over the kept units
    r = DirectRunner(model, rows=1, max_tokens=64, block_size=16)
    r.run(ids, logits="none")
    s = r.state.temporal[:, 0]
    n_units = plan.config.units_per_layer
    err2 = norm2 = 0.0
    for layer, kept in enumerate(plan.retained):
        units = s[layer].reshape(n_units, -1, s.shape[-1])[kept]
        err2 += float((fake_int8(units) - units).double().pow(2).sum())
        norm2 += float(units.double().pow(2).sum())
    assert got["state"]["int8"][0] == pytest.approx((err2 / norm2) ** 0.5, rel=1e-4)
    assert got["state"]["int8"][0] > 0


def test_shuffled_bands_leave_more_error_than_horizon_bands_on_the_paper_profile(tmp_path, capsys):
    """On random weights with the paper's decays the horizons are the decays, so INT4 on long-horizon units
    (the shuffled control) must leave more state error and divergence than INT4 on short ones: a control
    equal to the horizon arm would give ratio 1 and fail."""
    out = tmp_path / "pc.json"
    assert pc.main(["--tiny-profile", "kda", "--prefix", "48", "--prefixes", "2", "--seeds", "2",
                    "--tokens", "0", "16", "64", "--out", str(out), "--commit", "test"]) == 0
    res = json.loads(out.read_text())
    assert res["arms"] == ["horizon", "int8", "shuffled@1", "shuffled@2"]
    for metric in ("state", "kl"):
        last = res["horizon_vs_shuffled"][metric][-1]
        assert last["horizon_lower"] == 2 and last["shuffled_over_horizon_median"] > 2
    assert "shuf/hor" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["uniform", "horizon@3", "int8"])
def test_precision_that_is_not_unseeded_bands_is_refused(bad):
    from trtllm_dasc.errors import UserError
    with pytest.raises(UserError, match="--precision"):
        pc.main(["--smoke", "--precision", bad])
