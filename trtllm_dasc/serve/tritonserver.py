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
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field

from trtllm_dasc.dist.group import free_port  # noqa: F401  (also this module's: tests import it here)
from trtllm_dasc.errors import UserError


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
    return paths


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


# the APIs a restricted server answers only with the admin header: loading models from any path (and so
# running any model.py) and registering shared memory (a client could map the Python stub's own region)
RESTRICTED_APIS = "model-repository,shared-memory"
ADMIN_HEADER = "dasc-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


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

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Poll /v2/health/ready until the server (and so every model's warm-up) is ready."""
        import urllib.request
        deadline = time.time() + timeout
        url = f"http://{self.http_url}/v2/health/ready"
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.proc.returncode}:\n{self.log()[-4000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout} s:\n{self.log()[-4000:]}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the server's own process group goes with it (its Python
        backend stubs must not outlive it)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_server(model_repository: str, work_dir: str, *, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None, log_verbose: int = 0,
                 extra_args: list[str] | None = None, env: dict | None = None,
                 tp: tuple[int, str] | None = None, host: str = "127.0.0.1",
                 admin_key: str | None = None) -> ServerProcess:
    """Start tritonserver on 127.0.0.1 (or ``host``) for ``model_repository``; ``work_dir`` keeps the
    backends directory and the server log. Returns at once: call ``wait_ready``. With ``admin_key`` the
    repository and shared-memory APIs answer only requests carrying it (restricted_api_args).

    ``tp = (T, engine_dir)`` with T > 1: one mpirun runs the server as rank 0 and T - 1 dist.worker ranks of
    that engine (MPMD); the dasc_hybrid model inside the server joins as rank 0. ``proc`` is then mpirun:
    when any rank dies mpirun ends the rest, so the server never outlives its TP group."""
    paths = find_server()
    os.makedirs(work_dir, exist_ok=True)
    backends = backends_dir(os.path.join(work_dir, "backends"), paths)
    ports = [p or free_port() for p in (http_port, grpc_port, metrics_port)]
    run_env = dict(os.environ)
    run_env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [paths.libs, run_env.get("LD_LIBRARY_PATH")]))
    run_env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), run_env.get("PATH", "")])
    run_env.update(env or {})
    cmd = [paths.binary, "--model-repository", os.path.abspath(model_repository),
           "--backend-directory", backends, "--http-address", host, "--grpc-address", host,
           "--metrics-address", host, "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
           "--metrics-port", str(ports[2]), "--log-verbose", str(log_verbose), "--disable-auto-complete-config",
           *(restricted_api_args(admin_key) if admin_key else []), *(extra_args or [])]
    if tp is not None and tp[0] > 1:
        from trtllm_dasc.dist.launch import MPIRUN_FLAGS, find_mpirun, mpi_environment, pinned_paths
        # MPMD: mpirun -np 1 tritonserver ... : -np T-1 python -m trtllm_dasc.dist.worker --engine DIR,
        # each with this PATH (the stub finds its interpreter there) and LD_LIBRARY_PATH
        run_env = mpi_environment(tp[0], run_env)
        pin = pinned_paths(run_env)
        cmd = [find_mpirun(), *MPIRUN_FLAGS, "-np", "1", *pin, *cmd, ":", "-np", str(tp[0] - 1), *pin,
               sys.executable, "-m", "trtllm_dasc.dist.worker", "--engine", os.path.abspath(tp[1])]
    log_path = os.path.join(work_dir, "tritonserver.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, start_new_session=True)
    log.close()
    return ServerProcess(proc, *ports, log_path, run_env, host=host, admin_key=admin_key)
