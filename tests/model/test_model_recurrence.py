"""The torch reference recurrence (chunked, varlen, h0 -> ht) equals transformers' token-by-token loops,
and run_recurrence's boundary states equal running the prefix alone."""
from __future__ import annotations

import inspect
import math

import pytest
import torch
from transformers.models.kimi_linear.modeling_kimi_linear import recurrent_kimi_delta_attention
from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule

from trtllm_dasc.model.recurrence import get_backend, naive, run_recurrence


def _inputs(kind, lens, H, HV, K, V, seed):
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lens), len(lens)
    q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
    v = torch.randn(1, T, HV, V, generator=g)
    gshape = (1, T, HV) if kind == "gdn" else (1, T, HV, K)
    # log decays in (log 0.2, log 0.999)
    gate = -torch.empty(gshape).uniform_(-math.log(0.999), -math.log(0.2), generator=g)
    beta = torch.rand(1, T, HV, generator=g)
    h0 = torch.randn(N, HV, K, V, generator=g) * 0.3
    return q, k, v, gate, beta, h0


def _reference(kind, q, k, v, g, beta, h0):
    # transformers swaps in fla's fused kernel (CUDA tensors only) where fla is installed, as on the GPU
    # machine: unwrap to its own token loop, the independent reference
    fn = inspect.unwrap(torch_recurrent_gated_delta_rule if kind == "gdn" else recurrent_kimi_delta_attention)
    # grouped value heads: each q/k head serves HV / H value heads (the model's repeat_interleave). Newer
    # transformers repeat inside the loop, older ones (5.17, the GPU machine's) expect it done: do it here
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)


CASES = [("gdn", 2, 6, 24, 40), ("gdn", 3, 3, 16, 16), ("kda", 3, 3, 24, 24), ("kda", 1, 1, 40, 40)]


@pytest.mark.parametrize("kind, H, HV, K, V", CASES, ids=[f"{c[0]}-H{c[1]}-HV{c[2]}-K{c[3]}-V{c[4]}" for c in CASES])
def test_reference_matches_transformers_varlen(kind, H, HV, K, V):
    lens = [1, 130, 64, 7]
    q, k, v, g, beta, h0 = _inputs(kind, lens, H, HV, K, V, seed=H * K)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    o, ht = getattr(naive, kind)(q, k, v, g, beta, h0, cu)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        ro, rh = _reference(kind, q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], h0[i:i + 1])
        torch.testing.assert_close(o[:, a:b], ro, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ht[i], rh[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_boundary_states_equal_prefix_runs(kind):
    # kimi's KDA has one head count for q/k and v; gdn groups value heads
    lens, H, HV, K, V = [100, 5, 70], (2 if kind == "gdn" else 3), (4 if kind == "gdn" else 3), 16, 8
    q, k, v, g, beta, h0 = _inputs(kind, lens, H, HV, K, V, seed=5)
    cu = [0, 100, 105, 175]
    cuts = [[1, 64, 99, 100], [], [3, 70]]
    o, ht, hb = run_recurrence(get_backend("torch"), kind, q, k, v, g, beta, h0, cu, cuts)
    o_plain, ht_plain = getattr(naive, kind)(q, k, v, g, beta, h0, cu)
    torch.testing.assert_close(o, o_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ht, ht_plain, rtol=1e-5, atol=1e-6)
    assert hb.shape == (6, HV, K, V)
    rows = [(0, 1), (0, 64), (0, 99), (0, 100), (2, 3), (2, 70)]
    for row, (i, p) in enumerate(rows):
        a = cu[i]
        _, rh = _reference(kind, q[:, a:a + p], k[:, a:a + p], v[:, a:a + p], g[:, a:a + p], beta[:, a:a + p],
                           h0[i:i + 1])
        torch.testing.assert_close(hb[row], rh[0], rtol=1e-4, atol=1e-5)


class _ChunkStatesBackend:
    """The torch reference with a `<kind>_chunk_states` as fla's backend offers (recurrence/fla.py): the state
    at each chunk start computed by transformers' token loop over the prefix (brute force, independent of
    the code under test), chunks of 16 tokens."""
    CHUNK = 16
    gdn, kda = staticmethod(naive.gdn), staticmethod(naive.kda)

    def __init__(self, kind):
        setattr(self, f"{kind}_chunk_states", lambda *a, **kw: self._states(kind, *a, **kw))
        self.calls = 0

    def _states(self, kind, q, k, v, g, beta, h0, cu):
        self.calls += 1
        o, ht = getattr(naive, kind)(q, k, v, g, beta, h0, cu)
        chunks = []
        for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
            for start in range(0, b - a, self.CHUNK):
                if start == 0:
                    chunks.append(h0[i].float())
                else:
                    sl = slice(a, a + start)
                    chunks.append(_reference(kind, q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl],
                                             h0[i:i + 1])[1][0])
        return o, ht, torch.stack(chunks), self.CHUNK


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_boundary_states_from_chunk_states(kind):
    # a backend that keeps its chunk-start states (fla's, on a GPU) takes one call for every cut of the batch:
    # cuts on a chunk boundary (16, 48), off one (1, 21, 50: replayed from the boundary below), at the end
    # (64), in sequences of several chunks and of less than one; each against the prefix run alone
    lens, H, HV, K, V = [64, 5, 53], (2 if kind == "gdn" else 3), (4 if kind == "gdn" else 3), 16, 8
    q, k, v, g, beta, h0 = _inputs(kind, lens, H, HV, K, V, seed=6)
    cu = [0, 64, 69, 122]
    cuts = [[1, 16, 21, 48, 64], [3], [16, 50]]
    backend = _ChunkStatesBackend(kind)
    o, ht, hb = run_recurrence(backend, kind, q, k, v, g, beta, h0, cu, cuts)
    assert backend.calls == 1
    o_plain, ht_plain = getattr(naive, kind)(q, k, v, g, beta, h0, cu)
    torch.testing.assert_close(o, o_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ht, ht_plain, rtol=1e-5, atol=1e-6)
    rows = [(i, p) for i, c in enumerate(cuts) for p in c]
    assert hb.shape == (len(rows), HV, K, V)
    for row, (i, p) in enumerate(rows):
        a = cu[i]
        _, rh = _reference(kind, q[:, a:a + p], k[:, a:a + p], v[:, a:a + p], g[:, a:a + p], beta[:, a:a + p],
                           h0[i:i + 1])
        torch.testing.assert_close(hb[row], rh[0], rtol=1e-4, atol=1e-5, msg=f"cut {p} of sequence {i}")


def test_backend_selection():
    from trtllm_dasc.errors import UserError
    assert get_backend("auto", "cpu") is naive
    assert get_backend("torch", "cpu") is naive
    with pytest.raises(UserError):
        get_backend("triton")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="unavailable"):
            get_backend("fla", "cpu")
