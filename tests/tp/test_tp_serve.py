"""`dasc serve --tp`: one mpirun of tritonserver (rank 0, the dasc_hybrid model inside it) and T-1 worker
ranks. Streamed outputs equal the TP1 engine's for a dasc arm whose checkpoints move units between ranks;
a rank that dies takes the server down within 30 s (never a hung, half-alive server)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve_helpers import StreamClient, build_engine, serve, start_dasc_serve, triton_inputs
from tp_helpers import build_tp_model, have_mpi

pytestmark = pytest.mark.skipif(have_mpi() is not None, reason=f"no MPI here: {have_mpi()}")

ARM = ["--wmax", 32, "--placement", "storage", "--max-batch-size", 4, "--kv-blocks", 300, "--block-size", 4,
       "--interval", 8, "--max-context", 128]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp-serve-kda")
    build_tp_model(path, "kda", seed=31)
    return path


def _prompts():
    import random
    rng = random.Random(5)
    base = [rng.randrange(3, 97) for _ in range(30)]
    return [base[:rng.randrange(8, 30)] + [rng.randrange(3, 97) for _ in range(rng.randrange(1, 4))] for _ in range(8)]


def test_tp2_serving_equals_tp1_engine_with_moved_units(model, tmp_path):
    import tritonclient.grpc as grpc

    from trtllm_dasc.engine.engine import Engine
    from trtllm_dasc.engine.request import GenerationRequest
    from trtllm_dasc.serve.host import engine_config
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 4, *ARM)
    cfg = engine_config(str(engine_dir))
    from trtllm_dasc.plan import PlanOptions, plan_from_path
    assert plan_from_path(str(model), PlanOptions(wmax=32, tp=4, placement="storage"))[0].moved_units > 0
    # the reference: the same arm in this process at TP1 (the TP1 engine is checked against transformers
    # elsewhere; dasc is lossy, so transformers itself is not the reference here)
    import dataclasses
    ref_engine = Engine(dataclasses.replace(cfg, model=str(model), tp_size=1, placement="off", plan_path=None,
                                            rank_weights=None))
    prompts = _prompts()
    # one request at a time on both sides: with a lossy arm, whether a prompt hits a checkpoint another
    # stored (and so what it computes) depends on the order requests meet the cache
    want = [ref_engine.generate([GenerationRequest(i, p, 4)])[0] for i, p in enumerate(prompts)]
    again = ref_engine.generate([GenerationRequest("again", prompts[0], 3)])[0]
    server = serve(engine_dir, tmp_path / "work", tp=4)
    try:
        client = StreamClient(server.grpc_url)
        try:
            got = {}
            for i, p in enumerate(prompts):
                client.send(f"s{i}", triton_inputs(grpc, p, 4, streaming=True))
                got.update(client.collect(1))
            client.send("again", triton_inputs(grpc, prompts[0], 3, streaming=True))
            rec = client.collect(1)["again"]
        finally:
            client.close()
        for i in range(len(prompts)):
            assert got[f"s{i}"]["error"] is None and got[f"s{i}"]["tokens"] == want[i], i
        assert rec["cached"] > 0 and rec["tokens"] == again
        # the all-to-all's time on the metrics port (stores moved units away, the hit brought them back)
        exchange = {}
        for _ in range(20):
            exchange = _exchange_seconds(server.metrics_url)
            if exchange.get("store", 0) > 0 and exchange.get("load", 0) > 0:
                break
            time.sleep(0.5)
        assert exchange.get("store", 0) > 0 and exchange.get("load", 0) > 0, exchange
    finally:
        server.stop()


def _exchange_seconds(url: str) -> dict:
    import re
    import urllib.request
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^dasc_checkpoint_exchange_seconds_total\{.*?op="(\w+)".*?\} (\S+)$', text, re.M)}


def test_a_dead_rank_takes_the_server_down(model, tmp_path):
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 100, "--block-size", 4, "--max-context", 64)
    server = serve(engine_dir, tmp_path / "work", tp=2)
    try:
        # the worker itself (mpirun's own command line names it too)
        workers = subprocess.run(["pgrep", "-f", f"^{sys.executable} -m trtllm_dasc.serve.worker --engine {engine_dir}"],
                                 capture_output=True, text=True).stdout.split()
        assert len(workers) == 1
        subprocess.run(["kill", "-9", workers[0]])
        t0 = time.time()
        while server.proc.poll() is None and time.time() - t0 < 30:
            time.sleep(0.5)
        assert server.proc.poll() is not None, "the server outlived its dead rank by 30 s"
        # nothing of it is left serving: no tritonserver of this engine, no stub
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", str(engine_dir)], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of the dead server remain: {left}"
    finally:
        server.stop()


def test_tp_build_writes_per_rank_weights(model, tmp_path):
    """dasc-build --tp 4 cuts the checkpoint once per rank: rank files instead of the full weights, each
    holding a quarter of every sharded tensor; a file cut for another bundle order is refused."""
    import json

    from trtllm_dasc.errors import UserError
    from trtllm_dasc.model.rank_weights import RankWeights
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 4, *ARM)
    assert not list((engine_dir / "model").glob("*.safetensors"))
    full = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    sizes = [(engine_dir / "weights" / f"rank{r}.safetensors").stat().st_size for r in range(4)]
    # the replicated part (embedding, LM head, norms, routers) is on every rank, the rest split in four
    assert all(s < full for s in sizes) and sum(sizes) < 2 * full
    meta = json.loads((engine_dir / "weights" / "rank1.json").read_text())
    assert meta["tp_size"] == 4 and meta["tp_rank"] == 1
    wrong = [list(reversed(row)) for row in meta["bundle_order"]]
    with pytest.raises(UserError, match="rebuild the engine"):
        RankWeights(str(engine_dir / "weights"), 1, 4, wrong)


def test_dasc_serve_names_the_rank_that_took_the_server_down(model, tmp_path):
    """A worker rank killed under `dasc serve --tp 2`: mpirun ends the server at once, and dasc serve's line
    said only 'tritonserver exited with code 137' (tritonserver itself killed, as by the OOM killer?); the
    rank that died was named in mpirun's report inside the server log alone. From a review helper; fails on
    the old code."""
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 100, "--block-size", 4, "--max-context", 64)
    proc, _ = start_dasc_serve(engine_dir, tmp_path / "work")
    try:
        workers = subprocess.run(["pgrep", "-f", f"^{sys.executable} -m trtllm_dasc.serve.worker --engine {engine_dir}"],
                                 capture_output=True, text=True).stdout.split()
        assert len(workers) == 1
        subprocess.run(["kill", "-9", workers[0]])
        assert proc.wait(30) != 0
        err = proc.stderr.read()
        assert f"TP rank 1 (pid {workers[0]}) was killed by signal 9" in err, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


def test_dasc_serve_stops_when_tritonserver_is_killed_under_mpirun(model, tmp_path):
    """SIGKILL of tritonserver itself at TP 2: mpirun did not always notice (its rank 0 is the server), nothing
    listened any more, and dasc serve waited for good (the metrics check reads an unreachable port as alive; a
    review helper saw it in 2 of 4 tries). dasc serve now watches the tritonserver process itself."""
    from trtllm_dasc.serve.tritonserver import find_server
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 100, "--block-size", 4, "--max-context", 64)
    proc, _ = start_dasc_serve(engine_dir, tmp_path / "work")
    try:
        binary = os.path.realpath(find_server().binary)
        pids = [int(p) for p in subprocess.run(["pgrep", "-f", str(engine_dir / "model_repo")], capture_output=True,
                                               text=True).stdout.split()]
        (server,) = [p for p in pids if _exe(p) == binary]
        # Open MPI's segments live in this run's own folder, which the stop removes: killed TP groups left
        # 16 MiB a rank in /dev/shm (a review helper's finding)
        with open(f"/proc/{server}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        mpi_dir = env[b"OMPI_MCA_btl_sm_backing_directory"].decode()
        assert any(f.startswith("sm_segment") for f in os.listdir(mpi_dir)), os.listdir(mpi_dir)
        # mpirun held still stands for the runs where it did not notice: what dasc serve does may not rest on it
        mpirun = os.getsid(server)
        os.kill(mpirun, signal.SIGSTOP)
        os.kill(server, signal.SIGKILL)
        assert proc.wait(30) != 0
        assert "tritonserver" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        subprocess.run(["pkill", "-9", "-f", str(engine_dir)])          # what the old code left
    time.sleep(1.0)
    left = subprocess.run(["pgrep", "-f", str(engine_dir)], capture_output=True, text=True).stdout.split()
    assert not left, left
    assert not os.path.exists(mpi_dir), os.listdir(mpi_dir)


def _exe(pid: int) -> str | None:
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return None


def test_a_rank_that_cannot_start_is_named_by_dasc_serve(model, tmp_path):
    """A TP engine whose rank 1 weights are truncated: the worker says why in the server log, mpirun ends the job,
    and dasc serve said only 'tritonserver exited with code 2' (a review helper's finding; fails on the old
    code). Its error now carries the worker's own line."""
    from trtllm_dasc.parallel.group import free_port
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 100, "--block-size", 4, "--max-context", 64)
    weights = engine_dir / "weights" / "rank1.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine_dir), "--http-port",
                           str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
                           "--work-dir", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "TP rank 1 of 2 could not start" in last and "rank 1's weights" in last, \
        proc.stderr[-3000:]


