"""Synthetic decay checkpoints: config.json + sharded safetensors holding only A_log and dt_bias.

Real Kimi-Linear-48B / Qwen3-Next-80B weights are not reachable here, but the planner reads nothing else,
so a checkpoint whose decay tensors follow the paper's reported profiles (Sec. 3.3, Fig. 2; Sec. 5.2)
exercises it at full size. Two profiles (PROFILES), both through the paper's pooled quartiles
  kda channel decay alpha = exp(g): median 0.471, IQR [0.170, 0.774]
  gdn head decay:                   median 0.969, IQR [0.894, 0.997]
with layer-to-layer (and head-to-head) variation, so ragged storage beats padded as in App. B:
  "paper-capacity" (the default, from 12-07): two more knots, at the decay factors whose horizon is 16 and 512
      tokens, placed so that `dasc plan` gives the paper's TP-balanced capacities at both ends of its range
      (Sec. 5.2: KDA 2.63x-28.04x, GDN 1.10x-2.48x for W_max 16-512, on the released 48B / 80B shapes).
      The quartiles alone left the tails free: the first profile kept 6.1% of KDA channels past 512 tokens
      (10.74x) where the paper's 28.04x implies ~0.17%.
  "paper-quartiles" (sessions up to 12-07): the quartiles and invented tails only. Kept for what was built
      from it: the embedded default model, the tests' tiny models (write_tiny_model), issue 34's trained quality
      models (their frozen / anchored decay),
      and dummy-weight engines whose record names no profile.

Construction: the pooled alphas are exact quantiles of a piecewise-linear (in logit space) quantile
function through the profile's knots; units are ranked by a per-layer + per-head + per-unit score and the
i-th ranked unit gets the i-th alpha. Then A_log is drawn per head and dt_bias solved so that
-exp(A_log) * softplus(a + dt_bias) = ln(alpha) at the planner's a = -0.3.
"""
from __future__ import annotations

import json
import os

import numpy as np

from trtllm_dasc.errors import UserError
from trtllm_dasc.plan.horizons import DEFAULT_A
from trtllm_dasc.plan.horizons import DecayParams
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.families.released import complete_released

# horizon H = ln(eps) / ln(alpha) (plan/horizons.py, eps 1e-3): the decay factor whose horizon is W tokens
def _alpha_at_horizon(tokens: float, eps: float = 1e-3) -> float:
    return float(np.exp(np.log(eps) / tokens))


# each profile: the knots (probability, alpha) of its pooled quantile function, and how the alphas spread over
# layers and heads. The paper-capacity knots' probabilities were fitted (bisection, 12-07) so that `dasc plan
# --tp 8 --placement hybrid` on the synthetic 48B / 80B checkpoints of seed 0 gives 2.63x / 28.04x (KDA, W_max
# 16 / 512) and 1.105x / 2.482x (GDN), the paper's 2.63 / 28.04 and 1.10 / 2.48; in between (not fitted: the
# paper gives no figure) KDA 4.95x / 6.87x, GDN 1.34x / 1.61x at W_max 64 / 128.
# tests/plan/test_synthetic_profile.py recomputes them from the stored tensors against the paper's figures.
PROFILES = {
    "paper-capacity": {
        "kda": {"knots": ((0.0, 0.010), (0.25, 0.170), (0.5, 0.471), (0.64160, _alpha_at_horizon(16)),
                          (0.75, 0.774), (0.99824, _alpha_at_horizon(512)), (1.0, 0.995)),
                "layer_sd": 1.0, "head_sd": 0.8, "heavy_layer": 2.5},
        "gdn": {"knots": ((0.0, 0.600), (0.09679, _alpha_at_horizon(16)), (0.25, 0.894), (0.5, 0.969),
                          (0.61068, _alpha_at_horizon(512)), (0.75, 0.997), (1.0, 0.9995)),
                "layer_sd": 0.5, "head_sd": 0.0, "heavy_layer": 0.0},
    },
    "paper-quartiles": {
        "kda": {"knots": ((0.0, 0.010), (0.25, 0.170), (0.5, 0.471), (0.75, 0.774), (1.0, 0.995)),
                "layer_sd": 1.0, "head_sd": 0.8, "heavy_layer": 2.5},
        "gdn": {"knots": ((0.0, 0.600), (0.25, 0.894), (0.5, 0.969), (0.75, 0.997), (1.0, 0.9995)),
                "layer_sd": 0.5, "head_sd": 0.0, "heavy_layer": 0.0},
    },
}
DEFAULT_PROFILE = "paper-capacity"
# what a dummy-weights record without a "decay_profile" was built with (engines built before 12-07)
LEGACY_PROFILE = "paper-quartiles"


