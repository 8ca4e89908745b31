"""Warm-up: before an engine reports ready, run a synthetic workload that takes every code path its arm
will take, so Triton's JIT compiles and fla's autotuning happen here and not inside users' first requests
(on the H200 an unwarmed process ran its first prefix-reuse pass 2-3x slower in the dasc arms).

Triton compiles a kernel variant per specialisation of its integer arguments (equal to 1, divisible by
16, neither), so the shapes must vary the way real traffic does. For each batch size b in max_batch, ...,
4, 2, 1 (largest first, see below), two rounds run with b requests in the same steps (a lone request: three
times, on the 16-token grid, off it, and once as a prefill step in the lower autotune bucket of fla's norms:
round_lengths):
  cold   b distinct long prompts (lengths both on and off the 16-token grid): a batched chunked prefill
         with checkpoint captures and stores at batch b, then decode at batch b;
  hits   b prompts extending the cold ones by 1 + {15, 4, 31, 0, ...} tokens: checkpoint loads at batch
         b (wr: replays + replay merge), short prefills of both kinds of lengths with stores, decode at batch b.
One request per round samples (temperature, top-k, top-p). Then batches of 1, 3 and 16 short prompts whose
captures each replay a single token (one_token_capture_prompts), and the cache is flushed and the counters reset.

Prompt lengths (prompt_lengths): the first LONG_PER_ROUND prompts of the first round (the largest batch)
and of the last (one request) are the longest, two
prefill chunks and a few tokens (two requests' chunked prefills share steps, the second chunk runs at a start
offset of a full chunk, a chunk holds up to prefill_chunk / interval checkpoint captures, hits load them
from that deep), capped by max_context and, halved until it fits, by the KV cache. Users' prompts that long
are ordinary (the H200's first pass of 2.3-3k-token prompts ran 21x slower than its second while warm-up
stopped at 517 tokens: 2 x interval + 5, the old cap). The other prompts of a round keep the short lengths
(2 x interval + 5, at most 4096): the batch shapes, at a cost that does not grow with the context.
"""
from __future__ import annotations

import random
import time

from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.model.fused_ops import PINNED_ROWS
from trtllm_dasc.model.recurrence.fla import CHUNK

TAILS = (15, 4, 31, 0, 63, 9, 16, 2)
DECODE = 3
LONG_PER_ROUND = 2                  # at most 2 (_long_lengths)
SHORT_LONE = 5                      # a lone prompt this short decodes over a single key split (round_lengths)


# batch sizes of the one-token capture round (one_token_capture_prompts): Triton's three classes of an integer
# argument, equal to 1, neither, divisible by 16
ONE_TOKEN_CAPTURES = (1, 3, 16)


def one_token_capture_prompts(cfg, rng, vocab: int) -> list[list[list[int]]]:
    """Batches of cold prompts whose every capture is replayed from a chunk start as a single token.
    A step's checkpoint captures come from fla's chunk states (model/recurrence run_recurrence,
    _from_chunk_states): a capture p tokens into a sequence, p off the CHUNK grid, replays the p % CHUNK tokens
    after the chunk start below it, all of a step's such replays in one varlen call; when each is one token
    long that call has as many tokens as sequences, and the backend takes fla's recurrent kernel for it
    (recurrence/fla.py _call), a kernel whose batch size N Triton specialises (1, divisible by 16, neither).
    Warm-up's other prompts met it only by chance, and 12-06's 48B dense server compiled that kernel inside
    requests 20 minutes into the matched-HBM cells (0.43 s, N neither 1 nor a multiple of 16). A prompt of
    CHUNK + 2 tokens is captured at its last token but one (the prompt end's checkpoint, CHUNK + 1 tokens in).
    Where the round cannot reach a class it costs a few short prefills and says nothing: an interval under
    CHUNK + 1 that does not divide CHUNK adds captures whose replays are longer (one dividing CHUNK captures on
    chunk starts, no replay); the batch of 16 needs max_batch >= 16, room for 16 captures in one step
    (max_step_captures) and free checkpoint slots and KV blocks for 16 short prompts."""
    length = CHUNK + 2
    if length + DECODE + 1 > cfg.max_context:
        return []
    # distinct first tokens, and (the caller) an empty cache: no prompt shares a prefix with another, so none is
    # also captured at a branch point, which would add replays of other lengths (or more one-token ones) to the step
    batches = []
    for n in ONE_TOKEN_CAPTURES:
        if n <= min(cfg.max_batch, vocab):
            firsts = rng.sample(range(vocab), n)
            batches.append([[first] + [rng.randrange(vocab) for _ in range(length - 1)] for first in firsts])
    return batches


def batch_buckets(max_batch: int) -> list[int]:
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return out + [max_batch]


def _lengths(longest: int, b: int) -> list[int]:
    """b prompt lengths <= longest, alternating a multiple of 16 and an odd length."""
    out = []
    for i in range(b):
        n = max(1, longest - 37 * i)
        out.append(max(1, n - n % 16) if i % 2 == 0 else n | 1)
    return [min(n, longest) for n in out]


