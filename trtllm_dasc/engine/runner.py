"""ModelRunner: the tensors of one arm (dense or dasc) on one TP rank, and ``execute(StepPlan)``.

  model        HybridModel (one TP rank)
  plan         DascPlan (W_max, codec, layout); dense is the plan with W_max = 0 and the native codec
  state        RecurrentState rows (one per running request, one more per dasc-wr replay in flight)
  kv           PagedKVCache for the full-attention layers (addressed by the plan's block tables)
  pool         CheckpointPool of compressed checkpoints, sized from the state budget by the planner's rule

It holds no bookkeeping: which row, block or slot is whose is decided by the scheduler (rank 0), and a
runner executes that decision: resets -> KV copies -> checkpoint loads -> forward (replays, replay merge,
the rest) -> checkpoint stores -> sampling. Every TP rank runs the same plans. The replay merge's tables
(per linear layer, the units this rank's checkpoints keep) are data the runner builds once from the plan
and hands to every forward; the model runs the merge itself.
"""
from __future__ import annotations

import json
import sys

import torch

from trtllm_dasc.engine.config import EngineConfig, replay_tokens
from trtllm_dasc.engine.kernel_cache import use_kernel_cache
from trtllm_dasc.engine.loading import check_memory, weight_source
from trtllm_dasc.engine.pools import checkpoint_pool
from trtllm_dasc.engine.sampling import process_logits, sample
from trtllm_dasc.engine.step import StepOutput, StepPlan
from trtllm_dasc.errors import UserError
from trtllm_dasc.checkpoint_files import dummy_marker
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model import ForwardOutput, HybridModel, SeqInput
from trtllm_dasc.model.prefill_flops import prefill_flops
from trtllm_dasc.model.workspace import largest_step
from trtllm_dasc.plan import PlanOptions, plan_from_path
from trtllm_dasc.spec import PLAN_TO_ENGINE, plan_fields
from trtllm_dasc.state import StateLayout
from trtllm_dasc.model.decode_graphs import capturable
from trtllm_dasc.plan import DascPlan
from trtllm_dasc.parallel.group import check_device
from trtllm_dasc.parallel.storage import exchanges
from trtllm_dasc.model.decode_graphs import DecodeGraphs
from trtllm_dasc.state.host_tier import HostTier, host_slots_for

DENSE_SLOTS_DEFAULT = 64


