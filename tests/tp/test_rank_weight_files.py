"""A TP engine's per-rank weight files (dasc-build --tp, model/rank_weights.py) on bad input, without MPI:
writing them on a full disk, and reading back files edited after the build. From a review's reproductions;
each fails on the code before its fix."""
from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tp_helpers import ROOT, build_tp_model


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpw") / "gdn"
    build_tp_model(path, "gdn", seed=3)
    return path


def _limit_file_size(limit: int):
    def preexec():
        # a write past the limit fails with EFBIG (as ENOSPC on a full disk) instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_rank_weights_that_cannot_be_written_are_one_line(tp_model, tmp_path):
    """A full disk while writing rank files (a 200 KiB tmpfs, or here a file-size limit) ended dasc-build with
    a SafetensorError traceback and exit code 1; the output is left as it was."""
    out = tmp_path / "engine"
    r = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(tp_model), "--output",
                        str(out), "--device", "cpu", "--tp", "2", "--wmax", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, preexec_fn=_limit_file_size(64 << 10))
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1, r.stderr
    assert "rank 0" in errors[0] and "rank0.safetensors" in errors[0], errors[0]
    # the file as the user will look for it: in --output, not the temporary .engine.building-PID-XXXX
    assert f"{out}/weights/rank0.safetensors" in errors[0] and ".building" not in errors[0], errors[0]
    assert not out.exists() and not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def tp_engine(tp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("tpe") / "engine"
    r = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build", "--model", str(tp_model), "--output",
                        str(out), "--device", "cpu", "--tp", "2", "--wmax", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def _load_rank0(engine):
    """Rank 0's model from its rank file, as a TP server's rank 0 loads it (engine/loading.py)."""
    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.engine.config import engine_config
    from trtllm_dasc.engine.loading import weight_source
    from trtllm_dasc.engine.runner import engine_plan
    from trtllm_dasc.model.model import HybridModel
    cfg = engine_config(str(engine))
    order = engine_plan(cfg).bundle_order
    model_cfg = HybridConfig.from_path(cfg.model)
    HybridModel.from_source(model_cfg, weight_source(cfg, model_cfg, 0, order), dtype="float32", device="cpu",
                            tp_rank=0, tp_size=2, bundle_order=order, backend="torch")


def _edit(tensors):
    names = sorted(tensors)
    return {
        "missing": lambda: tensors.pop(names[3]),
        "short": lambda: tensors.update({"lm_head.weight": tensors["lm_head.weight"][:-1].contiguous()}),
        "integer": lambda: tensors.update({"lm_head.weight": tensors["lm_head.weight"].to(torch.int32)}),
    }


@pytest.mark.parametrize("edit, needle", [("missing", "cannot give tensor"), ("short", "expects a float tensor"),
                                          ("integer", "expects a float tensor"), ("other_rank", "tp_rank 1")])
def test_a_rank_file_edited_after_the_build_is_refused_at_load(tp_engine, tmp_path, edit, needle):
    """A rank file re-saved without one of its tensors raised SafetensorError (a traceback in the server log);
    an lm_head one row short, or stored as int32, was loaded and served; rank 1's file copied over rank 0's
    (same shapes) was served as rank 0's weights. Each is one UserError at load now."""
    from safetensors.torch import load_file, save_file
    from trtllm_dasc.errors import UserError
    engine = tmp_path / "engine"
    shutil.copytree(tp_engine, engine)
    _load_rank0(engine)                                  # untouched: loads
    w = engine / "weights" / "rank0.safetensors"
    if edit == "other_rank":
        shutil.copy(engine / "weights" / "rank1.safetensors", w)
    else:
        tensors = load_file(str(w))
        _edit(tensors)[edit]()
        save_file(tensors, str(w))
    with pytest.raises(UserError, match=needle) as info:
        _load_rank0(engine)
    assert "\n" not in str(info.value)
