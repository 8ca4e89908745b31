"""A generation request, validated before it touches the cache (a bad one allocates nothing)."""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.errors import UserError


@dataclass(slots=True)
class RequestStats:
    """What the serving layer reports per request (cached_tokens feeds the client's hit rate)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0          # C_i: prompt tokens served from a checkpoint (paper Eq. 9)
    checkpoint_loaded: bool = False
    replayed_tokens: int = 0        # dasc-wr suffix replay (extra compute, not counted as new tokens)
    checkpoints_stored: int = 0
    output_tokens: int = 0


@dataclass(slots=True)
class GenerationRequest:
    request_id: object
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    stats: RequestStats = field(default_factory=RequestStats)

    def validate(self, vocab_size: int, max_context: int) -> None:
        """Raise UserError naming the field; called before any allocation."""
        if not isinstance(self.prompt, (list, tuple)) or len(self.prompt) == 0:
            raise UserError("input_ids: the prompt is empty")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens <= 0:
            raise UserError(f"request_output_len must be a positive integer, got {self.max_new_tokens!r}")
        bad = [t for t in self.prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise UserError(f"input_ids: token id {bad[0]!r} is outside the vocabulary [0, {vocab_size})")
        if len(self.prompt) + self.max_new_tokens > max_context:
            raise UserError(f"input_ids: prompt of {len(self.prompt)} tokens + request_output_len "
                            f"{self.max_new_tokens} exceeds the max context of {max_context} tokens")
        self.stats.prompt_tokens = len(self.prompt)
