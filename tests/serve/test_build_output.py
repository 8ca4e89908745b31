"""Where dasc-build writes: the engine appears complete or not at all (built beside the output, renamed
into place); --force replaces a dasc engine and nothing else; a concurrent build of the same output is
refused in one line (two racing builds: exactly one succeeds and the engine is complete); an OS error
(/proc, /sys, a file as parent, a failing write mid-build) is one line with no traceback."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_scripts import dasc_build
from build_scripts.engine_output import OutputLock
from serve_helpers import build
from tp_helpers import ROOT


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    build(root / "ckpt", "gdn", seed=2)
    return root / "ckpt"


def _run(ckpt, out, capfd, *flags) -> tuple[int, str]:
    rc = dasc_build.main(["--model", str(ckpt), "--output", str(out), "--device", "cpu", *map(str, flags)])
    return rc, capfd.readouterr().err


def _one_error(rc, err, *needles):
    errors = [line for line in err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert all(n in errors[0] for n in needles), errors[0]


def _complete(engine) -> dict:
    """The engine's metadata, after checking that every part of a finished build is there."""
    meta = json.loads((engine / "config.json").read_text())
    assert meta["dasc_engine_version"] >= 1
    for part in ("plan.json", "model/model.safetensors", "model/config.json", "model_repo/tensorrt_llm/config.pbtxt",
                 "model_repo/dasc_hybrid/config.pbtxt", "kernels"):
        assert (engine / part).exists(), part
    return meta


def _siblings(parent) -> list[str]:
    """Temporary directories and lock files a build leaves behind (none)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_force_replaces_an_engine_in_one_step(ckpt, tmp_path, capfd):
    out = tmp_path / "engine"
    rc, err = _run(ckpt, out, capfd, "--wmax", 0)
    assert rc == 0, err
    assert _complete(out)["engine"]["wmax"] == 0 and _siblings(tmp_path) == []
    rc, err = _run(ckpt, out, capfd, "--wmax", 16, "--force")
    assert rc == 0, err
    assert _complete(out)["engine"]["wmax"] == 16 and _siblings(tmp_path) == []


def test_force_never_replaces_what_is_not_an_engine(ckpt, tmp_path, capfd):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    _one_error(*_run(ckpt, user, capfd, "--force"), "not a dasc engine")
    assert (user / "thesis.tex").read_text() == "precious" and sorted(os.listdir(user)) == ["thesis.tex"]
    # a config.json of some other program is not the marker either
    (user / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _one_error(*_run(ckpt, user, capfd, "--force"), "not a dasc engine")
    assert (user / "thesis.tex").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    _one_error(*_run(ckpt, afile, capfd, "--force"), "not a directory")
    assert afile.read_text() == "x"
    link = tmp_path / "link"
    link.symlink_to(user)
    _one_error(*_run(ckpt, link, capfd, "--force"), "symbolic link")
    assert link.is_symlink() and (user / "thesis.tex").exists()
    assert _siblings(tmp_path) == []


def test_an_empty_directory_is_filled(ckpt, tmp_path, capfd):
    out = tmp_path / "empty"
    out.mkdir()
    rc, err = _run(ckpt, out, capfd)
    assert rc == 0, err
    _complete(out)


def test_a_held_lock_refuses_the_build_in_one_line(ckpt, tmp_path, capfd):
    out = tmp_path / "engine"
    with OutputLock(str(out)) as lock:
        _one_error(*_run(ckpt, out, capfd), "another dasc-build", f"pid {os.getpid()}")
        assert not out.exists() and os.path.exists(lock.path)
    # released: the lock file is gone and the build goes through
    assert not os.path.exists(lock.path)
    rc, err = _run(ckpt, out, capfd)
    assert rc == 0, err
    _complete(out)
    assert _siblings(tmp_path) == []


def test_two_racing_builds_one_succeeds_and_the_engine_is_complete(ckpt, tmp_path):
    out = tmp_path / "engine"
    cmd = [sys.executable, "-m", "build_scripts.dasc_build", "--model", str(ckpt), "--output", str(out),
           "--device", "cpu", "--skip-finite-check"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(120), p.stderr.read()) for p in procs]
    ok = [err for rc, err in results if rc == 0]
    refused = [(rc, err) for rc, err in results if rc != 0]
    assert len(ok) == 1 and len(refused) == 1, results
    rc, err = refused[0]
    errors = [line for line in err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "another dasc-build" in errors[0] or "exists and is not empty" in errors[0], errors[0]
    assert f"wrote {out}" in ok[0]
    _complete(out)
    assert _siblings(tmp_path) == []


@pytest.mark.parametrize("where", ["/proc/dasc-engine", "/sys/dasc-engine", "FILE/engine"], ids=["proc", "sys", "file"])
def test_unwritable_output_is_one_line(ckpt, tmp_path, capfd, where):
    if where.startswith("FILE"):
        (tmp_path / "FILE").write_text("x")
        where = str(tmp_path / where)
    _one_error(*_run(ckpt, where, capfd), "--output")
    assert not os.path.lexists(where)


def test_os_error_mid_build_is_one_line_and_keeps_the_old_engine(ckpt, tmp_path, capfd, monkeypatch):
    out = tmp_path / "engine"
    rc, err = _run(ckpt, out, capfd, "--wmax", 0)
    assert rc == 0, err

    def full_disk(src, dst, weights=True):
        os.makedirs(dst)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(dst, "model.safetensors"))
    monkeypatch.setattr(dasc_build, "copy_model", full_disk)
    _one_error(*_run(ckpt, out, capfd, "--wmax", 16, "--force"), "No space left on device", "model.safetensors")
    assert _complete(out)["engine"]["wmax"] == 0 and _siblings(tmp_path) == []


def _can_mount_tmpfs(where) -> str | None:
    """None when `unshare -rm` can mount a tmpfs here (root, or user namespaces allowed), else why not."""
    if shutil.which("unshare") is None:
        return "no unshare"
    where.mkdir(exist_ok=True)
    r = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else f"cannot mount a tmpfs: {r.stderr.strip()}"


@pytest.mark.parametrize("tp", [1, 2])
def test_a_full_disk_names_the_file_in_the_output_directory(tmp_path, tp):
    """A build on a full disk (a 200 KiB tmpfs): at TP1 the one line named the checkpoint's file the model was
    copied from ("No space left on device (/path/to/ckpt/model.safetensors)"), at TP2 the rank file in the
    temporary .engine.building-PID-XXXX directory. Both name the file inside --output now; nothing is left
    behind. From a review's reproduction; fails on the code before the fix."""
    from tp_helpers import build_tp_model
    disk = tmp_path / "disk"
    why = _can_mount_tmpfs(disk)
    if why:
        pytest.skip(why)
    ckpt = tmp_path / "ckpt"
    build_tp_model(ckpt, "gdn", seed=3)
    out = disk / "engine"
    build_cmd = [sys.executable, "-m", "build_scripts.dasc_build", "--model", str(ckpt), "--output", str(out),
                 "--device", "cpu", "--tp", str(tp), "--wmax", "0"]
    # the tmpfs lives in its own mount namespace: the build, then what it left there, from inside it
    script = (f"mount -t tmpfs -o size=200k tmpfs {disk} && {subprocess.list2cmdline(build_cmd)}; rc=$?; "
              f"ls -A {disk} >&2; exit $rc")
    r = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1, r.stderr
    written = f"{out}/model/model.safetensors" if tp == 1 else f"{out}/weights/rank"
    assert "no space left on device" in errors[0].lower() and written in errors[0], errors[0]
    assert ".building" not in errors[0] and str(ckpt) not in errors[0], errors[0]
    # nothing left on the disk: no engine, no building directory, no lock file (ls printed nothing after it)
    assert r.stderr.rstrip().endswith(errors[0]), r.stderr