class ModelRunner:
    """``tp_rank``: this process's rank of ``cfg.tp_size``; ``all_reduce``: callable(tensor) -> summed tensor
    over the ranks (parallel.TPGroup.all_reduce), required when tp_size > 1; ``all_to_all``: the variable-split
    exchange (parallel.TPGroup.all_to_all), required when the plan's storage balancing moves units."""

    def __init__(self, cfg: EngineConfig, tp_rank: int = 0, all_reduce=None, all_to_all=None):
        self.cfg, self.tp_rank = cfg, tp_rank
        check_device(cfg.device)
        if not 0 <= tp_rank < cfg.tp_size:
            raise UserError(f"tp_rank {tp_rank} is outside 0..{cfg.tp_size - 1}")
        if cfg.tp_size > 1 and all_reduce is None:
            raise UserError("tp_size > 1 needs the ranks' all-reduce (run it through trtllm_dasc.parallel)")
        # before anything compiles (the loads below warm kernels), on every rank
        use_kernel_cache(cfg)
        # the plan first: its bundle order decides which heads this rank loads
        self.plan = engine_plan(cfg)
        model_cfg = HybridConfig.from_path(cfg.model, conv_dtype=cfg.dtype)
        source = weight_source(cfg, model_cfg, tp_rank, self.plan.bundle_order)
        dense = self.plan.config.dense_checkpoint_bytes_per_rank(cfg.tp_size)
        self.budget = (DENSE_SLOTS_DEFAULT + 1) * dense if cfg.state_budget_bytes is None else cfg.state_budget_bytes
        self.num_rows = 2 * cfg.max_batch
        self.replay_window = replay_window(cfg, self.plan.replay_window)
        # refused before a byte is loaded when it cannot fit (model/footprint.py)
        self.footprint = check_memory(cfg, model_cfg, source, tp_rank, self.plan.bundle_order, self.num_rows,
                                      self.budget, self.replay_window)
        self.model = HybridModel.from_source(model_cfg, source, dtype=cfg.dtype, device=cfg.device,
                                             backend=cfg.backend, tp_rank=tp_rank, tp_size=cfg.tp_size,
                                             bundle_order=self.plan.bundle_order)
        self.model.zero_out_of_vocab = cfg.out_of_vocab_inputs == "zero"
        self.dummy_weights = getattr(source, "dummy", False)
        # cuDNN's long-prefill attention graphs for the lengths a step can reach (model/attention.py), on
        # every rank (a TP worker runs its own runner) before the engine can report ready; nothing on a CPU
        # or when no step reaches CUDNN_MIN_TOKENS
        self.model.warm_long_prefill(min(cfg.prefill_chunk, cfg.max_context, cfg.max_num_tokens or cfg.max_context))
        # and the fused MoE kernels' tile configs for every step size up to the largest step (model.warm_moe):
        # uncapped, the running requests' chunks together, past max_context (a Qwen-80B engine of the default
        # 8 x 2048-token chunks in a 4,096 context met the 128-row tiles, from 6,554 tokens a step, unwarmed)
        self.model.warm_moe(largest_step(cfg, self.replay_window).tokens)
        self.model.all_reduce = all_reduce
        # plain, storage-balanced (the all-to-all) or one per codec segment (horizon precision)
        self.pool = checkpoint_pool(self.plan, self.budget, tp_rank, all_to_all, device=cfg.device)
        # the host tier: as many host slots on every rank (the bottleneck rank's slot bytes set the count)
        self.slot_bytes = self.plan.bottleneck_slot_bytes()
        self.num_host_slots = host_slots_for(cfg.host_cache_bytes, self.slot_bytes)
        self.host_tier = HostTier(self.pool, self.num_host_slots, cfg.device) if self.num_host_slots else None
        # cost-aware eviction's value of a checkpoint: the prefill FLOPs a hit saves (model/prefill_flops.py)
        flops = prefill_flops(self.model, cfg.tp_size)
        self.flops_per_token, self.flops_per_pair = flops.per_token, flops.per_pair
        # the storage all-to-all's report (exchange_report): a balanced pool of one codec has it; a mixed
        # precision pool's segments do not report yet
        self._exchanges = exchanges(self.plan) and hasattr(self.pool, "exchange_report")
        # CUDA graphs pad a decode batch up to its bucket into one state row and one KV block that the
        # scheduler never hands out (it knows num_rows rows and cfg.num_kv_blocks blocks)
        graphs = graphs_wanted(cfg, self.model)
        self.state = self.model.new_state(self.num_rows + int(graphs))
        self.kv = self.model.new_kv_cache(cfg.num_kv_blocks + int(graphs), cfg.block_size)
        self.graphs = None
        if graphs:
            self.graphs = DecodeGraphs(self.model, self.state, self.kv, cfg.max_batch,
                                       max_blocks=-(-cfg.max_context // cfg.block_size), pad_row=self.num_rows,
                                       pad_block=cfg.num_kv_blocks)
        # host KV: the KV cache's block tensors mirrored in host blocks, on the checkpoint tier's copy stream
        self.kv_tier = None
        if cfg.host_kv_blocks:
            self.kv_tier = HostTier(None, cfg.host_kv_blocks, cfg.device,
                                    stream=self.host_tier.stream if self.host_tier else None,
                                    tensors=[t for layer in self.kv.pools for t in layer])
        # the replay merge's tables: per linear layer, the local units this rank's checkpoints keep
        self.merge_tables = [self._one_layer_layout(kept) for kept in self.plan.local_retained(tp_rank)]

    # ---- the step -----------------------------------------------------------------------------------
    def execute(self, plan: StepPlan, sample_tokens: bool = True) -> StepOutput:
        """Run one step. Raises on a failure of the whole step (the scheduler fails its requests);
        per-span problems (non-finite logits, a failing sample) and failed tier copies come back as errors."""
        copy_errors, failed = self._tier_copies(plan)
        if plan.resets:
            self.state.reset(plan.resets)
        if self.kv_tier is not None and self.kv_tier.pending:
            # the step's KV reads and writes wait for the copies of the blocks they touch (a warmed block, a
            # block a demotion is still reading)
            self.kv_tier.wait_slots({b for s in plan.spans for b in s.block_table}
                                    | {b for pair in plan.kv_copies for b in pair})
        self.kv.copy_blocks(plan.kv_copies)
        # the loads read slots a promotion may still be writing (the demotions need no wait here)
        self._wait_slots([s for s, _ in plan.loads + plan.warm_loads])
        if plan.loads:
            self.pool.load([s for s, _ in plan.loads], self.state.temporal, self.state.conv,
                           [r for _, r in plan.loads], zero_fill=True)
        if plan.warm_loads:
            # wr-warm scratch rows: the checkpoint's retained units (omitted ones zero), conv state zero as
            # a wr scratch's (it is not known at the window's start)
            rows = [r for _, r in plan.warm_loads]
            self.pool.load([s for s, _ in plan.warm_loads], self.state.temporal, self.state.conv, rows, zero_fill=True)
            self.state.conv[:, rows] = 0
        out = self._graph_step(plan)
        if out is None:
            batch = [SeqInput(s.token_ids, s.row, s.block_table, s.start, tuple(p for p, _ in s.captures),
                              s.replay_into) for s in plan.spans]
            out = self.model.forward(batch, self.state, self.kv, logits=[s.logits for s in plan.spans],
                                     merge_tables=self.merge_tables)
        n = len(plan.spans)
        result = StepOutput(tokens=[None] * n, errors=[None] * n, logits=[None] * n, log_probs=[None] * n,
                            gen_logits=[None] * n)
        result.stored = self._store(out, plan, result.errors)
        self._sample(out, plan, result, sample_tokens)
        if failed is not None:
            # read after the sampling's sync: the flags' all-reduce costs the GPU no wait of its own
            copy_errors = [e or ("failed on another TP rank" if f else None)
                           for e, f in zip(copy_errors, failed.tolist())]
        result.copy_errors = copy_errors if any(copy_errors) else []
        return result

    def _tier_copies(self, plan: StepPlan):
        """Queue the step's copies between the tiers. Returns, per copy (demotions, promotions, host KV's), None
        or why it failed here, and under TP the ranks' summed failure flags (a tensor, read after the step):
        every rank holds its own share of a copied slot, so a copy failed where it failed on any rank. Every
        rank runs the same plan, so every rank reaches that all-reduce (only in a step with copies)."""
        errors = []
        if plan.demotions or plan.promotions:
            if self.host_tier is None:
                raise RuntimeError("a step copies checkpoints between tiers, but this runner has no host tier")
            errors += self.host_tier.run(plan.demotions, plan.promotions)
        if plan.kv_tier_copies:
            if self.kv_tier is None:
                raise RuntimeError("a step copies KV blocks between tiers, but this runner has no host KV")
            errors += self.kv_tier.run_ordered(plan.kv_tier_copies)
        if not errors or self.cfg.tp_size == 1:
            return errors, None
        flags = torch.tensor([e is not None for e in errors], dtype=torch.int32, device=self.cfg.device)
        return errors, self.model.all_reduce(flags)

    def _wait_slots(self, slots) -> None:
        if self.host_tier is not None and slots:
            self.host_tier.wait_slots(slots)

    def _graph_step(self, plan: StepPlan):
        """A pure decode step (one token per span, no loads, replays or captures) through the CUDA graphs:
        its ForwardOutput, or None when the step (or the setup) is not one the graphs take."""
        g, spans = self.graphs, plan.spans
        if (g is None or plan.loads or plan.warm_loads or plan.replays
                or any(len(s.token_ids) != 1 or s.captures or s.logits == "none" for s in spans)
                or len({s.row for s in spans}) != len(spans)):
            return None
        ids = [int(s.token_ids[0]) for s in spans]
        starts = [s.start for s in spans]
        if (min(ids) < 0 or max(ids) >= self.model.spec.vocab_size or min(starts) < 0
                or not g.eligible(starts)):
            return None                     # model.forward says what is wrong, or takes the odd shape
        try:
            # validation into the host mirrors, then (first time for this batch size) the capture: neither
            # touches a real row
            b = g.fill(ids, starts, [s.row for s in spans], [s.block_table for s in spans])
        except ValueError:
            return None                     # a block table the cache refuses: forward raises it properly
        if g.use_graphs and b not in g.graphs:
            try:
                g.capture(b)
            except Exception as e:  # noqa: BLE001 - a capture the device refuses: serve on, eagerly
                self._drop_graphs(e)
                return None
        # from here a failure is the step's: the state rows may have advanced, so no eager retry
        n = len(spans)
        logits, greedy, finite = g.launch(n)
        return ForwardOutput(logits, list(range(n + 1)), list(range(n + 1)), picks=(greedy, finite))

    def capture_graphs(self) -> None:
        """Record every decode bucket's CUDA graph now (the engine's warm-up calls this before ready)."""
        if self.graphs is not None:
            try:
                self.graphs.warmup()
            except Exception as e:  # noqa: BLE001 - see _drop_graphs
                self._drop_graphs(e)

    def _drop_graphs(self, e: Exception) -> None:
        """A graph that cannot be captured costs speed, not service: say so once, decode eagerly from then on
        (the capture's warm-up runs touched only the reserved padding row and block)."""
        print(f"dasc: decode CUDA graphs off ({type(e).__name__}: {e}); decode steps run eagerly",
              file=sys.stderr, flush=True)
        self.graphs = None

    def _store(self, out, plan: StepPlan, errors: list) -> list[bool]:
        """Store the captured boundary states into the plan's slots; a non-finite capture is not stored
        (it would poison every later hit) and fails its request. Returns, per capture of the plan (spans
        in order, each span's captures in order), whether it was stored."""
        wanted = [(i, pos, slot) for i, s in enumerate(plan.spans) for pos, slot in s.captures]
        if not wanted:
            return []
        # the forward's captures come in (sequence, position) order: index them to the plan's order
        k_of = {(i, pos): k for k, (i, pos) in enumerate(zip(out.capture_seq, out.capture_pos))}
        order = [k_of[(i, pos)] for i, pos, _ in wanted]
        temporal, conv = out.capture_temporal, out.capture_conv
        bad = ~(torch.isfinite(temporal.flatten(1)).all(1) & torch.isfinite(conv.flatten(1)).all(1))
        if self.cfg.tp_size > 1:
            # each rank sees only its heads' share: stored where it is finite on every rank (a rank deciding
            # alone entered the storage all-to-all without the others, or wrote a checkpoint rank 0 never
            # recorded); every rank runs the same plan, so every rank reaches this all-reduce
            bad = self.model.all_reduce(bad.to(torch.int32)) > 0
        finite = (~bad).tolist()
        stored = [finite[k] for k in order]
        for ok, (i, _, _) in zip(stored, wanted):
            if not ok:
                errors[i] = "non-finite recurrent state: the checkpoint was not stored"
        which = [k for k, ok in zip(order, stored) if ok]
        if which:
            # a captured slot may be one a demotion is still reading: its store waits for that copy alone
            self._wait_slots([slot for (_, _, slot), ok in zip(wanted, stored) if ok])
            # captures are [n, L, ...]; the store reads [L, n, ...] views (any stride along L and n)
            self.pool.store(temporal.transpose(0, 1), conv.transpose(0, 1), which,
                            [slot for (_, _, slot), ok in zip(wanted, stored) if ok])
        return stored

    def _sample(self, out, plan: StepPlan, result: StepOutput, sample_tokens: bool) -> None:
        cu = out.logits_cu
        rows = [i for i, s in enumerate(plan.spans) if s.logits != "none"]
        if not rows:
            return
        bans = [(j, t) for j, i in enumerate(rows) for t in plan.spans[i].banned]
        # spans whose token comes from processed logits (penalties, bias) or that return log probs /
        # generation logits: they read their own row, the rest take the batched argmax
        special = {j for j, i in enumerate(rows) if plan.spans[i].sampling is not None and (
            plan.spans[i].sampling.processed or plan.spans[i].log_prob or plan.spans[i].raw_logits)}
        if out.picks is not None and not bans and not special and len(rows) == out.logits.shape[0]:
            # the decode graph's own argmax and health check, one logits row per span, already on the host
            greedy, finite = out.picks
            last = out.logits
        else:
            # one device sync for every span's health and every greedy choice
            finite = torch.isfinite(out.logits).all(-1).tolist()
            last = out.logits[torch.tensor([cu[i + 1] - 1 for i in rows], device=out.logits.device)]
            raw = last
            if bans:
                last = last.clone() if special else last
                last[[j for j, _ in bans], [t for _, t in bans]] = float("-inf")
            greedy = torch.argmax(last, -1).tolist()
        for j, i in enumerate(rows):
            s = plan.spans[i]
            if not all(finite[cu[i]:cu[i + 1]]):
                result.errors[i] = result.errors[i] or "non-finite logits"
                continue
            if s.logits == "all":
                result.logits[i] = out.logits[cu[i]:cu[i + 1]].cpu()
            if s.sampling is None or not sample_tokens or result.errors[i]:
                continue
            if s.banned and len(s.banned) >= last.shape[-1]:
                result.errors[i] = "every token is banned (bad_words_list / min_tokens)"
                continue
            try:
                if j in special:
                    result.tokens[i] = self._sample_special(raw[j], s, result, i)
                else:
                    result.tokens[i] = greedy[j] if s.sampling.greedy else sample(last[j], s.sampling, s.token_index)
            except Exception as e:  # noqa: BLE001 - one request's sampling must not fail the step
                result.errors[i] = f"sampling failed: {type(e).__name__}: {e}"

    @staticmethod
    def _sample_special(raw: torch.Tensor, s, result: StepOutput, i: int) -> int:
        """One span's token from its processed logits (TensorRT-LLM's order: bias, temperature, penalties,
        bans), with its log probability and raw logits when asked."""
        x = process_logits(raw, s.sampling, s.history, s.banned)
        token = int(torch.argmax(x)) if s.sampling.greedy else sample(x, s.sampling, s.token_index, scaled=True)
        if s.log_prob:
            result.log_probs[i] = float(torch.log_softmax(x, -1)[token])
        if s.raw_logits:
            result.gen_logits[i] = raw.float().cpu()
        return token

    # ---- replay merge tables ---------------------------------------------------------------------------
    def _one_layer_layout(self, kept: list[int]) -> StateLayout:
        cfg = self.plan.config
        # local unit ids of this rank: a rank's layer holds shard(tp).units of them
        return StateLayout.from_retained([kept], units_per_layer=cfg.shard(self.cfg.tp_size).units,
                                         unit_elements=cfg.unit_elements, value_dim=cfg.value_head_dim)

    def exchange_report(self) -> dict | None:
        """The storage balance's all-to-all timings per store and load; None where no units move between ranks."""
        return self.pool.exchange_report() if self._exchanges else None

    def tier_report(self) -> dict:
        """Rank 0's host-tier copies: bytes queued per direction (checkpoints and KV blocks together) and the
        seconds the copy stream spent on those finished (one stream serves both tiers); zeros with no tier."""
        tiers = [t for t in (self.host_tier, self.kv_tier) if t is not None]
        out = {"copy_bytes": {d: sum(t.copied[d] for t in tiers) for d in ("to_host", "to_device")},
               "copy_seconds": tiers[0].stream.seconds() if tiers else 0.0}
        out["kv_copy_bytes"] = dict(self.kv_tier.copied) if self.kv_tier else {"to_host": 0, "to_device": 0}
        return out

    def reset_tier_stats(self) -> None:
        """Zero what tier_report counts (the engine's reset_stats zeroes the cache's copy counters: the bytes and
        seconds kept counting warm-up's copies, so bytes per copy no longer matched the slot size)."""
        tiers = [t for t in (self.host_tier, self.kv_tier) if t is not None]
        for i, t in enumerate(tiers):
            t.reset_stats(stream=i == 0)        # one stream serves both tiers

    def stop(self) -> None:
        """Nothing to release in one process (DistributedRunner releases the other TP ranks here)."""

    def memory_report(self) -> dict:
        report = self.pool.memory_report()
        # the replay window under the stats' key "wr_window" (kept: a JSON key users read)
        report.update(host_slots=self.num_host_slots, host_kv_blocks=self.cfg.host_kv_blocks,
                      host_kv_bytes=self.kv_tier.allocated_bytes() if self.kv_tier else 0,
                      host_bytes=self.host_tier.allocated_bytes() if self.host_tier else 0,
                      arm=self.cfg.arm, dense_slot_bytes=self.plan.config.dense_checkpoint_bytes_per_rank(1),
                      wr_window=self.replay_window)
        return report


def graphs_wanted(cfg: EngineConfig, model: HybridModel) -> bool:
    """Decode steps as CUDA graphs: asked for, on a GPU, with the kernel backend (its decode path reads no
    host values), on one rank (the all-reduce is not captured), with dense MLPs or MoE layers on a fused
    backend (the per-expert loop reads the routing on the host: model/moe, decode_graphs.capturable)."""
    return cfg.cuda_graphs and cfg.tp_size == 1 and getattr(model.backend, "fused_mixer", False) and capturable(model)


def engine_plan(cfg: EngineConfig):
    """The arm's plan: planned from the checkpoint now, or read from ``cfg.plan_path`` (a build's plan.json),
    which must describe this checkpoint and this arm."""
    # the conv state is checkpointed in the model's own precision (the paper's native-precision b^conv)
    arm = plan_fields(cfg)
    options = PlanOptions(**arm)
    if cfg.plan_path is None:
        # dummy weights without a dummy record (EngineConfig(load_format="dummy") on a bare config): seed 0
        seed = 0 if cfg.load_format == "dummy" and dummy_marker(cfg.model) is None else None
        return plan_from_path(cfg.model, options, conv_dtype=cfg.dtype, dummy_seed=seed)[0]
    try:
        with open(cfg.plan_path) as f:
            plan = DascPlan.from_dict(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"plan {cfg.plan_path!r} cannot be read: {e}") from None
    for name, value in arm.items():
        if getattr(plan.options, name) != value:
            raise UserError(f"plan {cfg.plan_path!r} has {name}={getattr(plan.options, name)!r}, the engine "
                            f"{PLAN_TO_ENGINE[name]}={value!r}")
    model = HybridConfig.from_path(cfg.model, conv_dtype=cfg.dtype).to_dict()
    if plan.config.to_dict() != model:
        raise UserError(f"plan {cfg.plan_path!r} was made for another model or dtype than {cfg.model!r}")
    if cfg.plan_digest is not None and plan.digest() != cfg.plan_digest:
        # its options and model check out, but not its units: another selection served under the build's name
        raise UserError(f"plan {cfg.plan_path!r} is not the plan this engine was built with (edited after the "
                        "build): rebuild the engine with dasc-build")
    return plan


def replay_window(cfg: EngineConfig, plan_window: int) -> int:
    """The tokens a wr hit of this engine replays (engine/config.py replay_tokens)."""
    return replay_tokens(cfg.policy, plan_window, cfg.max_context, cfg.replay_window)
