"""dasc-build and dasc serve as a user runs them: bad options are one line and exit code 2; an engine
directory is self-contained (it serves after being moved); dasc serve reports ready, answers, and stops
cleanly on SIGTERM and when its server dies, never leaving a process behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from serve_helpers import StreamClient, build, build_engine, serve, triton_inputs
from trtllm_dasc.serve.tritonserver import free_port


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    build(tmp / "ckpt", "gdn", seed=5)
    return tmp / "ckpt"


@pytest.fixture(scope="module")
def engine(ckpt, tmp_path_factory):
    """One engine of the checkpoint for the tests that serve an engine directory (a build and its
    checks are ~10 s of a loaded 2-core machine; these tests only need one to exist)."""
    return build_engine(ckpt, tmp_path_factory.mktemp("cli-engine") / "engine", "--wmax", 16, "--max-batch-size", 2,
                        "--kv-blocks", 128, "--block-size", 4, "--max-context", 128)


def dasc_build(*args):
    return subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flags,needle", [
    (("--tp", 3), "TP degree 3 does not divide the 2"), (("--max-batch-size", 0), "max_batch"), (("--device", "foo"), "device"),
    (("--wmax", -1), "wmax"), (("--kv-blocks", 99999999999999), "num_kv_blocks"), (("--dtype", "int4"), "--dtype"),
    (("--state-budget-bytes", 10), "budget"), (("--max-queue-delay-microseconds", -5), "max-queue-delay"),
    # past int32 / uint64 they wrote config.pbtxt files tritonserver cannot parse (a review helper's finding)
    (("--max-batch-size", 2**31), "max_batch"), (("--max-queue-delay-microseconds", 10**20), "max-queue-delay"),
    # accepted and without effect on real weights before
    (("--seed", 3), "--load-format dummy"),
    (("--tp-timeout-s", 0), "tp_timeout_s"), (("--tp-timeout-s", "nan"), "tp_timeout_s"),
], ids=["tp", "batch", "device", "wmax", "kv-blocks", "dtype", "budget", "delay", "batch-int32", "delay-huge", "seed",
        "tp-timeout-zero", "tp-timeout-nan"])
def test_bad_build_options_are_one_line(ckpt, tmp_path, flags, needle):
    proc = dasc_build("--model", ckpt, "--output", tmp_path / "e", "--device", "cpu", *flags)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and needle in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "e").exists()


def test_build_refuses_to_overwrite_and_a_non_checkpoint(ckpt, tmp_path):
    out = tmp_path / "e"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    proc = dasc_build("--model", ckpt, "--output", out, "--device", "cpu")
    assert proc.returncode == 2 and "--force" in proc.stderr and (out / "keep.txt").exists()
    proc = dasc_build("--model", tmp_path, "--output", tmp_path / "f", "--device", "cpu")
    assert proc.returncode == 2 and "no config.json" in proc.stderr


def test_engine_dir_is_self_contained(engine, tmp_path):
    meta = json.loads((engine / "config.json").read_text())
    assert meta["engine"]["wmax"] == 16 and (engine / "plan.json").is_file() and (engine / "kernels").is_dir()
    moved = tmp_path / "elsewhere" / "engine"
    moved.parent.mkdir()
    # the module's engine itself, moved: nothing is left where it was built while it serves (moved back after)
    shutil.move(str(engine), str(moved))
    try:
        assert not engine.exists()
        server = serve(moved, tmp_path / "work")
        try:
            import tritonclient.grpc as grpc
            client = StreamClient(server.grpc_url)
            client.send("a", triton_inputs(grpc, [1, 2, 3], 2, streaming=True))
            rec = client.collect(1)["a"]
            client.close()
            assert rec["error"] is None and len(rec["tokens"]) == 2
        finally:
            server.stop()
    finally:
        shutil.move(str(moved), str(engine))


def _serve_proc(args, tmp_path, work_dir=True):
    """dasc serve, ready; its work directory tmp_path/work, or (work_dir=False) the temporary one it makes,
    under tmp_path/work as TMPDIR (so _server_pids finds the server's processes either way)."""
    ports = [free_port() for _ in range(3)]
    cmd = [sys.executable, "-m", "trtllm_dasc.cli", "serve", *map(str, args), "--http-port", ports[0],
           "--grpc-port", ports[1], "--metrics-port", ports[2]]
    env = dict(os.environ)
    if work_dir:
        cmd += ["--work-dir", tmp_path / "work"]
    else:
        (tmp_path / "work").mkdir()
        env["TMPDIR"] = str(tmp_path / "work")
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 240
    line = ""
    while time.time() < deadline and "ready:" not in line:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
    assert "ready:" in line, line
    return proc, ports


def _server_pids(tmp_path):
    out = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_dasc_serve_builds_a_checkpoint_answers_and_stops_on_sigterm(ckpt, tmp_path):
    """Without --work-dir: the temporary work directory it made keeps only the server's log after the stop (the
    engine it built there, a copy of the checkpoint's files beside the rank weights, and the ~3 MB backends
    copy were left in /tmp by every run: 62 such directories after one day of this suite; fails on the old code)."""
    proc, ports = _serve_proc(["--model", ckpt, "--device", "cpu", "--dtype", "float32", "--wmax", 0,
                               "--max-batch-size", 2, "--kv-blocks", 128, "--max-context", 128], tmp_path,
                              work_dir=False)
    (made,) = (tmp_path / "work").iterdir()
    assert (made / "engine" / "model_repo").is_dir() and (made / "backends").is_dir()
    try:
        import tritonclient.grpc as grpc
        client = StreamClient(f"127.0.0.1:{ports[1]}")
        client.send("a", triton_inputs(grpc, [4, 5, 6], 3))
        rec = client.collect(1)["a"]
        client.close()
        assert rec["error"] is None and rec["tokens"][:3] == [4, 5, 6] and len(rec["tokens"]) == 6
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    time.sleep(0.5)
    assert not _server_pids(tmp_path), "tritonserver outlived dasc serve"
    assert [p.name for p in made.iterdir()] == ["tritonserver.log"] and "Started GRPCInferenceService" in (made / "tritonserver.log").read_text()
    assert f"server log kept: {made / 'tritonserver.log'}" in proc.stderr.read()


def test_dasc_serve_exits_when_its_server_dies(engine, tmp_path):
    proc, _ = _serve_proc(["--model", engine], tmp_path)
    for pid in _server_pids(tmp_path):
        if pid != proc.pid:
            os.kill(pid, signal.SIGKILL)
    assert proc.wait(60) != 0


def test_dasc_serve_refuses_one_port_for_two_endpoints(engine, tmp_path):
    """--http-port and --grpc-port the same: tritonserver failed after the model load, the cause only in its
    log ("not ready"). Now one line before anything starts. From a review helper; fails on the old code."""
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine), "--http-port",
                           "18123", "--grpc-port", "18123", "--work-dir", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "--http-port and --grpc-port are both 18123" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_dasc_serve_refuses_a_port_in_use_before_starting(engine, tmp_path):
    """Port 8000 (or any) already taken: tritonserver exited only after the model's warm-up (61 s here), and
    dasc serve said "exited with code 1", the cause in its log alone. Now one line before anything starts.
    From a review helper; fails on the old code."""
    import socket
    import time
    from trtllm_dasc.parallel.group import free_port
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    busy = holder.getsockname()[1]
    try:
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine), "--http-port",
                               str(free_port()), "--grpc-port", str(busy), "--metrics-port", str(free_port()),
                               "--work-dir", str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    finally:
        holder.close()
    err = proc.stderr.strip()
    assert proc.returncode == 2 and f"--grpc-port {busy} is in use" in err, err
    assert err.splitlines()[-1].startswith("dasc serve: error") and "Traceback" not in err
    assert time.time() - t0 < 60


