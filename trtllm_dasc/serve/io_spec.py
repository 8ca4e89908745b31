"""The tensorrt_llm model's Triton I/O (served also as dasc_hybrid, its earlier name): TensorRT-LLM's `tensorrt_llm` model (its
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt), name for name, dtype for dtype, dim for dim, so
its clients work unchanged; plus what is ours (cached_tokens, replayed_tokens, cache_control, cache_stats,
finish_reason).

Every TensorRT-LLM input is declared, the ones we do not support too: a request using one gets an error
naming it (from serve/convert.py) instead of Triton's "unexpected input". The committed template
model_repo/tensorrt_llm/config.pbtxt is rendered from this table (`python -m trtllm_dasc.serve.io_spec`);
a test keeps the two equal.
"""
from __future__ import annotations

import sys
from typing import NamedTuple


class TensorSpec(NamedTuple):
    name: str
    dtype: str                    # Triton TYPE_* name
    dims: tuple[int, ...]
    optional: bool = True
    scalar: bool = False          # dims [1] reshaped to [] (TensorRT-LLM's per-request scalars)
    ragged: bool = False


def _scalar(name, dtype, optional=True):
    return TensorSpec(name, dtype, (1,), optional, scalar=True)


def _ragged(name, dtype, dims=(-1,)):
    return TensorSpec(name, dtype, dims, True, ragged=True)


