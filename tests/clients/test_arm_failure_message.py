"""A server that dies mid-cell without --keep-going: one line on stderr naming the arm, the failure and how to
resume (the cells done are kept), exit 1; not a traceback. The cell it was running is not recorded as done."""
from __future__ import annotations

import json
import os

from clients import arms as armlib
from clients import matched_hbm, runner

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "trtllm_dasc", "assets", "tiny-kimi-linear")


def test_dead_server_is_one_line_and_resumable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(armlib, "build_engine", lambda model, arm, out, budget, flags: out)
    monkeypatch.setattr(armlib, "share_kernels", lambda engine, kernels: None)

    def served(arm, engine, units, store, ctx, call, commit, *a, **k):
        # what runner.served raises when tritonserver exits during the protocol, after one cell was written
        store.write(arm["key"], units[0], call, commit, {"seconds": 1.0, "blocks": []})
        raise RuntimeError(f"arm {arm['spec']}: tritonserver exited with code -9 during the protocol (log: L); "
                           "the client saw: 1 fill request(s) failed")
    monkeypatch.setattr(runner, "served", served)
    out = tmp_path / "out"
    argv = ["--model", MODEL, "--out", str(out), "--arms", "dense", "--dense-slots", "3", "--scale", "0.03",
            "--blocks-per-phase", "1", "--seeds", "42,7", "--device", "cpu", "--dtype", "float32"]
    assert matched_hbm.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    last = err[-1]
    assert last.startswith("matched_hbm: error: arm dense: tritonserver exited with code -9"), err
    cells = str(out / "cells")
    assert "1 of 2 cells done" in last and f"--cells-dir {cells}" in last, last
    with open(out / "matched_hbm.json") as f:
        res = json.load(f)
    assert res["complete"] is False and res["failed_arms"][0]["spec"] == "dense"
    assert len(os.listdir(out / "cells" / "cells" / "dense")) == 1
