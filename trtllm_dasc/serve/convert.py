"""TensorRT-LLM's request/response conventions <-> the engine's GenerationRequest / RequestOutput.

Pure numpy (no Triton import): the Triton model hands us a request's inputs as {name: array} (each with
the leading batch dimension max_batch_size > 0 gives it) and sends what we return. Semantics follow
TensorRT-LLM's tensorrt_llm model: input_lengths trims input_ids; end_id -1 means none; runtime_top_k 0
and runtime_top_p 0 mean off (both off, or top_k 1: greedy); streaming responses carry only new tokens,
a non-streaming output holds the prompt too unless exclude_input_in_output; word lists are [2, N]
(flattened ids, then end offsets padded with -1). Anything we do not support is an error naming the input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from trtllm_dasc.engine.request import GenerationRequest, RequestOutput
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.errors import UserError, naming_entry
from trtllm_dasc.serve.io_spec import INPUT_NAMES, SUPPORTED

# unsupported inputs a client may still send with their neutral value (the stock client always sends some)
NEUTRAL = {"len_penalty": 1.0, "beam_search_diversity_rate": 0.0, "runtime_top_p_decay": 1.0}
# beam-search-only or decay-only knobs: meaningless without those features, so any value is harmless
# accepted and without effect here; decoder_input_ids / _lengths as TensorRT-LLM treats them for a
# decoder-only model (read for encoder models only, utils.cc): its end_to_end_test.py forwards its
# preprocessing's DECODER_INPUT_ID to tensorrt_llm on every request
IGNORED = {"early_stopping", "runtime_top_p_min", "runtime_top_p_reset_ids", "draft_acceptance_threshold",
           "decoder_input_ids", "decoder_input_lengths"}


@dataclass(slots=True)
class ServeRequest:
    """One sequence of a Triton request, as the engine runs it, plus how to answer it."""

    gen: GenerationRequest
    streaming: bool = False
    exclude_input: bool = False
    perf_metrics: bool = False
    context_logits: bool = False
    log_probs: bool = False
    generation_logits: bool = False
    batch_index: int = 0
    batch_size: int = 1
    sent: list = field(default_factory=list)       # tokens already answered (non-streaming: all of them)
    log_prob_list: list = field(default_factory=list)   # every output token's log prob so far
    gen_logits_list: list = field(default_factory=list)  # non-streaming: every output token's raw logits


@dataclass(slots=True)
class Control:
    """A cache_control request: 'flush' or 'stats' (ours; answered with cache_stats)."""

    command: str


def _first(arr: np.ndarray, b: int):
    flat = np.asarray(arr).reshape(arr.shape[0], -1) if np.ndim(arr) else np.asarray(arr).reshape(1, 1)
    return flat[min(b, flat.shape[0] - 1)][0]


def _scalar(inputs: dict, name: str, b: int, kind):
    if name not in inputs:
        return None
    arr = inputs[name]
    if np.size(arr) == 0:
        return None
    value = _first(arr, b)
    try:
        if kind is bool:
            return bool(value)
        if kind is int:
            if isinstance(value, (float, np.floating)) and not float(value).is_integer():
                raise ValueError
            return int(value)
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"input '{name}' must be a {kind.__name__}, got {value!r}") from None


def _words(inputs: dict, name: str, b: int) -> list[list[int]]:
    """TensorRT-LLM's word list [2, N] (per batch entry [B, 2, N]): ids, then end offsets, -1 padded."""
    if name not in inputs or np.size(inputs[name]) == 0:
        return []
    arr = np.asarray(inputs[name])
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[1] != 2:
        raise UserError(f"input '{name}' must have shape [batch, 2, N], got {list(arr.shape)}")
    ids, offsets = arr[min(b, arr.shape[0] - 1)].astype(np.int64)
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if not start < end <= len(ids):
            raise UserError(f"input '{name}': offsets {offsets.tolist()} do not split {len(ids)} ids")
        words.append(ids[start:end].tolist())
        start = int(end)
    return words


