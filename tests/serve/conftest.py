"""Shared by the serving tests: the embedded default model's engine, built once per session, and one real
tritonserver serving it, shared by the modules that ask the same of it (before: each module built its own
engine and started its own server, about a minute of a loaded 2-core CI machine each).

The shared server has every option its users need at once: the admin key (test_serve_guards: only the
restricted APIs care) and a 1 s drain (test_cancel's prompt shutdown: only stop() reads it). --wmax 0 makes
every cached prefix exact, so what one module leaves in the cache never changes another's greedy tokens.
A module may stop it (test_cancel checks its shutdown): the next one that asks gets a fresh server. So
test_cancel runs after every other module of the shared server (pytest_collection_modifyitems): its stop
no longer costs the next module a second start and warm-up.

--prefill-chunk 64 --interval 32: warm-up's long prompts are two prefill chunks and its short ones two
intervals (engine/warmup.py), so with the defaults (2048, 256) every start of this engine prefilled ~960-
and ~520-token prompts through the CPU kernels (most of a minute on a loaded 2-core machine, each start;
measured: 56 s of CPU, 18 s with these); the tests' prompts are all shorter than one chunk."""
from __future__ import annotations

from pathlib import Path

import pytest

from serve_helpers import build_engine, serve
from trtllm_dasc.serve.tritonserver import new_admin_key

ASSET = Path(__file__).resolve().parents[2] / "trtllm_dasc" / "assets" / "tiny-kimi-linear"
# the default engine's dasc-build flags (the embedded model as test_cancel, test_drain, test_openai_frontend,
# test_serve_guards and test_text_serving serve it)
DEFAULT_FLAGS = ("--wmax", 0, "--max-batch-size", 4, "--kv-blocks", 512, "--max-context", 1024, "--prefill-chunk", 64,
                 "--interval", 32)
DRAIN_S = 1.0


# the shared server's module that stops it (see the module's docstring)
STOPS_SHARED = "test_cancel.py"


def pytest_collection_modifyitems(config, items):
    """Move the items of STOPS_SHARED right after the last other item that uses the shared server."""
    stopping = [it for it in items if it.path.name == STOPS_SHARED and it.path.parent == Path(__file__).parent]
    if not stopping:
        return
    rest = [it for it in items if it not in stopping]
    users = [i for i, it in enumerate(rest) if "default_server" in getattr(it, "fixturenames", ())]
    if not users:
        return
    at = max(users) + 1
    items[:] = rest[:at] + stopping + rest[at:]


@pytest.fixture(scope="session")
def default_engine(tmp_path_factory) -> Path:
    """The embedded default model built with DEFAULT_FLAGS (dasc-build's console entry, once)."""
    return build_engine(ASSET, tmp_path_factory.mktemp("default") / "engine", *DEFAULT_FLAGS)


class SharedServer:
    """The default engine's server, started on first use and again after someone stopped it."""

    def __init__(self, engine: Path, root: Path):
        self.engine, self.root, self.server, self.starts = engine, root, None, 0

    def get(self):
        if self.server is None or self.server.proc.poll() is not None:
            self.starts += 1
            self.server = serve(self.engine, self.root / f"work{self.starts}", admin_key=new_admin_key(),
                                drain_seconds=DRAIN_S)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@pytest.fixture(scope="session")
def shared_servers(default_engine, tmp_path_factory):
    holder = SharedServer(default_engine, tmp_path_factory.mktemp("default-serve"))
    yield holder
    holder.stop()


@pytest.fixture(scope="module")
def default_server(shared_servers, request):
    """The running shared server of the default engine (see the module's docstring). Stopped after the
    last module that uses it: an idle server's processes would hold memory through the rest of the suite."""
    yield shared_servers.get()
    items = request.session.items
    later = items[max(i for i, item in enumerate(items) if item.module is request.module) + 1:]
    if not any("default_server" in getattr(item, "fixturenames", ()) for item in later):
        shared_servers.stop()
