"""EngineHost without Triton: the sink protocol (one final response on every path) and the warning when
prompts share prefixes but the checkpoints do not serve them."""
import logging
import threading
import time

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
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host")
    build(tmp / "ckpt", "kda", seed=8)
    # checkpoints at prompt ends only: prompts that share a prefix (cached KV) but never repeat get no hit
    return build_engine(tmp / "ckpt", tmp / "engine", "--wmax", 0, "--max-batch-size", 2, "--kv-blocks", 400,
                        "--block-size", 4, "--max-context", 256, "--prompt-only")


@pytest.fixture(scope="module")
def host(engine):
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


def test_a_plain_host_refuses_a_batch_it_cannot_answer_in_one_response(engine):
    # non-decoupled: one response a request, one sequence a response. A batch of 2 came back as its last
    # entry alone, shape [1, 1, T], with no error (session 36's review); now it is refused in one line
    h = EngineHost(str(engine), warmup=False, decoupled=False)
    try:
        batch, one = Sink(), Sink()
        h.submit({"input_ids": np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], np.int32),
                  "input_lengths": np.array([[3], [5]], np.int32),
                  "request_output_len": np.array([[2], [2]], np.int32)}, "b", batch)
        h.submit(inputs([1, 2, 3], 2), "one", one)
        # a non-UTF-8 control word is a bad input, not an internal error
        control = Sink()
        h.submit({**inputs([1], 1), "cache_control": np.array([[b"\xff\xfe"]], object)}, "c", control)
        for s in (batch, one, control):
            assert s.done.wait(60)
            assert [f for _, _, f in s.sent].count(True) == 1
        assert batch.sent[-1][0] is None and "decoupled" in batch.sent[-1][1]
        assert one.sent[-1][1] is None and one.sent[-1][0]["output_ids"].shape == (1, 1, 5)
        assert "cache_control" in control.sent[-1][1] and "internal error" not in control.sent[-1][1]
    finally:
        h.shutdown()


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


def test_drain_refuses_new_requests_and_cancels_the_rest_at_the_deadline(engine, tmp_path, monkeypatch):
    from trtllm_dasc.serve.drain import DRAIN_ENV, is_drained, request_drain
    drain_file = str(tmp_path / "drain")
    monkeypatch.setenv(DRAIN_ENV, drain_file)
    h = EngineHost(str(engine), warmup=False)
    step = h.engine.step

    def slow_step():
        # 10 ms a step: the long request's 200 tokens outlive the 1 s deadline on any CPU (a fast one decoded
        # them all before it, and the request ended 'length')
        time.sleep(0.01)
        return step()
    monkeypatch.setattr(h.engine, "step", slow_step)
    try:
        short, long_ = Sink(), Sink()
        h.submit(inputs([1, 2, 3], 2), "short", short)
        h.submit({**inputs([4, 5, 6], 200), "streaming": np.array([True])}, "long", long_)
        assert short.done.wait(60)
        t0 = time.time()
        request_drain(drain_file, 1.0)
        # admission closes at once (the watcher polls every 50 ms), in one line
        time.sleep(0.3)
        late = Sink()
        h.submit(inputs([7], 1), "late", late)
        assert late.done.wait(5) and "shutting down" in late.sent[-1][1] and "\n" not in late.sent[-1][1]
        assert not is_drained(drain_file)
        # the long request runs until the deadline, then its final response says 'cancelled'
        assert long_.done.wait(10)
        tensors, error, final = long_.sent[-1]
        assert error is None and final and tensors["finish_reason"].reshape(-1)[0] == b"cancelled"
        assert 0.9 < time.time() - t0 < 3
        n = sum(t["output_ids"].shape[-1] for t, _, _ in long_.sent[:-1] if t is not None)
        assert 0 < n < 200
        deadline = time.time() + 2
        while not is_drained(drain_file) and time.time() < deadline:
            time.sleep(0.02)
        assert is_drained(drain_file) and h.stats()["inflight"] == 0
    finally:
        h.shutdown()