def _check_unsupported(inputs: dict) -> None:
    for name, arr in inputs.items():
        if name not in INPUT_NAMES:
            raise UserError(f"input '{name}' is not an input of dasc_hybrid")
        if name in SUPPORTED or name in IGNORED or np.size(arr) == 0:
            continue
        if name in NEUTRAL:
            value = np.asarray(arr).reshape(-1)
            if np.all(value == NEUTRAL[name]):
                continue
            raise UserError(f"input '{name}' = {value[0]!r} is not supported by dasc_hybrid (only the neutral "
                            f"{NEUTRAL[name]!r})")
        raise UserError(f"input '{name}' is not supported by dasc_hybrid")


def sampling_params(inputs: dict, b: int) -> SamplingParams:
    top_k = _scalar(inputs, "runtime_top_k", b, int) or 0
    top_p = _scalar(inputs, "runtime_top_p", b, float) or 0.0
    temperature = _scalar(inputs, "temperature", b, float)
    seed = _scalar(inputs, "seed", b, int)
    if top_k < 0:
        raise UserError(f"input 'runtime_top_k' must be >= 0, got {top_k}")
    if not 0.0 <= top_p <= 1.0:
        raise UserError(f"input 'runtime_top_p' must lie in [0, 1], got {top_p}")
    penalties = {}
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = _scalar(inputs, name, b, float)
        if value is not None:
            penalties[name] = value
    penalties["embedding_bias"], penalties["embedding_bias_width"] = _bias(inputs, b)
    try:
        if top_k == 1 or (top_k == 0 and top_p == 0.0):
            # greedy (top-k 1, as TensorRT-LLM runs it): the temperature still scales the logits the
            # penalties and the log probs see
            return SamplingParams(temperature=1.0 if temperature is None else temperature, top_k=1, seed=seed,
                                  **penalties)
        return SamplingParams(temperature=1.0 if temperature is None else temperature, top_k=top_k,
                              top_p=top_p if top_p > 0.0 else 1.0, seed=seed, **penalties)
    except UserError as e:
        raise UserError(f"input '{_param_input(str(e))}': {e}") from None


def _bias(inputs: dict, b: int) -> tuple:
    """embedding_bias [vocab] (per batch entry [B, vocab]; empty: none) -> (its non-zero (id, value) pairs, the
    row's length: the engine checks it is the vocabulary's, or None for none)."""
    arr = inputs.get("embedding_bias")
    if arr is None or np.size(arr) == 0:
        return (), None
    arr = np.asarray(arr)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.floating):
        raise UserError(f"input 'embedding_bias' must be FP32 [batch, vocab], got {arr.dtype} {list(arr.shape)}")
    row = arr[min(b, arr.shape[0] - 1)].astype(np.float32)
    if not np.all(np.isfinite(row)):
        raise UserError("input 'embedding_bias' must be finite")
    ids = np.flatnonzero(row)
    return tuple(zip(ids.tolist(), row[ids].tolist())), int(row.shape[0])


def _param_input(message: str) -> str:
    for field_name, input_name in (("temperature", "temperature"), ("top_k", "runtime_top_k"),
                                   ("top_p", "runtime_top_p"), ("seed", "seed"),
                                   ("repetition_penalty", "repetition_penalty"),
                                   ("presence_penalty", "presence_penalty"),
                                   ("frequency_penalty", "frequency_penalty"), ("embedding_bias", "embedding_bias")):
        if message.startswith(field_name):
            return input_name
    return "sampling"


