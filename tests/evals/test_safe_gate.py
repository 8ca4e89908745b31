"""The training's KDA forget gate keeps a finite gradient where transformers' softplus gives NaN
(evals/safe_gate.py). Reference: the same gate written out in float64, where exp does not overflow until
x = 709, differentiated by autograd."""
from __future__ import annotations

import torch

from trtllm_dasc.evals.safe_gate import make_kda_gates_gradient_safe
from trtllm_dasc.evals.train import TrainConfig, build_model

TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=512, tokens_per_step=512)


def _gates(model):
    return [m for m in model.modules() if type(m).__name__ == "KimiLinearForgetGate"]


def _gate_with_large_softplus_argument():
    """A fresh KDA forget gate with two channels' dt_bias at 95 and 300: their softplus argument is past
    fp32's exp overflow (88.7) for every input, as layer 6's was at step 11,572 of session 32's run."""
    model = build_model(TrainConfig(arch="kda", **TINY))
    gate = _gates(model)[0]
    with torch.no_grad():
        gate.dt_bias[3] = 95.0
        gate.dt_bias[17] = 300.0
    hidden = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    return gate, hidden


def _float64_reference(gate, hidden):
    """The gate's output and d(sum of output * w)/d(hidden, f_b_proj.weight) in float64."""
    h = hidden.double().clone().requires_grad_(True)
    wa = gate.f_a_proj.weight.detach().double()
    wb = gate.f_b_proj.weight.detach().double().requires_grad_(True)
    x = (h @ wa.T @ wb.T + gate.dt_bias.detach().double()).view(2, 5, -1, gate.head_dim)
    out = -torch.exp(gate.A_log.detach().double()) * torch.log1p(torch.exp(x))
    return out, h, wb


def _grads(gate, hidden, weights):
    h = hidden.clone().requires_grad_(True)
    gate.zero_grad(set_to_none=True)
    out = gate(h)
    (out * weights).sum().backward()
    return out.detach(), h.grad, gate.f_b_proj.weight.grad


def test_build_model_gives_every_kda_gate_a_finite_gradient_matching_float64():
    gate, hidden = _gate_with_large_softplus_argument()
    weights = torch.randn(2, 5, TINY["heads"], TINY["head_dim"], generator=torch.Generator().manual_seed(1))
    out, dh, dwb = _grads(gate, hidden, weights)
    ref, h64, wb64 = _float64_reference(gate, hidden)
    (ref * weights.double()).sum().backward()
    assert torch.isfinite(dh).all() and torch.isfinite(dwb).all()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dh.double(), h64.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dwb.double(), wb64.grad, rtol=1e-4, atol=1e-4)


def test_the_input_does_reach_transformers_nan_gradient():
    """Without the replacement, transformers' own forward gives NaN on this input: the test above is not
    vacuous (if a transformers release fixes its softplus, this fails and the module can go)."""
    gate, hidden = _gate_with_large_softplus_argument()
    gate.forward = type(gate).forward.__get__(gate)          # the class's own forward back
    weights = torch.ones(2, 5, TINY["heads"], TINY["head_dim"])
    out, dh, dwb = _grads(gate, hidden, weights)
    assert torch.isfinite(out).all()
    assert not torch.isfinite(dwb).all()


def test_every_kda_layer_is_patched_and_gdn_is_left_alone():
    kda = build_model(TrainConfig(arch="kda", **TINY))
    gates = _gates(kda)
    assert gates and all("forward" in vars(g) for g in gates)
    assert make_kda_gates_gradient_safe(build_model(TrainConfig(arch="gdn", **TINY))) == 0
