"""Full-attention layers over the paged KV cache: qwen3_next gated GQA, kimi_linear MLA.

Each forward writes the batch's new tokens into the cache, reads every cached token of each sequence
back, and attends causally (query at absolute position p sees keys 0..p). At TP the heads are split
(RankShare): q/k/v column-parallel, o_proj row-parallel (``partial``: the model all-reduces the output);
a head count the TP degree does not divide keeps the layer whole on every rank.
MLA caches the compressed latent (kv_a_layernorm'd) and the shared k_rope part, one [kv_lora + rope]
row per token, and expands keys/values with kv_b_proj at attention time. Like transformers' KimiLinear,
MLA applies no RoPE (Kimi-Linear's MLA is NoPE); the k_rope channels are used as plain key channels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtllm_dasc.model.ops import apply_partial_rope, linear, rms_norm, rope_cos_sin
from trtllm_dasc.model.tp import RankShare, blocks
from trtllm_dasc.model.weights import load


@dataclass(slots=True)
class AttnBatch:
    """Where the batch's tokens go: sequence i is rows cu_seqlens[i]:cu_seqlens[i+1], starting at
    absolute position starts[i]; kv_index[i] are the flat KV rows of its positions [0, starts[i] + T_i)
    (the last T_i are written by this forward, all are read)."""

    cu_seqlens: list[int]
    starts: list[int]
    kv_index: list[torch.Tensor] | None
    positions: torch.Tensor          # [T] absolute positions
    # a batch on the paged kernel (kernels/decode_attention.py: decode steps, short chunks), per new token:
    # (its sequence's block table [T, max blocks] int32, its length = position + 1 [T] int32, its flat KV
    # row [T]) as kv.token_tables makes them; kv_index is then None
    paged: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


# cuDNN's SDPA (torch prefers it on Hopper) builds an execution graph for every new (T, S) shape: on the
# H200 a prefix-reuse replay of 51 new prompts spent 2.08 s of CPU in _cudnn_attention_forward against
# 22 ms when the same prompts came again (`python -m benchmarks first_seed_profile`), so every
# user's first request with a new length paid it. Flash and memory-efficient attention have no such step.
# The switch is process-wide (torch.backends.cuda.enable_cudnn_sdp), flipped once when a layer is loaded
# on a GPU: a context manager around each call cost 25 us per call, per sequence and layer.
def keep_cudnn_out_of_sdpa(device) -> None:
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


# A long prefill from position 0 takes cuDNN's attention after all: on the H200 at 16k tokens it ran MLA's
# and the GQA layer's causal attention in 5.1 / 3.2 ms against flash's 10.8 / 7.1
# (`python -m benchmarks attention_prefill`). Its per-shape graph build (60-80 ms there) is kept out of
# users' requests by padding the length up to a multiple of CUDNN_BUCKET, so the lengths it sees are few,
# and by building them all when the engine's runner loads the model (warm_long_prefill). Exact: a causal
# query never sees the padded keys after it. Shorter prefills, prefix hits and fp32 (cuDNN has no fp32
# kernel) stay on flash / memory-efficient attention.
CUDNN_MIN_TOKENS = 4096
CUDNN_BUCKET = 1024


# Whether this build's cuDNN attention takes values of their own head dim (MLA: keys 192, values 128), per
# (heads, kv heads, key dim, value dim): on the H200 that ran MLA's 16k causal attention in 4.43 ms against
# 5.13 with the values padded to 192 (`python -m benchmarks attention_prefill`, arm cudnn_dv), and saves
# the padded copy. A shape missing here is tried; one the build refuses gets the padded
# values (and flash behind cuDNN) from then on.
_CUDNN_OWN_VALUE_DIM: dict[tuple[int, int, int, int], bool] = {}


def _cudnn_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of q [T, H, E], k [T, Hk, E], v [T, Hk, Ev] on cuDNN (flash if cuDNN refuses the shapes),
    T padded up to the bucket. Returns [T, H, Ev]. The padding goes on the token dim before the [1, H, T, E]
    views are taken and an unpadded call's inputs are made contiguous, so every call has the layout
    (strides) of warm_long_prefill's contiguous tensors: cuDNN's graph cache keys on strides too."""
    pad = -q.shape[0] % CUDNN_BUCKET
    return _cudnn_sdpa(*(F.pad(t, (0, 0, 0, 0, 0, pad)) if pad else t.contiguous() for t in (q, k, v)))[:q.shape[0]]


