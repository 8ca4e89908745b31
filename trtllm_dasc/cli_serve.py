"""`dasc serve`: serve an engine directory (or build one from a checkpoint first) with tritonserver.

Starts the real tritonserver on 127.0.0.1 with the engine directory's model repository, waits until it is
ready (the tensorrt_llm model reports ready only after the engine's warm-up), prints the endpoints, and
then stays in the foreground. It stops the server and exits on Ctrl-C / SIGTERM (0), when the server
exits (its code), or when the engine inside it has died (1; seen on the metrics port), never leaving a
hung process behind.

Ctrl-C / SIGTERM drain gracefully (serve/drain.py): the model refuses new requests at once (one line: the
server is shutting down), the requests in flight finish or, after --drain-seconds, end with a 'cancelled'
final response; then the server reports not-ready, the models unload, tritonserver (and at TP every rank) exits, the Python backend's shared-memory regions
of this server are removed; anything still running 10 s after the drain (at most --drain-seconds + 1 s) is
killed (a client holding its gRPC stream open keeps Triton 2.51 from unloading the model).
The exit code is then 0 (also after a kill past the bound, which the log line says). A second Ctrl-C ends the
drain's wait at once. SIGHUP (a closed terminal) drains the same way, unless it is ignored (`nohup`). A
`dasc serve` killed outright (SIGKILL) takes its server along (tritonserver gets SIGTERM; at TP mpirun does
and ends every rank), and a tritonserver gone from under mpirun at TP ends the run (1) even when mpirun did
not notice.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from trtllm_dasc.engine_dir import is_engine_dir
from trtllm_dasc.engine_dir import read as read_engine_dir
from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.tritonserver import LOG_NAME, start_server, whitespace_in
from trtllm_dasc.engine.config import from_engine_fields
from trtllm_dasc.serve.repository import cache_policy
from trtllm_dasc.parallel.launch import find_mpirun, rank_that_ended
from trtllm_dasc.serve.tritonserver import new_admin_key
from trtllm_dasc.serve.load_errors import start_failure

POLL_S = 1.0
STALE_S = 30.0     # metrics not refreshed this long: the model's stub is gone


def add_arguments(p) -> None:
    from build_scripts.dasc_build import add_arguments as build_arguments
    p.add_argument("--http-port", type=int, default=8000, help="tritonserver's HTTP port (default 8000)")
    p.add_argument("--grpc-port", type=int, default=8001, help="tritonserver's gRPC port (default 8001)")
    p.add_argument("--metrics-port", type=int, default=8002, help="tritonserver's Prometheus metrics port (default 8002)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the HTTP, gRPC and metrics endpoints listen on (default 127.0.0.1, this machine "
                        "only; 0.0.0.0 for every interface). TP ranks talk over loopback whatever this says")
    p.add_argument("--openai-port", type=int, default=None,
                   help="also serve an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models) "
                        "on this port, on --host (default: off)")
    p.add_argument("--restrict-apis", action="store_true",
                   help="answer the model-repository and shared-memory APIs only with the header "
                        "'dasc-admin-key: KEY' (gRPC: 'triton-grpc-protocol-dasc-admin-key'; a fresh KEY per "
                        "run, written to WORK_DIR/admin-key, mode 0600)")
    p.add_argument("--drain-seconds", type=float, default=10.0,
                   help="on Ctrl-C / SIGTERM: seconds the requests in flight get to finish before they are "
                        "cancelled (default 10; new requests are refused at once; a second Ctrl-C stops without "
                        "waiting)")
    p.add_argument("--work-dir", default=None, help="where the server log (and a built engine) go "
                                                   "(default: a new temporary directory, of which only the server "
                                                   "log is kept when the run ends)")
    p.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for the warm-up")
    # the build options, for a checkpoint given as --model (ignored for an engine directory)
    build = p.add_argument_group("build (when --model is a checkpoint)")
    before = len(p._actions)
    build_arguments(build, p)
    for action in build._group_actions:
        if action.dest == "output":
            action.required, action.default = False, None
            action.help = "engine directory to build into (default: WORK_DIR/engine)"
    # which build options a user changed, to say they are ignored when --model is an engine directory
    # (its sections are groups of `p`, so they are the actions added since `before`)
    p.set_defaults(build_defaults={a.dest: a.default for a in p._actions[before:]
                                   if a.dest not in ("output", "model", "help")})


def engine_dir_for(args, work_dir: str) -> str:
    if is_engine_dir(args.model):
        defaults = getattr(args, "build_defaults", {})
        changed = [d for d, default in defaults.items() if getattr(args, d, default) != default]
        if changed:
            # the engine serves as it was built (its own TP, W_max, ...): a --tp 4 given here changed nothing
            flags = ", ".join("--" + d.replace("_", "-") for d in changed)
            print(f"[dasc serve] warning: {args.model} is an engine directory: the build options {flags} are "
                  "ignored (it serves as built; rebuild it with dasc-build to change them)", file=sys.stderr)
        return os.path.abspath(args.model)
    from build_scripts.dasc_build import build
    args.output = args.output or os.path.join(work_dir, "engine")
    print(f"[dasc serve] {args.model} is a checkpoint: building {args.output}", file=sys.stderr)
    return build(args)


def engine_alive(metrics_url: str) -> bool:
    """False once the tensorrt_llm model reports its engine dead (dasc_engine_alive 0)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return True          # the server being gone is noticed through its process
    values = [line.rsplit(" ", 1)[-1] for line in text.splitlines() if line.startswith("dasc_engine_alive")]
    # the gauges outlive the model's stub (a killed stub leaves its last values, dasc_engine_alive 1): the
    # refresh timestamp (set twice a second by the stub's metrics thread) going stale says it is gone
    stamps = [float(line.rsplit(" ", 1)[-1]) for line in text.splitlines()
              if line.startswith("nv_trt_llm_general_metrics") and 'general_type="timestamp"' in line]
    if stamps and time.time() - max(stamps) / 1e6 > STALE_S:
        return False
    return not values or all(float(v) != 0 for v in values)


