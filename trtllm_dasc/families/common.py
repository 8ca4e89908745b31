"""Network fields both families spell the same way (transformers' names)."""
from __future__ import annotations

from trtllm_dasc.families.fields import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_VOCAB, Fields


def common_network(f: Fields, default_eps: float) -> dict:
    """NetworkSchema kwargs shared by every family (raises MissingField for an absent required one)."""
    f.choice("hidden_act", choices=("silu",), default="silu")
    return dict(hidden_size=f.int("hidden_size", hi=MAX_HIDDEN), vocab_size=f.int("vocab_size", hi=MAX_VOCAB),
                intermediate_size=f.int("intermediate_size", hi=MAX_INTERMEDIATE),
                num_attention_heads=f.int("num_attention_heads", hi=MAX_HEADS),
                tie_word_embeddings=f.bool("tie_word_embeddings", default=False),
                attention_bias=f.bool("attention_bias", default=False),
                # an eps above 1 is no longer a guard against division by zero but a different norm
                rms_norm_eps=f.float("rms_norm_eps", lo=0.0, hi=1.0, default=default_eps))


def moe_fields(f: Fields, moe: bool, *, experts: tuple, top_k: tuple, norm: tuple) -> dict:
    """The router fields: required when some layer is MoE, checked whenever present."""
    # a dense model may carry zeros here; a MoE one needs them all positive
    need = dict(lo=1) if moe else dict(lo=0, default=0)
    return dict(num_experts=f.int(*experts, hi=MAX_EXPERTS, **need), top_k=f.int(*top_k, hi=MAX_EXPERTS, **need),
                moe_intermediate_size=f.int("moe_intermediate_size", hi=MAX_INTERMEDIATE, **need),
                norm_topk_prob=f.bool(*norm, default=True))
