"""`dasc` command line: one subcommand per module, imported only when used (keeps `dasc plan` light).

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Errors a user can fix
(bad config, bad flags, missing tensors) are raised as ``UserError`` subclasses and printed as one line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from trtllm_dasc.errors import UserError

# name -> (module, one-line help)
SUBCOMMANDS = {
    "plan": ("trtllm_dasc.plan.cli", "plan dasc compression from the decay weights and report capacity"),
    "synth": ("trtllm_dasc.plan.synthetic", "write a synthetic decay checkpoint (config.json + safetensors)"),
    "logits": ("trtllm_dasc.cli_logits", "prefill token ids and write float32 logits (.npy)"),
    "build": ("build_scripts.dasc_build", "build an engine directory from a checkpoint (same as dasc-build)"),
    "serve": ("trtllm_dasc.cli_serve", "serve an engine directory (or a checkpoint) with tritonserver"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (like every other user error), not a usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _exit_through_finally_on_sigterm():
    """SIGTERM (`timeout`, a job scheduler, docker stop) raises SystemExit(143) instead of ending the process
    at once, so the command leaves through its finally blocks: a tritonserver it started (in a session of its
    own, so not signalled with it) is stopped, not left holding the GPU. A handler the command installs
    itself (dasc serve drains) replaces this one; one installed before (an embedding program) is kept.
    Whether it installed one (then _execute puts the default back)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False
    _forget_deferred()
    signal.signal(signal.SIGTERM, _sigterm_to_system_exit)
    return True


def _sigterm_to_system_exit(signum, frame):
    """SystemExit(143), unless the signal came inside an import: there the handler may run in Python called
    from an extension's C++ (torch's import, through pybind11), where an exception aborts the process (SIGABRT
    and 80 lines of C++ unwinding, seen at dasc-build's start). The signal is sent again 50 ms later, until it
    lands outside the import (a command that ends before it does still exits 143: _execute)."""
    if _inside_import(frame):
        again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
        again.daemon = True
        _DEFERRED_SIGTERM.append(again)
        again.start()
        return
    _forget_deferred()
    sys.exit(128 + signal.SIGTERM)


_DEFERRED_SIGTERM: list = []   # the resend timers of a SIGTERM held back by an import, not yet delivered


def _forget_deferred() -> None:
    """Cancel the pending resends: one firing after the command ended would signal its caller (a test, a
    notebook) or the next command run in the same process."""
    for timer in _DEFERRED_SIGTERM:
        timer.cancel()
    _DEFERRED_SIGTERM.clear()


def _inside_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _execute(prog: str, run, args) -> int:
    """Run a command; a UserError is one line on stderr and exit code 2, never a traceback."""
    installed = _exit_through_finally_on_sigterm()
    try:
        rc = run(args) or 0
        # a SIGTERM held back by an import whose resend had not come when the command ended (the finally below
        # cancels the resend)
        return 128 + signal.SIGTERM if installed and _DEFERRED_SIGTERM else rc
    except UserError as e:
        # under mpirun every rank meets the same bad input: rank 0 alone says so
        if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
            print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: the command's finally blocks have run (dasc-build removed its half-built directory, the output
        # is as it was); a traceback says nothing more. 130 as the shell's 128 + SIGINT
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (head, a closed pipe) went away: not an error of ours
        sys.stderr.close()
        return 0
    finally:
        # a command run in-process (a test, a notebook) leaves the caller's SIGTERM as it found it
        if installed:
            _forget_deferred()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_command(prog: str, description: str, add_arguments, run, argv=None) -> int:
    """A standalone console command (dasc-build) with the same one-line error handling."""
    parser = _Parser(prog=prog, description=description)
    add_arguments(parser)
    return _execute(prog, run, parser.parse_args(argv))


def main(argv=None) -> int:
    parser = _Parser(prog="dasc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return _execute(f"dasc {args.command}", importlib.import_module(SUBCOMMANDS[args.command][0]).run, args)


if __name__ == "__main__":
    sys.exit(main())
