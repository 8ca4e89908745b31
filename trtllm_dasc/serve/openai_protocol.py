"""The OpenAI request side of the frontend (openai_frontend.py): validation of /v1/completions and
/v1/chat/completions bodies into one `GenRequest` per prompt and OpenAI-style errors (chat templates:
openai_chat.py).

Field handling follows what OpenAI's API and vLLM / trtllm-serve accept, so stock clients (the `openai`
package, genai-perf / aiperf's OpenAI modes, lm-eval's local-completions) work unchanged:
- supported: model, prompt (str, list of str, token ids, list of token-id lists), messages, max_tokens
  (chat: also max_completion_tokens), temperature, top_p, top_k (extension), min_tokens and ignore_eos
  (extensions, as vLLM), repetition_penalty (vLLM's), stop (str or list), stream, stream_options.include_usage,
  seed (any int64, wrapped to the engine's uint64; absent: a fresh random one per sampled request), n / best_of = 1,
  logprobs (completions: the top-N count; chat: a bool with top_logprobs), echo (completions, with
  max_tokens 0 allowed: lm-eval's loglikelihood requests are echo + logprobs + max_tokens 1); chat's
  add_generation_prompt and continue_final_message (vLLM's; openai_chat.py).
- refused with a 400 naming the field: n > 1, best_of > 1, echo on chat, a non-empty logit_bias, suffix,
  non-zero presence / frequency penalties, tools, and vLLM's min_p, stop_token_ids and a response_format other
  than text (they would change the output: never ignored).
- other fields (user, metadata, ...) are ignored, as vLLM does, so tools sending extras still work.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

# the temperature below which a request is greedy (TensorRT-LLM's top_k 1)
GREEDY_BELOW = 1e-5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# the most alternatives a token's top_logprobs may list (OpenAI's chat limit; vLLM's default)
MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = message, param, status, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(slots=True)
class GenRequest:
    """One prompt's generation, in the core model's terms."""
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_tokens: int = 0
    seed: int | None = None
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    # log probs: None = not asked; N = each token's log prob and its top-N alternatives (from the raw
    # generation logits); prompt_logprobs adds the prompt's tokens' (echo, from the context logits)
    logprobs: int | None = None
    prompt_logprobs: bool = False
    # echo: the prompt text the choice's text starts with
    echo_text: str | None = None

    def triton_inputs(self, end_id: int) -> dict:
        """The JSON body of the core model's generate_stream (TensorRT-LLM's input names)."""
        body = {"input_ids": self.prompt_ids, "input_lengths": [len(self.prompt_ids)],
                # max_tokens 0 (echo): one token is generated for the prompt's logits and dropped
                "request_output_len": [max(1, self.max_tokens)], "streaming": [True],
                "end_id": [-1 if self.ignore_eos else end_id], "min_tokens": [self.min_tokens],
                # the end token counted and scored as vLLM does (usage, logprobs; lm-eval's loglikelihood reads
                # the generated token's log prob): the engine leaves it out by default, as TensorRT-LLM
                "return_end_token": [True]}
        greedy = self.temperature < GREEDY_BELOW or self.top_p == 0
        if greedy:
            # OpenAI's temperature 0 is greedy, and so is its top_p 0 (the smallest nucleus: the top token);
            # TensorRT-LLM says so with top_k 1 (its own top_p 0 means "off": mapped, it sampled everything)
            body["runtime_top_k"] = [1]
        else:
            # TensorRT-LLM's top_p 0 means off (greedy with top_k 0): OpenAI's default top_p is 1
            body.update(temperature=[self.temperature], runtime_top_k=[self.top_k],
                        runtime_top_p=[self.top_p if self.top_p > 0 else 1.0])
        if self.seed is not None:
            body["seed"] = [self.seed]
        elif not greedy:
            # no seed: a fresh sample each request (OpenAI's seed is the opt-in to repeatable sampling, vLLM's
            # default is random); the engine's own default, seed 0 as TensorRT-LLM's, gave every request the
            # same sample
            body["seed"] = [secrets.randbits(63)]
        if self.repetition_penalty != 1.0:
            body["repetition_penalty"] = [self.repetition_penalty]
        if self.logprobs is not None:
            # the raw logits give both the chosen token's log prob and its alternatives, from one array
            # (lm-eval's is_greedy compares them for equality)
            body["return_generation_logits"] = [True]
        if self.prompt_logprobs:
            # the prompt's logits: the engine then computes the whole prompt (no cached prefix)
            body["return_context_logits"] = [True]
        return body


def _number(body: dict, name: str, default, lo=None, hi=None, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    # NaN and infinity parse as JSON numbers in Python and would pass the range checks below
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        raise APIError(f"'{name}' must be {'an integer' if integer else 'a finite number'}, got {value!r}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise APIError(f"'{name}' must lie in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}", name)
    return value


def _refuse(body: dict, name: str, neutral=(None,), why: str = "is not supported") -> None:
    if name in body and body[name] not in neutral:
        raise APIError(f"'{name}' = {body[name]!r} {why}", name)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 16:
        raise APIError("'stop' must be a string or a list of at most 16 strings", "stop")
    return [s for s in stop if s]


def common_fields(body: dict, chat: bool) -> dict:
    """The sampling fields both endpoints share, validated; refuses what the engine cannot do."""
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object", None)
    _refuse(body, "n", (None, 1), "is not supported: only n = 1")
    _refuse(body, "best_of", (None, 1), "is not supported: only best_of = 1")
    if chat:
        _refuse(body, "echo", (None, False), "is not supported on chat completions")
    logprobs, echo = _logprobs(body, chat), body.get("echo", False) is True
    if body.get("echo") not in (None, False, True):
        raise APIError(f"'echo' must be a boolean, got {body['echo']!r}", "echo")
    _refuse(body, "suffix", (None, ""), "is not supported")
    _refuse(body, "logit_bias", (None, {}), "is not supported")
    _refuse(body, "presence_penalty", (None, 0, 0.0), "is not supported (only 0)")
    _refuse(body, "frequency_penalty", (None, 0, 0.0), "is not supported (only 0)")
    _refuse(body, "tools", (None, []), "is not supported")
    # vLLM's sampling extensions that change the output: served (repetition_penalty) or refused, never ignored
    _refuse(body, "min_p", (None, 0, 0.0), "is not supported (only 0)")
    _refuse(body, "stop_token_ids", (None, []), "is not supported")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise APIError(f"'response_format' = {fmt!r} is not supported (only {{'type': 'text'}})", "response_format")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise APIError(f"'stream' must be a boolean, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError("'stream_options' must be an object", "stream_options")
    # vLLM takes any int64; the engine's seed is a uint64: a negative one wraps, as C's cast would
    seed = _number(body, "seed", None, -(2**63), 2**64 - 1, integer=True)
    seed = None if seed is None else seed % 2**64
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise APIError(f"'ignore_eos' must be a boolean, got {ignore_eos!r}", "ignore_eos")
    return {"stream": bool(stream), "include_usage": bool(options.get("include_usage")), "echo": echo,
            "sampling": {"temperature": float(_number(body, "temperature", 1.0, 0, 2)),
                         "top_p": float(_number(body, "top_p", 1.0, 0, 1)),
                         # -1 and 0 both mean every token (vLLM's and TensorRT-LLM's "off")
                         "top_k": max(0, _number(body, "top_k", 0, -1, None, integer=True) or 0),
                         "min_tokens": _number(body, "min_tokens", 0, 0, None, integer=True),
                         "seed": seed, "ignore_eos": ignore_eos, "stop": _stop(body),
                         "repetition_penalty": float(_number(body, "repetition_penalty", 1.0, 1e-6, 100)),
                         "logprobs": logprobs, "prompt_logprobs": echo and logprobs is not None}}


def _logprobs(body: dict, chat: bool) -> int | None:
    """The top-N count when log probs are asked for, else None. Completions: logprobs = N (0: only the
    chosen token's); chat: logprobs = true with top_logprobs = N."""
    if chat:
        top = _number(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
        flag = body.get("logprobs")
        if flag not in (None, False, True):
            raise APIError(f"'logprobs' must be a boolean on chat completions, got {flag!r}", "logprobs")
        if top and not flag:
            raise APIError("'top_logprobs' needs 'logprobs' = true", "top_logprobs")
        return (top or 0) if flag else None
    if body.get("logprobs") is False:
        return None
    return _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)


def max_tokens(body: dict, prompt_len: int, max_context: int, default: int | None, echo: bool = False) -> int:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    room = max_context - prompt_len
    if room < 1:
        raise APIError(f"the prompt has {prompt_len} tokens; this model's context is {max_context} tokens",
                       "messages" if "messages" in body else "prompt", code="context_length_exceeded")
    # echo with max_tokens 0 scores the prompt alone (OpenAI's and vLLM's completions allow it)
    value = _number(body, name, None, 0 if echo else 1, None, integer=True)
    if value is None:
        return min(room, default) if default else room
    if value > room:
        raise APIError(f"'{name}' = {value} with a prompt of {prompt_len} tokens exceeds this model's context "
                       f"of {max_context} tokens", name, code="context_length_exceeded")
    return value


def prompts(body: dict, tok) -> list[list[int]]:
    """/v1/completions' prompt as token-id lists: a string is encoded with the tokenizer's special tokens
    (BOS), as the ensemble's preprocessing does; token ids are taken as they are."""
    p = body.get("prompt")
    if isinstance(p, str):
        return [tok.encode(p)]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return [tok.encode(x) for x in p]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [_ids(p, tok)]
        if all(isinstance(x, list) and x for x in p):
            return [_ids(x, tok) for x in p]
    raise APIError("'prompt' must be a string, a list of strings, a list of token ids or a list of token-id "
                   "lists (not empty)", "prompt")


def _ids(ids: list, tok) -> list[int]:
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < tok.vocab_size for i in ids):
        raise APIError(f"'prompt': token ids must be integers in [0, {tok.vocab_size})", "prompt")
    return list(ids)