def _check_ports_free(args) -> None:
    """Each endpoint's port, bound and released before anything starts: a port in use made tritonserver exit
    only after the model's warm-up (a minute or more), with the cause in its log alone."""
    import socket
    for name in ("http_port", "grpc_port", "metrics_port", "openai_port"):
        port = getattr(args, name, None)
        if not port:
            continue
        flag = "--" + name.replace("_", "-")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # as tritonserver binds (SO_REUSEADDR: a port in TIME_WAIT is free to it)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((args.host or "0.0.0.0", port))
            except socket.gaierror as e:
                raise UserError(f"--host {args.host} is not an address ({e.strerror or e})") from None
            except OSError as e:
                # only a port in use is the port's fault: an address not on this machine or a privileged port
                # failed the same bind (and was reported as "in use")
                if e.errno == errno.EADDRINUSE:
                    raise UserError(f"{flag} {port} is in use ({e.strerror}): stop what holds it or pass another "
                                    f"{flag}") from None
                if e.errno == errno.EADDRNOTAVAIL:
                    raise UserError(f"--host {args.host} is not an address of this machine ({e.strerror}): give one "
                                    "of its own, 127.0.0.1 or 0.0.0.0") from None
                raise UserError(f"cannot listen on {args.host}:{port} ({flag}): {e.strerror or e}") from None


def _engine_to_serve(args, work_dir: str):
    """The engine directory to serve (built into work_dir when --model is a checkpoint), checked and announced:
    (engine_dir, its model repository, TP size, the dummy-weights notice or None)."""
    engine_dir = engine_dir_for(args, work_dir)
    repo = os.path.join(engine_dir, "model_repo")
    if not os.path.isdir(repo):
        raise UserError(f"{engine_dir} has no model_repo/ (the engine directory is incomplete): rebuild it with "
                        "dasc-build")
    # lazy: torch / numpy load only when this runs (keeps importing this module light)
    from trtllm_dasc.serve.host import dummy_notice
    found = read_engine_dir(engine_dir)
    cfg = from_engine_fields(found.engine, f"{found.path}/config.json")
    # dasc's prefix cache is lossy unless W_max 0 with every codec native: say so before anything is served
    print(f"[dasc serve] prefix cache: {cache_policy(cfg.wmax, cfg.policy, cfg.codec, cfg.precision, cfg.conv_codec)}",
          file=sys.stderr, flush=True)
    notice = dummy_notice(found)
    if notice:
        print(f"[dasc serve] {notice}", file=sys.stderr, flush=True)
    if cfg.tp_size > 1:
        find_mpirun()
    return engine_dir, repo, cfg.tp_size, notice


