"""EngineHost without Triton: the sink protocol (one final response on every path) and the warning when
prompts share prefixes but the checkpoints do not serve them."""
import logging
import threading

import numpy as np
import pytest

from serve_helpers import build, build_engine
from trtllm_dasc.serve.host import WARN_WINDOW, EngineHost


class Sink:
    def __init__(self):
        self.sent, self.done = [], threading.Event()

    def send(self, tensors, error, final):
        self.sent.append((tensors, error, final))
        if final:
            self.done.set()

    def cancelled(self):
        return False


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host")
    build(tmp / "ckpt", "kda", seed=8)
    # checkpoints at prompt ends only: prompts that share a prefix (cached KV) but never repeat get no hit
    engine = build_engine(tmp / "ckpt", tmp / "engine", "--wmax", 0, "--max-batch-size", 2, "--kv-blocks", 400,
                          "--block-size", 4, "--max-context", 256, "--prompt-only")
    h = EngineHost(str(engine), warmup=False)
    yield h
    h.shutdown()


def inputs(prompt, n=1):
    return {"input_ids": np.array([prompt], np.int32), "input_lengths": np.array([len(prompt)], np.int32),
            "request_output_len": np.array([n], np.int32)}


def test_every_path_ends_with_one_final_response(host):
    good, bad, stop = Sink(), Sink(), Sink()
    host.submit(inputs([1, 2, 3], 2), "g", good)
    host.submit({"input_ids": np.array([[1]], np.int32)}, "b", bad)
    host.submit({**inputs([1], 1), "stop": np.array([True])}, "nothing-to-stop", stop)
    for s in (good, bad, stop):
        assert s.done.wait(60)
        assert [f for _, _, f in s.sent].count(True) == 1 and s.sent[-1][2]
    assert bad.sent[-1][1] and "input_lengths" in bad.sent[-1][1]
    assert good.sent[-1][0]["output_ids"].shape == (1, 1, 5)


def test_shared_prefixes_with_no_hits_are_warned_about(host, caplog):
    rng = np.random.default_rng(0)
    shared = rng.integers(0, 90, 40).tolist()
    caplog.set_level(logging.WARNING, logger="trtllm_dasc.serve")
    # each prompt's checkpoint sits at its own end (len - 1): the shared 40-token prefix has KV but no
    # checkpoint, so the hit rate stays at zero while most prompt tokens are shared
    for i in range(WARN_WINDOW + 2):
        sink = Sink()
        host.submit(inputs(shared + rng.integers(0, 90, 4).tolist()), f"r{i}", sink)
        assert sink.done.wait(60)
    warned = [r for r in caplog.records if "share prefixes" in r.getMessage()]
    assert warned, [r.getMessage() for r in caplog.records]