def _serve_refused(args, tmp_path, *, work_dir=True):
    """dasc serve with args that must be refused before anything starts: (exit code, stderr)."""
    from trtllm_dasc.parallel.group import free_port
    cmd = [sys.executable, "-m", "trtllm_dasc.cli", "serve", *map(str, args)]
    if "--http-port" not in args:
        cmd += ["--http-port", str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    if work_dir:
        cmd += ["--work-dir", str(tmp_path / "w")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    err = proc.stderr.strip()
    assert "Traceback" not in err and err.splitlines()[-1].startswith("dasc serve: error"), err
    return proc.returncode, err


@pytest.mark.parametrize("host,says", [
    ("nonexistent.invalid", "--host nonexistent.invalid is not an address"),
    ("192.0.2.55", "--host 192.0.2.55 is not an address of this machine"),   # TEST-NET-1: never local
])
def test_dasc_serve_blames_a_bad_host_not_the_port(engine, tmp_path, host, says):
    """An unresolvable or foreign --host was reported as "--http-port N is in use", the port being free.
    From a review helper; fails on the old code."""
    rc, err = _serve_refused(["--model", engine, "--host", host], tmp_path)
    assert rc == 2 and says in err and "in use" not in err, err


def test_dasc_serve_refuses_a_work_dir_that_cannot_be_one(engine, tmp_path):
    """A file as --work-dir (or one under a file) ended in FileExistsError's traceback. From a review helper."""
    (tmp_path / "f").write_text("x")
    for bad in (tmp_path / "f", tmp_path / "f" / "sub"):
        rc, err = _serve_refused(["--model", engine, "--work-dir", bad], tmp_path, work_dir=False)
        assert rc == 2 and f"--work-dir {bad} cannot be made a directory" in err, err


def test_dasc_serve_refuses_a_missing_model_a_bad_ready_timeout_and_an_engine_without_its_repository(engine,
                                                                                                    tmp_path):
    """--model that does not exist printed "is a checkpoint: building" first; --ready-timeout -5 started the
    server and then said "not ready after -5.0 s"; an engine without model_repo/ said only "tritonserver
    exited with code 1". Each now one line before anything starts. From a review helper."""
    rc, err = _serve_refused(["--model", tmp_path / "nothing"], tmp_path)
    assert rc == 2 and "does not exist" in err and "building" not in err, err
    for bad in ("-5", "0", "nan", "inf"):
        rc, err = _serve_refused(["--model", engine, "--ready-timeout", bad], tmp_path)
        assert rc == 2 and "--ready-timeout must be a positive number" in err, err
    partial = tmp_path / "partial"
    shutil.copytree(engine, partial, symlinks=True)
    shutil.rmtree(partial / "model_repo")
    rc, err = _serve_refused(["--model", partial], tmp_path)
    assert rc == 2 and "has no model_repo/" in err, err


def test_a_refused_serve_leaves_no_temporary_work_directory(engine, tmp_path):
    """Without --work-dir, dasc serve makes one under the temporary directory; a run refused before the server
    started (an engine without model_repo/, here) left it behind, empty of anything a user needs. From a review
    helper; fails on the old code."""
    from trtllm_dasc.parallel.group import free_port
    partial = tmp_path / "partial"
    shutil.copytree(engine, partial, symlinks=True)
    shutil.rmtree(partial / "model_repo")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(partial), "--http-port",
                           str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp)})
    assert proc.returncode == 2 and "has no model_repo/" in proc.stderr, proc.stderr
    assert list(tmp.iterdir()) == []


