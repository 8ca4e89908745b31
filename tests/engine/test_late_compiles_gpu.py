"""Warm-up leaves nothing to compile (GPU): after Engine.warmup, lone requests of unusual lengths (a single
token, odd lengths off the 16-token grid, the H200 replay's 2,466-token miss, capped by the context) and a
hit compile no Triton kernel (engine/compile_watch.py counts them), at two engine geometries. On the H200 a
lone request after warm-up took 27 s on a cold kernel cache against 2 s on a warm one: fla autotuned a norm
bucket warm-up had not reached (engine/warmup.py round_lengths). A failure lists the watch's lines: which
kernels, which specialisations. Then a step whose five captures each replay one token (the variant of fla's
recurrent kernel 12-06's 48B dense server compiled inside requests) compiles nothing either."""
from __future__ import annotations

import random

import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, split_wmax
from trtllm_dasc.engine import compile_watch as cw
from trtllm_dasc.model.recurrence.fla import CHUNK

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: Triton compiles "
                                 "kernels only for a GPU (the interpreter runs them on the CPU uncompiled)")]

LENGTHS = (1, 17, 418, 2466)


GEOMETRIES = {
    # the served 48B's shape of an engine (Kimi-Linear: KDA + MLA), dasc-wr so loads replay and merge
    "wr_interval_256": dict(policy="wr", max_batch=4, block_size=16, interval=256, prefill_chunk=2048,
                            max_context=4096, num_kv_blocks=2048),
    # the matched-HBM cells' engine (dense, prompt ends only, a 2,801-token interval, one chunk a prompt): there
    # warm-up met no unpaged step of at most 2,048 rows and fla autotuned MLA's latent norm inside the
    # first request to run in one (27 s on the H200; engine/warmup.py round_lengths)
    "dense_matched_hbm": dict(policy="nr", max_batch=8, block_size=16, interval=2801, prefill_chunk=8192,
                              max_num_tokens=8192, max_context=2816, num_kv_blocks=2048, prompt_only=True),
}


@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_lone_requests_of_unusual_lengths_compile_nothing_after_warmup(tiny_models, monkeypatch, tmp_path,
                                                                       geometry):
    path = tiny_models["kda"][0]
    over = dict(GEOMETRIES[geometry])
    wmax = split_wmax(path) if over["policy"] == "wr" else 0
    # its own kernel cache: a cold one, as on the machine that showed the late compile
    engine = make_engine(path, device="cuda", dtype="bfloat16", wmax=wmax,
                         kernel_cache_dir=str(tmp_path / "kernels"), **over)
    lines = []
    emit = cw.WATCH.emit
    monkeypatch.setattr(cw.WATCH, "emit", lambda line: (lines.append(line), emit(line)))
    engine.warmup()
    assert engine.stats()["kernels_compiled_after_warmup"] == 0, "the watch is not installed on a GPU engine"
    rng, new = random.Random(5), 4
    prompts = [[rng.randrange(VOCAB) for _ in range(min(n, engine.cfg.max_context - 40))] for n in LENGTHS]
    for i, prompt in enumerate(prompts):
        engine.generate([greedy(("lone", i), prompt, n=new)])
    # a lone hit: the 418-token prompt extended (a checkpoint load, wr: a replay; a short prefill off the grid)
    engine.generate([greedy("hit", prompts[2] + [3, 1, 4, 1, 5], n=new)])
    # the finding first: a failed load check below must not hide which kernels compiled
    assert engine.stats()["kernels_compiled_after_warmup"] == 0, "\n".join(lines)
    assert engine.stats()["checkpoint_loads"][over["policy"]] == 1
    # five prompts of 2 x CHUNK + 2 tokens, no shared prefix: each prompt-end capture replays one token, all of a
    # step's in one call of fla's recurrent kernel (N = 5; with max_batch 4, N = 4 then 1: engine/warmup.py
    # one_token_capture_prompts)
    engine.flush()
    firsts = rng.sample(range(VOCAB), 5)
    engine.generate([greedy(("one-token captures", j), [f] + [rng.randrange(VOCAB) for _ in range(2 * CHUNK + 1)],
                            n=new) for j, f in enumerate(firsts)])
    assert engine.stats()["kernels_compiled_after_warmup"] == 0, "\n".join(lines)
