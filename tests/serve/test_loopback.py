"""Every listening socket of a TP2 server (tritonserver as rank 0 of one mpirun, a worker rank beside it,
the Python backend stubs) is on loopback, read from /proc (tests/serve/listeners.py). One exception, named:
Open MPI 5's prterun keeps its out-of-band listener on every interface (it refuses a loopback-only one)."""
from __future__ import annotations


import pytest

from listeners import is_loopback, listening_sockets, process_tree
from serve_helpers import build, build_engine, serve

from test_server_load import TP_MODEL
from tp_helpers import have_mpi


def test_every_listener_of_a_tp2_server_is_on_loopback(tmp_path):
    if have_mpi() is not None:
        pytest.skip(f"no MPI here: {have_mpi()}")
    build(tmp_path / "ckpt", "kda", seed=44, **TP_MODEL)
    engine = build_engine(tmp_path / "ckpt", tmp_path / "engine", "--tp", 2, "--wmax", 0, "--max-batch-size", 2,
                          "--kv-blocks", 100, "--max-context", 64)
    server = serve(engine, tmp_path / "work", tp=2)
    try:
        found = listening_sockets(process_tree(server.proc.pid))
    finally:
        server.stop()
    commands = " ".join(cmd for _, cmd, _ in found)
    # the server's three ports, the rendezvous store, gloo, and a worker rank were all seen
    assert "tritonserver" in commands and "trtllm_dasc.serve.worker" in commands and len(found) >= 6, found
    exposed = [(pid, cmd, addr) for pid, cmd, addr in found if not is_loopback(addr)
               and not cmd.split()[0].endswith("prterun")]
    assert not exposed, exposed
