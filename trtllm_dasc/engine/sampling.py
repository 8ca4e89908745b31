"""Token sampling: greedy, or seeded temperature / top-k / top-p, after TensorRT-LLM's logits processing
(embedding bias, temperature, repetition / presence / frequency penalties, bans), with the sampled token's
log probability.

Sampling is stateless: the draw of output token i of a request uses a generator seeded from (seed, i), so
a request's tokens depend on neither the batch it ran in nor on which process samples it (TP ranks, a
restarted worker), and a sampling decision is plain data in a StepPlan.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trtllm_dasc.errors import UserError

U64 = 1 << 64


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0      # 0: greedy
    top_k: int = 0                # 0: no top-k cut (1: greedy)
    top_p: float = 1.0            # 1: no nucleus cut
    seed: int | None = None       # None: 0
    # TensorRT-LLM's penalties (neutral 1 / 0 / 0), over the prompt's and the output's tokens
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # embedding_bias as its non-zero entries ((token id, value), ...): plain data a plan carries to every
    # rank, and a few entries for the usual sparse bias instead of a vocabulary-sized row per step
    embedding_bias: tuple = ()
    # the length of the row the client sent (Triton's embedding_bias [batch, vocab]): TensorRT-LLM requires the
    # model's vocabulary size, and a row of another tokenizer would bias the wrong ids; None: given as pairs
    embedding_bias_width: int | None = None

    def __post_init__(self):
        self.temperature = _real("temperature", self.temperature)
        if not self.temperature >= 0.0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0, got {self.top_k}")
        self.top_p = _real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < U64:
                raise UserError(f"seed must lie in [0, 2**64), got {self.seed}")
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if not self.repetition_penalty > 0.0:
            raise UserError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        self.presence_penalty = _real("presence_penalty", self.presence_penalty)
        self.frequency_penalty = _real("frequency_penalty", self.frequency_penalty)
        if not isinstance(self.embedding_bias, (tuple, list)):
            raise UserError(f"embedding_bias must be (token id, value) pairs, got {type(self.embedding_bias).__name__}")
        try:
            self.embedding_bias = tuple((_integer("embedding_bias token", t), _real("embedding_bias", v))
                                        for t, v in self.embedding_bias)
        except (TypeError, ValueError):
            raise UserError("embedding_bias must be (token id, value) pairs") from None
        if self.embedding_bias_width is not None:
            self.embedding_bias_width = _integer("embedding_bias_width", self.embedding_bias_width)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether the penalties need the token counts of the text so far."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def processed(self) -> bool:
        """Whether the logits change before sampling (the argmax may move)."""
        return self.penalized or bool(self.embedding_bias)


def _integer(name: str, value) -> int:
    """An int (numpy/torch integer scalars accepted; bools and floats refused)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise UserError(f"{name} must be an integer, got {value!r}")
    return int(value.__index__())


def _real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise UserError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise UserError(f"{name} must be finite, got {value!r}")
    return out


def draw_seed(seed: int | None, token_index: int) -> int:
    """A 63-bit generator seed from (request seed, output index): splitmix64 of their combination."""
    z = ((seed or 0) + 0x9E3779B97F4A7C15 * (token_index + 1)) % U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % U64
    return (z ^ (z >> 31)) >> 1


def draw_uniform(seed: int | None, token_index: int) -> float:
    """The one uniform number in [0, 1) that decides output token token_index of a request: drawn on the
    host from (seed, index) alone, so every device and every TP rank picks the same token from the same
    distribution."""
    gen = torch.Generator().manual_seed(draw_seed(seed, token_index))
    return float(torch.rand(1, generator=gen, dtype=torch.float64))