def test_a_stopped_worker_cannot_hold_the_server_past_the_tp_timeout(model, tmp_path):
    """A worker stopped (SIGSTOP) while idle, then a request whose plan is past Open MPI's eager size: rank 0
    waited in the plan's broadcast, an MPI call without a timeout, and the server stayed ready for good (a
    review helper's finding; fails on the old code). The step watchdog aborts the job after --tp-timeout-s."""
    import tritonclient.grpc as grpc
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 200, "--block-size", 4, "--max-context", 320, "--tp-timeout-s", 4)
    proc, ports = start_dasc_serve(engine_dir, tmp_path / "work")
    client = StreamClient(f"127.0.0.1:{ports[1]}")
    try:
        (worker,) = subprocess.run(["pgrep", "-f", f"^{sys.executable} -m trtllm_dasc.serve.worker --engine {engine_dir}"],
                                   capture_output=True, text=True).stdout.split()
        os.kill(int(worker), signal.SIGSTOP)
        client.send("big", triton_inputs(grpc, list(range(3, 203)), 2, streaming=True))
        assert proc.wait(60) != 0
        assert "has not ended in 4 s" in open(tmp_path / "work" / "tritonserver.log").read()
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-9", "-f", str(engine_dir)])      # what the old code left, stopped
        client.close()


def test_mpirun_killed_is_exit_code_137(model, tmp_path):
    """mpirun itself SIGKILLed under dasc serve: it said 'exited with code -9' and exited 247 (sys.exit(-9));
    now 128 + 9, as a shell reports a killed process (a review helper's finding; fails on the old code)."""
    engine_dir = build_engine(model, tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                              "--kv-blocks", 100, "--block-size", 4, "--max-context", 64)
    proc, _ = start_dasc_serve(engine_dir, tmp_path / "work")
    try:
        (worker,) = subprocess.run(["pgrep", "-f", f"^{sys.executable} -m trtllm_dasc.serve.worker --engine {engine_dir}"],
                                   capture_output=True, text=True).stdout.split()
        os.kill(os.getsid(int(worker)), signal.SIGKILL)          # the session's leader: mpirun
        assert proc.wait(60) == 137
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-9", "-f", str(engine_dir)])