def test_an_engine_given_as_the_checkpoint_is_one_line(engine, tmp_path):
    """dasc-build / dasc logits --model ENGINE: "unsupported model_type None" (the engine's config.json has none).
    Now one line naming it and where its model is. From a review helper; fails on the old code."""
    proc = dasc_build("--model", engine, "--output", tmp_path / "e", "--device", "cpu")
    assert proc.returncode == 2 and "is a dasc engine directory" in proc.stderr, proc.stderr
    assert str(engine / "model") in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "logits", "--model", str(engine), "--ids", "1,2,3",
                           "--out", str(tmp_path / "l.pt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is a dasc engine directory" in proc.stderr, proc.stderr


def test_build_options_given_with_an_engine_directory_are_named_as_ignored(tmp_path, capsys):
    """dasc serve --model ENGINE_DIR --tp 4 served the engine at its built TP without a word: the build options
    a user changed are named in one warning line; none changed, no warning."""
    import argparse
    from trtllm_dasc.cli_serve import add_arguments, engine_dir_for
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text('{"dasc_engine_version": 1}')
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert engine_dir_for(p.parse_args(["--model", str(engine)]), str(tmp_path)) == str(engine)
    assert "warning" not in capsys.readouterr().err
    assert engine_dir_for(p.parse_args(["--model", str(engine), "--tp", "4", "--wmax", "64"]), str(tmp_path)) \
        == str(engine)
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and ("--tp, --wmax are ignored" in err[0] or "--wmax, --tp are ignored" in err[0]), err


def test_the_tp_timeout_is_the_engines(ckpt, tmp_path):
    """dasc-build --tp-timeout-s lands in the engine's config (ranks.join_ranks gives it to the TP group:
    tests/tp/test_tp_faults.py shows a hung rank ending the job after it); without the flag, 600 s."""
    from trtllm_dasc.engine.config import engine_config
    for flags, expect in (([], 600.0), (["--tp-timeout-s", 30], 30.0)):
        out = tmp_path / f"e{len(flags)}"
        proc = dasc_build("--model", ckpt, "--output", out, "--device", "cpu", "--wmax", 0, *flags)
        assert proc.returncode == 0, proc.stderr
        assert engine_config(str(out)).tp_timeout_s == expect


def test_a_killed_dasc_serve_takes_its_server_along_and_sighup_drains(engine, tmp_path):
    """dasc serve killed outright (SIGKILL) left tritonserver serving in its own session with nothing to stop
    it, and SIGHUP (a closed terminal) killed dasc serve alone the same way (a review helper's finding; fails
    on the old code): the server now gets SIGTERM when its launcher dies, and SIGHUP drains as SIGTERM does."""
    proc, _ = _serve_proc(["--model", engine], tmp_path)
    assert _server_pids(tmp_path)
    proc.kill()
    proc.wait(30)
    deadline = time.time() + 30
    while _server_pids(tmp_path) and time.time() < deadline:
        time.sleep(0.5)
    left = _server_pids(tmp_path)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "tritonserver outlived a killed dasc serve"
    shutil.rmtree(tmp_path / "work")
    proc, _ = _serve_proc(["--model", engine], tmp_path)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(60) == 0 and "draining" in proc.stderr.read()
    time.sleep(0.5)
    assert not _server_pids(tmp_path)


def test_readiness_is_this_servers_own(engine, tmp_path):
    """Two servers started at once on the same ports: the second one's wait_ready was answered by the first
    (dasc serve printed ready), then its own tritonserver failed to bind (a review helper's finding; fails on
    the old code). Readiness now needs this server's own log to say it listens."""
    from serve_helpers import serve
    from trtllm_dasc.serve.tritonserver import start_server
    first = serve(engine, tmp_path / "a")
    try:
        second = start_server(str(engine / "model_repo"), str(tmp_path / "b"), http_port=first.http_port,
                              grpc_port=first.grpc_port, metrics_port=first.metrics_port)
        try:
            with pytest.raises(RuntimeError, match="exited with code"):
                second.wait_ready(120)
        finally:
            second.stop()
    finally:
        first.stop()


def test_sighup_stays_ignored_under_nohup(engine, tmp_path):
    """`nohup dasc serve`: SIGHUP was ignored as asked until dasc serve took it to drain (a review helper's
    finding on this session's change): an ignored SIGHUP stays ignored."""
    ports = [free_port() for _ in range(3)]
    cmd = ["nohup", sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine), "--http-port", ports[0],
           "--grpc-port", ports[1], "--metrics-port", ports[2], "--work-dir", tmp_path / "work"]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "ready:" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGHUP)
        time.sleep(3.0)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_work_dir_with_whitespace_is_refused_before_anything_starts(engine, tmp_path):
    """The Python backend starts its stubs through a shell line from WORK_DIR/backends: a work dir (or the
    temporary directory) with a space left every stub dead, never ready (a review helper's finding on this
    session's change). Refused in one line, as the model path is."""
    rc, err = _serve_refused(["--model", engine, "--work-dir", tmp_path / "sp ace"], tmp_path, work_dir=False)
    assert rc == 2 and "--work-dir" in err and "contains whitespace" in err, err
    spaced_tmp = tmp_path / "t mp"
    spaced_tmp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "serve", "--model", str(engine), "--http-port",
                           str(free_port()), "--grpc-port", str(free_port()), "--metrics-port", str(free_port())],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(spaced_tmp)})
    assert proc.returncode == 2 and "set TMPDIR" in proc.stderr and not list(spaced_tmp.iterdir()), proc.stderr


