"""Horizon validation (paper Table 1b): the observations come from the model's own recurrence, the
correlations are per (prefix, layer), and on weights whose decay is set by dt_bias the empirical horizons
rank like the static ones."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trtllm_dasc.evals.horizon_validation import LayerObservation, correlate, observe

from hybrid_tiny import build


@pytest.fixture(scope="module", params=["gdn", "kda"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"hv-{request.param}")
    build(path, request.param, seed=3)
    return request.param, str(path)


def test_observed_states_are_the_state_the_model_keeps(tiny):
    """The recorded final state of each linear layer is what DirectRunner leaves in its state row, and the
    recorded log-decays give the horizon formula's inputs (negative, one per unit and token)."""
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    arch, path = tiny
    model = HybridModel.from_pretrained(path)
    ids = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 90, (40,), generator=ids).tolist()
    (layers,) = observe(model, [prompt])
    runner = DirectRunner(model, rows=1, max_tokens=64)
    runner.run(prompt, logits="none")
    temporal = runner.state.temporal                      # [L, rows, HV, K, V]
    assert len(layers) == temporal.shape[0]
    for l, ob in enumerate(layers):
        S = temporal[l, 0]
        expect = S.flatten(1).norm(dim=-1) if arch == "gdn" else S.norm(dim=-1).flatten()
        assert np.allclose(ob.state_norm, expect.numpy(), rtol=1e-5, atol=1e-7)
        assert (ob.g_mean < 0).all() and ob.g_mean.shape == ob.state_norm.shape


def test_correlations_on_hand_made_observations():
    eps = 1e-3
    hs = np.array([1.0, 2.0, 5.0, math.inf])
    g = math.log(eps) / np.array([1.5, 2.5, 4.0, 50.0])          # empirical horizons in the same order
    ob = LayerObservation("kda", g, state_norm=np.array([4.0, 3.0, 2.0, 1.0]), readout=np.array([1.0, 3.0, 2.0, 4.0]))
    flat = LayerObservation("kda", g, state_norm=np.ones(4), readout=np.ones(4))
    out = correlate([hs, hs], [[ob, flat]], eps)
    assert out["H_e"]["median"] == pytest.approx(1.0) and out["H_e"]["pairs"] == 2
    assert out["M_S"]["pairs"] == 1 and out["M_S"]["median"] == pytest.approx(-1.0)
    assert out["M_R"]["median"] == pytest.approx(0.8)            # ranks 1,3,2,4 against 1,2,3,4
    # the per-pair rhos behind each summary (so a result file can be audited): the flat layer's M_S has none
    assert [p[:2] for p in out["M_S"]["rhos"]] == [[0, 0], [0, 1]] and out["M_S"]["rhos"][1][2] is None
    assert out["M_R"]["rhos"][0] == [0, 0, pytest.approx(0.8)]
    with pytest.raises(ValueError, match="observed layers"):
        correlate([hs], [[ob, flat]], eps)


def test_static_horizons_rank_like_the_observed_decay(tiny):
    """dt_bias spreads the decays far more than the token-dependent part moves them (random weights):
    within each layer the empirical horizons must rank almost like the static ones."""
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    arch, path = tiny
    _, static = plan_from_path(path, PlanOptions(wmax=16))
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 90, size=n).tolist() for n in (32, 96)]
    out = correlate(static, observe(HybridModel.from_pretrained(path), prompts))
    assert out["H_e"]["median"] > 0.9, out
    assert out["H_e"]["pairs"] == 2 * len(static)


def test_cli_writes_the_table_on_task_prompts(tmp_path, capsys):
    import json

    from trtllm_dasc.evals.horizon_validation import main
    from trtllm_dasc.evals.train import TrainConfig, build_model
    path = tmp_path / "kda"
    build_model(TrainConfig(arch="kda", vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16,
                            intermediate_size=64)).save_pretrained(path)
    out = tmp_path / "hv.json"
    assert main(["--model", str(path), "--out", str(out), "--prefixes", "3", "--length", "256"]) == 0
    r = json.loads(out.read_text())
    assert r["prefixes"] == 3 and r["spearman"]["H_e"]["pairs"] == 3 * 3      # 3 prefixes x 3 linear layers
    assert "rho(H_s, H_e)" in capsys.readouterr().out
    assert main(["--model", str(path), "--out", str(out), "--prefixes", "0"]) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: fla's fused mixer runs on a GPU only")
def test_observations_on_the_fla_backend_equal_the_reference(tiny):
    """A GPU model runs fla's fused mixer, which hands the recurrence the raw gate with A_log / dt_bias: the
    observations (decays, state norms, readouts) equal those of the same weights through the CPU reference."""
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.recurrence import fla as fla_backend
    if not fla_backend.available("cuda")[0]:
        pytest.skip(f"fla unavailable: {fla_backend.available('cuda')[1]}")
    arch, path = tiny
    prompt = torch.randint(3, 90, (200,), generator=torch.Generator().manual_seed(1)).tolist()
    (ref,) = observe(HybridModel.from_pretrained(path), [prompt])
    (gpu,) = observe(HybridModel.from_pretrained(path, device="cuda", backend="fla"), [prompt])
    assert len(ref) == len(gpu)
    # every layer's and signal's error first, then the check: a failure names which signal and layer is off
    # and by how much (fla's chunk kernels run tl.dot in TF32 for fp32 inputs on Hopper; on the CPU, under
    # Triton's interpreter, the same comparison agrees to 1e-6 of the largest value:
    # scripts/diagnostics/fla_observations_on_cpu.py)
    def rel(x, y):          # of the largest value; an all-zero reference signal counts its absolute error
        scale = np.abs(x).max()
        return float(np.abs(x - y).max() / (scale if scale > 0 else 1.0))
    errors = {(layer, name): rel(getattr(a, name), getattr(b, name))
              for layer, (a, b) in enumerate(zip(ref, gpu)) for name in ("g_mean", "state_norm", "readout")}
    # fla's fp32 kernels within test_fla_gpu.py's tolerance; the raw gate recorded as the decay is O(1) off
    assert max(errors.values()) <= 1e-2, {k: f"{v:.2e}" for k, v in errors.items()}
