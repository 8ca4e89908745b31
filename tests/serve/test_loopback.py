"""Every listening socket of a TP2 server (tritonserver as rank 0 of one mpirun, a worker rank beside it,
the Python backend stubs) is on loopback, read from /proc (tests/serve/listeners.py). One exception, named:
Open MPI 5's prterun keeps its out-of-band (OOB) listeners, one IPv4 and one IPv6, on the wildcard address.

Measured with Open MPI 5.0.11 / PRRTE 3.0.11 (`ss -ltnp` while `mpirun -np 2` ran): no MCA parameter confines
them. prte_if_include / oob_tcp_if_include (env PRTE_MCA_..., `--prtemca`, OMPI_MCA_...) set to `lo` or
127.0.0.1/8, and prte_if_exclude=eth0, abort the launch ("No network interfaces were found for out-of-band
communications": the OOB component skips the loopback device whatever the include list says); set to eth0
the listeners stay on 0.0.0.0 and [::] (the include list picks the addresses it advertises, not the bind
address: PRRTE's oob_tcp_listener.c binds INADDR_ANY / in6addr_any unconditionally);
oob_tcp_disable_ipv4_family / _ipv6_family leave both listeners in place; oob=^tcp aborts as above.
prterun's PMIx listener (ptl tcp) is on 127.0.0.1 by default, and is held to it here."""
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
    # prterun's OOB listeners (see above) are the only exception: on the wildcard address, at most one per
    # address family; any other address of prterun's (an interface's own, its PMIx listener) is not
    oob = [(pid, cmd, addr) for pid, cmd, addr in found if cmd.split()[0].endswith("prterun")
           and addr.rsplit(":", 1)[0] in ("0.0.0.0", "[::]")]
    assert len(oob) <= 2, oob
    exposed = [(pid, cmd, addr) for pid, cmd, addr in found if not is_loopback(addr) and (pid, cmd, addr) not in oob]
    assert not exposed, exposed
