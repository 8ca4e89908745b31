"""HybridModel: the lean inference runtime of qwen3_next / kimi_linear (one TP rank of it).

One forward call processes a batch of sequences, each continuing from its carried state: the recurrent
state rows of its slot (RecurrentState) and its cached full-attention tokens (PagedKVCache). A sequence
may ask for checkpoints: the linear layers' states after chosen prefix lengths, captured in the same pass.
At tp_size > 1 only the linear-attention layers are sharded (by bundles, tp.py); their row-parallel
partial outputs go through `all_reduce` (set by the distributed runtime); the rest is replicated.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

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
from trtllm_dasc.model.tp import check_bundle_order, local_bundles
from trtllm_dasc.model.weights import CheckpointReader, load

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class SeqInput:
    """One sequence of a forward batch. capture_at: absolute prefix lengths p, start < p <= start + T,
    after which the linear layers' states are captured (start = tokens already in the KV cache)."""

    token_ids: torch.Tensor | list[int]
    slot: int                             # row of the RecurrentState
    seq_id: object = None                 # PagedKVCache sequence id (default: the slot); created if absent
    capture_at: tuple[int, ...] = ()


@dataclass(slots=True)
class Refresh:
    """dasc-wr inside the same forward: the batch's first ``num_replay`` sequences replay a suffix from
    zero scratch states; in every linear layer they run first, then ``merge(layer, src_slots, dst_slots)``
    copies the units the checkpoint omitted from each replay's state into the state its request continues
    from, then the other sequences run. Attention and MLP see all tokens in one pass, so a hit costs the
    W replayed tokens, not a second forward."""

    num_replay: int
    src_slots: list[int]                  # replay sequences' state rows (in batch order)
    dst_slots: list[int]                  # the rows each one refreshes
    merge: object                         # callable(linear_layer_index, src_slots, dst_slots)


@dataclass(slots=True)
class ForwardOutput:
    logits: torch.Tensor | None           # fp32 [T_total, vocab] ("all") or [N, vocab] ("last")
    cu_seqlens: list[int]                 # sequence i's tokens are rows cu_seqlens[i]:cu_seqlens[i+1]
    starts: list[int]                     # tokens each sequence had cached before this call
    capture_seq: list[int] = field(default_factory=list)      # batch index of every captured checkpoint
    capture_pos: list[int] = field(default_factory=list)      # its absolute prefix length
    capture_temporal: torch.Tensor | None = None               # fp32 [n, L_linear, HV, K, V]
    capture_conv: torch.Tensor | None = None                   # [n, L_linear, C, W-1]