def run(args) -> int:

    for name in ("http_port", "grpc_port", "metrics_port", "openai_port"):
        if getattr(args, name, None) is not None and not 0 < getattr(args, name) < 65536:
            raise UserError(f"--{name.replace('_', '-')} must be a port number, got {getattr(args, name)}")
    ports = [(name, getattr(args, name)) for name in ("http_port", "grpc_port", "metrics_port", "openai_port")
             if getattr(args, name, None)]
    for i, (name, port) in enumerate(ports):
        # two endpoints on one port: tritonserver failed after the model load, the cause in its log alone
        same = [other for other, p in ports[i + 1:] if p == port]
        if same:
            raise UserError(f"--{name.replace('_', '-')} and --{same[0].replace('_', '-')} are both {port}: give each "
                            "endpoint its own port")
    if not 0 <= args.drain_seconds <= 3600:
        raise UserError(f"--drain-seconds must be between 0 and 3600, got {args.drain_seconds}")
    if not (math.isfinite(args.ready_timeout) and args.ready_timeout > 0):
        raise UserError(f"--ready-timeout must be a positive number of seconds, got {args.ready_timeout}")
    if not os.path.exists(args.model):
        raise UserError(f"--model {args.model} does not exist (an engine directory or a checkpoint directory)")
    # an address or a port that cannot be used is said now, not after a build of minutes (and again below)
    _check_ports_free(args)
    made_here = args.work_dir is None
    # Triton's Python backend starts each stub through a shell line from the backends folder (in the work dir)
    # and the model.py path: whitespace in either left every stub dead and the server never ready, said now
    # (before a build of minutes) rather than by start_server
    engine_path = args.model if is_engine_dir(args.model) else (args.output or None)
    for flag, path in (("--work-dir", args.work_dir or tempfile.gettempdir()), ("--model", engine_path)):
        if path is not None and whitespace_in(path):
            raise UserError(f"{flag} {whitespace_in(path)!r} contains whitespace, which Triton's Python backend "
                            "cannot take" + (" (the temporary directory: set TMPDIR)" if flag == "--work-dir"
                                             and not args.work_dir else ": use a path without spaces"))
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="dasc-serve-")
    try:
        os.makedirs(work_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"--work-dir {work_dir} cannot be made a directory ({e.strerror or e})") from None
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        # a terminal closed during a build ends it through the finally below (the temporary work dir tidied);
        # _serve's own handler replaces this once the server starts
        signal.signal(signal.SIGHUP, lambda s, f: sys.exit(128 + signal.SIGHUP))
    try:
        return _serve(args, work_dir)
    finally:
        if made_here:
            _tidy_temporary_work_dir(work_dir)