def _long_lengths(longest: int, n: int) -> list[int]:
    """n <= 2 long prompt lengths: longest on the 16-token grid, then longest made odd (both past two chunks
    when longest is two chunks + 5)."""
    return [max(1, longest - longest % 16), max(1, longest - (1 - longest % 2))][:n]


def _lone_low_bucket(longest: int) -> int:
    """A lone prompt whose prefill steps are in the lower of the pinned autotune buckets of fla's row-tiled
    norms (model/fused_ops.PINNED_ROWS: at most 2,048 rows) and past the paged attention path's
    PAGED_MAX_TOKENS (the path that skips the latent's norm), off the 16-token grid: 2,047 tokens, or the
    longest prompt where that is shorter."""
    return max(1, min(longest, PINNED_ROWS - 1))


def round_lengths(b: int, buckets: list[int], longest: int, short: int) -> list[list[int]]:
    """The cold prompts' lengths of each round at batch size b. The largest batch holds the long prompts beside
    its others; the batches between keep to the short ones. A lone request (b = 1) runs alone in each of its
    rounds: on the 16-token grid, off it, and one prompt of at most PINNED_ROWS tokens (_lone_low_bucket): a
    batch of one has a single length a step, and Triton specialises on each integer argument (1, divisible
    by 16, neither), so each class needs a round of its own. The last one is what the H200 lacked: where the
    checkpoint interval is long (the matched-HBM engines: 2,801 tokens in a 2,816-token context), the short
    prompts are as long as the long ones (prompt_lengths), so no unpaged prefill step of warm-up had 2,048
    rows or fewer, and fla autotuned MLA's latent norm for that bucket (nine configs compiled, 24 s) inside
    a user's request: the last request of the first replay, a lone 2,466-token miss (the part of it left
    after the step it shared), took 27.1 s instead of 2 s on both cold machines of 12-04. The kernel caches
    those calls returned date nine layer_norm_fwd_kernel compiles and its autotune record (key D = 512,
    NB = 1) inside that replay, and no other compile after warm-up."""
    if b == 1:
        # and a short one: its decode reads fewer keys than one split of the paged decode kernel holds, the
        # SPLITS = 1 variant (kernels/decode_attention.py), which a lone 1- or 17-token request compiled inside
        # itself on the H200 (tests/engine/test_late_compiles_gpu.py, 12-05) while every warm-up decode was long
        lone = _long_lengths(longest, LONG_PER_ROUND) + [_lone_low_bucket(longest), min(longest, SHORT_LONE)]
        return [[n] for n in dict.fromkeys(lone)]
    n_long = min(b, LONG_PER_ROUND) if b == buckets[-1] else 0
    return [_long_lengths(longest, n_long) + _lengths(short, b)[n_long:]]


def prompt_lengths(cfg, worst_case_blocks) -> tuple[int, int]:
    """(longest, short): the cold prompts' lengths before the per-prompt offsets of _lengths (see the
    module's docstring). worst_case_blocks(prompt_len, max_new): the scheduler's count of a request's KV
    blocks."""
    # room for the longest tail and the decode after the cold prompt, in the context and in the KV cache
    room = cfg.max_context - max(TAILS) - 1 - DECODE
    longest = max(1, min(room, 2 * cfg.prefill_chunk + 5))
    while longest > 1 and worst_case_blocks(longest + 1 + max(TAILS), DECODE) > cfg.num_kv_blocks:
        longest //= 2
    return longest, max(1, min(longest, 2 * cfg.interval + 5, 4096))


def warmup(engine) -> dict:
    cfg, t0 = engine.cfg, time.perf_counter()
    rng = random.Random(0)
    vocab = engine.vocab_size
    longest, short = prompt_lengths(cfg, engine.scheduler.worst_case_blocks)
    requests = 0
    # largest batch first: fla autotunes a kernel once, on its first call, with a key that ignores the
    # token count, so that first call should look like full-batch traffic rather than a lone request
    buckets = batch_buckets(cfg.max_batch)
    for b in reversed(buckets):
        for r, lengths in enumerate(round_lengths(b, buckets, longest, short)):
            cold = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
            hits = [p + [rng.randrange(vocab) for _ in range(1 + TAILS[i % len(TAILS)])] for i, p in enumerate(cold)]
            for name, prompts in (("cold", cold), ("hit", hits)):
                batch = [GenerationRequest(("warmup", b, r, name, i), p, DECODE,
                                           SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=i)
                                           if i == 0 else SamplingParams())
                         for i, p in enumerate(prompts)]
                engine.generate(batch)
                requests += len(batch)
    for i, prompts in enumerate(one_token_capture_prompts(cfg, rng, vocab)):
        engine.flush()
        engine.generate([GenerationRequest(("warmup", "one-token captures", i, j), p, DECODE, SamplingParams())
                         for j, p in enumerate(prompts)])
        requests += len(prompts)
    # the decode buckets the traffic above did not reach: their CUDA graphs, before the first user's step
    engine.runner.capture_graphs()
    engine.flush()
    engine.reset_stats()
    engine.ready = True
    return {"seconds": time.perf_counter() - t0, "requests": requests, "longest_prompt": longest,
            "short_prompt": short, "batch_sizes": batch_buckets(cfg.max_batch)}