def test_a_warmed_host_says_how_long_warm_up_took(engine, capfd):
    # the server log's model load covers the weights and the warm-up; this line splits them
    h = EngineHost(str(engine), warmup=True)
    try:
        err = capfd.readouterr().err
        line = [x for x in err.splitlines() if x.startswith("dasc: warm-up: ")]
        assert len(line) == 1, err
        assert f"{h.warmup_report['requests']} requests in " in line[0]
        assert f"prompts up to {h.warmup_report['longest_prompt']} tokens" in line[0]
    finally:
        h.shutdown()


def test_an_ablation_engine_says_so_at_start_and_a_plain_one_does_not(tmp_path, caplog):
    # dasc-build --ablation-step-*: the served engine is slower on purpose, and its log must not let that pass
    build(tmp_path / "ckpt", "kda", seed=8)
    said = {}
    for name, flags in (("plain", []), ("slowed", ["--ablation-step-delay-ms", 40, "--ablation-step-slowdown", 2])):
        engine = build_engine(tmp_path / "ckpt", tmp_path / name, "--wmax", 0, "--max-batch-size", 2, "--kv-blocks",
                              100, "--block-size", 4, "--max-context", 128, *flags)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="trtllm_dasc"):
            h = EngineHost(str(engine), warmup=False)
        h.shutdown()
        said[name] = [r.getMessage() for r in caplog.records if "ABLATION" in r.getMessage()]
        if name == "slowed":
            assert (h.engine.cfg.step_delay_s, h.engine.cfg.step_slowdown) == (0.04, 2.0)
    assert said["plain"] == [] and len(said["slowed"]) == 1
    assert "40 ms + 1 x its own time" in said["slowed"][0]


def test_a_stop_naming_the_clients_id_finds_a_request_forwarded_twice(host):
    """A forwarding model whose core is itself a forwarder (tensorrt_llm_bls with tensorrt_llm_model_name
    dasc_hybrid) forwards under the client's id plus two suffixes: a stop naming the client's id (TensorRT-LLM's
    rule) and one naming the first forwarder's id (its cancellation watch, passed on unchanged by dasc_hybrid)
    both still find it; a client's own id that merely holds the mark is no forwarded id. Before, only the last
    suffix was taken off, so the client's stop found nothing and the request ran to its end."""
    import uuid
    from trtllm_dasc.serve.bls import forward_id
    for stop_by in ("client", "first-forwarder"):
        first = forward_id("job-7", "tensorrt_llm_bls")
        twice = forward_id(first, "dasc_hybrid")
        run, stop = Sink(), Sink()
        host.submit(inputs([1, 2, 3], 200), twice, run)
        host.submit({**inputs([1], 1), "stop": np.array([True])}, "job-7" if stop_by == "client" else first, stop)
        assert run.done.wait(120) and stop.done.wait(60)
        final = run.sent[-1][0]
        assert final["finish_reason"].reshape(-1)[0] == b"cancelled", stop_by
        assert final["output_ids"].shape[-1] < 3 + 200, stop_by
    # an id of the client's own that holds the mark (not followed by a forwarder's uuid): one id, no stop key more
    from trtllm_dasc.serve.host import _stop_keys
    assert _stop_keys("a#dasc-fwd-b") == ["a#dasc-fwd-b"]
    u = uuid.uuid4().hex
    assert _stop_keys(f"a#dasc-fwd-b#dasc-fwd-{u}") == [f"a#dasc-fwd-b#dasc-fwd-{u}", "a#dasc-fwd-b"]


def test_a_batch_is_queued_whole_or_not_at_all(engine):
    """The engine's state may change between the host's check of a batch and its queueing (a shutdown, the
    engine's death): the batch is then refused whole, never left half-queued (its first sequence ran, was
    aborted and counted as a cancellation beside the refusal)."""
    h = EngineHost(str(engine), warmup=False)
    try:
        eng, calls = h.engine, []
        real = eng._check

        def check(req):
            calls.append(req)
            if len(calls) == 2:
                # at the batch's last check, before it is queued: the engine shuts down
                eng._closed = True
            real(req)
        eng._check = check
        before = eng.telemetry.snapshot()
        batch = Sink()
        h.submit({"input_ids": np.array([[1, 2, 3], [4, 5, 6]], np.int32), "input_lengths": np.array([[3], [3]], np.int32),
                  "request_output_len": np.array([[50], [50]], np.int32)}, "b", batch)
        assert batch.done.wait(60)
        assert [f for _, _, f in batch.sent].count(True) == 1 and "shut down" in batch.sent[-1][1]
        time.sleep(1.0)
        after = eng.telemetry.snapshot()
        assert after["ended"] == before["ended"] and after["requests"] == before["requests"], (before, after)
        assert not eng._seqs and not eng.has_work() and h.stats()["rejected"] == 1
        eng._closed = False
    finally:
        h.shutdown()


