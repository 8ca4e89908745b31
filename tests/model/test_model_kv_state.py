"""Paged KV cache addressing (block tables, exact pool positions, block copies) and state row export/import."""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model import KVCacheConfig, PagedKVCache, RecurrentState


def _kv(num_blocks=6, block_size=4):
    return PagedKVCache(KVCacheConfig(num_layers=2, token_shapes=[(2, 3), (2, 3)], num_blocks=num_blocks,
                                      block_size=block_size))


def _tok(n, base):
    return torch.arange(n * 6, dtype=torch.float32).view(n, 2, 3) + base


def test_write_read_through_block_tables():
    kv = _kv()
    # a sequence on blocks [4, 1, 3]: position p lives in block table[p // 4], row p % 4
    table = [4, 1, 3]
    index = kv.token_index(table, 0, 9)
    assert index.tolist() == [16, 17, 18, 19, 4, 5, 6, 7, 12]
    for layer in range(2):
        kv.write(layer, index, [_tok(9, 0), _tok(9, 100)])
    k, v = kv.read(1, kv.token_index(table, 0, 9))
    torch.testing.assert_close(k, _tok(9, 0))
    torch.testing.assert_close(v, _tok(9, 100))
    # position 5 sits in block 1, row 1
    assert torch.equal(kv.pools[0][0][1][1], _tok(9, 0)[5])
    with pytest.raises(ValueError, match="cannot hold"):
        kv.token_index(table, 0, 13)
    with pytest.raises(ValueError, match="outside"):
        kv.token_index([0, 6], 0, 5)


def test_copy_blocks_copies_every_layer_and_component():
    kv = _kv()
    for layer in range(2):
        kv.write(layer, kv.token_index([0, 1], 0, 6), [_tok(6, layer), _tok(6, 10 + layer)])
    kv.copy_blocks([(1, 5), (0, 2)])
    for layer in range(2):
        for c in range(2):
            assert torch.equal(kv.pools[layer][c][5], kv.pools[layer][c][1])
            assert torch.equal(kv.pools[layer][c][2], kv.pools[layer][c][0])
    # the copy is a copy: writing the destination leaves the source alone
    kv.write(0, kv.token_index([0, 5], 5, 6), [_tok(1, 50), _tok(1, 50)])
    assert torch.equal(kv.pools[0][0][1][1], _tok(6, 0)[5])
    assert torch.equal(kv.pools[0][0][5][1], _tok(1, 50)[0])


def test_export_import_tokens():
    kv = _kv()
    for layer in range(2):
        kv.write(layer, kv.token_index([3, 0], 0, 5), [_tok(5, layer), _tok(5, 10 + layer)])
    data = kv.export_tokens([3, 0], 5)
    other = _kv(block_size=2)
    other.import_tokens([0, 1, 2], data)
    for layer in range(2):
        for a, b in zip(other.read(layer, other.token_index([0, 1, 2], 0, 5)),
                        kv.read(layer, kv.token_index([3, 0], 0, 5))):
            torch.testing.assert_close(a, b)


def test_state_rows_export_import():
    cfg = HybridConfig(model_type="qwen3_next", arch="gdn", num_hidden_layers=3,
                       layer_types=["linear_attention", "full_attention", "linear_attention"], num_key_heads=2,
                       num_value_heads=4, key_head_dim=3, value_head_dim=5, conv_kernel=4)
    st = RecurrentState.zeros(cfg, 4, tp_size=2, dtype=torch.bfloat16)
    assert st.temporal.shape == (2, 4, 2, 3, 5) and st.temporal.dtype == torch.float32
    assert st.conv.shape == (2, 4, cfg.conv_dim // 2, 3) and st.conv.dtype == torch.bfloat16
    st.temporal.normal_()
    st.conv.normal_()
    rows = st.export_rows([3, 1])
    other = RecurrentState.zeros(cfg, 2, tp_size=2, dtype=torch.bfloat16)
    other.import_rows([0, 1], rows)
    assert torch.equal(other.temporal[:, 0], st.temporal[:, 3]) and torch.equal(other.conv[:, 1], st.conv[:, 1])
    st.reset([3])
    assert st.temporal[:, 3].abs().max() == 0 and torch.equal(rows.temporal[:, 0], other.temporal[:, 0])
    with pytest.raises(ValueError):
        other.import_rows([0], rows)
    with pytest.raises(IndexError):
        other.export_rows([2])


def test_token_index_equals_block_times_size_plus_offset_for_every_span():
    # against the definition, position by position: spans starting and ending inside blocks, empty spans,
    # block sizes 1 to 16, tables longer than the span needs
    import random
    rng = random.Random(0)
    for bs in (1, 2, 4, 16):
        kv = _kv(num_blocks=200, block_size=bs)
        for _ in range(300):
            end = rng.randint(0, 60)
            start = rng.randint(0, end)
            table = rng.sample(range(200), -(-end // bs) + rng.randint(0, 3))
            want = [table[p // bs] * bs + p % bs for p in range(start, end)]
            assert kv.token_index(table, start, end).tolist() == want
