"""Linear-attention token mixers: Gated DeltaNet (qwen3_next) and Kimi Delta Attention (kimi_linear).

Both work on flattened varlen tokens x [T, D] and one TP rank's share of heads (tp.py). forward() reads
the carried states of the batch's sequences (h0 [N, HV, K, V] fp32, conv0 [N, C, W-1]) and returns the
row-parallel partial output (sum over ranks = the layer output; at TP=1 it is the output), the new
states, and the states captured at the requested token counts (cuts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_dasc.model.fused_ops import gated_norm, prefill_conv, short_conv
from trtllm_dasc.model.ops import causal_conv, gated_rms_norm, linear, linear_groups
from trtllm_dasc.model.recurrence import run_recurrence
from trtllm_dasc.model.tp import GDNSlice, KDASlice
from trtllm_dasc.model.weights import load


@dataclass(slots=True)
class MixerOut:
    out: torch.Tensor       # [T, D] partial output of this rank
    ht: torch.Tensor | None  # [N, HV, K, V] fp32 final temporal states (None: updated in place)
    conv: torch.Tensor | None  # [N, C, W-1] final conv states (None: updated in place)
    hb: torch.Tensor        # [n_cuts, HV, K, V] fp32 captured temporal states, (sequence, cut) order
    conv_b: torch.Tensor    # [n_cuts, C, W-1] captured conv states


def log_decay(raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """The per-token log decay, -exp(A_log) * softplus(raw + dt_bias) in fp32 (transformers' formula), from the
    raw gate projection: GDN raw [T, HV], A_log and dt_bias [HV]; KDA raw [T, H, K], A_log [H], dt_bias
    [H*K]. fla's fused mixer takes the same three and computes it in its kernel (recurrence/fla.py)."""
    A = A_log.exp().view(-1, *[1] * (raw.dim() - 2))
    return -A * F.softplus(raw.float() + dt_bias.view(raw.shape[1:]))


def _conv_parts(x, weight, conv0, cu_seqlens, cuts, parts: list[int], fused: bool, head_dim: int):
    """The short conv with its output cut into `parts` channels (q, k, v): (outputs, state, captures,
    normalized). Fused: a prefill takes our conv kernels (model/kernels/conv.py), which also l2-normalise
    q and k per head (normalized True: the recurrence must not do it again); a decode step and shapes the
    kernel does not take go to fla's (fused_ops.short_conv). Else the torch reference."""
    if fused:
        from trtllm_dasc.model.kernels import conv as conv_kernel
        decode = x.shape[0] == len(cu_seqlens) - 1 and not any(cuts or [])
        if not decode and conv_kernel.supports(parts, head_dim, weight.shape[1]):
            return (*prefill_conv(x, weight, conv0, cu_seqlens, cuts, parts, head_dim), True)
        return (*short_conv(x, weight, conv0, cu_seqlens, cuts, split=parts), False)
    y, conv, conv_b = causal_conv(x, weight, conv0, cu_seqlens, cuts)
    return torch.split(y, parts, dim=-1), conv, conv_b, False


class GDNLayer:
    """Gated DeltaNet with short conv, per-head scalar decay, grouped value heads, gated RMSNorm."""

    kind = "gdn"

    def __init__(self, w: dict, H: int, HV: int, K: int, V: int, eps: float):
        self.w, self.H, self.HV, self.K, self.V, self.eps = w, H, HV, K, V, eps

    @classmethod
    def load(cls, src, prefix: str, cfg, spec, bundles: list[int], dtype, device) -> "GDNLayer":
        H, HV, K, V, W = (cfg.num_key_heads, cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim,
                          cfg.conv_kernel)
        D, r = spec.hidden_size, HV // H
        s = GDNSlice.build(bundles, H, HV, K, V)
        p = prefix + "linear_attn."
        # the checkpoint interleaves q, k, v, z (and b, a) per key head; regrouped here into one block each
        # and stacked into one projection: a single GEMM per step whose q, k, v columns line up with the
        # conv's channels and whose z, b, a follow
        n = len(bundles)
        qkvz = load(src, p + "in_proj_qkvz.weight", (H * (2 * K + 2 * r * V), D), dtype, device, s.qkvz_rows)
        qkvz = qkvz.view(n, 2 * K + 2 * r * V, D)
        ba = load(src, p + "in_proj_ba.weight", (2 * HV, D), dtype, device, s.ba_rows).view(n, 2 * r, D)
        w = {"in_proj": torch.cat([qkvz[:, :K].reshape(-1, D), qkvz[:, K:2 * K].reshape(-1, D),
                                   qkvz[:, 2 * K:2 * K + r * V].reshape(-1, D), qkvz[:, 2 * K + r * V:].reshape(-1, D),
                                   ba[:, :r].reshape(-1, D), ba[:, r:].reshape(-1, D)]),
             "conv": load(src, p + "conv1d.weight", (cfg.conv_dim, 1, W), dtype, device, s.conv_channels)[:, 0],
             "A_log": load(src, p + "A_log", (HV,), torch.float32, device, s.value_heads),
             "dt_bias": load(src, p + "dt_bias", (HV,), torch.float32, device, s.value_heads),
             "norm": load(src, p + "norm.weight", (V,), dtype, device),
             "out": load(src, p + "out_proj.weight", (D, HV * V), dtype, device, cols=s.out_cols)}
        return cls(w, len(bundles), len(bundles) * r, K, V, spec.rms_norm_eps)

    def forward(self, x, cu_seqlens: list[int], h0, conv0, backend, cuts=None) -> MixerOut:
        T, H, HV, K, V = x.shape[0], self.H, self.HV, self.K, self.V
        fused = getattr(backend, "fused_mixer", False)
        norm_fn = gated_norm if fused else gated_rms_norm
        qkv, z, b, a = torch.split(linear(x, self.w["in_proj"]), [2 * H * K + HV * V, HV * V, HV, HV], dim=-1)
        (q, k, v), conv, conv_b, normed = _conv_parts(qkv, self.w["conv"], conv0, cu_seqlens, cuts,
                                                      [H * K, H * K, HV * V], fused, K)
        if fused:       # fla's kernel computes the decay from a and beta from b (recurrence/fla.py)
            g, beta, gate = a, b, {"A_log": self.w["A_log"], "dt_bias": self.w["dt_bias"], "beta_logits": True,
                                   "qk_normalized": normed}
        else:
            g = log_decay(a, self.w["A_log"], self.w["dt_bias"])
            beta, gate = torch.sigmoid(b), {}
        o, ht, hb = run_recurrence(backend, "gdn", q.reshape(1, T, H, K), k.reshape(1, T, H, K),
                                   v.reshape(1, T, HV, V), g[None], beta[None], h0, cu_seqlens, cuts, **gate)
        o = norm_fn(o[0], z.view(T, HV, V), self.w["norm"], self.eps, "silu")
        return MixerOut(linear(o.reshape(T, HV * V), self.w["out"]), ht, conv, hb, conv_b)


class KDALayer:
    """Kimi Delta Attention: q/k/v short convs, per-channel decay from a low-rank gate, sigmoid-gated norm."""

    kind = "kda"

    def __init__(self, w: dict, H: int, K: int, eps: float):
        self.w, self.H, self.K, self.eps = w, H, K, eps

    @classmethod
    def load(cls, src, prefix: str, cfg, spec, bundles: list[int], dtype, device) -> "KDALayer":
        H, K, W, D = cfg.num_key_heads, cfg.key_head_dim, cfg.conv_kernel, spec.hidden_size
        s = KDASlice.build(bundles, K)
        p = prefix + "self_attn."

        def rows(name, shape, dt=dtype):
            return load(src, p + name, shape, dt, device, s.head_rows)
        # every projection of x in one GEMM per step: q, k, v (the conv's channels), then f_a, g_a, b
        w = {"in_proj": torch.cat([rows(f"{n}_proj.weight", (H * K, D)) for n in "qkv"]
                                  + [load(src, p + "f_a_proj.weight", (K, D), dtype, device),
                                     load(src, p + "g_a_proj.weight", (K, D), dtype, device),
                                     load(src, p + "b_proj.weight", (H, D), dtype, device, s.heads)]),
             "conv": torch.cat([rows(f"{n}_conv1d.weight", (H * K, 1, W))[:, 0] for n in "qkv"]),
             # index_select, not [heads]: on the meta device (model/footprint.py, every engine start) advanced
             # indexing runs a Python meta kernel whose first call imports sympy, ~1 s of each rank's start
             "A_log": load(src, p + "A_log", (1, 1, H, 1), torch.float32, device).view(H).index_select(
                 0, s.heads.to(device)),
             "dt_bias": rows("dt_bias", (H * K,), torch.float32),
             # f_b over f_a and g_b over g_a, stacked: one launch for both at a decode step (linear_groups)
             "fg_b": torch.cat([rows("f_b_proj.weight", (H * K, K)), rows("g_b_proj.weight", (H * K, K))]),
             "o_norm": load(src, p + "o_norm.weight", (K,), dtype, device),
             "o": load(src, p + "o_proj.weight", (D, H * K), dtype, device, cols=s.head_rows)}
        return cls(w, len(bundles), K, spec.rms_norm_eps)

    def forward(self, x, cu_seqlens: list[int], h0, conv0, backend, cuts=None, in_place=None) -> MixerOut:
        """in_place: (states [R, H, K, V] fp32, conv states [R, C, W-1], rows [N]) for a decode step whose
        recurrent and conv states are read and written where they live (backend.kda_decode_in_place,
        conv_kernel.conv_decode_in_place); h0 and conv0 are then unused and the returned ht and conv None."""
        T, H, K = x.shape[0], self.H, self.K
        fused = getattr(backend, "fused_mixer", False)
        norm_fn = gated_norm if fused else gated_rms_norm
        mixed, fg_a, b = torch.split(linear(x, self.w["in_proj"]), [3 * H * K, 2 * K, H], dim=-1)
        f_b_out, g_b_out = linear_groups(fg_a, self.w["fg_b"], 2)
        if in_place is not None:
            qkv, conv, normed = self._conv_in_place(mixed, in_place[1], in_place[2], cu_seqlens), None, False
        else:
            qkv, conv, conv_b, normed = _conv_parts(mixed, self.w["conv"], conv0, cu_seqlens, cuts, [H * K] * 3,
                                                    fused, K)
        q, k, v = (t.reshape(1, T, H, K) for t in qkv)
        raw_gate = f_b_out.view(T, H, K)
        if fused:       # fla's kernel computes the decay from the raw gate and beta from b (recurrence/fla.py)
            g, beta, gate = raw_gate, b, {"A_log": self.w["A_log"], "dt_bias": self.w["dt_bias"], "beta_logits": True,
                                          "qk_normalized": normed}
        else:
            g = log_decay(raw_gate, self.w["A_log"], self.w["dt_bias"])
            beta, gate = torch.sigmoid(b), {}
        if in_place is not None:
            states, _, rows = in_place
            o, ht, hb = backend.kda_decode_in_place(q, k, v, g[None], beta[None], states, rows, **gate), None, \
                states.new_empty(0, *states.shape[1:])
            conv_b = in_place[1].new_empty(0, *in_place[1].shape[1:])
        else:
            o, ht, hb = run_recurrence(backend, "kda", q, k, v, g[None], beta[None], h0, cu_seqlens, cuts, **gate)
        og = g_b_out.view(T, H, K)
        o = norm_fn(o[0], og, self.w["o_norm"], self.eps, "sigmoid")
        return MixerOut(linear(o.reshape(T, H * K), self.w["o"]), ht, conv, hb, conv_b)

    def _conv_in_place(self, mixed, conv_states, rows, cu_seqlens):
        """A decode step's conv on the state rows where they live: one kernel (kernels/conv.py), or, for
        shapes it does not take, fla's update between a gather and a scatter of the rows."""
        from trtllm_dasc.model.kernels import conv as conv_kernel
        parts, W = [self.H * self.K] * 3, self.w["conv"].shape[1]
        if conv_kernel.supports(parts, self.K, W):
            return conv_kernel.conv_decode_in_place(mixed, self.w["conv"], conv_states, rows, parts, self.K)
        qkv, conv, _ = short_conv(mixed, self.w["conv"], conv_states[rows], cu_seqlens, None, split=parts)
        conv_states[rows] = conv
        return qkv
