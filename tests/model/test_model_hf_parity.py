"""Our runtime's logits and states equal transformers' Qwen3NextForCausalLM / KimiLinearForCausalLM."""
from __future__ import annotations

import copy
import os

import pytest
import torch
from hybrid_tiny import VOCAB, assert_logits_close, hf_logits

from trtllm_dasc.model import HybridModel
from trtllm_dasc.model.direct import DirectRunner


def _ids(T: int, seed: int = 0):
    return torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ["gdn", "kda"])
@pytest.mark.parametrize("T", [1, 63, 130])
def test_logits_match_transformers(tiny, arch, T):
    path, hf = tiny(arch)
    ids = _ids(T, T)
    assert_logits_close(HybridModel.from_pretrained(path).prefill(ids), hf_logits(hf, ids))


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_long_prompt_T1000(tiny, arch):
    path, hf = tiny(arch, "long")
    ids = _ids(1000, 7)
    assert_logits_close(HybridModel.from_pretrained(path).prefill(ids), hf_logits(hf, ids))


def test_mla_with_q_lora(tiny):
    path, hf = tiny("kda", "qlora")
    ids = _ids(40, 3)
    assert_logits_close(HybridModel.from_pretrained(path).prefill(ids), hf_logits(hf, ids))


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_sharded_checkpoint(tiny, arch):
    path, hf = tiny(arch, "sharded")
    assert os.path.isfile(os.path.join(path, "model.safetensors.index.json"))
    ids = _ids(20, 1)
    assert_logits_close(HybridModel.from_pretrained(path).prefill(ids), hf_logits(hf, ids))


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_states_match_transformers_cache(tiny, arch):
    """Temporal state [HV, K, V] and conv state (last W-1 inputs) equal transformers' cache, per linear layer."""
    path, hf = tiny(arch)
    ids = torch.tensor(_ids(45, 2))
    with torch.no_grad():
        cache = hf(ids[None], use_cache=True).cache
    model = HybridModel.from_pretrained(path)
    r = DirectRunner(model, rows=2, max_tokens=64, block_size=16)
    r.run(ids, row=1)
    state = r.state
    for l, layer in enumerate(model.cfg.linear_layers):
        ref_t, ref_c = cache.get_recurrent_state(layer)[0], cache.get_conv_state(layer)[0]
        torch.testing.assert_close(state.temporal[l, 1], ref_t.float(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(state.conv[l, 1], ref_c[:, 1:], rtol=1e-4, atol=1e-5)
    assert state.temporal[:, 0].abs().max() == 0


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_bf16_close_to_transformers_bf16(tiny, arch):
    path, hf = tiny(arch)
    ids = _ids(50, 4)
    # a copy: the session's fp32 reference must not be rounded
    ref = hf_logits(copy.deepcopy(hf).to(torch.bfloat16), ids)
    out = HybridModel.from_pretrained(path, dtype="bfloat16").prefill(ids)
    assert_logits_close(out, ref, rel=0.1)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_tie_word_embeddings_as_transformers_reads_it(tmp_path, arch):
    """tie_word_embeddings=true: Qwen3NextForCausalLM ties lm_head to the embedding; KimiLinearForCausalLM
    declares no tied weights, so its lm_head stays its own weight whatever the config says (our runtime tied it
    for both until 12-07, and a Kimi checkpoint with the flag set gave other logits than transformers')."""
    from hybrid_tiny import build
    hf = build(tmp_path, arch, seed=5, tie_word_embeddings=True)
    tied = hf.lm_head.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()
    assert tied == (arch == "gdn")
    ids = _ids(30, 4)
    assert_logits_close(HybridModel.from_pretrained(str(tmp_path)).prefill(ids), hf_logits(hf, ids))