def test_a_failed_copy_names_the_file_written_not_the_checkpoints(ckpt, tmp_path, capfd, monkeypatch):
    """Without a tmpfs: the copy of the weights fails as shutil's does on a full disk (the OSError carries the
    source as filename, the destination as filename2); the line named the source."""
    out = tmp_path / "engine"

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), src, None, dst)

    def full_disk(src, dst):
        if str(src).endswith(".safetensors"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src, None, dst)
        return shutil.copyfile(src, dst)
    monkeypatch.setattr(dasc_build.os, "link", cross_device)
    monkeypatch.setattr(dasc_build.shutil, "copy2", full_disk)
    rc, err = _run(ckpt, out, capfd, "--wmax", 0)
    monkeypatch.undo()
    _one_error(rc, err, "No space left on device", f"({out}/model/model.safetensors)")
    assert str(ckpt) not in err and not out.exists() and _siblings(tmp_path) == []


def test_a_killed_builds_leftovers_are_cleared(ckpt, tmp_path, capfd):
    """SIGKILL leaves the building directory and the (unlocked) lock file: the next build takes both over."""
    out = tmp_path / "engine"
    left = tmp_path / ".engine.building-999999-dead"
    (left / "model").mkdir(parents=True)
    (tmp_path / ".engine.dasc-build.lock").write_text("999999")
    rc, err = _run(ckpt, out, capfd)
    assert rc == 0, err
    _complete(out)
    assert _siblings(tmp_path) == []


def test_an_output_path_with_a_quote_builds_the_text_models(tmp_path, capfd):
    """The text models' config.pbtxt get tokenizer_dir "../../model", never the engine's path; the quote check
    ran on the temporary build directory's absolute path, so an engine named with a quote was refused after
    the plan, the checks and the copy. From a review helper; fails on the old code."""
    asset = os.path.join(os.path.dirname(dasc_build.__file__), "..", "trtllm_dasc", "assets", "tiny-kimi-linear")
    out = tmp_path / 'my"engine'
    rc, err = _run(asset, out, capfd, "--wmax", 0, "--dtype", "float32")
    assert rc == 0, err
    for name in ("preprocessing", "postprocessing"):
        assert 'string_value: "../../model"' in (out / "model_repo" / name / "config.pbtxt").read_text()


@pytest.mark.parametrize("renameat2", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("force", [False, True])
def test_a_directory_made_at_the_output_during_the_build_is_never_replaced(tmp_path, monkeypatch, force, renameat2):
    """The output was checked when the build began and again under its lock, both before the build's minutes of
    work; publish then exchanged the new engine with whatever stood at the output and deleted it. A directory of
    the user's made there meanwhile (mkdir + copy while a long build runs) was removed, without --force too.
    Now publish refuses in one line and leaves it as it was, whatever --force says (--force replaces engines
    only); the new engine is not kept. Both ways of publishing: the atomic exchange, and the two renames of a
    kernel without renameat2. From a review helper; fails on the old code."""
    from build_scripts import engine_output
    from build_scripts.engine_output import staged_output
    if not renameat2:
        monkeypatch.setattr(engine_output, "_exchange", lambda a, b: False)
    from trtllm_dasc.errors import UserError
    out = tmp_path / "engine"
    with pytest.raises(UserError, match="appeared during the build") as info:
        with staged_output(str(out), force) as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps({"dasc_engine_version": 1, "engine": {}}))
            # the user's directory, made after the checks and before the build ends
            out.mkdir()
            (out / "notes.txt").write_text("mine")
    assert "\n" not in str(info.value)
    assert sorted(os.listdir(out)) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert _siblings(tmp_path) == []