def _cudnn_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of q [T, H, E], k [T, Hk, E], v [T, Hk, Ev] as they are (any strides with a unit last one)
    on cuDNN, values at their own dim where the build takes that (flash behind cuDNN otherwise, values
    padded). Returns [T, H, Ev]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    E, Ev = q.shape[-1], v.shape[-1]
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    gqa = q.shape[1] != k.shape[1]
    shape = (q.shape[1], k.shape[1], E, Ev)
    if Ev != E and _CUDNN_OWN_VALUE_DIM.get(shape, True):
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
            _CUDNN_OWN_VALUE_DIM[shape] = True
            return out[0].transpose(0, 1)
        except torch.cuda.OutOfMemoryError:
            raise                                   # memory, not the shape: nothing to remember
        except RuntimeError:                        # "no available kernel": this build wants one head dim
            _CUDNN_OWN_VALUE_DIM[shape] = False
    if Ev < E:
        vt = F.pad(vt, (0, E - Ev))                 # flash and older cuDNN want one head dim
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION], set_priority=True):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    return out[0, ..., :Ev].transpose(0, 1)


def _takes_cudnn(T: int, start: int, q: torch.Tensor) -> bool:
    """Whether a sequence's attention takes the cuDNN long-prefill path (see CUDNN_MIN_TOKENS)."""
    return start == 0 and T >= CUDNN_MIN_TOKENS and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def long_prefill_lengths(max_tokens: int, device, dtype) -> range:
    """The bucketed lengths a long prefill of at most max_tokens can run on cuDNN (_takes_cudnn); empty where
    none can (short, off the GPU, fp32)."""
    if max_tokens < CUDNN_MIN_TOKENS or torch.device(device).type != "cuda" or dtype not in (torch.bfloat16,
                                                                                           torch.float16):
        return range(0)
    return range(CUDNN_MIN_TOKENS, -(-max_tokens // CUDNN_BUCKET) * CUDNN_BUCKET + 1, CUDNN_BUCKET)


def warm_long_prefill(shapes: set[tuple[int, int, int, int]], max_tokens: int, device, dtype) -> int:
    """Build cuDNN's graph for every bucketed length _attend can ask for up to max_tokens, for each
    attention shape (heads, kv heads, key dim, value dim). Returns the calls made."""
    calls = 0
    for H, Hk, E, Ev in sorted(shapes):
        for T in long_prefill_lengths(max_tokens, device, dtype):
            _attend(torch.zeros(T, H, E, device=device, dtype=dtype), torch.zeros(T, Hk, E, device=device, dtype=dtype),
                    torch.zeros(T, Hk, Ev, device=device, dtype=dtype), 0)
            calls += 1
    return calls


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q [T, H, E], k [S, Hk, E], v [S, Hk, Ev] with S = start + T. Returns [T, H, Ev]."""
    T, S, Ev = q.shape[0], k.shape[0], v.shape[-1]
    if _takes_cudnn(T, start, q):
        return _cudnn_causal(q, k, v)
    if Ev != q.shape[-1]:
        # the other fused SDPA kernels want one head dim: pad v, slice the output
        v = F.pad(v, (0, q.shape[-1] - Ev)) if Ev < q.shape[-1] else v
    qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    gqa = q.shape[1] != k.shape[1]
    if start == 0:
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=gqa)
    elif T == 1:
        # a decode step sees every key: no mask, and flash takes the GQA heads as they are
        out = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=gqa)
    elif q.is_cuda:
        # imported here: torch.nn.attention.bias pulls in torch._dynamo (1.4 s of every process start)
        from torch.nn.attention.bias import causal_lower_right
        if gqa:
            # the lower-right causal bias goes to flash / efficient kernels with equal head counts
            rep = q.shape[1] // k.shape[1]
            kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
        # query i (absolute position start + i) sees keys 0..start + i: causal aligned to the lower
        # right, which the fused GPU kernels take as is (no [T, S] mask tensor)
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=causal_lower_right(T, S))
    else:
        # the CPU has no fused kernel for that bias (it would build this mask anyway)
        mask = torch.arange(S, device=q.device)[None, :] <= (start + torch.arange(T, device=q.device))[:, None]
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    return out[0].transpose(0, 1)[..., :Ev]


class GatedAttention:
    """qwen3_next: q carries an output gate, q/k RMSNorm (1 + w), partial RoPE, GQA, sigmoid gate before o_proj."""

    kind = "gqa"

    def __init__(self, w: dict, spec, heads: int, kv_heads: int, partial: bool):
        self.w, self.spec = w, spec
        self.H, self.Hk, self.partial = heads, kv_heads, partial     # this rank's heads

    @property
    def kv_token_shapes(self) -> list[tuple[int, ...]]:
        return [(self.Hk, self.spec.head_dim), (self.Hk, self.spec.head_dim)]

    @property
    def prefill_shape(self) -> tuple[int, int, int, int]:
        """(heads, kv heads, key dim, value dim) of this layer's _attend calls."""
        return self.H, self.Hk, self.spec.head_dim, self.spec.head_dim

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "GatedAttention":
        keep_cudnn_out_of_sdpa(device)
        D, H, Hk, hd = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        p = prefix + "self_attn."
        heads, kv_heads = share.part(H), share.kv_heads(H, Hk)
        split = heads is not None and kv_heads is not None
        shapes = {"q_proj": (H * hd * 2, D), "k_proj": (Hk * hd, D), "v_proj": (Hk * hd, D), "o_proj": (D, H * hd)}
        # q_proj interleaves each head's query and gate rows: a head is 2 * hd consecutive rows
        rows = {"q_proj": blocks(heads, 2 * hd), "k_proj": blocks(kv_heads, hd),
                "v_proj": blocks(kv_heads, hd)} if split else {}
        cols = {"o_proj": blocks(heads, hd)} if split else {}
        w = {n: load(src, p + n + ".weight", s, dtype, device, rows.get(n), cols.get(n)) for n, s in shapes.items()}
        if spec.attention_bias:
            for n, s in shapes.items():
                if n != "o_proj":
                    w[n + ".bias"] = load(src, p + n + ".bias", (s[0],), dtype, device, rows.get(n))
                elif not split or share.owns_bias:
                    w[n + ".bias"] = load(src, p + n + ".bias", (D,), dtype, device)
        w["q_norm"] = load(src, p + "q_norm.weight", (hd,), dtype, device)
        w["k_norm"] = load(src, p + "k_norm.weight", (hd,), dtype, device)
        return cls(w, spec, len(heads) if split else H, len(kv_heads) if split else Hk, split)

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv, layer: int, fused: bool = False) -> torch.Tensor:
        """fused: accepted for the model's one call signature (this layer's norms stay torch's)."""
        s, w, T = self.spec, self.w, x.shape[0]
        H, Hk, hd, eps = self.H, self.Hk, s.head_dim, s.rms_norm_eps
        qg = linear(x, w["q_proj"], w.get("q_proj.bias")).view(T, H, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
        q = rms_norm(q, w["q_norm"], eps, offset=True)
        k = rms_norm(linear(x, w["k_proj"], w.get("k_proj.bias")).view(T, Hk, hd), w["k_norm"], eps, offset=True)
        v = linear(x, w["v_proj"], w.get("v_proj.bias")).view(T, Hk, hd)
        cos, sin = rope_cos_sin(batch.positions, s.rotary_dim, s.rope_theta, x.dtype)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        if batch.paged is not None:
            # triton: GPU decode only
            from trtllm_dasc.model.kernels.decode_attention import paged_decode_attention
            tables, lens, new_rows = batch.paged
            kv.write(layer, new_rows, [k, v])
            k_pool, v_pool = kv.pools[layer]
            out = paged_decode_attention(q.contiguous(), k_pool, v_pool, tables, lens, hd ** -0.5)
            return linear(out.reshape(T, H * hd) * torch.sigmoid(gate), w["o_proj"], w.get("o_proj.bias"))
        out = torch.empty(T, H, hd, dtype=x.dtype, device=x.device)
        for i, (a, b) in enumerate(zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:])):
            index, start = batch.kv_index[i], batch.starts[i]
            kv.write(layer, index[start:], [k[a:b], v[a:b]])
            k_all, v_all = kv.read(layer, index)
            out[a:b] = _attend(q[a:b], k_all, v_all, start)
        out = out.reshape(T, H * hd) * torch.sigmoid(gate)
        return linear(out, w["o_proj"], w.get("o_proj.bias"))