# what dasc-build wrote as a dummy record's "decay_profile" before profiles had names: the one profile of then
_UNNAMED_RECORD = "the planner's paper-shaped profile (trtllm_dasc/plan/synthetic.py)"


def check_profile(profile) -> str:
    if not isinstance(profile, str) or profile not in PROFILES:
        raise UserError(f"decay profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    return profile


def profile_of_record(record: dict | None) -> str:
    """The decay profile of dummy weights with this record (checkpoint_files.dummy_marker): its name; the legacy
    profile where the record predates names, so an older engine keeps the weights it was planned for; the
    default where there is no record (dummy weights asked for on a plain config, a build to come)."""
    if record is None:
        return DEFAULT_PROFILE
    name = record.get("decay_profile", _UNNAMED_RECORD)
    if name == _UNNAMED_RECORD:
        return LEGACY_PROFILE
    if not isinstance(name, str) or name not in PROFILES:
        raise UserError(f"the dummy-weights record (dummy_weights.json) names decay profile {name!r}: it must be "
                        f"one of {', '.join(PROFILES)}")
    return name


# shapes of the released models (../shared/reference), embedded so a fresh clone needs nothing else
KIMI_48B = {
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "vocab_size": 163840,
    "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024, "num_hidden_layers": 27,
    "num_attention_heads": 32, "num_key_value_heads": 32, "kv_lora_rank": 512, "q_lora_rank": None,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "rms_norm_eps": 1e-5,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                           "kda_layers": [i for i in range(1, 27) if i % 4], "full_attn_layers": [4, 8, 12, 16,
                                                                                                  20, 24, 27]},
}
QWEN3_NEXT_80B = {
    "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_num_value_heads": 32, "linear_num_key_heads": 16,
    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
    "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)],
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "rms_norm_eps": 1e-6,
}


def _quantile_alphas(knots: tuple, n: int) -> np.ndarray:
    """n alphas at probabilities (i + 0.5) / n of the quantile function linear in logit(alpha) between knots."""
    probs_at, alpha_at = (np.array(v, dtype=np.float64) for v in zip(*knots))
    logit = np.log(alpha_at / (1 - alpha_at))
    x = np.interp((np.arange(n) + 0.5) / n, probs_at, logit)
    return 1 / (1 + np.exp(-x))


def synthetic_decay(arch: str, num_layers: int, num_heads: int, units_per_head: int, seed: int = 0,
                    profile: str = DEFAULT_PROFILE):
    """alpha[l, u] for u = head * units_per_head + j (gdn: units_per_head = 1)."""
    prof = PROFILES[check_profile(profile)][arch]
    rng = np.random.default_rng(seed)
    layer_bias = rng.normal(0.0, prof["layer_sd"], num_layers)
    # one long-memory layer, as the paper's KDA profile has
    layer_bias[rng.integers(num_layers)] += prof["heavy_layer"]
    head_bias = rng.normal(0.0, prof["head_sd"], (num_layers, num_heads))
    score = (layer_bias[:, None, None] + head_bias[:, :, None]
             + rng.normal(0.0, 1.0, (num_layers, num_heads, units_per_head))).reshape(num_layers, -1)
    alphas = _quantile_alphas(prof["knots"], score.size)
    out = np.empty(score.size)
    out[np.argsort(score, axis=None, kind="stable")] = alphas
    return out.reshape(score.shape)


def decay_tensors(alpha: np.ndarray, units_per_head: int, seed: int = 0, a: float = DEFAULT_A):
    """Per layer (A_log [heads], dt_bias [units]) reproducing ln(alpha) at gate logit a."""
    rng = np.random.default_rng(seed + 1)
    layers, units = alpha.shape
    heads = units // units_per_head
    A_log = np.log(rng.uniform(1.0, 16.0, (layers, heads)))
    y = -np.log(alpha) / np.repeat(np.exp(A_log), units_per_head, axis=1)    # softplus(a + dt_bias)
    dt_bias = y + np.log(-np.expm1(-y)) - a                                   # inverse softplus
    return A_log, dt_bias


