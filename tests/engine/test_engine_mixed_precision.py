"""Horizon precision end to end (issue 35): an engine whose plan gives every kept unit a codec from its
horizon band serves, stores a checkpoint, and on a repeated prefix loads it. The loaded state must equal
an independent reconstruction of the stored one, bit for bit: the test's own horizons (numpy, from the
saved decay tensors), bands (thresholds counted), and per-unit numpy fake-quant (tests/state/fake_quant.py);
omitted units zero. The continuation must be the brute-force one from that state."""
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, split_wmax

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "state"))
from fake_quant import checkpoint_horizons, fake_quant, unit_rows  # noqa: E402

CODECS = {"kda": ("int4", "fp8", "int8", "native"), "gdn": ("native", "int4", "int8", "fp8")}


def thresholds(hs: list[np.ndarray], wmax: int, n: int) -> list[int]:
    """n integer thresholds above wmax that split the kept units' horizons into nonempty bands."""
    kept = np.sort(np.concatenate([h[h > wmax] for h in hs]))
    out = []
    for q in np.linspace(0, 1, n + 2)[1:-1]:
        t = int(np.floor(kept[int(q * len(kept))])) + 1
        if not out or t > out[-1]:
            out.append(t)
    assert len(out) == n and all(np.abs(kept - t).min() > 1e-3 for t in out)
    return out


def conv8(x: np.ndarray) -> np.ndarray:
    """One layer's conv state -> its 8-bit round trip (one scale per layer, paper Eq. 10 over the layer)."""
    s = np.float32(max(np.abs(x).max(), np.float32(1e-8))) / np.float32(127)
    return (np.clip(np.rint(x / s), -127, 127).astype(np.float32) * np.float32(s)).astype(np.float32)


@pytest.mark.parametrize("arch,conv_codec", [("kda", "native"), ("gdn", "native"), ("kda", "int8")])
def test_horizon_precision_engine_hits_and_loads_the_fake_quant_state(tiny_models, arch, conv_codec):
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    path, _ = tiny_models[arch]
    wmax = split_wmax(path)
    hs = checkpoint_horizons(path)
    ths, codecs = thresholds(hs, wmax, 3), CODECS[arch]
    spec = f"horizon:{','.join(map(str, ths))}:{','.join(codecs)}"
    codec_of = [{int(u): codecs[int(np.sum(np.array(ths) <= h[u]))] for u in np.nonzero(h > wmax)[0]} for h in hs]
    assert {c for d in codec_of for c in d.values()} == set(codecs)
    engine = make_engine(path, wmax=wmax, precision=spec, max_batch=1, conv_codec=conv_codec)
    runner = engine.runner
    assert runner.plan.options.precision == spec
    assert runner.plan.unit_codecs() == [[d[u] for u in sorted(d)] for d in codec_of]
    pool = runner.pool
    assert pool.slot_bytes == runner.plan.slot_bytes_per_rank()[0]
    stored, loads = {}, []
    inner_store, inner_load = pool.store, pool.load

    def store_spy(temporal, conv, rows, slots, **kw):
        inner_store(temporal, conv, rows, slots, **kw)
        for r, s in zip(rows, slots):
            stored[s] = (temporal[:, r].clone(), conv[:, r].clone())

    def load_spy(slots, temporal, conv, rows, **kw):
        inner_load(slots, temporal, conv, rows, **kw)
        loads.extend((s, temporal[:, r].clone(), conv[:, r].clone()) for s, r in zip(slots, rows))
    pool.store, pool.load = store_spy, load_spy
    rng = random.Random(7)
    prefix = [rng.randrange(VOCAB) for _ in range(13)]
    (first,) = engine.generate([greedy(0, prefix + [1], 3)])
    # garbage in every row (what a reused row may hold): the load must zero the omitted units itself
    g = torch.Generator().manual_seed(0)
    runner.state.temporal.copy_(torch.randn(runner.state.temporal.shape, generator=g) * 10)
    prompt = prefix + [3, 4, 5]
    req = greedy(1, prompt, 4)
    (out,) = engine.generate([req])
    engine.sanity_check()
    pool.sanity_check()
    assert len(first) == 3 and req.stats.checkpoint_loaded and req.stats.cached_tokens == len(prefix)
    (slot, t_loaded, c_loaded), = loads
    t_stored, c_stored = stored[slot]
    n = len(hs[0])
    x = unit_rows(t_stored.numpy(), n)
    want = np.zeros_like(x)
    for l in range(x.shape[0]):
        for u, codec in codec_of[l].items():
            want[l, u] = fake_quant(x[l, u], codec)
    assert np.array_equal(unit_rows(t_loaded.numpy(), n), want)
    if conv_codec == "native":
        assert torch.equal(c_loaded, c_stored.to(c_loaded.dtype))
    else:
        c = c_stored.float().numpy()
        want_c = torch.from_numpy(np.stack([conv8(c[l]) for l in range(c.shape[0])])).to(c_loaded.dtype)
        assert torch.equal(c_loaded, want_c) and not torch.equal(c_loaded, c_stored.to(c_loaded.dtype))
    # brute force: exact prefix prefill (its KV), its recurrent state replaced by the loaded one, greedy continuation
    r = DirectRunner(HybridModel.from_pretrained(str(path)), rows=1, max_tokens=64, block_size=4)
    r.run(prefix, logits="none")
    r.state.temporal[:, 0] = t_loaded
    r.state.conv[:, 0] = c_loaded.to(r.state.conv.dtype)
    logits = r.run(prompt[len(prefix):], logits="last").logits[0]
    ref = []
    for _ in range(4):
        ref.append(int(torch.argmax(logits)))
        logits = r.run([ref[-1]], logits="last").logits[0]
    assert out == ref
