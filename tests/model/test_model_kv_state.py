"""Paged KV cache bookkeeping (exact block ids, refcounts, copy on write) and state row export/import."""
from __future__ import annotations

import pytest
import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model import KVCacheConfig, KVCacheFull, PagedKVCache, RecurrentState


def _kv(num_blocks=6, block_size=4):
    return PagedKVCache(KVCacheConfig(num_layers=2, token_shapes=[(2, 3), (2, 3)], num_blocks=num_blocks,
                                      block_size=block_size))


def _tok(n, base):
    return torch.arange(n * 6, dtype=torch.float32).view(n, 2, 3) + base


def test_blocks_allocated_in_order_and_freed():
    kv = _kv()
    kv.add_sequence("a")
    kv.reserve("a", 9)
    assert kv.block_table("a") == [0, 1, 2] and kv.num_free_blocks == 3
    for layer in range(2):
        kv.write(layer, "a", 0, [_tok(9, 0), _tok(9, 100)])
    kv.commit("a", 9)
    k, v = kv.read(1, "a", 9)
    torch.testing.assert_close(k, _tok(9, 0))
    torch.testing.assert_close(v, _tok(9, 100))
    kv.free_sequence("a")
    assert kv.num_free_blocks == 6 and list(kv.free) == [3, 4, 5, 0, 1, 2]
    kv.sanity_check()


def test_shared_prefix_copy_on_write():
    kv = _kv()
    kv.add_sequence("a")
    kv.reserve("a", 6)
    kv.write(0, "a", 0, [_tok(6, 0), _tok(6, 0)])
    kv.commit("a", 6)
    # the prefix cache keeps a's blocks alive beyond the request
    held = kv.block_table("a")
    kv.incref(held)
    kv.free_sequence("a")
    assert kv.ref[:2] == [1, 1]
    kv.add_sequence("b", blocks=held, length=6)
    assert kv.ref[:2] == [2, 2]
    kv.reserve("b", 7)
    # block 1 was shared and partly filled: b got a private copy (block 2), block 0 stays shared
    assert kv.block_table("b") == [0, 2] and kv.ref[:3] == [2, 1, 1]
    kv.write(0, "b", 6, [_tok(1, 50), _tok(1, 50)])
    kv.commit("b", 7)
    k, _ = kv.read(0, "b", 7)
    torch.testing.assert_close(k[:6], _tok(6, 0))
    torch.testing.assert_close(k[6:], _tok(1, 50))
    # the held copy still holds the original token 5 in its second block
    assert torch.equal(kv.pools[0][0][1][1], _tok(6, 0)[5])
    kv.sanity_check()
    kv.free_sequence("b")
    kv.decref(held)
    assert kv.num_free_blocks == 6
    kv.sanity_check()


def test_full_cache_raises_before_changing_anything():
    kv = _kv(num_blocks=2)
    kv.add_sequence("a")
    with pytest.raises(KVCacheFull):
        kv.reserve("a", 9)
    assert kv.num_free_blocks == 2 and kv.block_table("a") == []
    with pytest.raises(ValueError):
        kv.add_sequence("c", blocks=[0], length=5)


def test_export_import_sequence():
    kv = _kv()
    kv.add_sequence(7)
    kv.reserve(7, 5)
    for layer in range(2):
        kv.write(layer, 7, 0, [_tok(5, layer), _tok(5, 10 + layer)])
    kv.commit(7, 5)
    data = kv.export_sequence(7)
    other = _kv(block_size=2)
    other.import_sequence("x", data)
    assert other.seq_len("x") == 5 and other.block_table("x") == [0, 1, 2]
    for layer in range(2):
        for a, b in zip(other.read(layer, "x", 5), kv.read(layer, 7, 5)):
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
