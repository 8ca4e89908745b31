"""Helpers for tests/model (a uniquely named module: several test folders have a conftest.py).

Tiny qwen3_next / kimi_linear checkpoints written by transformers' save_pretrained (the reference).

Sizes are awkward on purpose (3 heads, head dims 24/40, grouped value heads, v_head_dim != qk dim).
Decay parameters get sane random values before saving so every head keeps a useful memory, and weights
are initialised larger than transformers' default so errors are not hidden by tiny activations.
"""
from __future__ import annotations

import math

import torch

VOCAB = 97
# build(..., **DENSE_MLP[arch]): every layer a dense MLP (the tiny models mix in MoE layers, whose expert
# loop no CUDA graph can capture)
DENSE_MLP = {"gdn": {"mlp_only_layers": [0, 1, 2, 3, 4]}, "kda": {"mlp_layer_types": ["dense"] * 5}}


def _qwen(long: bool = False, **over):
    from transformers import Qwen3NextConfig
    kw = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=56, num_hidden_layers=5, num_attention_heads=3,
              num_key_value_heads=1, head_dim=24, linear_num_key_heads=2, linear_num_value_heads=6,
              linear_key_head_dim=24, linear_value_head_dim=40, linear_conv_kernel_dim=4,
              moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=5, num_experts_per_tok=2,
              mlp_only_layers=[1], initializer_range=0.08,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention",
                           "full_attention"])
    if long:
        kw.update(hidden_size=16, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2, head_dim=8,
                  linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                  moe_intermediate_size=8, shared_expert_intermediate_size=8, num_experts=3, mlp_only_layers=[],
                  layer_types=["linear_attention", "full_attention", "linear_attention"], initializer_range=0.15)
    kw.update(over)
    return Qwen3NextConfig(**kw)


def _kimi(long: bool = False, **over):
    from transformers import KimiLinearConfig
    kw = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=56, moe_intermediate_size=24, num_hidden_layers=5,
              num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
              qk_nope_head_dim=16, v_head_dim=40, linear_head_dim=24, linear_num_heads=3, linear_conv_kernel_dim=4,
              num_local_experts=6, num_experts_per_tok=2, n_group=2, topk_group=1, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, initializer_range=0.08, mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"],
              layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention",
                           "full_attention"])
    if long:
        kw.update(hidden_size=16, intermediate_size=16, moe_intermediate_size=8, num_hidden_layers=3,
                  num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=8, qk_rope_head_dim=4,
                  qk_nope_head_dim=4, v_head_dim=8, linear_head_dim=8, linear_num_heads=2, num_local_experts=4,
                  mlp_layer_types=["dense", "sparse", "sparse"],
                  layer_types=["linear_attention", "full_attention", "linear_attention"], initializer_range=0.15)
    kw.update(over)
    return KimiLinearConfig(**kw)


def _sane_decays(model, seed: int):
    """A_log / dt_bias with per-step decays spread over roughly (0.3, 0.999)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(math.log(0.3), math.log(3.0), generator=g))
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty(p.shape).uniform_(-6.0, 0.5, generator=g))
            elif name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)


def build(path, arch: str, seed: int = 0, long: bool = False, max_shard_size=None, **over):
    """Save a random tiny model to `path`; returns the transformers model (fp32, eval)."""
    from transformers import KimiLinearForCausalLM, Qwen3NextForCausalLM
    torch.manual_seed(seed)
    if arch == "gdn":
        model = Qwen3NextForCausalLM(_qwen(long, **over))
    else:
        model = KimiLinearForCausalLM(_kimi(long, **over))
    _sane_decays(model, seed)
    model = model.float().eval()
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    return model


def hf_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.as_tensor(ids)[None]).logits[0].float()


def assert_logits_close(out: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4):
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= rel * scale, f"max|diff| {err:.3e} > {rel:g} * max|logit| {scale:.3e}"


def decode_case(path, arch: str, seed: int, lens: tuple, steps: int, device: str, **over):
    """A saved tiny model loaded by our runtime, prompts of the given lengths and `steps` decode tokens per
    prompt ([steps, len(lens)]): the setup of the decode-path tests."""
    from trtllm_dasc.model import HybridModel
    build(path, arch, seed=seed, **over)
    model = HybridModel.from_pretrained(str(path), device=device)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g) for n in lens]
    return model, prompts, torch.randint(0, VOCAB, (steps, len(lens)), generator=g)
