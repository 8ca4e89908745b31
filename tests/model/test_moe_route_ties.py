"""The fused router's tie rule (moe/route_kernel.py) on deliberately tied scores, for both routers: Kimi
(sigmoid, correction bias, grouped top-k) and Qwen (softmax top-k). Equal scores go to the lower expert id,
equal group scores to the lower group id, in every position of the selection: the kernel's ids equal a
reference that sorts stably (best first, lower id first among equals). transformers' own routers
(KimiLinearTopkRouter, Qwen3NextTopKRouter) and the layers' torch route() take torch.topk's order among equal
values, which is not promised to be the lower id (on the CPU it often is not): against them the kernel picks
the same multiset of scores (so the same routing weights, within a few ulps), differing at most in which of
the equally scored experts it takes. Triton's interpreter on CPU tensors.

The logits are exact: token t's hidden state is the unit vector e_t, so its logits are column t of the router
weight, set to multiples of 1/16; tied experts share a logit and a bias, so their scores are bit-equal in
torch and in the kernel alike."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from moe_helpers import assert_close, hf_block, ours  # noqa: E402

ON_GPU_LAUNCHER = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
pytestmark = pytest.mark.skipif(ON_GPU_LAUNCHER, reason="CPU tensors in Triton's interpreter")

E, TOP_K, D = 64, 8, 32
N_GROUP, TOPK_GROUP, GROUP = 4, 2, 16


def _low(n=E, value=-2.0):
    return torch.full((n,), value)


def _set(col, ids, values):
    for i, v in zip(ids, values):
        col[i] = v
    return col


def qwen_tokens() -> torch.Tensor:
    """[T, E] logits with ties: at the top-k boundary, above it, inside it, and everywhere."""
    cols = [
        # seven clear winners, then four tied for the last place (9, 20, 41, 63): the kernel takes 9
        _set(_low(), [50, 3, 17, 60, 28, 44, 11, 9, 20, 41, 63], [3.0, 2.875, 2.75, 2.5, 2.25, 2.0, 1.75, 1, 1, 1, 1]),
        # ten tied at the top for eight places: the eight lowest of them
        _set(_low(), [62, 55, 40, 33, 31, 18, 12, 7, 4, 1], [2.0] * 10),
        # a tie inside the selection (three equal in places 2-4), none at its edge
        _set(_low(), [6, 30, 22, 45, 13, 38, 59, 2], [3.0, 2.5, 2.5, 2.5, 2.0, 1.5, 1.25, 1.0]),
        # every expert equal: experts 0-7
        torch.zeros(E),
    ]
    return torch.stack(cols)


def kimi_bias() -> torch.Tensor:
    # by position in the group only: a group copied elsewhere keeps its scores, tied experts share a bias
    j = torch.arange(E) % GROUP
    return (j % 3).float() * 0.125 - 0.125


def kimi_tokens() -> torch.Tensor:
    cols = []
    # groups 0 and 2 clearly best; inside them seven clear winners and three tied for the last place (5, 34, 40,
    # all at j % 3 == 2: the same bias): the kernel takes 5
    c = _low()
    _set(c, [0, 1, 2, 32, 33, 35, 36], [3.0, 2.875, 2.75, 2.625, 2.5, 2.375, 2.25])
    _set(c, [5, 34, 40], [0.5, 0.5, 0.5])
    cols.append(c)
    # group 0 best (four high experts); groups 1 and 3 exact copies, tied for the second place: the kernel
    # keeps group 1, so its best four fill the other places
    c = _low()
    _set(c, range(0, 4), [3.0, 2.875, 2.75, 2.625])
    pattern = [1.5 - 0.25 * i for i in range(16)]
    _set(c, range(16, 32), pattern)
    _set(c, range(48, 64), pattern)
    cols.append(c)
    # every logit equal: groups 0 and 1 are tied with the rest; inside, the bias decides, then the lower id
    cols.append(torch.zeros(E))
    # tied groups with ties inside them (groups 1 and 2 copies, group 0 best; experts j = 2, 5, 8 of a group
    # share a logit and a bias)
    c = _low()
    _set(c, range(0, 6), [3.0, 2.875, 2.75, 2.625, 2.5, 2.375])
    tail = [-1.0] * 16
    tail[2] = tail[5] = tail[8] = 1.0
    _set(c, range(16, 32), tail)
    _set(c, range(32, 48), tail)
    cols.append(c)
    return torch.stack(cols)


def _stable_top(values: torch.Tensor, k: int) -> torch.Tensor:
    """The k best per row, best first, the lower index first among equals (the kernel's rule, written here
    with a stable sort, independent of the kernel's reductions)."""
    return torch.sort(values, dim=-1, descending=True, stable=True)[1][:, :k]


def lowest_id_kimi(logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    choice = logits.sigmoid() + bias
    groups = choice.view(-1, N_GROUP, GROUP).topk(2, dim=-1)[0].sum(-1)
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, _stable_top(groups, TOPK_GROUP), True)
    masked = choice.masked_fill(~keep.repeat_interleave(GROUP, dim=1), float("-inf"))
    return _stable_top(masked, TOP_K)


def lowest_id_qwen(logits: torch.Tensor) -> torch.Tensor:
    return _stable_top(torch.softmax(logits, dim=-1, dtype=torch.float), TOP_K)


def _hf_with_logits(arch: str, logits: torch.Tensor):
    """transformers' block whose router gives ``logits`` for x = I[:T] (and Kimi's tied-friendly bias), our
    layer holding its weights, and x."""
    if arch == "kda":
        block, cfg = hf_block(arch, seed=7, E=E, top_k=TOP_K, D=D, n_group=N_GROUP, topk_group=TOPK_GROUP)
    else:
        block, cfg = hf_block(arch, seed=7, E=E, top_k=TOP_K, D=D)
    T = logits.shape[0]
    with torch.no_grad():
        w = torch.zeros(E, D)
        w[:, :T] = logits.T
        block.gate.weight.copy_(w)
        if arch == "kda":
            block.gate.e_score_correction_bias.copy_(kimi_bias())
    return block, ours(arch, block, cfg), torch.eye(D)[:T]


@pytest.mark.parametrize("arch", ["kda", "gdn"], ids=["kimi", "qwen"])
def test_ties_go_to_the_lower_id_and_match_transformers_up_to_equal_scores(arch):
    from trtllm_dasc.model.moe import route_kernel as rk
    from trtllm_dasc.model.ops import linear
    logits = kimi_tokens() if arch == "kda" else qwen_tokens()
    block, layer, x = _hf_with_logits(arch, logits)
    T, s = x.shape[0], layer.spec
    with torch.no_grad():
        hf_logits, hf_w, hf_idx = block.gate(x)
        ref_w, ref_idx = layer.route(x)
        if arch == "kda":
            idx, w = rk.route(linear(x, layer.w["router"]), rk.KIMI, s.top_k, s.n_group, s.topk_group,
                              s.norm_topk_prob, s.routed_scaling_factor, layer.w["bias"], shared=1)
            choice = hf_logits.sigmoid() + kimi_bias()
            lowest = lowest_id_kimi(hf_logits, kimi_bias())
        else:
            idx, w = rk.route(linear(x, layer.router_all), rk.QWEN, s.top_k, norm=s.norm_topk_prob, shared=2,
                              weight_dtype=x.dtype)
            choice = torch.softmax(hf_logits, dim=-1, dtype=torch.float)
            lowest = lowest_id_qwen(hf_logits)
    assert torch.equal(hf_logits, logits), "the logits are exact"
    got = idx[:, :TOP_K].long()
    # the kernel's rule: best first, the lower id first among equal scores (and groups)
    assert torch.equal(got, lowest), f"kernel ids\n{got}\nlowest-id reference\n{lowest}"
    # the layers' torch route() is transformers' router, ties and all
    assert torch.equal(ref_idx, hf_idx) and torch.equal(ref_w, hf_w)
    # against transformers: the same scores chosen (only equally scored experts may be swapped), the same
    # routing weights as a multiset (within a few ulps: Triton's exp / sigmoid, the sum's order)
    assert torch.equal(choice.gather(1, got).sort(1)[0], choice.gather(1, hf_idx).sort(1)[0])
    assert_close("routing weights", hf_w.sort(1)[0], w[:, :TOP_K].sort(1)[0], ratio=1e-6)
    # the ties are real: some token has more equal scores at its boundary than places left for them
    kth = choice.gather(1, got[:, -1:])
    assert ((choice == kth).sum(1) > (choice.gather(1, got) == kth).sum(1)).any()
    if arch == "kda":
        # the tied groups: token 1 keeps groups 0 and 1 (not the copy, group 3); token 3 groups 0 and 1
        kept = [sorted(set((r // GROUP).tolist())) for r in got]
        assert kept[1] == [0, 1] and kept[3] == [0, 1]
        assert 5 in got[0].tolist() and not {34, 40} & set(got[0].tolist())
    else:
        assert got[0, -1].item() == 9 and got[3].tolist() == list(range(8))
        assert sorted(got[1].tolist()) == [1, 4, 7, 12, 18, 31, 33, 40]
    assert torch.equal(idx[:, TOP_K], torch.full((T,), E, dtype=torch.int32))
