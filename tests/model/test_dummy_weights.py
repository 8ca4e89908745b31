"""Dummy weights (dasc-build --load-format dummy): values fixed by (seed, tensor name) alone, a TP rank's
shard equal to the slice of the full tensor, decay tensors equal to the planner's synthetic checkpoint,
activations finite and O(1) through a deep tiny MoE stack, and a memory footprint equal to the parameter
count of transformers' own model of the same config."""
from __future__ import annotations

import math

import pytest
import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model import DummyWeights, HybridModel
from trtllm_dasc.model.footprint import model_footprint
from trtllm_dasc.model.weights import CheckpointReader
from trtllm_dasc.plan.synthetic import tiny_moe_config, write_checkpoint

EXPERT = {"kda": "model.layers.1.block_sparse_moe.experts.3.w1.weight",
          "gdn": "model.layers.1.mlp.experts.3.gate_proj.weight"}


def cfg_of(arch, **kw):
    return HybridConfig.from_dict(tiny_moe_config(arch, **kw))


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_values_depend_on_seed_and_name_only(arch):
    cfg = cfg_of(arch)
    a, b = DummyWeights(cfg, seed=5), DummyWeights(cfg, seed=5)
    names = [EXPERT[arch], "model.embed_tokens.weight", "lm_head.weight"]
    shapes = [(32, 64), (320, 64), (320, 64)]
    first = [a.get(n, s) for n, s in zip(names, shapes)]
    # asked in the opposite order, by another instance: the same values
    second = [b.get(n, s) for n, s in reversed(list(zip(names, shapes)))][::-1]
    for x, y in zip(first, second):
        assert torch.equal(x, y)
    assert not torch.equal(first[1], first[2])                       # another name, other values
    assert not torch.equal(first[0], DummyWeights(cfg, seed=6).get(names[0], shapes[0]))
    # N(0, 1/fan_in): the spread of 20k draws is within a few percent of 1/sqrt(64)
    assert first[1].std().item() == pytest.approx(1 / 8, rel=0.05)


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_a_tp_rank_holds_the_slice_of_the_full_tensor(arch):
    cfg = cfg_of(arch)
    full = HybridModel.from_source(cfg, DummyWeights(cfg, seed=2))
    rank = HybridModel.from_source(cfg, DummyWeights(cfg, seed=2), tp_rank=1, tp_size=2)
    # the replicated embedding is equal; rank 1 of 2 holds the second half of every expert's channels
    assert torch.equal(full.w["embed"], rank.w["embed"])
    mlp_full, mlp_rank = full.layers[1][1], rank.layers[1][1]
    assert torch.equal(mlp_rank.w["gate"], mlp_full.w["gate"][:, 16:])
    assert torch.equal(mlp_rank.w["down"], mlp_full.w["down"][:, :, 16:])


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_decay_tensors_are_the_planners_synthetic_checkpoint(arch, tmp_path):
    # the released shapes: the synthetic checkpoint `dasc synth` writes (read back through safetensors)
    path = write_checkpoint(str(tmp_path / arch), arch, seed=4, shards=1)
    cfg = HybridConfig.from_path(path)
    disk, dummy = CheckpointReader(path), DummyWeights(cfg, seed=4)
    prefix = cfg.family.linear_prefix
    for layer in (cfg.linear_layers[0], cfg.linear_layers[-1]):
        for kind in ("A_log", "dt_bias"):
            name = f"model.layers.{layer}.{prefix}{kind}"
            shape = tuple(disk.files.info(name).shape)
            assert torch.equal(dummy.get(name, shape), disk.get(name, shape).float())


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_activations_stay_finite_and_order_one_through_the_layers(arch):
    cfg = cfg_of(arch, layers=12)
    model = HybridModel.from_source(cfg, DummyWeights(cfg, seed=0))
    logits = model.prefill(list(range(3, 320, 11)))
    assert bool(torch.isfinite(logits).all())
    # normed hidden states times an N(0, 1/D) head: logits of unit spread, whatever the depth
    assert 0.3 < logits.std().item() < 3.0 and logits.abs().max().item() < 30


@pytest.mark.parametrize("arch", ["kda", "gdn"])
def test_footprint_is_transformers_parameter_count(arch):
    """The bytes the meta-device load counts equal 4 x the parameters (and the routers' correction-bias
    buffer) of transformers' model of the same config, in fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM
    raw = tiny_moe_config(arch)
    cfg = HybridConfig.from_dict(raw)
    hf_cfg = AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "architectures"}, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2)
    hf = AutoModelForCausalLM.from_config(hf_cfg)
    params = sum(p.numel() for p in hf.parameters()) + sum(
        b.numel() for n, b in hf.named_buffers() if n.endswith("e_score_correction_bias"))
    fp = model_footprint(cfg, DummyWeights(cfg), dtype="float32", tp_rank=0, tp_size=1, bundle_order=None,
                         state_rows=3, kv_blocks=5, block_size=4, pool_bytes=0)
    assert fp.weights == 4 * params
    # state rows: fp32 [L, rows, H, K, V] + conv [L, rows, C, W - 1], from the config's own formulas
    per_row = cfg.num_linear_layers * (cfg.num_value_heads * cfg.key_head_dim * cfg.value_head_dim * 4
                                       + cfg.conv_dim * (cfg.conv_kernel - 1) * 4)
    assert fp.state == 3 * per_row
    assert fp.kv > 0 and math.isclose(fp.total, fp.weights + fp.kv + fp.state)