# logits travel in fp32 (TensorRT-LLM's ${logits_datatype} filled with TYPE_FP32)
INPUTS = [
    _ragged("input_ids", "TYPE_INT32"),
    _ragged("encoder_input_features", "TYPE_FP16", (-1, -1)),
    _scalar("encoder_output_lengths", "TYPE_INT32"),
    _scalar("input_lengths", "TYPE_INT32", optional=False),
    _scalar("request_output_len", "TYPE_INT32", optional=False),
    _scalar("num_return_sequences", "TYPE_INT32"),
    _ragged("draft_input_ids", "TYPE_INT32"),
    _ragged("decoder_input_ids", "TYPE_INT32"),
    _scalar("decoder_input_lengths", "TYPE_INT32"),
    _ragged("draft_logits", "TYPE_FP32", (-1, -1)),
    _scalar("draft_acceptance_threshold", "TYPE_FP32"),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    _ragged("stop_words_list", "TYPE_INT32", (2, -1)),
    _ragged("bad_words_list", "TYPE_INT32", (2, -1)),
    _ragged("embedding_bias", "TYPE_FP32"),
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("runtime_top_k", "TYPE_INT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("runtime_top_p_min", "TYPE_FP32"),
    _scalar("runtime_top_p_decay", "TYPE_FP32"),
    _scalar("runtime_top_p_reset_ids", "TYPE_INT32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("early_stopping", "TYPE_BOOL"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("min_tokens", "TYPE_INT32"),
    # ours: min_tokens under TensorRT-LLM's older / executor name
    _scalar("min_length", "TYPE_INT32"),
    # ours: the end token is output (with its log prob / logits) as the request's last token; TensorRT-LLM's
    # rule, the default, leaves it out. The OpenAI frontend asks for it: vLLM counts and scores it (lm-eval's
    # loglikelihood reads the generated token's log prob, and the greedy next token is often the end)
    _scalar("return_end_token", "TYPE_BOOL"),
    _scalar("beam_search_diversity_rate", "TYPE_FP32"),
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("seed", "TYPE_UINT64"),
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("return_context_logits", "TYPE_BOOL"),
    _scalar("return_generation_logits", "TYPE_BOOL"),
    _scalar("return_perf_metrics", "TYPE_BOOL"),
    _scalar("exclude_input_in_output", "TYPE_BOOL"),
    _scalar("stop", "TYPE_BOOL"),
    _scalar("streaming", "TYPE_BOOL"),
    _ragged("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    _ragged("prompt_table_extra_ids", "TYPE_UINT64"),
    _scalar("prompt_vocab_size", "TYPE_INT32"),
    _ragged("cross_attention_mask", "TYPE_BOOL", (-1, -1)),
    TensorSpec("mrope_rotary_cos_sin", "TYPE_FP32", (-1,)),
    TensorSpec("mrope_position_deltas", "TYPE_INT64", (1,)),
    _scalar("lora_task_id", "TYPE_UINT64"),
    _ragged("lora_weights", "TYPE_FP16", (-1, -1)),
    _ragged("lora_config", "TYPE_INT32", (-1, 3)),
    _ragged("context_phase_params", "TYPE_UINT8"),
    _ragged("skip_cross_attn_blocks", "TYPE_BOOL", (1,)),
    _ragged("retention_token_range_starts", "TYPE_INT32"),
    _ragged("retention_token_range_ends", "TYPE_INT32"),
    _ragged("retention_token_range_priorities", "TYPE_INT32"),
    _ragged("retention_token_range_durations_ms", "TYPE_INT32"),
    _ragged("retention_decode_priority", "TYPE_INT32", (1,)),
    _ragged("retention_decode_duration_ms", "TYPE_INT32", (1,)),
    _ragged("guided_decoding_guide_type", "TYPE_STRING", (1,)),
    _ragged("guided_decoding_guide", "TYPE_STRING", (1,)),
    _ragged("lookahead_window_size", "TYPE_INT32", (1,)),
    _ragged("lookahead_ngram_size", "TYPE_INT32", (1,)),
    _ragged("lookahead_verification_set_size", "TYPE_INT32", (1,)),
    # ours: "flush" drops every cached prefix and checkpoint not in use (benchmark protocols); "stats"
    # answers the engine's counters; either way the answer is one final response with cache_stats (JSON)
    _ragged("cache_control", "TYPE_STRING", (1,)),
]

OUTPUTS = [
    TensorSpec("output_ids", "TYPE_INT32", (-1, -1)),
    TensorSpec("sequence_length", "TYPE_INT32", (-1,)),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    TensorSpec("context_logits", "TYPE_FP32", (-1, -1)),
    TensorSpec("generation_logits", "TYPE_FP32", (-1, -1, -1)),
    TensorSpec("batch_index", "TYPE_INT32", (1,)),
    TensorSpec("sequence_index", "TYPE_INT32", (1,)),
    TensorSpec("context_phase_params", "TYPE_UINT8", (-1,)),
    TensorSpec("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    TensorSpec("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    TensorSpec("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    TensorSpec("arrival_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("first_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("last_token_time_ns", "TYPE_INT64", (1,)),
    TensorSpec("acceptance_rate", "TYPE_FP32", (1,)),
    TensorSpec("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    TensorSpec("total_draft_tokens", "TYPE_INT32", (1,)),
    # ours, on every response: prompt tokens served from the cache (the client's Eq. 9 hit rate) and the
    # tokens a dasc-wr hit replayed
    TensorSpec("cached_tokens", "TYPE_INT32", (1,)),
    TensorSpec("replayed_tokens", "TYPE_INT32", (1,)),
    TensorSpec("cache_stats", "TYPE_STRING", (1,)),
    # ours, on every response (model_repo's model.py adds it): how a cached prefix was restored, e.g.
    # "dasc-nr W_max=16: cached prefixes are approximate ..." (serve/repository.py cache_policy)
    TensorSpec("dasc_policy", "TYPE_STRING", (1,)),
    # ours, on every final response: why the request ended, "length", "stop" (end id or stop word) or
    # "cancelled" (a stop request naming it, or a shutdown): a stopped request never passes for a completion
    TensorSpec("finish_reason", "TYPE_STRING", (1,)),
]

INPUT_NAMES = {t.name for t in INPUTS}

# what a request uses with a value of its own we honour; everything else must be absent or neutral
SUPPORTED = {"input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "beam_width",
             "temperature", "runtime_top_k", "runtime_top_p", "seed", "min_tokens", "min_length", "streaming", "stop",
             "stop_words_list", "bad_words_list", "exclude_input_in_output", "return_perf_metrics",
             "return_context_logits", "num_return_sequences", "cache_control", "repetition_penalty",
             "presence_penalty", "frequency_penalty", "embedding_bias", "return_log_probs",
             "return_generation_logits", "return_end_token"}


def _tensor(t: TensorSpec, is_input: bool) -> str:
    lines = [f'    name: "{t.name}"', f"    data_type: {t.dtype}", f"    dims: [ {', '.join(map(str, t.dims))} ]"]
    if t.scalar:
        lines.append("    reshape: { shape: [ ] }")
    if is_input and t.ragged:
        lines.append("    allow_ragged_batch: true")
    if is_input and t.optional:
        lines.append("    optional: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def render_config() -> str:
    """model_repo/tensorrt_llm/config.pbtxt: the I/O above plus the ${...} variables a build fills."""
    head = '''# Generated by `python -m trtllm_dasc.serve.io_spec` (do not edit: tests compare it with the table).
# The I/O of TensorRT-LLM's tensorrt_llm model plus ours; the dollar-brace variables are filled by dasc-build.
name: "tensorrt_llm"
backend: "python"
max_batch_size: ${max_batch_size}

model_transaction_policy {
  decoupled: ${decoupled_mode}
}

dynamic_batching {
  max_queue_delay_microseconds: ${max_queue_delay_microseconds}
}
'''
    inputs = "input [\n" + ",\n".join(_tensor(t, True) for t in INPUTS) + "\n]\n"
    outputs = "output [\n" + ",\n".join(_tensor(t, False) for t in OUTPUTS) + "\n]\n"
    tail = '''
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]

parameters: {
  key: "engine_dir"
  value: { string_value: "${engine_dir}" }
}
parameters: {
  key: "exclude_input_in_output"
  value: { string_value: "${exclude_input_in_output}" }
}
'''
    return head + "\n" + inputs + "\n" + outputs + tail


if __name__ == "__main__":
    sys.stdout.write(render_config())