def profile_decay_params(cfg, seed: int = 0, profile: str = DEFAULT_PROFILE) -> list:
    """The paper-shaped A_log / dt_bias of every linear layer of cfg (HybridConfig), as horizons.DecayParams
    (float64, flat: A_log [value heads], dt_bias [units]). The one source of the decay weights of a synthetic
    checkpoint (write_checkpoint) and of dummy weights (model/weights.py DummyWeights), so a dummy engine
    plans exactly what `dasc plan` plans for the synthetic checkpoint of the same seed."""
    per_head = cfg.units_per_layer // cfg.num_value_heads
    alpha = synthetic_decay(cfg.arch, cfg.num_linear_layers, cfg.num_value_heads, per_head, seed, profile)
    A_log, dt_bias = decay_tensors(alpha, per_head, seed)
    # float32, the dtype the tensors are stored and loaded in, so a plan from either source reads equal values
    return [DecayParams(layer=layer, A_log=A_log[i].astype(np.float32).astype(np.float64),
                        dt_bias=dt_bias[i].astype(np.float32).astype(np.float64))
            for i, layer in enumerate(cfg.linear_layers)]


MODELS = {"kda": KIMI_48B, "gdn": QWEN3_NEXT_80B}
# what a checkpoint directory holds that writing a new one would replace or contradict
_CHECKPOINT_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json")


def _prepare_out_dir(out_dir: str, force: bool) -> None:
    """Refuse to turn an existing model into a different one unless forced; then clear its weights so
    no stale shard (or index) of the old model survives next to the new one."""
    import glob
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out {out_dir} exists and is not a directory")
    found = sorted({f for pattern in _CHECKPOINT_FILES for f in glob.glob(os.path.join(out_dir, pattern))})
    if found and not force:
        raise UserError(f"--out {out_dir} already holds a checkpoint ({os.path.basename(found[0])}"
                        f"{f' and {len(found) - 1} more' if len(found) > 1 else ''}); pass --force to replace it")
    try:
        os.makedirs(out_dir, exist_ok=True)
        for f in found:
            os.remove(f)
    except OSError as e:
        raise UserError(f"--out {out_dir}: cannot write there: {e.strerror or e}") from None


def write_checkpoint(out_dir: str, arch: str, seed: int = 0, shards: int = 2, force: bool = False,
                     profile: str = DEFAULT_PROFILE) -> str:
    """Write config.json + decay-only safetensors (sharded with an index when shards > 1)."""
    from safetensors.numpy import save_file


    if arch not in MODELS:
        raise UserError(f"--arch must be kda or gdn, got {arch!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise UserError(f"--seed must be a non-negative integer, got {seed!r}")
    check_profile(profile)
    raw = dict(MODELS[arch])
    cfg = HybridConfig.from_dict(raw)
    fam = cfg.family
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 2 * cfg.num_linear_layers:
        raise UserError(f"--shards must be in 1..{2 * cfg.num_linear_layers} (one per decay tensor at most), "
                        f"got {shards!r}")
    tensors = {}
    for p in profile_decay_params(cfg, seed, profile):
        prefix = f"model.layers.{p.layer}.{fam.linear_prefix}"
        tensors[prefix + "A_log"] = p.A_log.astype(np.float32).reshape(fam.a_log_view)
        tensors[prefix + "dt_bias"] = p.dt_bias.astype(np.float32)
    _prepare_out_dir(out_dir, force)
    try:
        _write_files(out_dir, raw, tensors, shards, save_file)
    except OSError as e:
        raise UserError(f"--out {out_dir}: cannot write there: {e.strerror or e}") from None
    return out_dir


def _write_files(out_dir, raw, tensors, shards, save_file) -> None:
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"))
        return
    weight_map = {}
    for s, chunk in enumerate(np.array_split(np.array(names), shards)):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in chunk}, os.path.join(out_dir, file))
        weight_map.update({n: file for n in chunk})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"synthetic": "dasc decay-only"}, "weight_map": weight_map}, f, indent=2)


