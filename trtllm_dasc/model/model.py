"""HybridModel: the lean inference runtime of qwen3_next / kimi_linear (one TP rank of it).

One forward call processes a batch of sequences, each continuing from its carried state: its recurrent
state row (RecurrentState) and its cached full-attention tokens (PagedKVCache, through its block table).
A sequence may ask for checkpoints: the linear layers' states after chosen prefix lengths, captured in
the same pass. The forward allocates nothing: rows and blocks are the scheduler's decisions.
At tp_size > 1 the linear-attention layers are sharded by bundles (tp.py, the planner's permutation),
attention heads and MLP/expert channels in equal parts (RankShare; a part the degree does not divide
stays whole); every sharded layer's row-parallel partial output goes through `all_reduce` (set by the
distributed runtime). Embedding, norms, router and LM head are replicated.
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from trtllm_dasc.config import ConfigError, HybridConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.model.attention import AttnBatch, GatedAttention, MLAttention
from trtllm_dasc.model.kv_cache import KVCacheConfig, PagedKVCache
from trtllm_dasc.model.linear_attn import GDNLayer, KDALayer
from trtllm_dasc.model.mlp import DenseMLP, KimiMoE, QwenMoE
from trtllm_dasc.model.ops import rms_norm
from trtllm_dasc.model.recurrence import get_backend
from trtllm_dasc.model.spec import ModelSpec
from trtllm_dasc.model.state import RecurrentState
from trtllm_dasc.model.tp import RankShare, check_bundle_order, local_bundles
from trtllm_dasc.model.weights import CheckpointReader, load
from trtllm_dasc.state import StateLayout
from trtllm_dasc.state import ops as state_ops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class FamilyLayers(NamedTuple):
    linear: type
    attention: type
    moe: type


# the layer implementations of each family (keyed by the linear-attention kind, HybridConfig.arch)
LAYERS = {"gdn": FamilyLayers(GDNLayer, GatedAttention, QwenMoE), "kda": FamilyLayers(KDALayer, MLAttention, KimiMoE)}


@dataclass(slots=True)
class SeqInput:
    """One sequence of a forward batch: tokens at positions [start, start + T), continuing from state row
    ``row`` and the cached KV of positions [0, start). ``block_table`` covers positions [0, start + T)
    (the forward writes the new tokens' KV into it; it never allocates). capture_at: absolute prefix
    lengths p, start < p <= start + T, after which the linear layers' states are captured.

    replay_into: a dasc-wr replay (its row a scratch row): in every linear layer the replays run first,
    then the replay merge copies the units the checkpoint omitted (forward's merge_tables) from each
    replay's row into its ``replay_into`` row, then the other sequences run. Attention and MLP see all
    tokens in one pass, so a hit costs the W replayed tokens, not a second forward."""

    token_ids: torch.Tensor | list[int]
    row: int
    block_table: list[int]
    start: int = 0
    capture_at: tuple[int, ...] = ()
    replay_into: int | None = None


class ReplayMerge(NamedTuple):
    """One forward's replay merge: the batch's first ``count`` sequences are replays; per linear layer, the
    units ``tables[l]`` (a one-layer StateLayout) does not keep go from rows ``src`` to rows ``dst``."""

    count: int
    src: list[int]
    dst: list[int]
    tables: list[StateLayout]


@dataclass(slots=True)
class ForwardOutput:
    logits: torch.Tensor | None           # fp32 [R, vocab]: sequence i's rows are logits_cu[i]:logits_cu[i+1]
    logits_cu: list[int]
    cu_seqlens: list[int]                 # sequence i's tokens are rows cu_seqlens[i]:cu_seqlens[i+1]
    capture_seq: list[int] = field(default_factory=list)      # batch index of every captured checkpoint
    capture_pos: list[int] = field(default_factory=list)      # its absolute prefix length
    capture_temporal: torch.Tensor | None = None               # fp32 [n, L_linear, HV, K, V]
    capture_conv: torch.Tensor | None = None                   # [n, L_linear, C, W-1]
    # a decode graph's step (model/decode_graphs.py): per logits row its argmax and whether all its logits
    # are finite, computed inside the graph and already on the host; None: the sampler computes them
    picks: tuple[list[int], list[bool]] | None = None


LOGITS = ("none", "last", "all")
# a batch whose sequences each bring at most this many tokens attends through the paged kernel, every new
# token a query row of its own: the per-sequence SDPA loop costs a dozen launches per sequence and layer
# (a step of 64 hits and their 64 wr replays spent most of its time there), while each query row re-reads
# its sequence's keys, which costs more than flash attention's reuse only for long chunks
PAGED_MAX_TOKENS = 128


class HybridModel:
    def __init__(self, cfg: HybridConfig, spec: ModelSpec, weights: dict, layers: list, *, tp_rank: int,
                 tp_size: int, bundle_order: list[list[int]], dtype, device, backend):
        self.cfg, self.spec, self.w, self.layers = cfg, spec, weights, layers
        self.tp_rank, self.tp_size, self.bundle_order = tp_rank, tp_size, bundle_order
        self.dtype, self.device, self.backend = dtype, torch.device(device), backend
        self.all_reduce = None            # callable(tensor) -> tensor, required when tp_size > 1
        self.offset_norm = cfg.family.norm_offset
        # attention through the paged kernel (kernels/decode_attention.py), one launch for the batch, when every
        # sequence brings at most PAGED_MAX_TOKENS tokens (decode steps, checkpoint hits' short suffixes,
        # wr replays): None = with the kernel backend on a GPU (fla: fused mixers too); True / False force it
        # (tests run it on the CPU in Triton's interpreter)
        self.paged_attention: bool | None = None
        # a token id outside [0, vocab) in a forward: refused (False), or embedded as a zero vector (True), as
        # TensorRT-LLM's embedding lookup writes it (the engine's out_of_vocab_inputs = "zero")
        self.zero_out_of_vocab = False

    def _use_paged_attention(self, ids: list) -> bool:
        if self.cfg.num_linear_layers == len(self.layers) or any(t.numel() > PAGED_MAX_TOKENS for t in ids):
            return False
        if self.paged_attention is not None:
            return self.paged_attention
        return self._fused()

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "float32", device: str = "cpu", tp_rank: int = 0,
                        tp_size: int = 1, bundle_order=None, backend: str = "auto") -> "HybridModel":
        """Load a transformers checkpoint directory (config.json + safetensors, single or sharded)."""
        cfg = HybridConfig.from_path(path, conv_dtype=dtype if dtype in DTYPES else "float32")
        return cls.from_source(cfg, CheckpointReader(path), dtype=dtype, device=device, tp_rank=tp_rank,
                               tp_size=tp_size, bundle_order=bundle_order, backend=backend)

    @classmethod
    def from_source(cls, cfg: HybridConfig, src, *, dtype: str = "float32", device: str = "cpu",
                    tp_rank: int = 0, tp_size: int = 1, bundle_order=None, backend: str = "auto") -> "HybridModel":
        """Build from any weight source with `get(name, shape)` (CheckpointReader, RandomWeights)."""
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        spec, dt = ModelSpec.from_config(cfg), DTYPES[dtype]
        cfg.shard(tp_size)
        order = check_bundle_order(bundle_order, cfg.num_linear_layers, cfg.num_bundles, tp_size)
        D, V = spec.hidden_size, spec.vocab_size
        w = {"embed": load(src, "model.embed_tokens.weight", (V, D), dt, device),
             "norm": load(src, "model.norm.weight", (D,), dt, device)}
        w["lm_head"] = w["embed"] if spec.tie_word_embeddings else load(src, "lm_head.weight", (V, D), dt, device)
        layers, lin, share = [], 0, RankShare(tp_rank, tp_size)
        for i, kind in enumerate(cfg.layer_types):
            p = f"model.layers.{i}."
            if kind == "linear_attention":
                bundles = local_bundles(order[lin], tp_rank, tp_size)
                mixer = LAYERS[cfg.arch].linear.load(src, p, cfg, spec, bundles, dt, device)
                lin += 1
            else:
                mixer = LAYERS[cfg.arch].attention.load(src, p, spec, dt, device, share)
            if spec.mlp_types[i] == "moe":
                mlp = LAYERS[cfg.arch].moe.load(src, p, spec, dt, device, share)
            else:
                mlp_prefix = p + cfg.family.dense_mlp_prefix
                mlp = DenseMLP.load(src, mlp_prefix, D, spec.intermediate_size, dt, device, share)
            norms = [load(src, p + n + ".weight", (D,), dt, device)
                     for n in ("input_layernorm", "post_attention_layernorm")]
            layers.append((mixer, mlp, *norms))
        return cls(cfg, spec, w, layers, tp_rank=tp_rank, tp_size=tp_size, bundle_order=order, dtype=dt,
                   device=device, backend=get_backend(backend, device))

    def warm_long_prefill(self, max_tokens: int) -> int:
        """On a GPU: build cuDNN's attention graphs for the long-prefill lengths up to max_tokens that the
        attention layers bucket (attention.py: _attend, MLA's _cudnn_prefill), each through the path the layer
        takes (the engine's runner calls this when it loads). Returns the calls."""
        if self.device.type != "cuda":
            return 0
        from trtllm_dasc.model.attention import warm_long_prefill
        attention = [m for m, *_ in self.layers if m.kind not in ("gdn", "kda")]
        # MLA's long prefill has a layout of its own (keys and values from one GEMM): its first layer builds
        # the graphs (the others share the shapes), every layer makes its extended kv_b now
        mla = [m for m in attention if m.kind == "mla"]
        calls = mla[0].warm_long_prefill(max_tokens) if mla else 0
        for m in mla if calls else []:          # only where a long prefill can happen: 12 MB a layer at 32 heads
            m.kv_b_keys_values
        shapes = {m.prefill_shape for m in attention if m.kind != "mla"}
        return calls + warm_long_prefill(shapes, max_tokens, self.device, self.dtype)

    def warm_moe(self, max_tokens: int) -> int:
        """On a GPU: compile the fused MoE layer's kernels for every tile config a step of up to max_tokens
        tokens can pick (moe/kernel.py: by rows per expert), at an even and an odd count each, and time the
        small path's tiles for every pair count it meets, through one MoE layer (all share their shapes). Warm-up's prompts reach the configs of their own step sizes only:
        on the H200 a user's first batch of 8 prompts of ~3k tokens compiled the 128-row tiles (steps of
        4096+ tokens) inside the request. Returns the forwards run."""
        if self.device.type != "cuda":
            return 0
        layer = next((m for _, m, *_ in self.layers if getattr(m, "capturable", False)), None)
        if layer is None:
            return 0
        from trtllm_dasc.model.moe import small
        from trtllm_dasc.model.moe.kernel import warm_token_counts
        k = layer.spec.top_k
        counts = warm_token_counts(k, layer.spec.num_experts, max_tokens, small.SMALL_PAIRS)
        # and the small path's autotuner keys (its tiles timed per pair count: moe/small.py), every one a
        # step can meet, not only the decode buckets the graphs capture
        width = k + int(getattr(layer, "gate_up_all", None) is not None)
        counts = small.warm_token_counts(k, width) + counts
        D = layer.w["gate_up"].shape[2]
        with torch.no_grad():
            for T in counts:
                layer.forward(torch.randn(T, D, device=self.device).to(self.dtype), self._fused())
        return len(counts)

    def new_state(self, num_rows: int) -> RecurrentState:
        return RecurrentState.zeros(self.cfg, num_rows, self.tp_size, self.dtype, self.device)

    @property
    def kv_token_shapes(self) -> list[tuple[int, ...]]:
        """What one token of one full-attention layer caches on this rank (its KV heads at TP)."""
        for mixer, *_ in self.layers:
            if mixer.kind not in ("gdn", "kda"):
                return mixer.kv_token_shapes
        return self.spec.kv_token_shapes

    def new_kv_cache(self, num_blocks: int, block_size: int = 16) -> PagedKVCache:
        return PagedKVCache(KVCacheConfig(len(self.cfg.full_attention_layers), self.kv_token_shapes,
                                          num_blocks, block_size, self.dtype, str(self.device)))

    # ---- forward ----------------------------------------------------------------------------------
    def _prepare(self, batch: list[SeqInput], state: RecurrentState, kv: PagedKVCache, logits):
        if not batch:
            raise UserError("empty batch")
        modes = [logits] * len(batch) if isinstance(logits, str) else list(logits)
        if len(modes) != len(batch) or any(m not in LOGITS for m in modes):
            raise UserError(f"logits must be one of {LOGITS} or one per sequence, got {logits!r}")
        ids, cuts, self._outside_vocab = [], [], False
        for i, s in enumerate(batch):
            t = torch.as_tensor(s.token_ids, dtype=torch.long).reshape(-1)
            if t.numel() == 0:
                raise UserError(f"sequence {i} has no tokens")
            lo, hi = torch.aminmax(t)
            if lo < 0 or hi >= self.spec.vocab_size:
                if not self.zero_out_of_vocab:
                    raise UserError(f"token ids of sequence {i} must be in 0..{self.spec.vocab_size - 1}")
                self._outside_vocab = True      # _embed zero-fills them
            if not 0 <= s.row < state.num_rows:
                raise UserError(f"row {s.row} of sequence {i} is outside 0..{state.num_rows - 1}")
            if s.start < 0:
                raise UserError(f"start {s.start} of sequence {i} is negative")
            rel = sorted(int(p) - s.start for p in s.capture_at)
            if any(not 0 < r <= t.numel() for r in rel) or len(set(rel)) != len(rel):
                raise UserError(f"capture_at {list(s.capture_at)} of sequence {i} must be distinct prefix lengths "
                                f"in {s.start + 1}..{s.start + t.numel()}")
            ids.append(t)
            cuts.append(rel)
        if len({s.row for s in batch}) != len(batch):
            raise UserError("a batch may hold each state row once")
        self._check_replays(batch, state)
        if self._use_paged_attention(ids):
            # one set of tensors for the whole step; the layers read the KV through the block tables
            return ids, cuts, None, modes, kv.token_tables([s.block_table for s in batch], [s.start for s in batch],
                                                           [t.numel() for t in ids])
        kv_index = [kv.token_index(s.block_table, 0, s.start + t.numel()) for s, t in zip(batch, ids)]
        return ids, cuts, kv_index, modes, None

    def _check_replays(self, batch: list[SeqInput], state: RecurrentState) -> None:
        into = [s.replay_into for s in batch if s.replay_into is not None]
        if not into:
            return
        n = len(into)
        if any(s.replay_into is None for s in batch[:n]):
            raise UserError("replay sequences (replay_into) must come first in the batch")
        if any(not 0 <= r < state.num_rows for r in into):
            raise UserError(f"replay_into rows {into} must be in 0..{state.num_rows - 1}")
        if len(set(into)) != n or set(into) & {s.row for s in batch[:n]}:
            raise UserError(f"replay_into rows {into} must be distinct and none a replay's own row")
        if any(s.capture_at for s in batch[:n]):
            raise UserError("a replay sequence captures no checkpoint")

    @torch.inference_mode()
    def forward(self, batch: list[SeqInput], state: RecurrentState, kv: PagedKVCache, logits="all",
                timer=None, merge_tables: list[StateLayout] | None = None) -> ForwardOutput:
        """Prefill/decode a batch; updates the batch's state rows and writes its new tokens' KV.

        logits: 'all' (every token), 'last' (each sequence's last token) or 'none', or one of those per
        sequence. timer: optional callable(kind) -> context manager, kind in prologue (the checks and index
        tensors before the first layer, and the embedding) / linear_attn / attention / mlp / head.
        merge_tables: the replay merge's tables, needed when a sequence is a replay (SeqInput.replay_into):
        per linear layer of this rank, a one-layer StateLayout of the units the checkpoint keeps; the
        replay merge copies the others.
        """
        if self.tp_size > 1 and self.all_reduce is None:
            raise RuntimeError("tp_size > 1 needs model.all_reduce (set by the distributed runtime)")
        replays = [s for s in batch if s.replay_into is not None]
        replay = None
        if replays:
            if merge_tables is None or len(merge_tables) != self.cfg.num_linear_layers:
                raise UserError(f"replay sequences need merge_tables, one per linear layer "
                                f"({self.cfg.num_linear_layers})")
            replay = ReplayMerge(len(replays), [s.row for s in replays], [s.replay_into for s in replays],
                                 merge_tables)
        timer = timer or (lambda kind: contextlib.nullcontext())
        with timer("prologue"):
            x, cu, cuts, rows, attn_batch, sel, out = self._prologue(batch, state, kv, logits)
        first = batch[0].row
        # the batch's state rows as a slice when they are consecutive (one sequence always is): each linear
        # layer then reads and writes them in place of a gather and a scatter
        row_range = (first, first + len(batch)) if [s.row for s in batch] == list(range(first, first + len(batch))) \
            else None
        x, hbs, convs = self._layers(x, cu, rows, state, kv, attn_batch, cuts, replay, timer, row_range)
        if sel is not None:
            with timer("head"):
                rows_x = x if sel.numel() == x.shape[0] else x[sel]
                out.logits = self._head(rows_x)
        starts = [s.start for s in batch]
        out.capture_seq = [i for i, c in enumerate(cuts) for _ in c]
        out.capture_pos = [starts[i] + r for i, c in enumerate(cuts) for r in c]
        if out.capture_seq:
            out.capture_temporal = torch.stack(hbs, dim=1)
            out.capture_conv = torch.stack(convs, dim=1)
        return out

    def _prologue(self, batch, state, kv, logits):
        """What forward needs before the first layer, from the checked batch (_prepare): the embedded tokens,
        the token offsets, the capture cuts, the state rows and the attention batch on the device, the head's
        rows on the device (None: no logits) and the ForwardOutput with its logits offsets."""
        ids, cuts, kv_index, modes, paged = self._prepare(batch, state, kv, logits)
        starts = [s.start for s in batch]
        cu = [0]
        for t in ids:
            cu.append(cu[-1] + t.numel())
        dev = self.device
        positions = torch.cat([torch.arange(s, s + t.numel()) for s, t in zip(starts, ids)]).to(dev)
        attn_batch = AttnBatch(cu, starts, kv_index, positions, paged)
        rows = torch.tensor([s.row for s in batch], dtype=torch.long, device=dev)
        out = ForwardOutput(None, [0], cu)
        picks = []
        for i, mode in enumerate(modes):
            if mode == "all":
                picks.append(torch.arange(cu[i], cu[i + 1]))
            elif mode == "last":
                picks.append(torch.tensor([cu[i + 1] - 1]))
            out.logits_cu.append(out.logits_cu[-1] + (0 if mode == "none" else picks[-1].numel()))
        # the rows for the head copied to the device now, while nothing is queued: a copy from pageable
        # memory may wait for the queue, and after the layers that is the whole forward (the H200 sat idle
        # ~0.8 ms at the end of a 16k prefill: `python -m benchmarks model_prefill --arch kda --profile`, its gaps)
        sel = torch.cat(picks).to(dev) if picks else None
        x = self._embed(torch.cat(ids), self._outside_vocab)
        return x, cu, cuts, rows, attn_batch, sel, out

    def _embed(self, ids: torch.Tensor, outside_vocab: bool) -> torch.Tensor:
        """The embedded tokens of host ids [T]; with outside_vocab (_prepare found an id outside the vocabulary,
        let through only under zero_out_of_vocab) such an id is a zero vector, as TensorRT-LLM's lookup kernel
        writes it. An in-vocabulary batch pays nothing more."""
        table = self.w["embed"]
        if not outside_vocab:
            return table[ids.to(self.device)]
        inside = (ids >= 0) & (ids < table.shape[0])
        x = table[torch.where(inside, ids, 0).to(self.device)]
        return x * inside.to(self.device, x.dtype)[:, None]

    def _fused(self) -> bool:
        """fla's kernels for the work between the mixers too (the residual add + norm, SwiGLU): with the
        kernel backend on a GPU, like the mixers' own fusion; asked each forward (benchmarks swap backends)."""
        return self.device.type == "cuda" and getattr(self.backend, "fused_mixer", False)

    def _add_norm(self, x, delta, w, fused_w):
        """(RMSNorm(x + delta), x + delta); delta None: (RMSNorm(x), x). fused_w: the fused kernel's
        weight for this norm (fused_norm_weights), None for the torch reference."""
        eps = self.spec.rms_norm_eps
        if fused_w is not None:
            from trtllm_dasc.model.fused_ops import add_rms_norm
            return add_rms_norm(x, delta, fused_w, eps)
        x = x if delta is None else x + delta
        return rms_norm(x, w, eps, self.offset_norm), x

    @functools.cached_property
    def fused_norm_weights(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the (input, post-attention) norm weights the fused kernel multiplies with: qwen3_next's
        1 + w in fp32 as its reference computes it (made once), kimi's w as it is."""
        eff = self._fused_weight
        return [(eff(in_norm), eff(post_norm)) for _, _, in_norm, post_norm in self.layers]

    @functools.cached_property
    def fused_final_norm_weight(self) -> torch.Tensor:
        """The final norm's weight as the fused kernel multiplies with it."""
        return self._fused_weight(self.w["norm"])

    def _fused_weight(self, w: torch.Tensor) -> torch.Tensor:
        return 1.0 + w.float() if self.offset_norm else w

    def _layers(self, x, cu, rows, state, kv, attn_batch, cuts, replay, timer, row_range=None):
        """Every layer over the batch's hidden states x [T, D]: (x after the last layer, the captured
        temporal and conv states per linear layer). Updates the state rows and writes the new tokens' KV.
        Each residual add is taken together with the norm after it (one kernel when fused)."""
        lin, att, hbs, convs, fused, pending = 0, 0, [], [], self._fused(), None
        norms = self.fused_norm_weights if fused else [(None, None)] * len(self.layers)
        for (mixer, mlp, in_norm, post_norm), (in_fused, post_fused) in zip(self.layers, norms):
            h, x = self._add_norm(x, pending, in_norm, in_fused)
            if mixer.kind in ("gdn", "kda"):
                with timer("linear_attn"):
                    res = self._linear(mixer, lin, h, cu, rows, state, cuts, replay, row_range)
                    out = res.out if self.tp_size == 1 else self.all_reduce(res.out)
                hbs.append(res.hb)
                convs.append(res.conv_b)
                lin += 1
            else:
                with timer("attention"):
                    out = mixer.forward(h, attn_batch, kv, att, fused)
                    out = self.all_reduce(out) if mixer.partial else out
                att += 1
            with timer("mlp"):
                h, x = self._add_norm(x, out, post_norm, post_fused)
                y = mlp.forward(h, fused)
                pending = self.all_reduce(y) if mlp.partial else y
        return x + pending, hbs, convs

    @torch.inference_mode()
    def decode_static(self, ids, positions, rows, decode, state: RecurrentState, kv: PagedKVCache) -> torch.Tensor:
        """One decode step from device tensors alone: ids, positions, rows [B] int64 and decode = (block
        tables, lengths, new KV rows) as kv.token_tables makes them for one token each. Nothing inside reads
        a host value or copies from the host, so a CUDA graph of one batch size can capture it
        (model/decode_graphs.py); the caller checked the batch as forward does. Returns fp32 logits [B, vocab]."""
        B = ids.shape[0]
        cu = list(range(B + 1))
        batch = AttnBatch(cu, [], None, positions, decode)
        x, _, _ = self._layers(self.w["embed"][ids], cu, rows, state, kv, batch, [[] for _ in range(B)], None,
                               lambda kind: contextlib.nullcontext())
        return self._head(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 logits of hidden states x [n, D]: the final norm (one kernel when fused), the LM head."""
        fused_w = self.fused_final_norm_weight if self._fused() else None
        h, _ = self._add_norm(x, None, self.w["norm"], fused_w)
        return (h @ self.w["lm_head"].T).float()

    def _linear(self, mixer, lin, h, cu, rows, state, cuts, replay: ReplayMerge | None, row_range=None):
        """One linear layer over the batch; with replays: they first, then the replay merge, then the rest.
        row_range: (first, end) when the batch's rows are first..end-1 in order (views, not gathers)."""
        n = len(cu) - 1
        if (replay is None and cu[-1] == n and mixer.kind == "kda" and not any(cuts)
                and hasattr(self.backend, "kda_decode_in_place")):
            # a decode step: the kernels update the layer's state rows in place (no gather and scatter)
            return mixer.forward(h, cu, None, None, self.backend, cuts,
                                 in_place=(state.temporal[lin], state.conv[lin], rows))

        def run(a, b):
            base = cu[a]
            which = rows[a:b] if row_range is None else slice(row_range[0] + a, row_range[0] + b)
            res = mixer.forward(h[base:cu[b]], [c - base for c in cu[a:b + 1]], state.temporal[lin, which],
                                state.conv[lin, which], self.backend, cuts[a:b])
            state.temporal[lin, which] = res.ht
            state.conv[lin, which] = res.conv
            return res
        if replay is None:
            return run(0, n)
        first = run(0, replay.count)
        layer = state.temporal[lin:lin + 1]
        state_ops.replay_merge(layer, replay.src, layer, replay.dst, replay.tables[lin])
        if replay.count == n:
            return first
        rest = run(replay.count, n)
        # replay sequences capture nothing, so the captures are the rest's
        rest.out = torch.cat([first.out, rest.out])
        return rest

    def prefill(self, token_ids, logits: str = "all") -> torch.Tensor:
        """Logits of one sequence from scratch (fresh state and KV cache): fp32 [T, vocab]."""
        blocks = max(1, -(-len(token_ids) // 16))
        kv = self.new_kv_cache(blocks, 16)
        return self.forward([SeqInput(token_ids, 0, list(range(blocks)))], self.new_state(1), kv, logits).logits