class HybridModel:
    def __init__(self, cfg: HybridConfig, spec: ModelSpec, weights: dict, layers: list, *, tp_rank: int,
                 tp_size: int, bundle_order: list[list[int]], dtype, device, backend):
        self.cfg, self.spec, self.w, self.layers = cfg, spec, weights, layers
        self.tp_rank, self.tp_size, self.bundle_order = tp_rank, tp_size, bundle_order
        self.dtype, self.device, self.backend = dtype, torch.device(device), backend
        self.all_reduce = None            # callable(tensor) -> tensor, required when tp_size > 1
        self.offset_norm = cfg.arch == "gdn"

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
        layers, lin = [], 0
        for i, kind in enumerate(cfg.layer_types):
            p = f"model.layers.{i}."
            if kind == "linear_attention":
                bundles = local_bundles(order[lin], tp_rank, tp_size)
                mixer = (GDNLayer if cfg.arch == "gdn" else KDALayer).load(src, p, cfg, spec, bundles, dt, device)
                lin += 1
            else:
                mixer = (GatedAttention if cfg.arch == "gdn" else MLAttention).load(src, p, spec, dt, device)
            if spec.mlp_types[i] == "moe":
                mlp = (QwenMoE if cfg.arch == "gdn" else KimiMoE).load(src, p, spec, dt, device)
            else:
                mlp_prefix = p + ("mlp." if cfg.arch == "gdn" else "block_sparse_moe.")
                mlp = DenseMLP.load(src, mlp_prefix, D, spec.intermediate_size, dt, device)
            norms = [load(src, p + n + ".weight", (D,), dt, device)
                     for n in ("input_layernorm", "post_attention_layernorm")]
            layers.append((mixer, mlp, *norms))
        return cls(cfg, spec, w, layers, tp_rank=tp_rank, tp_size=tp_size, bundle_order=order, dtype=dt,
                   device=device, backend=get_backend(backend, device))

    def new_state(self, num_slots: int) -> RecurrentState:
        return RecurrentState.zeros(self.cfg, num_slots, self.tp_size, self.dtype, self.device)

    def new_kv_cache(self, num_blocks: int, block_size: int = 16) -> PagedKVCache:
        return PagedKVCache(KVCacheConfig(len(self.cfg.full_attention_layers), self.spec.kv_token_shapes,
                                          num_blocks, block_size, self.dtype, str(self.device)))

    # ---- forward ----------------------------------------------------------------------------------
    def _prepare(self, batch: list[SeqInput], state: RecurrentState, kv: PagedKVCache):
        if not batch:
            raise UserError("empty batch")
        ids, starts, cuts, seq_ids = [], [], [], []
        for i, s in enumerate(batch):
            t = torch.as_tensor(s.token_ids, dtype=torch.long).reshape(-1)
            if t.numel() == 0:
                raise UserError(f"sequence {i} has no tokens")
            if t.min() < 0 or t.max() >= self.spec.vocab_size:
                raise UserError(f"token ids of sequence {i} must be in 0..{self.spec.vocab_size - 1}")
            if not 0 <= s.slot < state.num_slots:
                raise UserError(f"slot {s.slot} of sequence {i} is outside 0..{state.num_slots - 1}")
            sid = s.slot if s.seq_id is None else s.seq_id
            start = kv.seq_len(sid) if kv.has_sequence(sid) else 0
            rel = sorted(int(p) - start for p in s.capture_at)
            if any(not 0 < r <= t.numel() for r in rel) or len(set(rel)) != len(rel):
                raise UserError(f"capture_at {list(s.capture_at)} of sequence {i} must be distinct prefix lengths "
                                f"in {start + 1}..{start + t.numel()}")
            ids.append(t)
            starts.append(start)
            cuts.append(rel)
            seq_ids.append(sid)
        if len({s.slot for s in batch}) != len(batch) or len(set(map(repr, seq_ids))) != len(batch):
            raise UserError("a batch may hold each slot and KV sequence once")
        for sid, start, t in zip(seq_ids, starts, ids):
            if not kv.has_sequence(sid):
                kv.add_sequence(sid)
            kv.reserve(sid, start + t.numel())
        return ids, starts, cuts, seq_ids

    @torch.inference_mode()
    def forward(self, batch: list[SeqInput], state: RecurrentState, kv: PagedKVCache, logits: str = "all",
                timer=None, refresh: Refresh | None = None) -> ForwardOutput:
        """Prefill/decode a batch; updates the state rows of the batch's slots and their KV sequences.

        logits: 'all' (every token), 'last' (each sequence's last token) or 'none'.
        timer: optional callable(kind) -> context manager, kind in linear_attn/attention/mlp/head (profiling).
        refresh: dasc-wr replay sequences at the head of the batch (see Refresh).
        """
        if self.tp_size > 1 and self.all_reduce is None:
            raise RuntimeError("tp_size > 1 needs model.all_reduce (set by the distributed runtime)")
        timer = timer or (lambda kind: contextlib.nullcontext())
        ids, starts, cuts, seq_ids = self._prepare(batch, state, kv)
        cu = [0]
        for t in ids:
            cu.append(cu[-1] + t.numel())
        dev = self.device
        positions = torch.cat([torch.arange(s, s + t.numel()) for s, t in zip(starts, ids)]).to(dev)
        attn_batch = AttnBatch(cu, starts, seq_ids, positions)
        slots = torch.tensor([s.slot for s in batch], dtype=torch.long, device=dev)
        x = self.w["embed"][torch.cat(ids).to(dev)]
        eps, lin, att, hbs, convs = self.spec.rms_norm_eps, 0, 0, [], []
        for mixer, mlp, in_norm, post_norm in self.layers:
            h = rms_norm(x, in_norm, eps, self.offset_norm)
            if mixer.kind in ("gdn", "kda"):
                with timer("linear_attn"):
                    res = self._linear(mixer, lin, h, cu, slots, state, cuts, refresh)
                    out = res.out if self.tp_size == 1 else self.all_reduce(res.out)
                hbs.append(res.hb)
                convs.append(res.conv_b)
                lin += 1
            else:
                with timer("attention"):
                    out = mixer.forward(h, attn_batch, kv, att)
                att += 1
            x = x + out
            with timer("mlp"):
                x = x + mlp.forward(rms_norm(x, post_norm, eps, self.offset_norm))
        for sid, start, t in zip(seq_ids, starts, ids):
            kv.commit(sid, start + t.numel())
        out = ForwardOutput(None, cu, starts)
        if logits != "none":
            with timer("head"):
                rows = x if logits == "all" else x[torch.tensor(cu[1:], device=dev) - 1]
                out.logits = (rms_norm(rows, self.w["norm"], eps, self.offset_norm) @ self.w["lm_head"].T).float()
        out.capture_seq = [i for i, c in enumerate(cuts) for _ in c]
        out.capture_pos = [starts[i] + r for i, c in enumerate(cuts) for r in c]
        if out.capture_seq:
            out.capture_temporal = torch.stack(hbs, dim=1)
            out.capture_conv = torch.stack(convs, dim=1)
        return out

    def _linear(self, mixer, lin, h, cu, slots, state, cuts, refresh):
        """One linear layer over the batch; with a refresh, replays first, then merge, then the rest."""
        def run(a, b):
            base = cu[a]
            res = mixer.forward(h[base:cu[b]], [c - base for c in cu[a:b + 1]], state.temporal[lin, slots[a:b]],
                                state.conv[lin, slots[a:b]], self.backend, cuts[a:b])
            state.temporal[lin, slots[a:b]] = res.ht
            state.conv[lin, slots[a:b]] = res.conv
            return res
        n = len(cu) - 1
        if refresh is None or refresh.num_replay == 0:
            return run(0, n)
        first = run(0, refresh.num_replay)
        refresh.merge(lin, refresh.src_slots, refresh.dst_slots)
        rest = run(refresh.num_replay, n)
        # replay sequences capture nothing, so the captures are the rest's
        rest.out = torch.cat([first.out, rest.out])
        return rest

    def prefill(self, token_ids, logits: str = "all") -> torch.Tensor:
        """Logits of one sequence from scratch (fresh state and KV cache): fp32 [T, vocab]."""
        n = len(token_ids)
        kv = self.new_kv_cache(max(1, -(-n // 16)), 16)
        return self.forward([SeqInput(token_ids, 0)], self.new_state(1), kv, logits).logits
