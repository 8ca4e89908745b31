"""The engine's decode steps through model/decode_graphs.py (runner._graph_step): greedy tokens equal
transformers' own, and the steps did go through the graph buffers. On the CPU the buffers run eagerly
(what a GPU captures and replays); graphs_wanted is forced on, as it is on a GPU with the fla backend."""
import pytest
import torch
from engine_helpers import greedy, make_engine, reference_greedy

pytest.importorskip("triton")


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_decode_steps_through_the_graph_buffers_match_transformers(tiny_models, arch, monkeypatch):
    from trtllm_dasc.engine import runner as runner_mod
    monkeypatch.setattr(runner_mod, "graphs_wanted", lambda cfg, model: True)
    path, hf = tiny_models[arch]
    eng = make_engine(path)
    r = eng.runner
    assert r.graphs is not None and r.state.num_rows == r.num_rows + 1 and r.kv.cfg.num_blocks == 401
    calls = []
    run = r.graphs.run
    r.graphs.run = lambda *a, **kw: calls.append(len(a[1])) or run(*a, **kw)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 11, 19)]
    outs = eng.generate([greedy(("g", i), p, n=5) for i, p in enumerate(prompts)])
    for p, out in zip(prompts, outs):
        assert out == reference_greedy(hf, p, 5)
    # three requests decode together: buckets of 4 (one padded entry), then fewer as they finish
    assert calls and max(calls) == 3
    eng.sanity_check()
    eng.shutdown()


def test_a_graph_that_fails_turns_graphs_off_and_the_step_runs_eagerly(tiny_models, monkeypatch, capsys):
    from trtllm_dasc.engine import runner as runner_mod
    monkeypatch.setattr(runner_mod, "graphs_wanted", lambda cfg, model: True)
    path, hf = tiny_models["kda"]
    eng = make_engine(path)

    def refuse(*a, **kw):
        raise RuntimeError("capture refused")
    eng.runner.graphs.run = refuse
    assert eng.generate([greedy("f", [3, 4, 5, 6], n=3)]) == [reference_greedy(hf, [3, 4, 5, 6], 3)]
    assert eng.runner.graphs is None
    assert "decode CUDA graphs off (RuntimeError: capture refused)" in capsys.readouterr().err
    eng.shutdown()