def parse_request(inputs: dict, request_id: str, *, decoupled: bool, exclude_default: bool = False):
    """A Triton request's inputs -> [ServeRequest per batch entry] or a Control. Raises UserError."""
    control = inputs.get("cache_control")
    if control is not None and np.size(control):
        command = _first(np.asarray(control, dtype=object), 0)
        command = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        if command not in ("flush", "stats"):
            raise UserError(f"input 'cache_control' must be 'flush' or 'stats', got {command!r}")
        return Control(command)
    _check_unsupported(inputs)
    ids = inputs.get("input_ids")
    if ids is None or np.size(ids) == 0:
        raise UserError("input 'input_ids' is required and must not be empty")
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2:
        raise UserError(f"input 'input_ids' must have shape [batch, tokens], got {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise UserError(f"input 'input_ids' must be INT32, got {ids.dtype}")
    out = []
    for b in range(ids.shape[0]):
        with naming_entry(b, ids.shape[0]):
            out.append(_parse_one(inputs, ids, b, f"{request_id}#{b}" if ids.shape[0] > 1 else request_id,
                                  decoupled, exclude_default))
    return out


def _parse_one(inputs, ids, b, rid, decoupled, exclude_default) -> ServeRequest:
    length = _scalar(inputs, "input_lengths", b, int)
    tokens = ids[b].tolist()
    if length is None:
        raise UserError("input 'input_lengths' is required")
    if not 0 < length <= len(tokens):
        raise UserError(f"input 'input_lengths' = {length} disagrees with input_ids of {len(tokens)} tokens")
    max_new = _scalar(inputs, "request_output_len", b, int)
    if max_new is None:
        raise UserError("input 'request_output_len' is required")
    if max_new <= 0:
        raise UserError(f"input 'request_output_len' must be positive, got {max_new}")
    for name, allowed in (("beam_width", 1), ("num_return_sequences", 1)):
        value = _scalar(inputs, name, b, int)
        if value is not None and value != allowed:
            raise UserError(f"input '{name}' = {value}: only {allowed} is supported (no beam search, one "
                            "sequence per request)")
    streaming = bool(_scalar(inputs, "streaming", b, bool))
    if streaming and not decoupled:
        raise UserError("input 'streaming': streaming needs the decoupled model (build without --no-decoupled)")
    end_id = _scalar(inputs, "end_id", b, int)
    exclude = _scalar(inputs, "exclude_input_in_output", b, bool)
    context = bool(_scalar(inputs, "return_context_logits", b, bool))
    log_probs = bool(_scalar(inputs, "return_log_probs", b, bool))
    gen_logits = bool(_scalar(inputs, "return_generation_logits", b, bool))
    # min_tokens is TensorRT-LLM's input; min_length its older (and the executor's) name: either, or both equal
    min_tokens, min_length = _scalar(inputs, "min_tokens", b, int), _scalar(inputs, "min_length", b, int)
    if min_tokens is not None and min_length is not None and min_tokens != min_length:
        raise UserError(f"inputs 'min_tokens' = {min_tokens} and 'min_length' = {min_length} disagree")
    gen = GenerationRequest(rid, tokens[:length], max_new, sampling_params(inputs, b),
                            end_id=None if end_id is None or end_id < 0 else end_id,
                            return_context_logits=context, use_cache=not context,
                            return_log_probs=log_probs, return_generation_logits=gen_logits,
                            include_end_token=bool(_scalar(inputs, "return_end_token", b, bool)),
                            min_tokens=(min_length if min_tokens is None else min_tokens) or 0,
                            stop_words=_words(inputs, "stop_words_list", b),
                            bad_words=_words(inputs, "bad_words_list", b))
    return ServeRequest(gen, streaming, exclude_default if exclude is None else exclude,
                        bool(_scalar(inputs, "return_perf_metrics", b, bool)), context, log_probs, gen_logits, b,
                        ids.shape[0])


def response_tensors(sreq: ServeRequest, out: RequestOutput) -> dict | None:
    """The tensors answering one event, or None when nothing is due yet (a non-streaming request before
    its end). Shapes carry the batch dimension of 1: output_ids [1, beam 1, tokens]."""
    sreq.sent.extend(out.token_ids)
    # every event's log probs and logits are kept: a non-streaming answer holds all of them
    if sreq.log_probs:
        sreq.log_prob_list.extend(out.log_probs or [])
    if sreq.generation_logits and out.generation_logits is not None:
        sreq.gen_logits_list.append(out.generation_logits.float().cpu().numpy())
    if not sreq.streaming and not out.finished:
        return None
    if sreq.streaming:
        tokens = list(out.token_ids)
    else:
        tokens = ([] if sreq.exclude_input else list(sreq.gen.prompt)) + list(sreq.sent)
    st = out.stats or sreq.gen.stats
    t = {"output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
         "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
         "cached_tokens": np.array([[st.cached_tokens]], dtype=np.int32),
         "replayed_tokens": np.array([[st.replayed_tokens]], dtype=np.int32)}
    if sreq.batch_size > 1:
        t["batch_index"] = np.array([[sreq.batch_index]], dtype=np.int32)
    if sreq.perf_metrics:
        for name, value, dtype in (("kv_cache_alloc_new_blocks", st.kv_new_blocks, np.int32),
                                   ("kv_cache_reused_blocks", st.kv_reused_blocks, np.int32),
                                   ("kv_cache_alloc_total_blocks", st.kv_total_blocks, np.int32),
                                   ("arrival_time_ns", st.arrival_time_ns, np.int64),
                                   ("first_scheduled_time_ns", st.first_scheduled_time_ns, np.int64),
                                   ("first_token_time_ns", st.first_token_time_ns, np.int64),
                                   ("last_token_time_ns", st.last_token_time_ns, np.int64),
                                   # speculative decoding's metrics: no draft tokens here
                                   ("acceptance_rate", 0.0, np.float32),
                                   ("total_accepted_draft_tokens", 0, np.int32),
                                   ("total_draft_tokens", 0, np.int32)):
            t[name] = np.array([[value]], dtype=dtype)
    if sreq.context_logits and out.context_logits is not None:
        t["context_logits"] = out.context_logits.float().cpu().numpy()[None]
    if sreq.log_probs:
        # TensorRT-LLM's shapes with the batch dimension: cum_log_probs [1, beam], output_log_probs [1, beam,
        # tokens] over the generated tokens (streaming: this response's; else all of them)
        lps = (out.log_probs or []) if sreq.streaming else sreq.log_prob_list
        cum = out.cum_log_prob if out.cum_log_prob is not None else float(np.sum(sreq.log_prob_list, dtype=np.float64))
        t["cum_log_probs"] = np.array([[cum]], dtype=np.float32)
        t["output_log_probs"] = np.array(lps, dtype=np.float32).reshape(1, 1, -1)
    if sreq.generation_logits:
        rows = [out.generation_logits.float().cpu().numpy()] if sreq.streaming and out.generation_logits is not None \
            else ([] if sreq.streaming else sreq.gen_logits_list)
        if rows:
            t["generation_logits"] = np.concatenate(rows)[None, None]
    return t


def finish_tensor(reason: str) -> dict:
    """finish_reason, on a request's final response: 'length', 'stop' or 'cancelled'."""
    return {"finish_reason": np.array([[reason.encode()]], dtype=object)}


def cancelled_tensors() -> dict:
    """The final response of a request a stop request or a shutdown ended: no tokens (sequence_length 0,
    which TensorRT-LLM's clients skip) and finish_reason 'cancelled'."""
    return {"output_ids": np.zeros((1, 1, 0), dtype=np.int32), "sequence_length": np.zeros((1, 1), dtype=np.int32),
            **finish_tensor("cancelled")}


def stopped_tensors(sreq: ServeRequest) -> dict:
    """The final response of a non-streaming request a stop request ended: as TensorRT-LLM answers it,
    the tokens generated so far (with the prompt unless exclude_input_in_output), finish_reason
    'cancelled'."""
    tokens = ([] if sreq.exclude_input else list(sreq.gen.prompt)) + list(sreq.sent)
    return {"output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(tokens)]], dtype=np.int32), **finish_tensor("cancelled")}


def stats_tensor(stats: dict) -> dict:
    return {"cache_stats": np.array([[json.dumps(stats, default=str).encode()]], dtype=object)}