def test_a_model_repository_path_with_whitespace_is_refused(engine, tmp_path):
    """Triton's Python backend stub cannot take a model.py path with a space: every stub died (std::invalid_argument,
    stol) and the server was never ready, with nothing said until --ready-timeout (a review helper's finding)."""
    spaced = tmp_path / "with space" / "engine"
    shutil.copytree(engine, spaced, symlinks=True)
    (tmp_path / "built here").mkdir()
    built = dasc_build("--model", engine / "model", "--output", tmp_path / "built here" / "engine", "--device", "cpu",
                       "--max-batch-size", 2, "--kv-blocks", 64, "--block-size", 4, "--max-context", 64)
    assert built.returncode == 0 and "contains whitespace" in built.stderr, built.stderr
    rc, err = _serve_refused(["--model", spaced], tmp_path)
    assert rc == 2 and "contains whitespace" in err and len(err.strip().splitlines()) <= 3, err


def test_a_second_ctrl_c_stops_without_waiting_for_the_drain(ckpt, tmp_path):
    """A second Ctrl-C was ignored: dasc serve drained for the whole --drain-seconds (a review helper's finding;
    fails on the old code). Here a stream that would run ~40 s (100 ms a step) under a 60-s drain: the second
    SIGINT stops the server within the unload's bound."""
    engine = build_engine(ckpt, tmp_path / "slow", "--wmax", 0, "--max-batch-size", 2, "--kv-blocks", 128,
                          "--block-size", 4, "--max-context", 512, "--ablation-step-delay-ms", 100)
    proc, ports = _serve_proc(["--model", engine, "--drain-seconds", 60], tmp_path)
    import tritonclient.grpc as grpc
    client = StreamClient(f"127.0.0.1:{ports[1]}")
    try:
        client.send("long", triton_inputs(grpc, [4, 5, 6], 400, streaming=True))
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(40) == 0
        assert time.time() - t0 < 20 and "second signal" in proc.stderr.read()
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