def _ends_within(proc, seconds: float) -> bool:
    """Whether ``proc`` exits within ``seconds`` (it is then reaped; poll() reports its code)."""
    try:
        proc.wait(seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _tidy_temporary_work_dir(work_dir: str) -> None:
    """What is left of a temporary work directory (one dasc serve made) when the run ends, however it ends:
    only the server's log, whose path the run printed (a refused run, before any server, leaves nothing). The
    engine built there from a checkpoint (its model/ a copy of the checkpoint where hard links cannot cross
    into the temporary directory, weights/ the per-rank shards at TP), the backends copy (~3 MB) and the admin
    key were left in /tmp by every run before."""
    log = os.path.join(work_dir, LOG_NAME)
    if not os.path.isfile(log):
        shutil.rmtree(work_dir, ignore_errors=True)
        return
    for name in os.listdir(work_dir):
        path = os.path.join(work_dir, name)
        if name == LOG_NAME:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    print(f"[dasc serve] server log kept: {log} (the rest of the temporary work directory removed)", file=sys.stderr)


def _serve(args, work_dir: str) -> int:
    engine_dir, repo, tp, notice = _engine_to_serve(args, work_dir)
    stop = {"signal": None, "count": 0}

    def on_signal(sig, frame):
        stop.update(signal=sig, count=stop["count"] + 1)
        if stop["count"] == 2:
            # a second Ctrl-C: the user will not wait for the drain (the requests in flight are cancelled)
            print("[dasc serve] second signal: stopping now, without waiting for the requests in flight",
                  file=sys.stderr, flush=True)
    # SIGHUP (a closed terminal, a dropped ssh session) drains as SIGTERM does: the server is in a session of
    # its own and would not see it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # `nohup dasc serve` ignores SIGHUP: it stays ignored (the server outlives the terminal, as asked)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, on_signal)
    admin_key = None
    if args.restrict_apis:
        admin_key = new_admin_key()
        key_path = os.path.join(work_dir, "admin-key")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(admin_key + "\n")
        print(f"[dasc serve] repository and shared-memory APIs restricted: header dasc-admin-key (gRPC: triton-grpc-protocol-dasc-admin-key), key in {key_path}",
              file=sys.stderr)
    _check_ports_free(args)
    server = start_server(repo, work_dir, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port, tp=(tp, engine_dir), host=args.host, admin_key=admin_key,
                          drain_seconds=args.drain_seconds, die_with_parent=True)
    print(f"[dasc serve] starting tritonserver for {engine_dir} (log: {server.log_path})", file=sys.stderr)
    try:
        deadline = time.time() + args.ready_timeout
        while True:
            try:
                server.wait_ready(timeout=min(POLL_S, max(0.1, deadline - time.time())))
                break
            except TimeoutError:
                if stop["signal"] is not None:
                    return 0
                if time.time() > deadline:
                    raise UserError(f"tritonserver was not ready after {args.ready_timeout} s; see {server.log_path}")
        print(f"[dasc serve] ready: HTTP {server.http_url}  gRPC {server.grpc_url}  metrics {server.metrics_url}"
              + ("  (DUMMY WEIGHTS)" if notice else ""), flush=True)
        if args.openai_port is not None:
            # lazy: torch / numpy load only when this runs (keeps importing this module light)
            from trtllm_dasc.serve.openai_frontend import start_frontend
            openai = start_frontend(engine_dir, server.http_url, args.host, args.openai_port)
            print(f"[dasc serve] OpenAI API: http://{server.connect_host}:{openai.port}/v1", flush=True)
        while stop["signal"] is None:
            if server.proc.poll() is not None:
                # at TP mpirun ends the server when any rank dies: its report (in the server log) names the rank
                rank = rank_that_ended(server.log()) if tp > 1 else None
                print(f"[dasc serve] tritonserver exited with code {server.proc.returncode}"
                      + (f": {rank}; see {server.log_path}" if rank else ""), file=sys.stderr)
                code = server.proc.returncode
                # a signal's -N as the shell's 128 + N (sys.exit(-9) exited 247)
                return 128 - code if code < 0 else (code or 1)
            if tp > 1 and server.tritonserver_pid() is None and not _ends_within(server.proc, 2.0):
                # at TP mpirun may outlive a killed tritonserver without noticing (its rank 0 is the server):
                # nothing listens any more, and the metrics check below reads an unreachable port as alive.
                # When a worker died, mpirun ends tritonserver and then itself ~30 ms later: that exit (above,
                # next round) names the rank, so it gets its 2 s first
                print(f"[dasc serve] tritonserver is gone (mpirun still running); stopping (see {server.log_path})",
                      file=sys.stderr)
                return 1
            if not engine_alive(server.metrics_url):
                print("[dasc serve] the engine died; stopping the server (see its log)", file=sys.stderr)
                return 1
            # a signal must start the drain at once (a sleep resumes after the handler): short slices
            until = time.time() + POLL_S
            while stop["signal"] is None and time.time() < until:
                time.sleep(0.02)
        print(f"[dasc serve] draining (at most {args.drain_seconds:g} s for the requests in flight)",
              file=sys.stderr, flush=True)
        server.stop(hurry=lambda: stop["count"] >= 2)
        report = server.stop_report
        killed = f", killed {len(report['killed'])} leftover processes" if report["killed"] else ""
        print(f"[dasc serve] stopped in {report['seconds']:.1f} s{killed}", file=sys.stderr)
        return 0
    except RuntimeError as e:
        # the model's own load or warm-up error, not only "tritonserver exited with code 1"
        raise UserError(start_failure(str(e).splitlines()[0], server.log(), server.log_path)) from None
    finally:
        server.stop()
