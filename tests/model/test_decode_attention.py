"""The batched paged decode attention kernel (Triton; the interpreter on the CPU) against its torch reference
and against the eager path's SDPA on the same gathered keys (model/attention.py's _attend)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
# Triton's interpreter reads loop bounds loaded from memory as 1-element arrays (numpy deprecates that)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

from trtllm_dasc.model.attention import _attend  # noqa: E402
from trtllm_dasc.model.kernels.decode_attention import (  # noqa: E402
    paged_decode_attention, paged_decode_attention_ref)

# natively on a GPU; on the CPU in Triton's interpreter (tests/conftest.py sets it without a GPU)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pools(B, H, Hk, DK, DV, lens, bs, seed=0, same_pool=False):
    g = torch.Generator().manual_seed(seed)
    blocks_per = [-(-n // bs) for n in lens]
    num_blocks = sum(blocks_per) + 3
    k_pool = torch.randn(num_blocks, bs, Hk, DK, generator=g)
    v_pool = k_pool if same_pool else torch.randn(num_blocks, bs, Hk, DV, generator=g)
    # block tables: a shuffled pool, padded with -1 past each sequence's blocks (never read)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    width = max(blocks_per) + 1
    tables = torch.full((B, width), -1, dtype=torch.int32)
    for b, nb in enumerate(blocks_per):
        tables[b, :nb] = torch.tensor(perm[:nb], dtype=torch.int32)
        perm = perm[nb:]
    q = torch.randn(B, H, DK, generator=g)
    return (t.to(DEV) for t in (q, k_pool, v_pool, tables, torch.tensor(lens, dtype=torch.int32)))


@pytest.mark.parametrize("H, Hk, DK, DV, bs", [(4, 2, 32, 32, 16), (3, 3, 24, 24, 4), (8, 1, 40, 40, 8)],
                         ids=["gqa", "mha-odd-dim", "mqa"])
def test_gqa_matches_reference_and_sdpa(H, Hk, DK, DV, bs):
    lens = [1, 5, 16, 17, 70]
    q, k_pool, v_pool, tables, seq_lens = _pools(len(lens), H, Hk, DK, DV, lens, bs)
    scale = DK ** -0.5
    got = paged_decode_attention(q, k_pool, v_pool, tables, seq_lens, scale)
    ref = paged_decode_attention_ref(q, k_pool, v_pool, tables, seq_lens, scale)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for b, n in enumerate(lens):
        t = torch.arange(n, device=DEV)
        rows = tables[b].long()[t // bs] * bs + t % bs
        k = k_pool.reshape(-1, Hk, DK)[rows]
        v = v_pool.reshape(-1, Hk, DV)[rows]
        sdpa = _attend(q[b:b + 1], k, v, n - 1)[0]          # the eager decode path: one query, all keys
        torch.testing.assert_close(got[b], sdpa, rtol=1e-5, atol=1e-5)


def test_mla_absorbed_layout_reads_the_value_as_the_latent_head():
    # one shared latent pool: keys are the whole row (lora + rope), values its first dv columns
    lens, lora, rope = [3, 33], 32, 8
    q, pool, _, tables, seq_lens = _pools(2, 4, 1, lora + rope, lora, lens, 16, seed=1, same_pool=True)
    got = paged_decode_attention(q, pool, pool, tables, seq_lens, 0.1, dv=lora)
    ref = paged_decode_attention_ref(q, pool, pool, tables, seq_lens, 0.1, dv=lora)
    assert got.shape == (2, 4, lora)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # against the softmax written out for one sequence
    t = torch.arange(33, device=DEV)
    k = pool.reshape(-1, 1, lora + rope)[tables[1].long()[t // 16] * 16 + t % 16, 0]
    p = torch.softmax(0.1 * q[1] @ k.T, dim=-1)
    torch.testing.assert_close(got[1], p @ k[:, :lora], rtol=1e-5, atol=1e-5)


def test_mla_query_in_two_tensors_matches_the_concatenated_query():
    # the MLA decode passes its latent query and the rope part where q_proj left it (a strided view)
    lens, lora, rope = [3, 40], 32, 8
    q, pool, _, tables, seq_lens = _pools(2, 4, 1, lora + rope, lora, lens, 16, seed=5, same_pool=True)
    wide = torch.randn(2, 4, 3 * rope, generator=torch.Generator().manual_seed(5)).to(DEV)
    wide[..., rope:2 * rope] = q[..., lora:]
    got = paged_decode_attention(q[..., :lora].contiguous(), pool, pool, tables, seq_lens, 0.1, dv=lora,
                                 q_rope=wide[..., rope:2 * rope])
    ref = paged_decode_attention_ref(q, pool, pool, tables, seq_lens, 0.1, dv=lora)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_latent_write_norms_the_rows_into_the_pool_and_touches_no_other():
    from trtllm_dasc.model.kernels.decode_attention import latent_write, latent_write_reference
    g = torch.Generator().manual_seed(6)
    lora, rope = 48, 8
    # kv_a's output: a [B, lora + rope] slice of something wider, as a strided view
    ckv = (torch.randn(3, lora + rope + 5, generator=g) * 3).to(DEV)[:, :lora + rope]
    weight = torch.rand(lora, generator=g).to(DEV) + 0.5
    pool = torch.full((4, 4, 1, lora + rope), float("nan"), device=DEV)
    ref = pool.clone()
    rows = torch.tensor([5, 0, 14], device=DEV)
    latent_write(ckv, weight, pool, rows, 1e-6)
    latent_write_reference(ckv, weight, ref, rows, 1e-6)
    flat, flat_ref = pool.view(-1, lora + rope), ref.view(-1, lora + rope)
    torch.testing.assert_close(flat[rows], flat_ref[rows], rtol=1e-5, atol=1e-5)
    others = torch.ones(16, dtype=torch.bool, device=DEV)
    others[rows] = False
    assert flat[others].isnan().all()


def test_bf16_inputs_keep_fp32_sums():
    lens = [200, 1]
    q, k_pool, v_pool, tables, seq_lens = _pools(2, 2, 2, 64, 64, lens, 16, seed=2)
    got = paged_decode_attention(q.bfloat16(), k_pool.bfloat16(), v_pool.bfloat16(), tables, seq_lens, 0.125)
    ref = paged_decode_attention_ref(q.bfloat16().float(), k_pool.bfloat16().float(), v_pool.bfloat16().float(),
                                     tables, seq_lens, 0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, rtol=1e-2, atol=1e-2)


def _paged_against_sdpa(model, prompts, rows: int, max_tokens: int, step):
    """Prefill `prompts` (rows 0, 1, ...) on the SDPA path, then run step(runner) -> logits from there once
    on the per-sequence SDPA path and once through the paged kernel: logits and layer 0's KV must agree.
    The prompts take the SDPA path in both arms: on a GPU fla's chunk kernels take fp32 matmuls as tf32,
    so rounding-level attention differences in a prefill would come back larger."""
    from trtllm_dasc.model.direct import DirectRunner
    results = []
    for paged in (False, True):
        model.paged_attention = False
        r = DirectRunner(model, rows=rows, max_tokens=max_tokens, block_size=4)
        for row, p in enumerate(prompts):
            r.run(p, row=row, logits="none")
        model.paged_attention = paged
        results.append((step(r), [t.clone() for t in r.kv.pools[0]]))
    model.paged_attention = None
    (eager, eager_kv), (paged, paged_kv) = results
    torch.testing.assert_close(paged, eager, rtol=1e-4, atol=1e-4)
    for a, b in zip(paged_kv, eager_kv):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_model_decode_steps_match_the_eager_path(tmp_path, arch):
    # three sequences of different lengths prefilled, then decode steps: the kernel path (Triton's
    # interpreter here) against the per-sequence SDPA path, logits and KV alike. The MLA latent is wider
    # than the nope part, so a softmax scale taken from the wrong width shows
    from hybrid_tiny import decode_case
    model, prompts, steps = decode_case(tmp_path, arch, 5, (5, 17, 33), 3, DEV,
                                        **({"kv_lora_rank": 24} if arch == "kda" else {}))
    _paged_against_sdpa(model, prompts, 3, 64, lambda r: torch.cat(
        [r.forward([r.seq(steps[i, row:row + 1], row) for row in range(3)], "last").logits for i in range(3)]))


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_short_chunks_after_a_prefix_match_the_eager_path(tmp_path, arch):
    # what a step of checkpoint hits and wr replays runs: several sequences, each a few new tokens after a
    # cached prefix (different lengths, one crossing a block edge) or none, all through the paged kernel
    # with one query row per token (causal: a row sees keys up to its own position), against the
    # per-sequence SDPA path with its lower-right causal mask; logits of every token and the KV written
    from hybrid_tiny import decode_case
    model, prompts, _ = decode_case(tmp_path, arch, 7, (6, 11, 19), 1, DEV,
                                    **({"kv_lora_rank": 24} if arch == "kda" else {}))
    # three continue a prefix, the fourth (row 3) starts fresh: a new prompt in the same step
    chunks = [p[:n] for p, n in zip(prompts, (2, 5, 3))] + [prompts[2][3:12]]
    _paged_against_sdpa(model, prompts, 4, 32,
                        lambda r: r.forward([r.seq(c, row) for row, c in enumerate(chunks)], "all").logits)


@pytest.mark.parametrize("splits", [2, 7])
def test_key_splits_combine_to_the_reference(splits):
    # a sequence of one key with 7 splits leaves six of them empty (max -inf, weight 0)
    lens = [1, 9, 70, 200]
    q, k_pool, v_pool, tables, seq_lens = _pools(len(lens), 4, 2, 32, 32, lens, 8, seed=4)
    got = paged_decode_attention(q, k_pool, v_pool, tables, seq_lens, 0.2, splits=splits)
    ref = paged_decode_attention_ref(q, k_pool, v_pool, tables, seq_lens, 0.2)
    assert not got.isnan().any()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_combine_kernel_matches_its_torch_reference_with_empty_splits():
    from trtllm_dasc.model.kernels.decode_attention import _combine, _combine_kernel, _pow2
    g = torch.Generator().manual_seed(9)
    B, H, S, DV = 2, 3, 5, 40
    o_part = torch.randn(B, H, S, DV, generator=g)
    ml = torch.stack([torch.randn(B, H, S, generator=g) * 3, torch.rand(B, H, S, generator=g) + 0.5], -1)
    ml[0, :, 3:, 0], ml[0, :, 3:, 1], o_part[0, :, 3:] = float("-inf"), 0.0, 0.0     # splits without keys
    o_part, ml = o_part.to(DEV), ml.to(DEV)
    out = torch.full((B, H, DV), float("nan"), device=DEV)
    _combine_kernel[(B * H, 3)](o_part, ml, out, S, DV, BLOCK_S=max(16, _pow2(S)), BLOCK_D=16)
    torch.testing.assert_close(out, _combine(o_part, ml), rtol=1e-5, atol=1e-5)


def test_paged_attention_takes_batches_up_to_the_token_limit(tmp_path):
    # with the paged path on, a batch whose longest sequence brings PAGED_MAX_TOKENS tokens gets per-token
    # tables (one row per new token, lengths position + 1); one token more and it takes the SDPA path
    from hybrid_tiny import decode_case
    from trtllm_dasc.model.direct import DirectRunner
    from trtllm_dasc.model.model import PAGED_MAX_TOKENS
    model, _, _ = decode_case(tmp_path, "kda", 8, (3,), 1, "cpu")
    model.paged_attention = True
    r = DirectRunner(model, rows=2, max_tokens=2 * PAGED_MAX_TOKENS + 8, block_size=4)
    for n, paged in ((PAGED_MAX_TOKENS, True), (PAGED_MAX_TOKENS + 1, False)):
        batch = [r.seq([1] * n, 0), r.seq([2] * 3, 1)]
        _, _, kv_index, _, tables = model._prepare(batch, r.state, r.kv, "last")
        assert (tables is not None) == paged and (kv_index is None) == paged
        if paged:
            assert tables[0].shape[0] == n + 3
            assert tables[1].tolist() == list(range(1, n + 1)) + [1, 2, 3]
    model.paged_attention = None


def test_token_tables_refuse_a_table_too_short_for_the_new_tokens():
    from trtllm_dasc.model.kv_cache import KVCacheConfig, PagedKVCache
    kv = PagedKVCache(KVCacheConfig(1, [(1, 8)], 6, 4, torch.float32, "cpu"))
    tables, lens, rows = kv.token_tables([[3, 1], [5]], [2, 0], [6, 4])
    assert lens.tolist() == [3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
    assert rows.tolist() == [14, 15, 4, 5, 6, 7, 20, 21, 22, 23]
    with pytest.raises(ValueError, match="cannot hold"):
        kv.token_tables([[3, 1], [5]], [2, 0], [7, 4])         # 9 tokens need 3 blocks of 4
    with pytest.raises(ValueError, match="outside"):
        kv.token_tables([[3, 9]], [2], [3])
