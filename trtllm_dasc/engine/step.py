"""StepPlan and StepOutput: what rank 0's scheduler decides for one step, and what executing it gives.

Plain data only (ints, lists, small dataclasses; no callables, no tensors but the optional CPU logits of
the output), so a plan pickles and every TP rank can execute the same decision: ``ModelRunner.execute``
is the one thing every rank runs. Order of execution: demotions -> promotions (the host tier) -> resets ->
kv_copies -> loads -> warm_loads -> forward (replay spans first, then the replay merge, then the rest) ->
stores of the captures -> sampling.

Replay (dasc-wr, paper Sec. 4.2): a hit loads its checkpoint into the request's row and re-runs the last W
cached tokens (the replay window) from a scratch row (zero; wr-warm: the checkpoint's retained units); in
every linear layer the units the checkpoint omitted are then copied from the scratch row into the
request's row (the replay merge). A replay is a span like any other, on the scratch row, that names the
row it merges into (``replay_into``): nothing pairs a replay with its request by list position.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_dasc.engine.sampling import SamplingParams


@dataclass(slots=True)
class Span:
    """One sequence's tokens in this step's forward: positions [start, start + len(token_ids)) of the
    sequence whose state lives in ``row`` and whose KV lives in ``block_table``."""

    token_ids: list[int]
    row: int
    start: int
    block_table: list[int]
    captures: list[tuple[int, int]] = field(default_factory=list)  # (prefix length, checkpoint slot)
    logits: str = "none"                  # none | last | all (all: context logits returned to the caller)
    sampling: SamplingParams | None = None   # sample the next token from the last position
    token_index: int = 0                  # which output token the sample is (seeds the draw)
    banned: list[int] = field(default_factory=list)   # token ids the sample must not take (bad words, end_id)
    # the prompt's and output's tokens so far, only when the sampling's penalties count them
    history: list[int] = field(default_factory=list)
    log_prob: bool = False                # return the sampled token's log probability
    raw_logits: bool = False              # return the last position's raw logits (generation logits)
    # a replay: this span runs on a scratch row (``row``), and after it, in every linear layer, the units
    # the checkpoint omitted are copied from that row into row ``replay_into`` (the request's). Replay
    # spans come first in a plan (they must run before the spans that continue from the merged rows)
    replay_into: int | None = None

    def in_prompt(self, prompt_len: int) -> bool:
        """Whether this span runs prompt tokens (a prefill chunk or a replay) rather than a decode past it."""
        return self.start < prompt_len


@dataclass(slots=True)
class StepPlan:
    step: int
    spans: list[Span]
    resets: list[int] = field(default_factory=list)                # rows zeroed first (fresh requests, scratch)
    kv_copies: list[tuple[int, int]] = field(default_factory=list)  # (src block, dst block)
    loads: list[tuple[int, int]] = field(default_factory=list)      # (slot, row): omitted units zero-filled
    warm_loads: list[tuple[int, int]] = field(default_factory=list)  # (slot, scratch row): wr-warm's start state
    # the host tier's checkpoint copies, run before everything else (demotions first): (device slot, host
    # slot) written back on eviction, and (host slot, device slot) promoted for this step's loads
    demotions: list[tuple[int, int]] = field(default_factory=list)
    promotions: list[tuple[int, int]] = field(default_factory=list)
    # host KV's block copies, in the order queued (before the kv_copies): ("demote", device block, host
    # block) for a prefix evicted to the host, ("promote", host block, device block) for one warmed back
    kv_tier_copies: list[tuple[str, int, int]] = field(default_factory=list)

    def copy_kind(self, i: int) -> str:
        """The i-th copy's kind, as the failed-copy counter labels it (telemetry.tier_copy_failures)."""
        nd, npr = len(self.demotions), len(self.promotions)
        if i < nd + npr:
            return "checkpoint_demotion" if i < nd else "checkpoint_promotion"
        return "kv_demotion" if self.kv_tier_copies[i - nd - npr][0] == "demote" else "kv_warm_back"

    def copy_name(self, i: int) -> str:
        """The i-th copy between the tiers (demotions, promotions, then kv_tier_copies), in words."""
        nd, npr = len(self.demotions), len(self.promotions)
        if i < nd:
            return "checkpoint demotion, device slot %d -> host slot %d" % self.demotions[i]
        if i < nd + npr:
            return "checkpoint promotion, host slot %d -> device slot %d" % self.promotions[i - nd]
        kind, a, b = self.kv_tier_copies[i - nd - npr]
        return (f"KV demotion, device block {a} -> host block {b}" if kind == "demote"
                else f"KV warm-back, host block {a} -> device block {b}")

    @property
    def replays(self) -> list[Span]:
        """The plan's replay spans (those with replay_into), in plan order."""
        return [s for s in self.spans if s.replay_into is not None]


@dataclass(slots=True)
class StepOutput:
    """Per span of the plan: the sampled token (None: no sample or failed), an error message (None: fine),
    the returned logits (CPU fp32 [T, vocab] for spans with logits 'all'); per capture of the plan in
    order, whether its checkpoint was stored (a non-finite state is not); per copy between the tiers (the
    plan's demotions, promotions, then kv_tier_copies), None or why it failed, on any rank (empty when
    none failed: the scheduler fails the requests that read what a failed copy was to write)."""

    tokens: list[int | None]
    errors: list[str | None]
    logits: list = field(default_factory=list)
    stored: list[bool] = field(default_factory=list)
    log_probs: list = field(default_factory=list)      # per span: the sampled token's log prob or None
    gen_logits: list = field(default_factory=list)     # per span: CPU fp32 [vocab] raw logits or None
    copy_errors: list = field(default_factory=list)
