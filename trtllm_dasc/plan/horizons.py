"""Static retention horizons from the decay weights alone (paper Eqs. 2-3).

    g   = -exp(A_log) * softplus(a + dt_bias)      a = -0.3: a fixed, slightly slow-decay gate logit
    H_s = ln(eps) / g                              tokens until the decay factor falls to eps (1e-3)

gdn: one horizon per value head (A_log [HV], dt_bias [HV]).
kda: one per (head, key channel): A_log is per head ([1, 1, H, 1] in the checkpoint), dt_bias per channel
     ([H * K]); unit index u = h * K + k.

Only the two tensors per linear layer are read, lazily, from whichever shard holds them, so planning an
80B checkpoint reads a few kilobytes.

The same on every CPU: numpy's exp / log / logaddexp take different SIMD paths per CPU (AVX-512 has its
own), so the fast float64 horizon may differ by a few ulps between machines. Every decision taken from a
horizon compares it with an integer (H_s > W_max; the wr window's power of two), and a few ulps can only
flip such a comparison when the horizon lies next to an integer. Those horizons (within a relative 1e-12
of an integer, about 4500 ulps) are recomputed exactly: decimal arithmetic, whose exp and ln are correctly
rounded in software, then rounded once to the nearest double. So the horizons the planner decides on are
identical on every machine, and a unit whose horizon is exactly W_max is omitted everywhere.
"""
from __future__ import annotations

import decimal
import re
from dataclasses import dataclass

import numpy as np

from trtllm_dasc.checkpoint_files import SafetensorsCheckpoint
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError

DEFAULT_A = -0.3
DEFAULT_EPS = 1e-3

# model.layers.{i}.<anything>.A_log / dt_bias: the released checkpoints use linear_attn. (gdn) and
# self_attn. (kda); transformers' in-memory kda module nests them under forget_gate.
_DECAY_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[\w.]*\.)?(A_log|dt_bias)$")


@dataclass(slots=True)
class DecayParams:
    """The decay tensors of one linear layer, as float64 numpy arrays (flattened)."""

    layer: int          # 0-indexed model layer id
    A_log: np.ndarray
    dt_bias: np.ndarray


class MissingDecayTensors(UserError):
    pass


def read_decay_params(model_dir: str, cfg: HybridConfig) -> list[DecayParams]:
    """A_log and dt_bias of every linear layer, validated against the config's shapes (and finite)."""
    files = SafetensorsCheckpoint(model_dir)
    wanted: dict[int, dict[str, str]] = {}
    for name in files.weight_map:
        m = _DECAY_NAME.search(name)
        if m:
            wanted.setdefault(int(m.group(1)), {})[m.group(2)] = name
    out = []
    for layer in cfg.linear_layers:
        names = wanted.get(layer, {})
        for kind in ("A_log", "dt_bias"):
            if kind not in names:
                raise MissingDecayTensors(
                    f"linear layer {layer} has no '{kind}' tensor in {model_dir} "
                    f"(looked for model.layers.{layer}.*.{kind}); dasc needs A_log and dt_bias when --wmax > 0")
        # float64 on the host: bf16/fp32 checkpoints both read exactly
        arrays = {kind: files.read_float64(name).reshape(-1) for kind, name in names.items()}
        out.append(DecayParams(layer=layer, A_log=arrays["A_log"], dt_bias=arrays["dt_bias"]))
    _check_shapes(out, cfg)
    return out


def _check_shapes(params: list[DecayParams], cfg: HybridConfig) -> None:
    # A_log is per (value) head in both families; kda's one head count makes value heads its heads
    heads = cfg.num_value_heads
    dt_len = cfg.units_per_layer
    for p in params:
        if p.A_log.size != heads:
            raise UserError(f"layer {p.layer}: A_log has {p.A_log.size} values, config implies {heads} heads")
        if p.dt_bias.size != dt_len:
            raise UserError(f"layer {p.layer}: dt_bias has {p.dt_bias.size} values, config implies {dt_len}")


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def log_decay(p: DecayParams, cfg: HybridConfig, a: float = DEFAULT_A) -> np.ndarray:
    """g per unit (float64, <= 0): gdn [HV], kda [H*K] head-major."""
    # a head's rate applies to each of its units: gdn one (the head), kda one per key channel
    rate = np.repeat(np.exp(p.A_log), cfg.units_per_layer // cfg.num_value_heads)
    return -rate * _softplus(a + p.dt_bias)


def horizons_from_params(params: list[DecayParams], cfg: HybridConfig, a: float = DEFAULT_A,
                         eps: float = DEFAULT_EPS) -> list[np.ndarray]:
    """H_s per unit for every linear layer. A unit that never decays (g == 0) has an infinite horizon.
    Horizons next to an integer are the correctly rounded double (module docstring): machine-independent."""
    if not 0.0 < eps < 1.0:
        raise UserError(f"eps must lie in (0, 1), got {eps}")
    out = []
    for p in params:
        g = log_decay(p, cfg, a)
        with np.errstate(divide="ignore"):
            h = np.where(g < 0.0, np.log(eps) / np.where(g < 0.0, g, -1.0), np.inf)
        a_logs = np.repeat(p.A_log, cfg.units_per_layer // cfg.num_value_heads)
        for u in np.flatnonzero(near_integer(h)):
            h[u] = exact_horizon(float(a_logs[u]), float(p.dt_bias[u]), a, eps)
        out.append(h)
    return out


# relative distance to the nearest integer below which a horizon is recomputed exactly: far above the few
# ulps numpy's SIMD paths differ by, far below the spacing of real horizons from the integers
NEAR_INTEGER_RTOL = 1e-12


def near_integer(h: np.ndarray) -> np.ndarray:
    """Finite horizons close enough to an integer that a CPU's last ulps could move them across it."""
    finite = np.isfinite(h)
    dist = np.abs(h - np.round(np.where(finite, h, 0.0)))
    return finite & (dist <= NEAR_INTEGER_RTOL * np.abs(h))


def exact_horizon(a_log: float, dt_bias: float, a: float = DEFAULT_A, eps: float = DEFAULT_EPS) -> float:
    """ln(eps) / (-exp(A_log) * softplus(a + dt_bias)) of the given doubles, correctly rounded to a double.
    Decimal's exp and ln are correctly rounded in software, so this is the same on every CPU; 60 significant
    digits leave the one final rounding as the only one that matters."""
    ctx = decimal.Context(prec=60)
    D = decimal.Decimal
    x = ctx.add(D(a), D(dt_bias))
    # softplus(x) = max(x, 0) + ln(1 + exp(-|x|)); for a tiny e = exp(-|x|), ln(1 + e) by its series
    # (1 + e would round e away at this precision)
    e = ctx.exp(-abs(x))
    if e < D("1e-20"):
        log1p = ctx.subtract(e, ctx.divide(ctx.multiply(e, e), 2))
    else:
        log1p = ctx.ln(ctx.add(1, e))
    softplus = ctx.add(max(x, D(0)), log1p)
    g = ctx.multiply(ctx.exp(D(a_log)), softplus)
    if g == 0:
        return float("inf")
    return float(ctx.divide(ctx.ln(D(eps)), -g))


def decay_factors(params: list[DecayParams], cfg: HybridConfig, a: float = DEFAULT_A) -> np.ndarray:
    """alpha = exp(g) of every unit, pooled over layers (the paper's Figure 2 profile)."""
    return np.exp(np.concatenate([log_decay(p, cfg, a) for p in params]))