class MLAttention:
    """kimi_linear MLA (DeepSeek-V2 style, NoPE): optional q LoRA, compressed kv latent + shared k_rope part."""

    kind = "mla"

    def __init__(self, w: dict, spec, heads: int, partial: bool):
        self.w, self.spec = w, spec
        self.H, self.partial = heads, partial

    @property
    def kv_token_shapes(self) -> list[tuple[int, ...]]:
        # the latent is shared by every head: each rank caches all of it
        return [(1, self.spec.kv_lora_rank + self.spec.qk_rope_head_dim)]

    @classmethod
    def load(cls, src, prefix: str, spec, dtype, device, share: RankShare = RankShare()) -> "MLAttention":
        keep_cudnn_out_of_sdpa(device)
        s, p = spec, prefix + "self_attn."
        D, H, qk = s.hidden_size, s.num_attention_heads, s.qk_head_dim
        heads = share.part(H)
        shapes = {"kv_a_proj_with_mqa": (s.kv_lora_rank + s.qk_rope_head_dim, D), "kv_a_layernorm": (s.kv_lora_rank,),
                  "kv_b_proj": (H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank),
                  "o_proj": (D, H * s.v_head_dim)}
        if s.q_lora_rank is None:
            shapes["q_proj"] = (H * qk, D)
        else:
            shapes.update(q_a_proj=(s.q_lora_rank, D), q_a_layernorm=(s.q_lora_rank,), q_b_proj=(H * qk, s.q_lora_rank))
        rows, cols = {}, {}
        if heads is not None:
            # per head: its query rows, its kv_b rows (nope keys + values), its o_proj columns
            rows = {"q_proj": blocks(heads, qk), "q_b_proj": blocks(heads, qk),
                    "kv_b_proj": blocks(heads, s.qk_nope_head_dim + s.v_head_dim)}
            cols = {"o_proj": blocks(heads, s.v_head_dim)}
        w = {n: load(src, p + n + ".weight", shape, dtype, device, rows.get(n), cols.get(n))
             for n, shape in shapes.items()}
        if s.attention_bias:
            for n in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj"):
                if n in shapes and (n != "o_proj" or heads is None or share.owns_bias):
                    w[n + ".bias"] = load(src, p + n + ".bias", (shapes[n][0],), dtype, device)
        return cls(w, spec, H if heads is None else len(heads), heads is not None)

    def forward(self, x: torch.Tensor, batch: AttnBatch, kv, layer: int, fused: bool = False) -> torch.Tensor:
        """fused: the latent's RMSNorm in fla's one kernel (model.py passes it with the fused mixers on a GPU;
        in torch it is six small kernels, which count in a decode step)."""
        s, w, T = self.spec, self.w, x.shape[0]
        H, nope, rope, lora, vd = (self.H, s.qk_nope_head_dim, s.qk_rope_head_dim,
                                   s.kv_lora_rank, s.v_head_dim)
        if s.q_lora_rank is None:
            q = linear(x, w["q_proj"])
        else:
            # transformers builds q_a_layernorm / kv_a_layernorm with the default eps 1e-6, not rms_norm_eps
            q = linear(rms_norm(linear(x, w["q_a_proj"], w.get("q_a_proj.bias")), w["q_a_layernorm"], 1e-6, False),
                       w["q_b_proj"])
        q = q.view(T, H, nope + rope)
        ckv = linear(x, w["kv_a_proj_with_mqa"], w.get("kv_a_proj_with_mqa.bias"))
        if batch.paged is not None and fused:
            # a decode step: the new latent rows normed into the pool in one kernel, no latent tensor
            return linear(self._decode(q, ckv, batch, kv, layer, raw=True).reshape(T, H * vd), w["o_proj"],
                          w.get("o_proj.bias"))
        if fused:
            from trtllm_dasc.model.fused_ops import add_rms_norm
            normed, _ = add_rms_norm(ckv[:, :lora], None, w["kv_a_layernorm"], 1e-6)
        else:
            normed = rms_norm(ckv[:, :lora], w["kv_a_layernorm"], 1e-6, False)
        latent = torch.cat([normed, ckv[:, lora:]], dim=-1)
        if batch.paged is not None:
            return linear(self._decode(q, latent, batch, kv, layer).reshape(T, H * vd), w["o_proj"],
                          w.get("o_proj.bias"))
        out = torch.empty(T, H, vd, dtype=x.dtype, device=x.device)
        whole = len(batch.cu_seqlens) == 2
        for i, (a, b) in enumerate(zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:])):
            index, start = batch.kv_index[i], batch.starts[i]
            kv.write(layer, index[start:], [latent[a:b, None]])
            if _takes_cudnn(b - a, start, q):
                # from position 0 the cached rows are the ones just written: no gather of them back (the pool
                # may hold another dtype: then they are read, as written); the whole batch one sequence:
                # its output as it comes (at 16k tokens the gather and the output copy took 0.1 ms a layer)
                same = kv.pools[layer][0].dtype == latent.dtype
                cached = latent[a:b] if same else kv.read(layer, index)[0][:, 0]
                res = self._cudnn_prefill(q[a:b], cached)
                if whole:
                    return linear(res.reshape(T, H * vd), w["o_proj"], w.get("o_proj.bias"))
                out[a:b] = res
                continue
            (cached,) = kv.read(layer, index)
            S = cached.shape[0]
            kvx = linear(cached[:, 0, :lora], w["kv_b_proj"]).view(S, H, nope + vd)
            k = torch.cat([kvx[..., :nope], cached[:, :, lora:].expand(S, H, rope)], dim=-1)
            out[a:b] = _attend(q[a:b], k, kvx[..., nope:], start)
        return linear(out.reshape(T, H * vd), w["o_proj"], w.get("o_proj.bias"))

    @functools.cached_property
    def kv_b_keys_values(self) -> torch.Tensor:
        """kv_b_proj extended over the whole cached row [latent | rope]: per head its nope key rows (zero on the
        rope columns), then rope identity rows (the shared rope part copied through, exactly), then its value
        rows; [H * (nope + rope + vd), lora + rope]. One GEMM of the cached rows gives every head's whole key
        and its value side by side, where the prefill otherwise concatenated a [S, H, nope + rope] key copy."""
        s, H = self.spec, self.H
        nope, rope, lora, vd = s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim
        kv_b = self.w["kv_b_proj"].view(H, nope + vd, lora)
        ext = kv_b.new_zeros(H, nope + rope + vd, lora + rope)
        ext[:, :nope, :lora] = kv_b[:, :nope]
        ext[:, nope:nope + rope, lora:] = torch.eye(rope, dtype=kv_b.dtype, device=kv_b.device)
        ext[:, nope + rope:, :lora] = kv_b[:, nope:]
        return ext.view(-1, lora + rope)

    def _cudnn_prefill(self, q: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        """Attention of a long prefill from position 0 on cuDNN: q [T, H, nope + rope], cached [T, lora + rope]
        (this sequence's rows). The rows are padded to the cuDNN bucket before the GEMM, so keys and values
        are views of one [T', H, nope + rope + vd] output with the same strides at every length (the layout
        warm_long_prefill builds the graphs for). Returns [T, H, vd]."""
        s, H, T = self.spec, self.H, q.shape[0]
        E = s.qk_nope_head_dim + s.qk_rope_head_dim
        pad = -T % CUDNN_BUCKET
        kvx = linear(F.pad(cached, (0, 0, 0, pad)) if pad else cached, self.kv_b_keys_values).view(T + pad, H, -1)
        q = F.pad(q, (0, 0, 0, 0, 0, pad)) if pad else q.contiguous()
        return _cudnn_sdpa(q, kvx[..., :E], kvx[..., E:])[:T]

    def warm_long_prefill(self, max_tokens: int) -> int:
        """Build cuDNN's graphs of _cudnn_prefill for every bucket up to max_tokens (zeros through this
        layer's own path: the layout is the real one). Returns the calls made."""
        s, calls = self.spec, 0
        dev, dtype = self.w["kv_b_proj"].device, self.w["kv_b_proj"].dtype
        for T in long_prefill_lengths(max_tokens, dev, dtype):
            q = torch.zeros(T, self.H, s.qk_nope_head_dim + s.qk_rope_head_dim, device=dev, dtype=dtype)
            self._cudnn_prefill(q, torch.zeros(T, s.kv_lora_rank + s.qk_rope_head_dim, device=dev, dtype=dtype))
            calls += 1
        return calls

    def _decode(self, q, latent, batch: AttnBatch, kv, layer: int, raw: bool = False) -> torch.Tensor:
        """A decode step in MLA's absorbed form: the query's nope part is taken into the latent space
        (q_nope W_kb per head), attention runs over the cached latent rows as one shared head (keys: the
        whole row, values: its lora part), and W_vb maps the result out. Same product as expanding every
        cached row through kv_b_proj (the prefill path), without that S x kv_b work per step.
        latent: the new tokens' cache rows; raw: kv_a_proj's output instead, which
        decode_attention.latent_write norms into the pool in one kernel (the fused path)."""
        # triton: GPU only
        from trtllm_dasc.model.kernels.decode_attention import latent_write, paged_decode_attention
        s, H = self.spec, self.H
        nope, rope, lora, vd = s.qk_nope_head_dim, s.qk_rope_head_dim, s.kv_lora_rank, s.v_head_dim
        tables, lens, new_rows = batch.paged
        (pool,) = kv.pools[layer]
        if raw:
            latent_write(latent, self.w["kv_a_layernorm"], pool, new_rows, 1e-6)
        else:
            kv.write(layer, new_rows, [latent[:, None]])
        kv_b = self.w["kv_b_proj"].view(H, nope + vd, lora)
        q_lat = torch.einsum("bhn,hnl->bhl", q[..., :nope], kv_b[:, :nope])
        if q_lat.stride(-1) != 1:
            q_lat = q_lat.contiguous()
        # the query as two tensors (latent part, rope part as q holds it): no concatenated copy
        o_lat = paged_decode_attention(q_lat, pool, pool, tables, lens, (nope + rope) ** -0.5, dv=lora,
                                       q_rope=q[..., nope:])
        return torch.einsum("bhl,hvl->bhv", o_lat, kv_b[:, nope:])
