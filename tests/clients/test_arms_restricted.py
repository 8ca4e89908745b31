"""The benchmark servers (clients/arms.serve, used by `make run`) run in explicit model-control mode, so
they must start with the repository and shared-memory APIs restricted, with a fresh key per run (the
refusal itself is checked against the real server in tests/serve/test_serve_guards.py)."""
from __future__ import annotations

import clients.arms as arms
import trtllm_dasc.serve.tritonserver as ts


class _Fake:
    def wait_ready(self, timeout):
        pass


def test_arm_servers_restrict_the_admin_apis_with_a_fresh_key(monkeypatch):
    calls = []
    monkeypatch.setattr(ts, "start_server", lambda repo, work, **kw: calls.append(kw) or _Fake())
    arms.serve("/nowhere/engine", "/nowhere/work", 1.0)
    arms.serve("/nowhere/engine", "/nowhere/work2", 1.0)
    keys = [c.get("admin_key") for c in calls]
    assert all(k and len(k) >= 32 for k in keys) and keys[0] != keys[1], keys
    args = ts.restricted_api_args(keys[0])
    assert args == [f"--http-restricted-api=model-repository,shared-memory:dasc-admin-key={keys[0]}",
                    f"--grpc-restricted-protocol=model-repository,shared-memory:dasc-admin-key={keys[0]}"]