def test_a_request_queued_as_the_engine_dies_gets_its_final_response(engine):
    """The engine's death (its loop thread) and a submit (a Triton thread) race: the death marked the engine
    dead and listed the requests to fail without the engine's lock, so a request queued in between (it saw
    the engine alive) was in neither list and never answered: its client waited forever."""
    h = EngineHost(str(engine), warmup=False)
    eng = h.engine
    try:
        # the loop stopped: the death below stands for the loop's own (a step's failure)
        with eng._cv:
            eng._stop, eng._drain = True, False
            eng._cv.notify()
        eng._thread.join(30)
        eng._thread = None

        class Seqs(dict):
            def __setitem__(self, key, value):
                # the submit holds the engine's lock here, past its check that the engine lives
                dying = threading.Thread(target=eng._die, args=("a step failed",))
                dying.start()
                dying.join(0.5)
                super().__setitem__(key, value)
        eng._seqs = Seqs(eng._seqs)
        sink = Sink()
        h.submit(inputs([1, 2, 3], 2), "x", sink)
        assert sink.done.wait(10), "never answered"
        assert [f for _, _, f in sink.sent].count(True) == 1 and "dead" in sink.sent[-1][1]
    finally:
        eng._seqs = dict(eng._seqs)
        h.shutdown()


def test_each_sequence_of_a_batch_ends_with_its_own_finish_reason(host):
    """A batch of two: sequence 0 ends on its end id, sequence 1 runs to its length. The stopped one's last
    response said nothing and the final one (batch_index 1, a 'length' end) said 'stop' ("stop wins").
    From a review helper; fails on the old code."""
    alone = Sink()
    host.submit(inputs([1, 2, 3], 3), "alone", alone)
    assert alone.done.wait(60)
    first = int(alone.sent[-1][0]["output_ids"].reshape(-1)[3])      # greedy's first token after [1, 2, 3]
    batch = Sink()
    host.submit({"input_ids": np.array([[1, 2, 3, 0], [4, 5, 6, 7]], np.int32),
                 "input_lengths": np.array([[3], [4]], np.int32),
                 "request_output_len": np.array([[3], [3]], np.int32),
                 "end_id": np.array([[first], [-1]], np.int32),
                 "streaming": np.array([[True], [True]])}, "batch", batch)
    assert batch.done.wait(60)
    ends = {}
    for tensors, error, final in batch.sent:
        assert error is None
        if tensors is not None and "finish_reason" in tensors:
            ends[int(tensors["batch_index"].reshape(-1)[0])] = tensors["finish_reason"].reshape(-1)[0]
    assert {i: (r.decode() if isinstance(r, bytes) else r) for i, r in ends.items()} == {0: "stop", 1: "length"}


def test_an_output_past_what_the_kv_cache_holds_is_cut_to_fit(tmp_path):
    """An engine whose KV cache holds fewer tokens than its max context (10 blocks of 8 = 80 tokens, context
    128): dasc-build warns, and a request whose prompt fits is served with its output cut to what the cache holds
    (the largest n with ceil((prompt + n - 1) / 8) <= 10), as an output past the context is; it was refused
    ("needs 16 KV blocks, the cache has 10") for any output that fit the context but not the cache (a review
    helper's finding; fails on the old code). A prompt past the cache's 80 tokens is still refused."""
    import subprocess
    import sys
    build(tmp_path / "ckpt", "gdn", seed=1)
    proc = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(tmp_path / "ckpt"),
                           "--output", str(tmp_path / "engine"), "--device", "cpu", "--dtype", "float32", "--wmax", "0",
                           "--block-size", "8", "--kv-blocks", "10", "--max-context", "128", "--max-batch-size", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # positions 0..126 of the longest sequence: ceil(127 / 8) = 16 blocks
    assert "cannot hold a sequence of --max-context 128" in proc.stderr and "--kv-blocks >= 16" in proc.stderr
    h = EngineHost(str(tmp_path / "engine"), warmup=False)
    try:
        cases = {"long": (list(range(1, 41)), 2**31 - 1), "edge": (list(range(1, 80)), 5),
                 "fits": (list(range(1, 41)), 20), "past": (list(range(1, 82)), 1)}
        sinks = {name: Sink() for name in cases}
        for name, (prompt, n) in cases.items():
            h.submit(inputs(prompt, n), name, sinks[name])
        for s in sinks.values():
            assert s.done.wait(120)
        generated = {name: None if s.sent[-1][1] else s.sent[-1][0]["output_ids"].shape[-1] - len(cases[name][0])
                     for name, s in sinks.items()}
        assert generated == {"long": 80 - 40 + 1, "edge": 80 - 79 + 1, "fits": 20, "past": None}, sinks["long"].sent[-1][1]
        assert "KV blocks" in sinks["past"].sent[-1][1]
    finally:
        h.shutdown()


