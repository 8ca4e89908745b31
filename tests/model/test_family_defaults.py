"""Config fields a checkpoint may leave out take transformers' defaults (the independent reference: its
configuration classes), so a trimmed or hand-written config.json describes the model transformers would build.
Qwen3-Next without head_dim: transformers' Qwen3NextConfig gives 256, we gave hidden_size // heads (128 on the
released 80B config), half-width attention and a 32-wide rotary part where the model has 64. From a review
helper; fails on the old code."""
from __future__ import annotations

import pytest


def test_qwen3_next_head_dim_default_is_transformers():
    transformers = pytest.importorskip("transformers")
    from trtllm_dasc.families import parse
    # the released 80B's attention shape (hidden 2048, 16 heads: hidden // heads = 128), head_dim left out
    raw = {k: v for k, v in transformers.Qwen3NextConfig(hidden_size=2048, num_attention_heads=16).to_dict().items()
           if k != "head_dim"}
    ours = parse(raw).network
    theirs = transformers.Qwen3NextConfig(**raw)
    assert raw["hidden_size"] // raw["num_attention_heads"] == 128
    assert ours.head_dim == theirs.head_dim == 256
