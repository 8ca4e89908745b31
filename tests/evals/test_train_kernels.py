"""GDN's recurrence through a KDA kernel (the training route where fla's GDN backward is wrong): against
transformers' torch GDN recurrence, with transformers' torch KDA recurrence standing in for fla's
chunk_kda (same signature), outputs and gradients; and the check can fail."""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.evals.train_kernels import choose_gdn_recurrence, gdn_through_kda, max_relative_error

kimi = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _torch(fn):
    return getattr(fn, "__wrapped__", fn)


@pytest.mark.parametrize("heads", [(2, 4), (3, 3)])
def test_gdn_through_kda_equals_the_gdn_recurrence(heads):
    adapter = gdn_through_kda(_torch(kimi.chunk_kimi_delta_attention))
    err = max_relative_error(adapter, _torch(qwen.torch_chunk_gated_delta_rule), "cpu", heads=heads, head_dim=16,
                             length=80)
    assert err < 1e-4


def test_the_check_catches_a_wrong_decay():
    kda = _torch(kimi.chunk_kimi_delta_attention)

    def doubled_decay(query, key, value, g, beta, **kw):
        return kda(query, key, value, g=2 * g, beta=beta, **kw)
    err = max_relative_error(gdn_through_kda(doubled_decay), _torch(qwen.torch_chunk_gated_delta_rule), "cpu",
                             head_dim=16, length=80)
    assert err > 1e-2


def test_on_cpu_nothing_is_patched():
    before = qwen.torch_chunk_gated_delta_rule
    assert choose_gdn_recurrence("cpu", log=lambda m: None) in ("torch", "fla")
    assert qwen.torch_chunk_gated_delta_rule is before


def test_a_bf16_run_is_compared_with_fp32_on_the_same_rounded_inputs():
    """The check's dtype mode: the tested function gets bf16 q/k/v/beta, the reference their fp32 values;
    a bf16 torch recurrence then differs from the fp32 one by bf16 rounding only."""
    ref = _torch(qwen.torch_chunk_gated_delta_rule)

    def in_bf16(**x):
        assert x["query"].dtype == torch.bfloat16 and x["g"].dtype == torch.float32
        return ref(**x)
    err = max_relative_error(in_bf16, ref, "cpu", head_dim=16, length=80, dtype=torch.bfloat16)
    assert 0 < err < 5e-2
