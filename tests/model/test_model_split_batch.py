"""Continuation is exact: split prefill (export state + KV, import into fresh objects) equals one prefill;
a batch of different-length prompts equals running them one by one; checkpoints captured mid-prefill
equal the state after prefilling exactly that prefix (checked against transformers' cache)."""
from __future__ import annotations

import pytest
import torch
from hybrid_tiny import VOCAB, assert_logits_close, hf_logits

from trtllm_dasc.model import HybridModel
from trtllm_dasc.model.direct import DirectRunner


def _ids(T, seed):
    return torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models(tiny):
    return {arch: (HybridModel.from_pretrained(tiny(arch)[0]), tiny(arch)[1]) for arch in ("gdn", "kda")}


def _split_run(model, ids, k, block_size=4):
    a = DirectRunner(model, rows=3, max_tokens=80, block_size=block_size)
    first = a.run(ids[:k], row=2).logits
    rows, cached = a.state.export_rows([2]), a.kv.export_tokens(a.table(2), k)
    # fresh objects: nothing carries over but the exported state and KV
    b = DirectRunner(model, rows=1, max_tokens=80, block_size=block_size)
    b.state.import_rows([0], rows)
    b.kv.import_tokens(b.table(0), cached)
    b.lengths[0] = k
    rest = b.run(ids[k:], row=0).logits
    return torch.cat([first, rest])


@pytest.mark.parametrize("arch", ["gdn", "kda"])
@pytest.mark.parametrize("k", [1, 3, 17, 64, 69])
def test_split_equals_unsplit(models, arch, k):
    model, _ = models[arch]
    ids = _ids(70, k)
    full = model.prefill(ids)
    split = _split_run(model, ids, k)
    assert_logits_close(split, full, rel=1e-5)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_token_by_token_decode_equals_transformers(models, arch):
    model, hf = models[arch]
    ids = _ids(12, 5)
    r = DirectRunner(model, rows=1, max_tokens=12, block_size=4)
    out = torch.cat([r.run(ids[t:t + 1]).logits for t in range(12)])
    assert_logits_close(out, hf_logits(hf, ids))


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_batch_equals_one_by_one(models, arch):
    model, hf = models[arch]
    prompts = [_ids(n, n) for n in (5, 33, 1, 70)]
    r = DirectRunner(model, rows=6, max_tokens=80, block_size=8)
    row_ids = (4, 0, 5, 2)
    out = r.forward([r.seq(p, row) for p, row in zip(prompts, row_ids)])
    for i, p in enumerate(prompts):
        rows = out.logits[out.cu_seqlens[i]:out.cu_seqlens[i + 1]]
        assert_logits_close(rows, hf_logits(hf, p))
    # a second batched step continues each sequence from its own state and cache
    nxt = [_ids(n, 100 + n) for n in (3, 1, 4, 2)]
    out2 = r.forward([r.seq(t, row) for t, row in zip(nxt, row_ids)], logits="last")
    for i, (p, t) in enumerate(zip(prompts, nxt)):
        assert_logits_close(out2.logits[i:i + 1], hf_logits(hf, torch.cat([p, t]))[-1:])


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_captures_equal_prefix_states(models, arch):
    """States captured at prefix lengths p equal transformers' cache after prefilling ids[:p]."""
    model, hf = models[arch]
    ids = _ids(50, 9)
    r = DirectRunner(model, rows=2, max_tokens=64, block_size=16)
    r.run(ids[:6], row=1)
    caps = (16, 32, 48, 50)
    out = r.forward([r.seq(_ids(9, 1), 0, capture_at=(4,)), r.seq(ids[6:], 1, capture_at=caps)])
    assert out.capture_seq == [0, 1, 1, 1, 1] and out.capture_pos == [4, *caps]
    L = model.cfg.num_linear_layers
    assert out.capture_temporal.shape[:2] == (5, L) and out.capture_conv.shape[:2] == (5, L)
    for j, p in enumerate(caps):
        with torch.no_grad():
            cache = hf(ids[:p][None], use_cache=True).cache
        for l, layer in enumerate(model.cfg.linear_layers):
            torch.testing.assert_close(out.capture_temporal[1 + j, l], cache.get_recurrent_state(layer)[0].float(),
                                       rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(out.capture_conv[1 + j, l], cache.get_conv_state(layer)[0][:, 1:],
                                       rtol=1e-4, atol=1e-5)
    # the capture at the prompt end is the final state
    torch.testing.assert_close(out.capture_temporal[-1], r.state.temporal[:, 1], rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_rows_in_order_and_out_of_order_give_the_same_states(models, arch):
    # a batch whose state rows are consecutive reads and writes them as a slice (model._linear's row_range),
    # any other order through a gather and a scatter: both paths, the same sequences, the same results,
    # and a row no sequence uses untouched
    model, _ = models[arch]
    prompts = [_ids(n, 40 + n) for n in (9, 14, 5)]
    out = {}
    for name, rows in (("slice", [1, 2, 3]), ("gather", [3, 1, 2])):
        r = DirectRunner(model, rows=5, max_tokens=48, block_size=4)
        idle = r.state.temporal[:, [0, 4]].clone()
        logits = r.forward([r.seq(p, row) for p, row in zip(prompts, rows)], "last").logits
        assert torch.equal(r.state.temporal[:, [0, 4]], idle)
        out[name] = (logits, r.state.temporal[:, rows].clone(), r.state.conv[:, rows].clone())
    for a, b in zip(out["slice"], out["gather"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