def add_arguments(p) -> None:
    p.add_argument("--arch", required=True, choices=["kda", "gdn"],
                   help="kda: Kimi-Linear-48B shapes; gdn: Qwen3-Next-80B shapes")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--seed", type=int, default=0, help="seed of the decay profile's draw (default 0)")
    p.add_argument("--shards", type=int, default=2, help="safetensors shards (1 writes model.safetensors; default 2)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=list(PROFILES),
                   help=f"decay profile (default {DEFAULT_PROFILE}: fitted to the paper's capacities; "
                        f"{LEGACY_PROFILE}: the first one, what engines built before 12-07 hold)")
    p.add_argument("--force", action="store_true",
                   help="replace a checkpoint already in --out (its config.json and safetensors files)")


def run(args) -> int:
    out = write_checkpoint(args.out, args.arch, args.seed, args.shards, force=args.force, profile=args.profile)
    print(f"wrote synthetic {args.arch} decay checkpoint to {out}")
    return 0


def write_tiny_model(out_dir: str, arch: str = "kda", seed: int = 0) -> str:
    """A small complete model (random weights, saved by transformers) whose decay weights follow the
    paper's profile: the embedded default model of `make run` and the engine demos."""
    import torch
    from transformers import (KimiLinearConfig, KimiLinearForCausalLM, Qwen3NextConfig,
                              Qwen3NextForCausalLM)

    torch.manual_seed(seed)
    if arch == "kda":
        cfg = KimiLinearConfig(vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                               q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32,
                               linear_head_dim=32, linear_num_heads=4, linear_conv_kernel_dim=4,
                               num_local_experts=4, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1,
                               eos_token_id=2, mlp_layer_types=["dense"] * 4,
                               layer_types=["linear_attention"] * 3 + ["full_attention"])
        model, per_head = KimiLinearForCausalLM(cfg), 32
    elif arch == "gdn":
        cfg = Qwen3NextConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=4,
                              linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
                              moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4,
                              num_experts_per_tok=2, mlp_only_layers=[0, 1, 2, 3],
                              layer_types=["linear_attention"] * 3 + ["full_attention"])
        model, per_head = Qwen3NextForCausalLM(cfg), 1
    else:
        raise UserError(f"arch must be kda or gdn, got {arch!r}")
    # the modules holding A_log and dt_bias, one per linear layer, in model order
    layers = [m for m in model.modules() if hasattr(m, "A_log") and hasattr(m, "dt_bias")]
    heads = layers[0].A_log.numel()
    # the first profile: the tests' and demos' expectations (kept counts, slot bytes) were written against it, and
    # a model this small has too few units for the fitted tails to matter
    alpha = synthetic_decay(arch, len(layers), heads, per_head, seed, LEGACY_PROFILE)
    A_log, dt_bias = decay_tensors(alpha, per_head, seed)
    with torch.no_grad():
        for i, m in enumerate(layers):
            m.A_log.copy_(torch.tensor(A_log[i], dtype=torch.float32).view_as(m.A_log))
            m.dt_bias.copy_(torch.tensor(dt_bias[i], dtype=torch.float32).view_as(m.dt_bias))
    model.float().eval().save_pretrained(out_dir)
    return out_dir


def tiny_moe_config(arch: str, layers: int = 6, experts: int = 8, top_k: int = 2, **over) -> dict:
    """The released model of `arch` shrunk to a CPU-sized mixture of experts: its routers (kda: sigmoid scores
    with groups and the correction bias, a shared expert, the first layer dense; gdn: softmax top-k, a gated
    shared expert), its layer pattern (every third layer full attention here), hidden 64, 4 linear heads of
    16, vocab 320. For tests and the benchmarks' --smoke runs; `over` replaces any field."""
    if arch not in MODELS:
        raise UserError(f"arch must be kda or gdn, got {arch!r}")
    raw, _ = complete_released(json.loads(json.dumps(MODELS[arch])))
    raw.update(hidden_size=64, vocab_size=320, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4 if arch == "kda" else 2)
    types = ["full_attention" if (i + 1) % 3 == 0 else "linear_attention" for i in range(layers)]
    if arch == "kda":
        raw["linear_attn_config"] = {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                     "kda_layers": [i + 1 for i, t in enumerate(types) if t == "linear_attention"],
                                     "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "full_attention"]}
        raw.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_experts=experts,
                   num_experts_per_token=top_k, num_expert_group=2, topk_group=1)
    else:
        raw.update(layer_types=types, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=16, linear_value_head_dim=16, num_experts=experts, num_experts_per_tok=top_k,
                   shared_expert_intermediate_size=32)
    raw.update(over)
    return raw
