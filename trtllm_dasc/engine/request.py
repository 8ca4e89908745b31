"""A generation request, validated before it touches the cache (a bad one allocates nothing), and what the
engine reports back for it."""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.engine.sampling import SamplingParams, _integer
from trtllm_dasc.errors import UserError

INT32_LIMIT = 1 << 31   # TensorRT-LLM's token ids are INT32

FINISH_REASONS = ("length", "stop", "cancelled", "error")


@dataclass(slots=True)
class RequestStats:
    """What the serving layer reports per request (cached_tokens feeds the client's hit rate)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0          # C_i: prompt tokens served from a checkpoint (paper Eq. 9)
    checkpoint_loaded: bool = False
    replayed_tokens: int = 0        # dasc-wr suffix replay (extra compute, not counted as new tokens)
    checkpoints_stored: int = 0
    output_tokens: int = 0
    # KV blocks (TensorRT-LLM's perf metrics): reused from the cache, newly allocated, the whole table
    kv_reused_blocks: int = 0
    kv_new_blocks: int = 0
    kv_total_blocks: int = 0
    kv_matched_tokens: int = 0      # prompt tokens whose KV the cache held at admission (the shared prefix)
    # wall-clock ns (time.time_ns, comparable with a client on the same host)
    arrival_time_ns: int = 0
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0


@dataclass(slots=True)
class RequestOutput:
    """One callback event: new tokens (streaming: only those since the last event), and on the final event
    ``finished`` with a reason; ``error`` names what went wrong for reason 'error'."""

    request_id: object
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    stats: RequestStats | None = None
    context_logits: object = None   # fp32 [prompt tokens computed, vocab] when the request asked for them
                                    # (positions cached_tokens .. len(prompt) - 1)
    # return_log_probs: per token of this event, log-softmax of the sampled token under the logits it was
    # sampled from (after bias, temperature, penalties and bans; before the top-k / top-p cut: TensorRT-LLM's
    # unnormalized log probs), and their running sum over the request's output so far
    log_probs: list | None = None
    cum_log_prob: float | None = None
    generation_logits: object = None   # fp32 [tokens of this event, vocab]: the model's raw logits


@dataclass(slots=True)
class GenerationRequest:
    request_id: object
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    return_context_logits: bool = False
    return_log_probs: bool = False
    return_generation_logits: bool = False
    # False: reuse nothing from the prefix cache (the context logits then cover the whole prompt; with a
    # hit they cover only the positions computed, [cached_tokens, len(prompt)))
    use_cache: bool = True
    min_tokens: int = 0             # end_id is not sampled before this many output tokens
    # the end token as the last output token (with its log prob and logits); False: left out, TensorRT-LLM's rule
    include_end_token: bool = False
    stop_words: list = field(default_factory=list)   # token sequences ending the output (reason 'stop')
    bad_words: list = field(default_factory=list)    # token sequences never completed by a sampled token
    stats: RequestStats = field(default_factory=RequestStats)

    def validate(self, vocab_size: int, max_context: int, out_of_vocab_inputs: str = "refuse") -> None:
        """Raise UserError naming the field; called before any allocation. Normalises numpy/torch ints and
        sequences to Python ints and lists. out_of_vocab_inputs (EngineConfig's): "refuse" a prompt id outside
        [0, vocab_size), or "zero": keep it (the model embeds it as zeros, as TensorRT-LLM does) if it is a
        32-bit id (TensorRT-LLM's input_ids are INT32; the penalties, the cache and the echo take it as is)."""
        if self.request_id is None or isinstance(self.request_id, bool) or not _hashable(self.request_id):
            raise UserError(f"request_id must be a string, an integer or a tuple of them, got {self.request_id!r}")
        self.prompt = _token_list(self.prompt)
        if not self.prompt:
            raise UserError("input_ids: the prompt is empty")
        self.max_new_tokens = _integer("request_output_len", self.max_new_tokens)
        if self.max_new_tokens <= 0:
            raise UserError(f"request_output_len must be a positive integer, got {self.max_new_tokens!r}")
        if out_of_vocab_inputs == "zero":
            bad = next((t for t in self.prompt if not -INT32_LIMIT <= t < INT32_LIMIT), None)
            if bad is not None:
                raise UserError(f"input_ids: token id {bad} is not a 32-bit integer")
        else:
            bad = next((t for t in self.prompt if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise UserError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size})")
        if len(self.prompt) + self.max_new_tokens > max_context:
            raise UserError(f"input_ids: prompt of {len(self.prompt)} tokens + request_output_len "
                            f"{self.max_new_tokens} exceeds the max context of {max_context} tokens")
        if self.end_id is not None:
            self.end_id = _integer("end_id", self.end_id)
            if not 0 <= self.end_id < vocab_size:
                raise UserError(f"end_id {self.end_id} is outside the vocabulary [0, {vocab_size})")
        if not isinstance(self.sampling, SamplingParams):
            raise UserError(f"sampling must be SamplingParams, got {type(self.sampling).__name__}")
        self.min_tokens = _integer("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise UserError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for name in ("stop_words", "bad_words"):
            words = getattr(self, name)
            if not isinstance(words, (list, tuple)):
                raise UserError(f"{name} must be a list of token sequences, got {type(words).__name__}")
            words = [_token_list(w) for w in words]
            if any(not w for w in words):
                raise UserError(f"{name}: a word has no tokens")
            if any(not 0 <= t < vocab_size for w in words for t in w):
                raise UserError(f"{name}: a token id is outside the vocabulary [0, {vocab_size})")
            setattr(self, name, words)
        width = self.sampling.embedding_bias_width
        if width is not None and width != vocab_size:
            # TensorRT-LLM's check ("Expected last dimension to be same as vocab size")
            raise UserError(f"embedding_bias: a row of {width} entries, but the model's vocabulary has {vocab_size} "
                            f"(send [batch, {vocab_size}], or [batch, 0] for none)")
        bad = next((t for t, _ in self.sampling.embedding_bias if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise UserError(f"embedding_bias: token id {bad} is outside the vocabulary [0, {vocab_size})")
        for name in ("return_context_logits", "return_log_probs", "return_generation_logits", "use_cache"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be a bool, got {getattr(self, name)!r}")


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False


def _token_list(prompt) -> list[int]:
    """list/tuple/numpy array/torch tensor of integers -> list of Python ints."""
    if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):
        shape = getattr(prompt, "shape", None)
        if shape is not None and len(shape) != 1:
            raise UserError(f"input_ids must be one-dimensional, got shape {list(shape)}")
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        raise UserError(f"input_ids must be a sequence of token ids, got {type(prompt).__name__}")
    try:
        return [_integer("input_ids", t) for t in prompt]
    except UserError:
        bad = next(t for t in prompt if isinstance(t, bool) or not hasattr(t, "__index__"))
        raise UserError(f"input_ids: token id {bad!r} is not an integer") from None