def test_an_embedding_bias_row_must_span_the_vocabulary(host):
    """TensorRT-LLM refuses an embedding_bias whose last dimension is not the vocabulary size; ours served a short
    row (one built for another tokenizer), biasing ids 0..n-1 (a review helper's finding; fails on the old code).
    A full row and the [batch, 0] 'none' are served."""
    vocab = host.engine.vocab_size
    sinks = {"short": Sink(), "full": Sink(), "none": Sink(), "long": Sink()}
    rows = {"short": np.ones((1, 5), np.float32), "full": np.zeros((1, vocab), np.float32),
            "none": np.zeros((1, 0), np.float32), "long": np.zeros((1, vocab + 1), np.float32)}
    for name, row in rows.items():
        host.submit({**inputs([1, 2, 3], 2), "embedding_bias": row}, name, sinks[name])
    for s in sinks.values():
        assert s.done.wait(60)
    for name in ("short", "long"):
        err = sinks[name].sent[-1][1]
        assert err and f"a row of {rows[name].shape[1]} entries" in err and f"vocabulary has {vocab}" in err, err
    for name in ("full", "none"):
        assert sinks[name].sent[-1][1] is None and sinks[name].sent[-1][0]["output_ids"].shape == (1, 1, 5)


def test_stats_count_refused_requests_as_ended_in_error(host):
    """cache_control's stats (EngineHost.stats) said ended error 0 beside 14 refused requests while the metrics
    port said 14 (a review helper's finding; fails on the old code): both now count a refusal as an error end."""
    from trtllm_dasc.serve.metrics import LABELLED
    before = host.stats()
    bad = [inputs([1, 2, 3], 0), {**inputs([1, 2, 3], 2), "beam_width": np.array([[2]], np.int32)},
           {"input_ids": np.array([[1]], np.int32)}]
    sinks = [Sink() for _ in bad]
    for i, (request, sink) in enumerate(zip(bad, sinks)):
        host.submit(request, f"bad{i}", sink)
    for sink in sinks:
        assert sink.done.wait(60) and sink.sent[-1][1]
    after = host.stats()
    assert after["rejected"] - before["rejected"] == 3
    assert after["ended"]["error"] - before["ended"]["error"] == 3
    (ended,) = [read for name, *_, read in LABELLED if name == "dasc_requests_ended_total"]
    assert ended(after)["error"] == after["ended"]["error"]


def test_the_kv_warning_counts_a_wr_hits_replay_blocks(capsys):
    """A wr engine needs the replay's blocks beside the sequence's (the scheduler's worst_case_blocks): 16 blocks
    of 8 hold a 128-token context but not a W=16 replay beside it, which the first warning missed (a review
    helper's finding): ceil(127 / 8) + ceil(16 / 8) = 18."""
    from build_scripts.dasc_build import warn_kv_context
    opts = dict(max_context=128, block_size=8, num_kv_blocks=16, policy="wr", replay_window=None)
    warn_kv_context(opts, 16)
    assert "with a 16-token replay" in capsys.readouterr().err
    warn_kv_context({**opts, "num_kv_blocks": 18}, 16)
    warn_kv_context({**opts, "policy": "nr"}, 16)
    assert capsys.readouterr().err == ""
    warn_kv_context({**opts, "num_kv_blocks": 17}, 16)
    assert "--kv-blocks >= 18" in capsys.readouterr().err