def process_logits(logits: torch.Tensor, params: SamplingParams, history=(), banned=()) -> torch.Tensor:
    """The fp32 logits [vocab] a token is sampled from, as TensorRT-LLM's penalty kernel makes them
    (kernels/penaltyKernels.cu): + embedding_bias, / temperature (when > 0: greedy's 0 scales nothing), then
    for each token occurring n > 0 times in ``history`` (prompt and output so far): repetition (x < 0 ?
    x * r : x / r), - presence, - frequency * n; then the banned ids (bad words, end_id before min_tokens)
    at -inf. Runs where the logits are."""
    x = logits.float().clone()
    if params.embedding_bias:
        ids = torch.tensor([t for t, _ in params.embedding_bias], device=x.device)
        x.index_add_(0, ids, torch.tensor([v for _, v in params.embedding_bias], device=x.device))
    if params.temperature > 0.0 and params.temperature != 1.0:
        x = x / params.temperature
    if params.penalized and len(history):
        h = torch.as_tensor(list(history), dtype=torch.long)
        # prompt ids outside the vocabulary (embedded as zeros, EngineConfig.out_of_vocab_inputs) have no logit
        # to penalise; a count of 2^31 bins would be 16 GB
        h = h[(h >= 0) & (h < x.numel())].to(x.device)
        counts = torch.bincount(h, minlength=x.numel())[:x.numel()]
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            r = params.repetition_penalty
            x = torch.where(seen, torch.where(x < 0, x * r, x / r), x)
        if params.presence_penalty != 0.0:
            x = x - params.presence_penalty * seen
        if params.frequency_penalty != 0.0:
            x = x - params.frequency_penalty * counts
    if len(banned):
        x[list(banned)] = float("-inf")
    return _overflowed_share(x)


def _overflowed_share(x: torch.Tensor) -> torch.Tensor:
    """Processed logits where fp32 overflowed (a tiny temperature, a huge bias or penalty): one +inf makes the
    softmax NaN everywhere (the inverse CDF then picked the last id). The tokens at +inf share the mass, the
    rest get none: the distribution's limit as their logits grow. Unchanged when nothing overflowed; no host
    synchronisation."""
    inf = torch.isposinf(x)
    return torch.where(inf.any(), torch.where(inf, 0.0, float("-inf")), x)


def sample(logits: torch.Tensor, params: SamplingParams, token_index: int, scaled: bool = False) -> int:
    """The next token from one position's logits [vocab], computed where the logits are (a 151,936 or
    163,840-entry row never crosses to the host: only the chosen id does).

    temperature scales the logits; top-k keeps the k largest (ties at the k-th kept); softmax; the tokens
    are ranked by probability (ties by id) and top-p keeps the smallest prefix whose mass reaches top_p;
    the token is the first in that order whose cumulative mass exceeds u x the kept mass (inverse CDF), u
    = draw_uniform(seed, token_index). ``scaled``: the logits come from process_logits (already divided by
    the temperature)."""
    if params.greedy:
        return int(torch.argmax(logits))
    x = logits.float()
    if not scaled:
        # less their max first: the same distribution (softmax ignores a shift), and never past fp32's range,
        # however small the temperature (1e-40 overflowed: the limit, the argmax, is what comes out)
        x = (x - x.max()) / params.temperature
    if params.top_k and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    ranked, order = torch.sort(probs, descending=True, stable=True)
    # the running sums in fp64: 150k fp32 terms would carry ~1e-5 of rounding into every boundary; and
    # renormalised there: the fp32 softmax sums to 1 - O(1e-6) (its exp's last bits differ between CPU
    # kinds), which would move the top-p cut by that much
    ranked = ranked.double()
    ranked = ranked / ranked.sum()
    if params.top_p < 1.0:
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        ranked = ranked.masked_fill(torch.cumsum(ranked, 0) - ranked >= params.top_p, 0.0)
    cdf = torch.cumsum(ranked, 0)
    target = (cdf[-1] * draw_uniform(params.seed, token_index)).reshape(1)
    # the first rank whose cumulative mass exceeds the target has a probability > 0
    pos = torch.searchsorted(cdf, target, right=True).clamp_max(cdf.numel() - 1)
    # no distribution at all (NaN logits, or every token at -inf): -1, read with the token in one transfer
    token = int(torch.where(cdf[-1] > 0, order[pos], -1))
    if token < 0:
        raise ValueError("the processed logits give no distribution to sample (NaN, or every token at -inf)")
    return token
