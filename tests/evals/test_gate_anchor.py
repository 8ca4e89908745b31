"""The gate anchor (evals/safe_gate.py enable_gate_anchor, TrainConfig.gate_anchor): each training forward
records, per gate, the mean squared log-ratio of each token's decay rate to its static one (KDA per key channel,
GDN per head). Checked
against a recomputation from the gate's own weights written here, against zero where the data-dependent part is
zero by construction, and by its effect: the same steps on the same batches with the anchor on end with gates
closer to their static rates than with it off."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtllm_dasc.evals.safe_gate import enable_gate_anchor
from trtllm_dasc.evals.train import TrainConfig, build_model, build_optimizer, forward_backward

TINY = dict(vocab_size=256, hidden_size=32, groups=1, heads=2, head_dim=16, intermediate_size=64, min_length=256,
            max_length=384, tokens_per_step=768, warmup_steps=1)


def _gates(model):
    return [m for m in model.modules() if type(m).__name__ == "KimiLinearForgetGate"]


def _by_hand(gate, h):
    """ln(softplus(x) / softplus(dt_bias))^2 averaged, x = f_b(f_a(h)) + dt_bias: the anchor's definition."""
    x = gate.f_b_proj(gate.f_a_proj(h)).float() + gate.dt_bias.float()
    ratio = F.softplus(x).clamp_min(1e-8).log() - F.softplus(gate.dt_bias.float()).clamp_min(1e-8).log()
    return ratio.square().mean()


def _anchor_now(model, tokens) -> float:
    """The anchor of a forward, recorded with the gates in training mode and no gradient."""
    terms = model.gate_anchor_terms
    terms.clear()
    with torch.no_grad():
        model(input_ids=tokens)
    value = torch.stack(terms).mean().item()
    terms.clear()
    return value


def test_each_gate_records_the_squared_log_ratio_of_its_rates():
    model = build_model(TrainConfig(arch="kda", gate_anchor=1.0, **TINY))
    gate = _gates(model)[0]
    h = torch.randn(2, 24, 32)
    gate.anchor_terms.clear()
    gate(h)
    (recorded,) = gate.anchor_terms
    assert recorded.item() == pytest.approx(_by_hand(gate, h).item(), rel=1e-5)
    # the data-dependent part zero: every token's rate is the static one, the term exactly 0
    gate.anchor_terms.clear()
    with torch.no_grad():
        gate.f_b_proj.weight.zero_()
    gate(h)
    assert gate.anchor_terms[-1].item() == 0.0
    # an evaluation forward records nothing
    gate.anchor_terms.clear()
    gate.eval()
    gate(h)
    assert gate.anchor_terms == []


def _deltanets(model):
    return [m for m in model.modules() if type(m).__name__ == "Qwen3NextGatedDeltaNet"]


def _gdn_by_hand(layer, h):
    """The same for a GatedDeltaNet: a is, per value head, the second half of in_proj_ba's group of columns
    (transformers' fix_query_key_value_ordering, written out here: groups of num_k_heads, each [b | a])."""
    ba = layer.in_proj_ba(h).float()
    per_group = layer.num_v_heads // layer.num_k_heads
    ba = ba.view(*h.shape[:2], layer.num_k_heads, 2 * per_group)
    a = ba[..., per_group:].reshape(*h.shape[:2], layer.num_v_heads)
    ratio = (F.softplus(a + layer.dt_bias.float()).clamp_min(1e-8).log()
             - F.softplus(layer.dt_bias.float()).clamp_min(1e-8).log())
    return ratio.square().mean()


def test_each_gdn_layer_records_the_squared_log_ratio_of_its_head_rates():
    # four heads: two key heads, so the grouped [b | a] column layout differs from a flat one
    model = build_model(TrainConfig(arch="gdn", gate_anchor=1.0, **{**TINY, "heads": 4}))
    layers = _deltanets(model)
    assert layers and all(layer.anchor_terms is model.gate_anchor_terms for layer in layers)
    layer = layers[0]
    h = torch.randn(2, 24, 32)
    layer.anchor_terms.clear()
    with torch.no_grad():
        layer(h)
    (recorded,) = layer.anchor_terms
    assert recorded.item() == pytest.approx(_gdn_by_hand(layer, h).item(), rel=1e-5)
    assert recorded.item() > 0
    # a (in_proj_ba's a columns) zero: every token's rate is the static one, the term exactly 0
    per_group = layer.num_v_heads // layer.num_k_heads
    with torch.no_grad():
        layer.in_proj_ba.weight.view(layer.num_k_heads, 2 * per_group, -1)[:, per_group:].zero_()
    layer.anchor_terms.clear()
    with torch.no_grad():
        layer(h)
    assert layer.anchor_terms[-1].item() == 0.0
    layer.anchor_terms.clear()
    layer.eval()
    with torch.no_grad():
        layer(h)
    assert layer.anchor_terms == []


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_training_with_the_anchor_keeps_the_gates_nearer_their_static_rates(arch):
    torch.manual_seed(0)
    batches = [torch.randint(0, 256, (2, 128)) for _ in range(6)]
    masks = [torch.ones_like(b) for b in batches]
    final = {}
    for weight in (0.0, 50.0):
        cfg = TrainConfig(arch=arch, gate_anchor=weight, lr=3e-3, **TINY)
        model = build_model(cfg)
        if weight == 0.0:
            model.gate_anchor_terms = enable_gate_anchor(model)     # recorded, but not in the loss
        opt = build_optimizer(model, cfg)
        start = _anchor_now(model, batches[0])
        for tokens, mask in zip(batches, masks):
            model.gate_anchor_terms.clear()
            forward_backward(model, opt, tokens, mask, cfg, torch.autocast("cpu", enabled=False))
            opt.step()
        final[weight] = _anchor_now(model, batches[0])
    assert final[50.0] < final[0.0] and final[50.0] < start


def test_the_anchor_is_a_finite_non_negative_weight():
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--gate-anchor"):
            TrainConfig(arch="kda", gate_anchor=bad).check()
    TrainConfig(arch="kda", gate_anchor=0.5).check()
    TrainConfig(arch="gdn", gate_anchor=0.5).check()


def test_enabling_twice_records_once_and_a_copy_records_into_its_own_list():
    import copy
    import pickle
    model = build_model(TrainConfig(arch="gdn", gate_anchor=1.0, **TINY))
    terms = model.gate_anchor_terms = enable_gate_anchor(model)     # build_model enabled it once already
    tokens = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        model(input_ids=tokens)
    assert len(terms) == len(_deltanets(model))
    terms.clear()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin(input_ids=tokens)
    assert terms == [] and len(twin.gate_anchor_terms) == len(_deltanets(twin))
    pickle.dumps(model)
