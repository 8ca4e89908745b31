"""The engine's decode steps through model/decode_graphs.py (runner._graph_step): greedy tokens equal those
of the same engine without graphs (and, on the CPU, transformers' own), and the steps did go through the
graph buffers. On a GPU the graphs are captured and replayed; on the CPU the buffers run eagerly.
graphs_wanted is forced on (on a GPU it is on with the fla backend and dense MLPs)."""
import pytest
import torch
from engine_helpers import build, greedy, make_engine, reference_greedy
from hybrid_tiny import DENSE_MLP

pytest.importorskip("triton")
# Triton's interpreter reads loop bounds loaded from memory as 1-element arrays (numpy deprecates that)
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def dense_models(tmp_path_factory):
    out = {}
    for i, arch in enumerate(("gdn", "kda")):
        path = tmp_path_factory.mktemp(f"graphs-{arch}")
        out[arch] = (path, build(path, arch, seed=20 + i, **DENSE_MLP[arch]))
    return out


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_decode_steps_through_the_graph_buffers_match_eager(dense_models, arch, monkeypatch):
    from trtllm_dasc.engine import runner as runner_mod
    path, hf = dense_models[arch]
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 11, 19)]
    eager = make_engine(path, device=DEV, cuda_graphs=False)
    expected = eager.generate([greedy(("e", i), p, n=5) for i, p in enumerate(prompts)])
    eager.shutdown()
    monkeypatch.setattr(runner_mod, "graphs_wanted", lambda cfg, model: True)
    eng = make_engine(path, device=DEV)
    r = eng.runner
    assert r.graphs is not None and r.state.num_rows == r.num_rows + 1 and r.kv.cfg.num_blocks == 401
    calls = []
    launch = r.graphs.launch

    def counted(n):
        out = launch(n)
        calls.append(n)
        return out
    r.graphs.launch = counted
    outs = eng.generate([greedy(("g", i), p, n=5) for i, p in enumerate(prompts)])
    assert outs == expected
    if DEV == "cpu":
        assert outs == [reference_greedy(hf, p, 5) for p in prompts]
    # three requests decode together (a bucket of 4, one padded entry), then fewer as they finish
    assert calls and max(calls) == 3 and r.graphs is not None
    assert r.graphs.use_graphs == (DEV == "cuda")
    eng.sanity_check()
    eng.shutdown()


def test_sampled_and_banned_requests_through_the_graph_buffers_match_eager(dense_models, monkeypatch):
    # the graph's own argmax is used only for plain greedy rows: a banned token (the sampler's fallback on
    # the step's logits) and a seeded temperature draw (logits rows read from the graph's output) beside
    # a greedy request give the tokens of the same engine without graphs
    from trtllm_dasc.engine import runner as runner_mod
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.engine.sampling import SamplingParams
    path, _ = dense_models["gdn"]
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (7, 12, 4)]

    def requests(tag):
        first = greedy((tag, 0), prompts[0], n=4)
        return [first, GenerationRequest((tag, 1), prompts[1], 4, SamplingParams(temperature=0.8, seed=5)),
                greedy((tag, 2), prompts[2], n=4, bad_words=[[t] for t in range(0, 64, 2)])]
    eager = make_engine(path, device=DEV, cuda_graphs=False)
    expected = eager.generate(requests("e"))
    eager.shutdown()
    monkeypatch.setattr(runner_mod, "graphs_wanted", lambda cfg, model: True)
    eng = make_engine(path, device=DEV)
    assert eng.runner.graphs is not None
    outs = eng.generate(requests("g"))
    assert outs == expected and all(t % 2 or t >= 64 for t in outs[2])
    eng.shutdown()


def test_a_capture_that_fails_turns_graphs_off_and_the_step_runs_eagerly(dense_models, monkeypatch, capsys):
    from trtllm_dasc.engine import runner as runner_mod
    monkeypatch.setattr(runner_mod, "graphs_wanted", lambda cfg, model: True)
    path, hf = dense_models["kda"]
    eng = make_engine(path, device=DEV)

    def refuse(b):
        raise RuntimeError("capture refused")
    eng.runner.graphs.use_graphs = True           # on the CPU too: the capture is what fails here
    eng.runner.graphs.capture = refuse
    out = eng.generate([greedy("f", [3, 4, 5, 6], n=3)])
    assert eng.runner.graphs is None
    assert "decode CUDA graphs off (RuntimeError: capture refused)" in capsys.readouterr().err
    if DEV == "cpu":
        assert out == [reference_greedy(hf, [3, 4, 5, 6], 3)]
    eng.shutdown()
