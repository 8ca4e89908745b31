"""model/decode_graphs.py: a decode step from the fixed buffers (bucketed, padded) against model.forward.

On the CPU the buffers run decode_static eagerly (use_graphs False: what a CUDA graph would replay); on a
GPU the same test captures and replays the graphs."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
# Triton's interpreter reads loop bounds loaded from memory as 1-element arrays (numpy deprecates that)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

from engine_helpers import one_torch_thread  # noqa: E402
from trtllm_dasc.model.decode_graphs import DecodeGraphs, buckets_for  # noqa: E402

# tiny ops on one torch thread (engine_helpers.one_torch_thread says why)
_one_thread = pytest.fixture(scope="module", autouse=True)(one_torch_thread)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_moe_models_are_captured_only_on_a_fused_backend(tiny):
    from trtllm_dasc.model import HybridModel
    path, _ = tiny("kda")                                  # MoE layers
    model = HybridModel.from_pretrained(path, device=DEV)
    r_state, kv = model.new_state(2), model.new_kv_cache(4, 4)
    # the fused kernels (a GPU's default) read nothing on the host; the CPU's per-expert loop does
    assert DecodeGraphs(model, r_state, kv, 1, 2, pad_row=1, pad_block=3, use_graphs=True).use_graphs == (DEV == "cuda")
    moes = [m for _, m, *_ in model.layers if hasattr(m, "backend")]
    assert moes
    for m in moes:
        m.backend = "loop"
    assert not DecodeGraphs(model, r_state, kv, 1, 2, pad_row=1, pad_block=3, use_graphs=True).use_graphs


def test_buckets():
    assert buckets_for(1) == [1]
    assert buckets_for(8) == [1, 2, 4, 8]
    assert buckets_for(6) == [1, 2, 4, 6]


# the moe cases only where they capture (a GPU): on the CPU they would run the per-expert loop eagerly,
# nothing the dense cases do not cover, at a minute and more each
_GPU_ONLY = pytest.mark.skipif(DEV != "cuda", reason="MoE decode graphs need the fused experts (a GPU)")


@pytest.mark.parametrize("arch, mlp", [("gdn", "dense"), ("kda", "dense"), pytest.param("gdn", "moe", marks=_GPU_ONLY),
                                       pytest.param("kda", "moe", marks=_GPU_ONLY)])
def test_bucketed_steps_match_forward_and_leave_other_rows_alone(tmp_path, arch, mlp):
    from hybrid_tiny import DENSE_MLP, decode_case
    from trtllm_dasc.model.direct import DirectRunner
    # moe: the tiny models' MoE layers, captured on a GPU through the fused experts (model/moe)
    model, prompts, steps = decode_case(tmp_path, arch, 6, (6, 13, 30), 4, DEV,
                                        **(DENSE_MLP[arch] if mlp == "dense" else {}))
    results = []
    for graphs in (False, True):
        # rows 0-2 the sequences, row 3 padding, row 4 an idle sequence that must not change. The prompts
        # run through the eager attention, the same in both arms: on the CPU the batched kernel runs in
        # Triton's interpreter, where these prefills took 40 of the test's 50 s (issue 31)
        model.paged_attention = False
        r = DirectRunner(model, rows=5, max_tokens=48, block_size=4)
        for row, p in enumerate(prompts):
            r.run(p, row=row, logits="none")
        r.run(prompts[0][:5], row=4, logits="none")
        model.paged_attention = True      # the eager arm's steps use the same batched attention: equal to rounding
        idle = r.state.temporal[:, 4].clone()
        pad_block = r.blocks_per_row * 4 - 1          # the last block of row 3: no sequence uses it
        dg = DecodeGraphs(model, r.state, r.kv, max_batch=4, max_blocks=r.blocks_per_row, pad_row=3,
                          pad_block=pad_block) if graphs else None
        logits = []
        for i in range(4):
            batch = [r.seq(steps[i, row:row + 1], row) for row in range(3)]
            if dg is None:
                logits.append(r.forward(batch, "last").logits)
            else:
                starts = [s.start for s in batch]
                got, greedy, finite = dg.run(steps[i].tolist(), starts, [0, 1, 2], [s.block_table for s in batch])
                # the graph's own argmax and health check, row for row, on the host
                assert greedy == got.argmax(-1).tolist() and finite == [True] * 3
                logits.append(got.clone())        # a view the next step overwrites
                for s in batch:
                    r.lengths[s.row] = s.start + 1
        assert torch.equal(r.state.temporal[:, 4], idle)
        if dg is not None:
            assert dg.use_graphs == (DEV == "cuda") and set(dg.graphs) == ({4} if DEV == "cuda" else set())
        results.append((torch.cat(logits), r.state.temporal[:, :3].clone(), r.state.conv[:, :3].clone()))
    model.paged_attention = None
    for a, b in zip(results[1], results[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_a_bad_block_table_is_refused_before_anything_moves(tmp_path):
    from hybrid_tiny import DENSE_MLP, decode_case
    from trtllm_dasc.model.direct import DirectRunner
    model, prompts, steps = decode_case(tmp_path, "gdn", 6, (6, 13), 2, DEV, **DENSE_MLP["gdn"])
    r = DirectRunner(model, rows=3, max_tokens=48, block_size=4)
    for row, p in enumerate(prompts):
        r.run(p, row=row, logits="none")
    dg = DecodeGraphs(model, r.state, r.kv, max_batch=2, max_blocks=r.blocks_per_row, pad_row=2,
                      pad_block=r.blocks_per_row * 3 - 1)
    before = r.state.temporal.clone(), r.kv.pools[0][0].clone()
    starts = [len(p) for p in prompts]
    tables = [r.table(0), r.table(1)]
    for bad, why in (([tables[0], tables[1][:1]], "cannot hold"), ([tables[0], [10 ** 6] * 12], "outside")):
        with pytest.raises(ValueError, match=why):
            dg.run(steps[0].tolist(), starts, [0, 1], bad)
    assert torch.equal(r.state.temporal, before[0]) and torch.equal(r.kv.pools[0][0], before[1])
