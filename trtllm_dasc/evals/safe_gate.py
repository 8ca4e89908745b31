"""A KDA forget gate whose gradient stays finite: training-only replacement of transformers' softplus.

transformers' `KimiLinearForgetGate` (5.24.0) computes the log decay as ``-exp(A_log) * softplus(x)`` with
``x = f_b_proj(f_a_proj(h)) + dt_bias`` and softplus written as ``where(x > 20, x, log(1 + exp(x)))``.
Forward, the ``where`` picks ``x`` and the loss stays finite. Backward, autograd differentiates both
branches: once any ``x`` passes 88.7, ``exp(x)`` is inf in fp32, the unused branch's gradient is
``0 * inf / inf`` = NaN, and NaN reaches every weight upstream of that gate.

It happened (session 32): the large KDA model's layer 6 reached ``x = 67`` at step 11,160 and ``x = 90`` at
step 11,572; from there nearly every batch gave a NaN gradient norm with a finite loss, the trainer skipped
20 updates in a row and stopped, and a resumed run stopped again after two steps
(quality-stages: train_kda_s32_call2/3.log, diagnostics_s32/gate_preact.py). Qwen3-Next's gate uses
``F.softplus`` and never had this.

``F.softplus`` (threshold 20: ``x`` above it, ``log1p(exp(x))`` below) has the same forward up to rounding
and a gradient that is finite everywhere (its backward is ``sigmoid(x)``, and 1 above the threshold).
"""
from __future__ import annotations

import types


def _safe_forward(self, hidden_states):
    import torch
    import torch.nn.functional as F
    hidden_shape = (*hidden_states.shape[:2], -1, self.head_dim)
    forget_gate = self.f_b_proj(self.f_a_proj(hidden_states))
    x = (forget_gate.float() + self.dt_bias.float().view(1, 1, -1)).view(hidden_shape)
    decay_rate = torch.exp(self.A_log.float())
    rate = F.softplus(x, beta=1.0, threshold=20.0)
    if self.training and getattr(self, "anchor_terms", None) is not None:
        self.anchor_terms.append(_anchor_term(rate, self.dt_bias.float().view(hidden_shape[2:])))
    return -decay_rate * rate


# the smallest decay rate the anchor's logarithm sees (a rate this small is a horizon of ~10^8 tokens)
_RATE_FLOOR = 1e-8


def _anchor_term(rate, dt_bias):
    """Mean over tokens and channels of ln(rate_t / rate_static)^2, rate_static = softplus(dt_bias): the squared
    log-ratio of each token's horizon to the channel's static one (the horizon is ln(eps) / (-exp(A_log) * rate),
    so A_log cancels). Zero exactly when the data-dependent part f_b_proj(f_a_proj(h)) is zero."""
    import torch
    import torch.nn.functional as F
    static = F.softplus(dt_bias, beta=1.0, threshold=20.0)
    return (torch.log(rate.clamp_min(_RATE_FLOOR)) - torch.log(static.clamp_min(_RATE_FLOOR))).square().mean()


def _gdn_ordering_with_anchor(self, mixed_qkvz, mixed_ba):
    """A GatedDeltaNet's ``fix_query_key_value_ordering`` that also records the anchor term of its head gates:
    Qwen3-Next computes its log decay inline in the forward as ``-exp(A_log) * softplus(a + dt_bias)``, with
    ``a`` the last output of this method (transformers 5.24.0), so this is the one point where ``a`` can be seen
    per layer. Bound to the layer (types.MethodType) as _safe_forward is: a copy of the model records into its
    own list, and the model still pickles."""
    import torch.nn.functional as F
    out = type(self).fix_query_key_value_ordering(self, mixed_qkvz, mixed_ba)
    if self.training:
        rate = F.softplus(out[-1].float() + self.dt_bias.float(), beta=1.0, threshold=20.0)
        self.anchor_terms.append(_anchor_term(rate, self.dt_bias.float()))
    return out


def enable_gate_anchor(model) -> list:
    """Make every linear-attention gate of ``model`` record its anchor term (``_anchor_term``) in one shared
    list on each training-mode forward; returns the list, which the trainer sums into the loss and empties.
    KDA's (gradient-safe) forget gates record per (token, key channel); Qwen3-Next's GatedDeltaNet records per
    (token, head) through ``_gdn_ordering_with_anchor``.
    Issue 34: with A_log / dt_bias frozen at the paper's profile, the trained data-dependent part still kept
    channels whose static horizon is <= 16 tokens alive for ~1k tokens on cwe prompts (Table 1b: 0.27 against
    the paper's 0.86), and dasc-nr at W=16 lost 5 points; the anchor pulls the tokens' horizons toward the static
    ones the planner reads. GDN's gate is per head and moves less (Table 1b 0.69), but its two heads that W=16
    omits are what decide nr16 against dense and against random masks, so it is held the same way."""
    terms: list = []
    gates = [m for m in model.modules() if type(m).__name__ == "KimiLinearForgetGate"]
    deltanets = [m for m in model.modules() if type(m).__name__ == "Qwen3NextGatedDeltaNet"]
    if not gates and not deltanets:
        raise ValueError("the gate anchor needs KDA forget gates or Qwen3-Next GatedDeltaNet layers; this model has none")
    for module in gates:
        if getattr(module.forward, "__func__", None) is not _safe_forward:
            raise ValueError("the gate anchor records in the gradient-safe forward: make_kda_gates_gradient_safe first")
        module.anchor_terms = terms
    for module in deltanets:
        module.anchor_terms = terms
        # bound once: a second call re-points the layer at the new list instead of wrapping the wrapper
        module.fix_query_key_value_ordering = types.MethodType(_gdn_ordering_with_anchor, module)
    return terms


def make_kda_gates_gradient_safe(model) -> int:
    """Give every `KimiLinearForgetGate` in ``model`` the gradient-safe softplus; returns how many. A model
    without such gates (Qwen3-Next) is left as it is (0)."""
    patched = 0
    for module in model.modules():
        if type(module).__name__ == "KimiLinearForgetGate":
            module.forward = types.MethodType(_safe_forward, module)
            patched += 1
    return patched
