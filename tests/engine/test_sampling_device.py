"""Sampling over a real vocabulary (151,936 / 163,840 entries) picks the token a brute-force numpy
reference picks from the same uniform draw, follows the distribution, and brings back nothing of the
logits row but the chosen id (the row stays where it is: on the GPU in serving)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from trtllm_dasc.engine.sampling import SamplingParams, draw_uniform, sample

PARAMS = [dict(temperature=1.0), dict(temperature=0.7, top_k=50), dict(temperature=1.3, top_p=0.9),
          dict(temperature=0.8, top_k=1000, top_p=0.5)]


def reference(logits: torch.Tensor, p: SamplingParams, u: float) -> tuple[int, float]:
    """(token, distance of the draw or of the top-p cut from the nearest boundary). The probabilities are
    torch's fp32 softmax of the tempered, top-k-masked logits (exp's last bits differ between CPU kinds,
    so the reference takes the same values); ranking, the top-p cut and the inverse CDF are numpy float64."""
    x = logits.float() / p.temperature
    if p.top_k and p.top_k < x.numel():
        kth = np.sort(x.numpy())[-p.top_k]
        x = torch.where(x < float(kth), torch.tensor(float("-inf")), x)
    probs = torch.softmax(x, dim=-1).numpy().astype(np.float64)
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    ranked = probs[order]
    cut = np.inf
    if p.top_p < 1.0:
        before = np.cumsum(ranked) - ranked
        cut = np.abs(before - p.top_p).min()
        ranked = np.where(before >= p.top_p, 0.0, ranked)
    cdf = np.cumsum(ranked)
    target = u * cdf[-1]
    pos = min(int(np.searchsorted(cdf, target, side="right")), cdf.size - 1)
    margin = min(abs(cdf[pos] - target), abs(target - (cdf[pos - 1] if pos else 0.0)), cut)
    return int(order[pos]), margin


@pytest.mark.parametrize("vocab", [151_936, 163_840])
def test_sampler_picks_the_reference_token(vocab):
    gen = torch.Generator().manual_seed(vocab)
    # peaked like a model's logits: a few dozen plausible tokens over a long tail
    logits = torch.randn(vocab, generator=gen) * 2.5
    logits[torch.randint(vocab, (30,), generator=gen)] += 9.0
    for kw in PARAMS:
        params = SamplingParams(seed=11, **kw)
        compared = 0
        for i in range(6):
            want, margin = reference(logits, params, draw_uniform(params.seed, i))
            if margin < 1e-9:
                continue            # a draw or a cut on a boundary: float64 sums may round either way
            assert sample(logits, params, i) == want, (i, kw)
            compared += 1
        assert compared >= 4, kw


def test_draws_follow_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    probs = torch.softmax(logits, 0).numpy()
    params = SamplingParams(temperature=1.0, seed=3)
    counts = np.bincount([sample(logits, params, i) for i in range(4000)], minlength=6) / 4000
    assert np.abs(counts - probs).max() < 0.03
    # top-p 0.7 keeps the tokens whose preceding mass is below 0.7: the top one (0.56) and the second
    kept = {sample(logits, SamplingParams(temperature=1.0, top_p=0.7, seed=3), i) for i in range(300)}
    assert kept == {0, 1}


class HostCopies(TorchFunctionMode):
    """Records every call that brings a tensor of more than `limit` elements to the host."""

    NAMES = {"cpu", "numpy", "tolist", "item", "__array__", "__reduce_ex__"}

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.seen = limit, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        to_cpu = name == "to" and any(str(a) == "cpu" for a in (*args[1:], *kwargs.values()))
        if t is not None and t.numel() > self.limit and (name in self.NAMES or to_cpu):
            self.seen.append((name, tuple(t.shape)))
        return func(*args, **kwargs)


@pytest.mark.parametrize("kw", PARAMS + [dict(temperature=0.0)], ids=["t1", "topk", "topp", "topk-topp", "greedy"])
def test_no_logits_row_comes_back_to_the_host(kw):
    logits = torch.randn(151_936, generator=torch.Generator().manual_seed(0))
    with HostCopies(limit=16) as mode:
        sample(logits, SamplingParams(seed=1, **kw), 0)
    assert mode.seen == []
