"""The real tritonserver binary (shipped by the nvidia-pytriton wheel) and how to run it here.

nvidia-pytriton 0.7.0 carries server 2.51.0 with the Python backend, a backend stub per Python version and
the shared libraries the stub links against (in ``nvidia_pytriton.libs``). We use only the binary:
  - a backends directory of our own: the Python backend plus the stub of *this* interpreter's version
    (so model.py runs with this environment's site-packages: torch, our package);
  - LD_LIBRARY_PATH with the wheel's bundled libraries;
  - this interpreter's bin directory first on PATH (the stub starts the interpreter it finds there).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field

from trtllm_dasc.serve.drain import (DEFAULT_DRAIN_S, DRAIN_ENV, UNLOAD_S, find_tritonserver, is_drained,
                                     kill_session, new_shm_prefix, remove_regions, request_drain, shm_backend_args)
from trtllm_dasc.parallel.group import free_port  # noqa: F401  (also this module's: tests import it here)
from trtllm_dasc.errors import UserError
from trtllm_dasc.parallel.launch import MPIRUN_FLAGS, find_mpirun, mpi_environment, pinned_paths


@dataclass(slots=True)
class ServerPaths:
    binary: str
    python_backend: str        # the wheel's backends/python directory
    stub: str                  # triton_python_backend_stub for this Python
    libs: str                  # nvidia_pytriton.libs


def find_server() -> ServerPaths:
    """Locate the installed tritonserver; a UserError tells how to install it when it is missing."""
    site = sysconfig.get_paths()["purelib"]
    root = os.path.join(site, "pytriton", "tritonserver")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    paths = ServerPaths(binary=os.path.join(root, "bin", "tritonserver"),
                        python_backend=os.path.join(root, "backends", "python"),
                        stub=os.path.join(root, "python_backend_stubs", version, "triton_python_backend_stub"),
                        libs=os.path.join(site, "nvidia_pytriton.libs"))
    missing = [p for p in (paths.binary, paths.python_backend, paths.stub) if not os.path.exists(p)]
    if missing:
        raise UserError(f"tritonserver not found ({missing[0]} is missing): install it with "
                        "`pip install --no-deps nvidia-pytriton==0.7.0` (make test/run do)")
    check_stub_numpy()
    return paths


def check_stub_numpy(version: str | None = None) -> None:
    """The 2.51 Python backend stub exchanges tensors through numpy 1.x's ABI: under numpy 2 it reads
    inputs wrong and a string input kills the stub (seen on the H200: "unpack_from requires a buffer of at
    least 84215049 bytes"). Refuse before starting rather than after the model reports ready."""
    if version is None:
        import numpy
        version = numpy.__version__
    if int(version.split(".")[0]) >= 2:
        raise UserError(f"numpy {version} is installed, but tritonserver 2.51's Python backend stub needs numpy<2: "
                        "`pip install 'numpy>=1.26,<2'` (pyproject pins it; on a GPU machine carry numpy==1.26.4)")


def backends_dir(dest: str, paths: ServerPaths | None = None) -> str:
    """A backend directory holding the Python backend with this interpreter's stub (made once per dest)."""
    paths = paths or find_server()
    python = os.path.join(dest, "python")
    if not os.path.isfile(os.path.join(python, "triton_python_backend_stub")):
        os.makedirs(python, exist_ok=True)
        for name in os.listdir(paths.python_backend):
            src = os.path.join(paths.python_backend, name)
            if os.path.isfile(src):
                shutil.copy2(src, python)
        shutil.copy2(paths.stub, python)
    return dest


# the server's log in its work directory (dasc serve keeps it when it tidies a temporary one)
LOG_NAME = "tritonserver.log"


# the APIs a restricted server answers only with the admin header: loading models from any path (and so
# running any model.py) and registering shared memory (a client could map the Python stub's own region)
RESTRICTED_APIS = "model-repository,shared-memory"
ADMIN_HEADER = "dasc-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# tritonserver's metrics thread (CPU, pinned-memory and GPU gauges) sleeps this long between polls, and the
# server's exit joins it: at Triton's default (2000 ms) every stop waited up to 2 s (0.7-0.9 s measured on
# an idle server) after the models had unloaded. A poll reads /proc/stat and /proc/meminfo (DCGM per GPU),
# cheap at 5 per second; our engine's own metrics are set by the model, not polled. A later
# --metrics-interval-ms in extra_args overrides it (tritonserver takes the last).
METRICS_INTERVAL_MS = 200
# how long wait_ready waits, after the server is ready, for the metrics port (opened just after the HTTP one;
# a server with metrics off never opens it and is ready after this wait)
METRICS_PORT_WAIT_S = 10.0


def whitespace_in(path: str) -> str | None:
    """The absolute path when it holds whitespace, else None. Triton's Python backend starts each stub through a
    shell line naming the backends folder (in the work dir) and the model.py path: whitespace in either left
    every stub dead (stol, or "No such file") and the server never ready, nothing said."""
    full = os.path.abspath(path)
    return full if any(c.isspace() for c in full) else None


def _terminate_with_parent():
    """A preexec_fn: the child gets SIGTERM when its parent thread ends (Linux prctl PR_SET_PDEATHSIG; None
    where there is none). libc and its prctl are found here, before the fork, so the child only calls it."""
    import ctypes
    import ctypes.util
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_signal():
        prctl(1, signal.SIGTERM, 0, 0, 0)      # PR_SET_PDEATHSIG = 1
        if os.getppid() != parent:             # the parent died before the prctl: nothing will signal us
            os.kill(os.getpid(), signal.SIGTERM)
    return set_signal


def new_admin_key() -> str:
    """A fresh per-run key for the restricted APIs."""
    import secrets
    return secrets.token_hex(16)


def restricted_api_args(key: str) -> list[str]:
    """tritonserver's options restricting RESTRICTED_APIS to requests carrying ``ADMIN_HEADER: key``."""
    spec = f"{RESTRICTED_APIS}:{ADMIN_HEADER}={key}"
    return [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]


@dataclass
class ServerProcess:
    """A running tritonserver on 127.0.0.1 (or ``host``; use as a context manager, or call stop()).
    ``admin_key``: the header value the restricted APIs want (None: not restricted)."""

    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: str
    env: dict = field(default_factory=dict, repr=False)
    host: str = "127.0.0.1"
    admin_key: str | None = field(default=None, repr=False)
    # the graceful drain (serve/drain.py): the file the model polls, the seconds it gets, the binary to
    # signal, the prefix of the Python backend's shared-memory regions of this server
    drain_file: str | None = None
    drain_seconds: float = DEFAULT_DRAIN_S
    binary: str | None = None
    shm_prefix: str | None = None
    mpi_shm_dir: str | None = None      # at TP: Open MPI's shared-memory backing folder of this run
    # what stop() found: the seconds from the signal to the exit, processes killed, regions removed
    stop_report: dict = field(default_factory=dict, repr=False)
    ready: bool = False

    @property
    def connect_host(self) -> str:
        """Where a local client reaches it (a wildcard address is reached on loopback)."""
        if self.host in ("0.0.0.0", "::", ""):
            return "127.0.0.1"
        return f"[{self.host}]" if ":" in self.host else self.host

    def admin_headers(self, protocol: str = "http") -> dict:
        """The header the restricted APIs want (gRPC: tritonserver expects it prefixed)."""
        if not self.admin_key:
            return {}
        return {(GRPC_HEADER_PREFIX if protocol == "grpc" else "") + ADMIN_HEADER: self.admin_key}

    @property
    def http_url(self) -> str:
        return f"{self.connect_host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.connect_host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.connect_host}:{self.metrics_port}/metrics"

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def listening(self) -> bool:
        """Whether this server's own log says it listens on its HTTP port (tritonserver's "Started HTTPService
        at HOST:PORT" line, written once it has bound the port)."""
        return re.search(rf'Started HTTPService at \S*:{self.http_port}"', self.log()) is not None

    def tritonserver_pid(self) -> int | None:
        """The tritonserver process of this run (itself at TP1, mpirun's child at TP), None once gone."""
        return find_tritonserver(self.proc.pid, self.binary) if self.binary else self.proc.pid

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Poll /v2/health/ready until the server (and so every model's warm-up) is ready, then until its
        metrics port accepts connections: tritonserver opens that port after the HTTP one (65 ms later on
        an H200), and a scrape in between was refused."""
        import urllib.request
        deadline = time.time() + timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    # the answer must be this server's: another one started at once on the same ports answered
                    # while this one had not bound them yet (it then failed, "already in use", after dasc serve
                    # had printed ready); this server's own log says when it listens
                    if r.status == 200 and self.listening():
                        self.ready = True
                        self._wait_metrics_port(min(deadline, time.time() + METRICS_PORT_WAIT_S))
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout} s:\n{self.log()[-4000:]}")

    def _wait_metrics_port(self, until: float) -> None:
        """Until the metrics port accepts a connection, or ``until`` (a server started with metrics off
        never opens it: then it is ready all the same)."""
        import socket
        while time.time() < until and self.proc.poll() is None:
            try:
                with socket.create_connection((self.connect_host.strip("[]"), self.metrics_port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)

    def stop(self, timeout: float | None = None, drain_seconds: float | None = None, hurry=None) -> int:
        """Graceful drain (serve/drain.py): admission closes, what is in flight finishes or is cancelled
        within ``drain_seconds``, tritonserver unloads its models and exits; after ``timeout`` (default: the
        drain time plus the unload's) whatever is left of the run is killed. Then no process of the server's
        session and none of its shared-memory regions remain. Returns the server's (or mpirun's) exit code.
        ``hurry()`` true ends the drain's wait at once (dasc serve: a second Ctrl-C)."""
        drain = self.drain_seconds if drain_seconds is None else drain_seconds
        timeout = drain + 1.0 + UNLOAD_S + 2.0 if timeout is None else timeout
        t0 = time.time()
        if self.proc.poll() is None:
            # a drain needs the server: with tritonserver gone (killed under mpirun) there is nothing to wait for
            if self.drain_file and self.ready and self.tritonserver_pid() is not None:
                # the model first (admission closed, streams ended), then the server: signalled at once,
                # tritonserver would refuse the ensemble's next steps of the streams still running
                deadline = request_drain(self.drain_file, drain) + 1.0
                while time.time() < deadline and self.proc.poll() is None and not is_drained(self.drain_file) \
                        and not (hurry and hurry()):
                    time.sleep(0.02)
            # at TP proc is mpirun: signal tritonserver itself (mpirun would not pass SIGTERM on to it)
            target = self.tritonserver_pid() or self.proc.pid
            try:
                os.kill(target, signal.SIGTERM)
            except ProcessLookupError:
                pass
            # tritonserver gives the unload UNLOAD_S (--exit-timeout-secs); a model a client's open gRPC stream
            # still references never unloads (Triton 2.51), and the server then hangs on exit: killed after
            until = min(t0 + timeout, time.time() + UNLOAD_S + 2.0)
            try:
                self.proc.wait(max(0.0, until - time.time()))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        exited = time.time() - t0
        # stubs, TP ranks: nothing of the run outlives it (they are all in the server's own session)
        killed = kill_session(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        removed = remove_regions(self.shm_prefix) if self.shm_prefix else []
        if self.mpi_shm_dir:
            removed += sorted(os.listdir(self.mpi_shm_dir)) if os.path.isdir(self.mpi_shm_dir) else []
            shutil.rmtree(self.mpi_shm_dir, ignore_errors=True)
        self.stop_report = {"seconds": exited, "killed": killed, "regions_removed": removed}
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(model_repository: str, work_dir: str, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, log_verbose: int = 0,
                 extra_args: list[str] | None = None, env: dict | None = None,
                 tp: tuple[int, str] | None = None, host: str = "127.0.0.1",
                 admin_key: str | None = None, drain_seconds: float = DEFAULT_DRAIN_S,
                 die_with_parent: bool = False) -> ServerProcess:
    """Start tritonserver on 127.0.0.1 (or ``host``) for ``model_repository``; ``work_dir`` keeps the
    backends directory and the server log. Returns at once: call ``wait_ready``. With ``admin_key`` the
    repository and shared-memory APIs answer only requests carrying it (restricted_api_args).

    ``tp = (T, engine_dir)`` with T > 1: one mpirun runs the server as rank 0 and T - 1 serve.worker ranks of
    that engine (MPMD); the dasc_hybrid model inside the server joins as rank 0. ``proc`` is then mpirun:
    when any rank dies mpirun ends the rest, so the server never outlives its TP group.

    ``drain_seconds``: what ServerProcess.stop (and so a SIGTERM to `dasc serve`) gives the requests in
    flight before cancelling them; tritonserver's own exit timeout is that plus the unload's.

    ``die_with_parent``: the server (mpirun at TP) gets SIGTERM when the thread that started it ends, so a
    launcher killed outright (SIGKILL, or a closed terminal) takes its server along: in its own session the
    server never saw the terminal's signals and kept serving with nothing to stop it. For a process that
    starts its server from its main thread and runs as long as it (dasc serve)."""
    for what, path in (("the model repository", model_repository), ("the work directory", work_dir)):
        if whitespace_in(path):
            raise UserError(f"{what} {whitespace_in(path)!r} contains whitespace, which Triton's Python backend "
                            "cannot take: use a path without spaces")
    paths = find_server()
    os.makedirs(work_dir, exist_ok=True)
    backends = backends_dir(os.path.join(work_dir, "backends"), paths)
    ports = [p or free_port() for p in (http_port, grpc_port, metrics_port)]
    run_env = dict(os.environ)
    run_env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [paths.libs, run_env.get("LD_LIBRARY_PATH")]))
    run_env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), run_env.get("PATH", "")])
    run_env.update(env or {})
    shm_prefix = new_shm_prefix()
    mpi_shm_dir = None
    drain_file = os.path.join(os.path.abspath(work_dir), f"drain-{shm_prefix[-9:-1]}")
    if os.path.exists(drain_file):
        os.unlink(drain_file)
    run_env[DRAIN_ENV] = drain_file
    # what tritonserver waits for in-flight inferences after the drain: none but an ensemble request Triton
    # lost track of (a cancelled ensemble stream holds one for good), so the unload's time
    exit_timeout = int(UNLOAD_S)
    cmd = [paths.binary, "--model-repository", os.path.abspath(model_repository),
           "--backend-directory", backends, "--http-address", host, "--grpc-address", host,
           "--metrics-address", host, "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
           "--metrics-port", str(ports[2]), "--log-verbose", str(log_verbose), "--disable-auto-complete-config",
           f"--exit-timeout-secs={exit_timeout}", f"--metrics-interval-ms={METRICS_INTERVAL_MS}",
           *shm_backend_args(shm_prefix),
           *(restricted_api_args(admin_key) if admin_key else []), *(extra_args or [])]
    if tp is not None and tp[0] > 1:
        # MPMD: mpirun -np 1 tritonserver ... : -np T-1 python -m trtllm_dasc.serve.worker --engine DIR,
        # each with this PATH (the stub finds its interpreter there) and LD_LIBRARY_PATH
        run_env = mpi_environment(tp[0], run_env)
        # Open MPI's shared-memory segments (16 MiB a rank) in a folder of this run, which stop() removes: a
        # TP group that had to be killed left them in /dev/shm (two incidents fill Docker's default 64 MiB)
        mpi_shm_dir = tempfile.mkdtemp(prefix=f"dasc-mpi-{shm_prefix[-9:-1]}-",
                                       dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        run_env["OMPI_MCA_btl_sm_backing_directory"] = mpi_shm_dir
        pin = pinned_paths(run_env)
        cmd = [find_mpirun(), *MPIRUN_FLAGS, "-np", "1", *pin, *cmd, ":", "-np", str(tp[0] - 1), *pin,
               sys.executable, "-m", "trtllm_dasc.serve.worker", "--engine", os.path.abspath(tp[1])]
    log_path = os.path.join(work_dir, LOG_NAME)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, start_new_session=True,
                            preexec_fn=_terminate_with_parent() if die_with_parent else None)
    log.close()
    return ServerProcess(proc, *ports, log_path, run_env, host=host, admin_key=admin_key, drain_file=drain_file,
                         drain_seconds=drain_seconds, binary=paths.binary, shm_prefix=shm_prefix,
                         mpi_shm_dir=mpi_shm_dir)
