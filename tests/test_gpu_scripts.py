"""The device scripts (scripts/gpu/*.sh) on the CPU: a shell mistake there costs a GPU call, which a session
has a few of. Every script parses (bash -n); and matched_cells.sh, run in a scratch copy of the scripts with
stand-ins for the two things only the GPU machine has (nvidia-smi, and python3 with the serving stack: it
records its arguments instead of serving), composes the call each MODEL asks for, and refuses a TP degree the
machine's GPUs cannot hold before it starts anything; quality_evals.sh warms the kernels in one process a model
before its shards, and the shards get what is left of the limit; train_quality.sh resumes from the newest stage:
carried (whole, or in parts over two calls), or else the one the previous call kept on the warm machine, stops
before training when there is none, and returns a stage only while the call's returns fit (RETURN_ONLY=1 brings
the rest back)."""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "scripts").rglob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _device_root(tmp_path, script: str, gpus: int = 1) -> tuple[Path, Path, Path, dict]:
    """A scratch repository root with scripts/gpu/{prelude.sh, SCRIPT} (kept between calls, as the device keeps
    its tree), a stand-in nvidia-smi with ``gpus`` GPUs, and an empty $OUT; (root, bin, out, env)."""
    root, bin_, out = tmp_path / "root", tmp_path / "bin", tmp_path / "out"
    for d in (root / "scripts" / "gpu", bin_):
        d.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for name in ("prelude.sh", script):
        shutil.copy(ROOT / "scripts" / "gpu" / name, root / "scripts" / "gpu" / name)
    _stub(bin_ / "nvidia-smi", f'case "$*" in *query-gpu*) seq 0 {gpus - 1};; esac\n')
    return root, bin_, out, {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(out)}


def _matched_call(tmp_path, gpus: int, **env) -> tuple[int, str, list[str]]:
    """Run scripts/gpu/matched_cells.sh in a scratch root; (exit code, output, the client's arguments)."""
    root, bin_, out, base_env = _device_root(tmp_path, "matched_cells.sh", gpus)
    (root / "tests" / "data").mkdir(parents=True)
    for cfg in (ROOT / "tests" / "data").glob("*.config.json"):
        shutil.copy(cfg, root / "tests" / "data" / cfg.name)
    log = tmp_path / "client_args"
    # python3 - <<PY (prelude's check of the serving wheels) passes; any other call is the client: recorded
    _stub(bin_ / "python3", f'if [ "$1" = - ]; then cat >/dev/null; exit 0; fi\nprintf "%s\\n" "$@" > {log}\n')
    env = {**base_env, "COMMIT": "abc1234", "BLOCKS": "1", **env}
    proc = subprocess.run(["bash", "scripts/gpu/matched_cells.sh"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    args = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, args


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_matched_cells_composes_the_kimi_call(tmp_path):
    rc, output, args = _matched_call(tmp_path, gpus=1)
    assert rc == 0, output
    assert args[:3] == ["-m", "clients.matched_hbm", "--paper"]
    assert _flag(args, "--model") == "tests/data/kimi-linear-48b-a3b.config.json" and _flag(args, "--tp") == "1"
    assert _flag(args, "--arms") == "dense,nr16,nr64,nr128,nr512,wr16,wr64,nr16+int8"
    assert _flag(args, "--call-arms") == "nr16" and _flag(args, "--commit") == "abc1234"
    # the cells directory keeps the name earlier sessions' directories have (a later call resumes them)
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_kimi48_full_b1_prompt_only_hr21.27_cabc1234"
    assert _flag(args, "--json").endswith("/out/matched_hbm_kimi48_full.json")
    assert (tmp_path / "out" / "cells.tgz").is_file()


def test_matched_cells_precision_arm_set_runs_in_its_own_directory(tmp_path):
    rc, output, args = _matched_call(tmp_path, gpus=1, ARM_SET="precision", CALL_ARMS="nr16+horizon+conv-int8")
    assert rc == 0, output
    assert _flag(args, "--arms") == "dense,nr16,nr16+int8,nr16+horizon+conv-int8"
    assert _flag(args, "--call-arms") == "nr16+horizon+conv-int8"
    # another arm list is another manifest: it must not resume the paper set's directory
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_kimi48_precision_full_b1_prompt_only_hr21.27_cabc1234"
    assert _flag(args, "--json").endswith("/out/matched_hbm_kimi48_precision_full.json")
    rc, output, args = _matched_call(tmp_path / "bad", gpus=1, ARM_SET="all")
    assert rc == 2 and "ARM_SET must be paper or precision" in output and args == []


def test_matched_cells_full_sample_is_passed_and_named(tmp_path):
    rc, output, args = _matched_call(tmp_path, gpus=1, FULL_SAMPLE="3300")
    assert rc == 0, output
    assert _flag(args, "--full-fill-last") == "3300" and _flag(args, "--full-replay-first") == "3300"
    # a budgeted full phase is another manifest: its own directory
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_kimi48_full_b1_fs3300_prompt_only_hr21.27_cabc1234"
    rc, output, args = _matched_call(tmp_path / "none", gpus=1)
    assert "--full-fill-last" not in args and "--full-replay-first" not in args
    # each arm its own fill tail: another manifest, its own directory
    rc, output, args = _matched_call(tmp_path / "auto", gpus=1, FULL_SAMPLE="3300", FULL_FILL="auto")
    assert rc == 0, output
    assert _flag(args, "--full-fill-last") == "auto" and _flag(args, "--full-replay-first") == "3300"
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_kimi48_full_b1_fs3300_ffauto_prompt_only_hr21.27_cabc1234"
    # alone it would name a directory _ffauto whose phase runs whole (from a review helper)
    rc, output, args = _matched_call(tmp_path / "alone", gpus=1, FULL_FILL="auto")
    assert rc == 2 and "FULL_FILL=auto needs FULL_SAMPLE" in output and args == []


def test_matched_cells_engine_speed_ablation_is_passed_and_named(tmp_path):
    rc, output, args = _matched_call(tmp_path, gpus=1, FULL_SAMPLE="3300", STEP_DELAY_MS="40", STEP_SLOWDOWN="2")
    assert rc == 0, output
    assert _flag(args, "--step-delay-ms") == "40" and _flag(args, "--step-slowdown") == "2"
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_kimi48_full_b1_fs3300_delay40_slow2_prompt_only_hr21.27_cabc1234"
    rc, output, args = _matched_call(tmp_path / "none", gpus=1)
    assert "--step-delay-ms" not in args and "--step-slowdown" not in args


def test_matched_cells_composes_the_qwen_tp2_call(tmp_path):
    rc, output, args = _matched_call(tmp_path, gpus=2, MODEL="qwen80", CALL_ARMS="nr16,nr16:storage")
    assert rc == 0, output
    assert _flag(args, "--model") == "tests/data/qwen3-next-80b-a3b.config.json" and _flag(args, "--tp") == "2"
    assert _flag(args, "--arms").split(",")[-2:] == ["nr16:storage", "nr16:hybrid"]
    assert _flag(args, "--call-arms") == "nr16,nr16:storage"
    assert _flag(args, "--cells-dir") == "/tmp/cells/mh_qwen80_tp2_full_b1_prompt_only_hr21.27_cabc1234"


def test_matched_cells_refuses_tp2_on_one_gpu_and_an_unknown_model(tmp_path):
    rc, output, args = _matched_call(tmp_path / "a", gpus=1, MODEL="qwen80")
    assert rc == 5 and "TP 2 needs 2 GPUs" in output and args == []
    rc, output, args = _matched_call(tmp_path / "b", gpus=1, MODEL="llama")
    assert rc == 2 and "MODEL must be kimi48 or qwen80" in output and args == []


class _PackedWheel:
    """A repository root holding only the prelude, a demo wheel (a binary with its executable mode among its
    members) and a python3 on PATH that is the real one but for pip, which records the wheel it was given: what
    pack_wheel.sh and the prelude's install need, on the CPU."""

    def __init__(self, tmp_path, server_bytes: bytes):
        import sys
        import zipfile
        self.tmp = tmp_path
        self.root, bin_, packed = tmp_path / "root", tmp_path / "bin", tmp_path / "packed"
        (self.root / "scripts" / "gpu").mkdir(parents=True)
        bin_.mkdir()
        shutil.copy(ROOT / "scripts" / "gpu" / "prelude.sh", self.root / "scripts" / "gpu" / "prelude.sh")
        self.wheel = tmp_path / "demo-1.0-py3-none-any.whl"
        self.members = {"demo/__init__.py": (b"x = 1\n", 0o644), "demo/bin/server": (server_bytes, 0o755),
                        "demo-1.0.dist-info/METADATA": (b"Name: demo\nVersion: 1.0\n", 0o644)}
        with zipfile.ZipFile(self.wheel, "w", zipfile.ZIP_DEFLATED) as z:
            for name, (data, mode) in self.members.items():
                info = zipfile.ZipInfo(name)
                info.external_attr = (0o100000 | mode) << 16
                z.writestr(info, data)
        self.env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "PACKED_DIR": str(packed),
                    "INSTALL_ONLY": "1"}
        self.got = tmp_path / "installed"
        self.got.mkdir()
        self.pip_log = tmp_path / "pip_log"
        _stub(bin_ / "python3", f'if [ "$1 $2" = "-m pip" ]; then cp "${{@: -1}}" {self.got}/; '
                                f'basename "${{@: -1}}" >> {self.pip_log}; exit 0; fi\n'
                                f'exec {sys.executable} "$@"\n')

    def pack(self, *folders: str) -> None:
        # the real python3 for pack_wheel.sh's own unzip (the stub is on PATH only for the prelude)
        env = {**self.env, "PATH": os.environ["PATH"]}
        proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "pack_wheel.sh"), str(self.wheel), *folders],
                              cwd=self.root, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr

    def prelude(self) -> str:
        proc = subprocess.run(["bash", "-c", "source scripts/gpu/prelude.sh"], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def installed_once_as_it_was(self) -> None:
        import zipfile
        assert self.pip_log.read_text().split() == [self.wheel.name]   # installed once, under its own name
        with zipfile.ZipFile(self.got / self.wheel.name) as z:
            files = {i.filename: (z.read(i), i.external_attr >> 16 & 0o777) for i in z.infolist() if not i.is_dir()}
        assert files == self.members


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_a_packed_wheel_installs_as_the_wheel_it_was(tmp_path):
    """scripts/gpu/pack_wheel.sh then the prelude's install of it (what call A does on a fresh machine): the wheel
    pip receives has the original's members, bytes and file modes (tritonserver stays executable), and a later
    call on the same machine does not install it again."""
    w = _PackedWheel(tmp_path, b"\x7fELF" + bytes(range(256)))
    w.pack(".whl_a")
    assert (w.root / ".whl_a" / (w.wheel.name + ".tar.xz")).is_file()
    for _ in range(2):
        w.prelude()
    w.installed_once_as_it_was()


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_a_wheel_packed_in_parts_installs_once_the_last_part_is_carried(tmp_path):
    """pack_wheel.sh with two folders (the tree too big for the whole packed wheel beside it): each call carries
    one part; the call with only the first installs nothing and says what is missing, the call that brings the
    second installs the original wheel (members, bytes, modes), and a later call does not install it again."""
    w = _PackedWheel(tmp_path, b"\x7fELF" + os.urandom(200_000))    # incompressible: parts of some size
    w.pack(".whl_a", ".whl_b")
    part_a = w.root / ".whl_a" / f"{w.wheel.name}.tar.xz.part-1-of-2"
    part_b = w.root / ".whl_b" / f"{w.wheel.name}.tar.xz.part-2-of-2"
    assert part_a.is_file() and part_b.is_file() and part_a.stat().st_size >= 100_000
    b_aside = tmp_path / part_b.name
    shutil.move(part_b, b_aside)             # call A0 carries .whl_a only
    assert "1 of 2 parts" in w.prelude() and not w.pip_log.exists()
    shutil.rmtree(w.root / ".whl_a")         # call A carries .whl_b only
    shutil.move(b_aside, part_b)
    for _ in range(2):                       # call A, then a later call on the same machine
        w.prelude()
    w.installed_once_as_it_was()


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_a_wheel_packed_with_a_big_first_part_installs_once_the_small_second_comes(tmp_path):
    """FIRST_PART_BYTES: the first part that many bytes (a call's room beside the tree), the second the rest (small
    enough to travel with the cells call's other wheels); the two join into the original wheel."""
    w = _PackedWheel(tmp_path, b"\x7fELF" + os.urandom(200_000))
    w.env["FIRST_PART_BYTES"] = "150000"
    w.pack(".whl_a", ".whl_b")
    part_a = w.root / ".whl_a" / f"{w.wheel.name}.tar.xz.part-1-of-2"
    part_b = w.root / ".whl_b" / f"{w.wheel.name}.tar.xz.part-2-of-2"
    assert part_a.stat().st_size == 150_000 and 40_000 < part_b.stat().st_size < 150_000
    b_aside = tmp_path / part_b.name
    shutil.move(part_b, b_aside)
    assert "1 of 2 parts" in w.prelude() and not w.pip_log.exists()
    shutil.rmtree(w.root / ".whl_a")
    shutil.move(b_aside, part_b)
    w.prelude()
    w.installed_once_as_it_was()


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("tar") is None, reason="needs tar and xz")
def test_a_first_part_past_the_packed_size_is_refused(tmp_path):
    w = _PackedWheel(tmp_path, b"\x7fELF" + os.urandom(2_000))
    env = {**w.env, "PATH": os.environ["PATH"], "FIRST_PART_BYTES": "10000000"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "pack_wheel.sh"), str(w.wheel), ".a", ".b"],
                          cwd=w.root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "FIRST_PART_BYTES must be between 0 and the packed size" in proc.stdout


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_background_cells_job_outlives_its_call_and_each_poll_returns_the_cells_so_far(tmp_path):
    """scripts/gpu/cells_background.sh with a stand-in cells script that writes one cell, waits for a go file
    and writes another: the start call returns while the job runs (its first cell already in the tarball), the
    job survives the call's end, and the poll after it ends brings both cells, the exit code and the job's own
    $OUT files, and fails (1) as the job did. The job gets the limit as CALL_LIMIT and SCRIPT_ARGS as arguments, and runs in the caller's
    directory."""
    import tarfile
    import time
    bg, cells, out = tmp_path / "bg", tmp_path / "cells", tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job.sh"
    job.write_text(f'mkdir -p {cells}/d && echo one > {cells}/d/c1 && echo "limit $CALL_LIMIT in $PWD args $*"\n'
                   f'while [ ! -f {tmp_path}/go ]; do sleep 0.1; done\n'
                   f'echo two > {cells}/d/c2 && echo kernels > "$OUT/k.part" && exit 3\n')
    env = {**os.environ, "BG_DIR": str(bg), "CELLS_ROOT": str(cells), "OUT": str(out), "BG_LIMIT": "777",
           "SCRIPT_ARGS": "--request-estimate-s 0.07"}
    script = str(ROOT / "scripts" / "gpu" / "cells_background.sh")

    def cells_in_tarball() -> set[str]:
        with tarfile.open(out / "cells_all.tgz") as t:
            return {Path(m.name).name for m in t.getmembers() if m.isfile()}

    start = time.time()
    proc = subprocess.run(["bash", script, "start", str(job), "2"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "still running" in proc.stdout and time.time() - start < 30
    assert cells_in_tarball() == {"c1"}
    proc = subprocess.run(["bash", script, "start", str(job)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "already running" in proc.stdout
    (tmp_path / "go").touch()
    proc = subprocess.run(["bash", script, "poll", "30"], env=env, capture_output=True, text=True, timeout=60)
    # in the caller's directory: the cells' manifest holds absolute paths, a job run elsewhere is another manifest
    assert "the job ended, exit code 3" in proc.stdout and proc.returncode == 1
    assert f"limit 777 in {os.getcwd()} args --request-estimate-s 0.07" in proc.stdout
    assert cells_in_tarball() == {"c1", "c2"} and (out / "k.part").read_text() == "kernels\n"


def test_a_poll_on_a_machine_without_the_job_says_so_at_once(tmp_path):
    """A poll that came late gets a fresh machine: it waited its whole limit (540 s of device time) for a job
    that is not there (a review helper). Now it says so and stops."""
    import time
    env = {**os.environ, "BG_DIR": str(tmp_path / "bg"), "CELLS_ROOT": str(tmp_path / "cells"),
           "OUT": str(tmp_path / "out")}
    (tmp_path / "out").mkdir()
    start = time.time()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu" / "cells_background.sh"), "poll", "20"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "no job on this machine" in proc.stdout and time.time() - start < 5


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_poll_killed_while_it_packs_leaves_no_truncated_tarball(tmp_path):
    """A poll killed at the call's limit while tar writes $OUT/cells_all.tgz: what is under $OUT still comes back,
    and a truncated tarball unpacks its last cell half-written (tar leaves the partial file), which the next call
    counts as done and the merge cannot read. The tarball must be whole or absent: real tar, SIGKILL mid-write."""
    import signal
    import tarfile
    import time
    bg, cells, out = tmp_path / "bg", tmp_path / "cells", tmp_path / "out"
    (bg / "out").mkdir(parents=True)
    out.mkdir()
    (bg / "started").write_text("0\n")
    (bg / "rc").write_text("0\n")              # the job ended: the poll packs at once
    (cells / "d" / "cells" / "dense").mkdir(parents=True)
    # incompressible bytes, so that packing them takes seconds
    (cells / "d" / "cells" / "dense" / "p0-b0-s42.c.json").write_bytes(os.urandom(40_000_000))
    env = {**os.environ, "BG_DIR": str(bg), "CELLS_ROOT": str(cells), "OUT": str(out)}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "gpu" / "cells_background.sh"), "poll", "1"], env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + 60
    while not any(f.stat().st_size > 0 for f in out.glob("cells_all*")) and proc.poll() is None:
        assert time.time() < end
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    tarball = out / "cells_all.tgz"
    if tarball.exists():
        with tarfile.open(tarball) as t:        # whole: every member reads to its end
            assert [m.size for m in t.getmembers() if m.isfile()] == [40_000_000]


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid")
def test_a_cells_call_killed_while_it_packs_leaves_no_truncated_tarball(tmp_path):
    """matched_cells.sh killed at the call's limit while it packs $OUT/cells.tgz (prelude.sh return_cells): as
    for a poll, the tarball that comes back must be whole or absent. The stand-in client writes an incompressible
    cell into its --cells-dir (under /tmp/cells, as on the device), so that packing it takes seconds."""
    import signal
    import tarfile
    import time
    root, bin_, out, base_env = _device_root(tmp_path, "matched_cells.sh")
    (root / "tests" / "data").mkdir(parents=True)
    _stub(bin_ / "python3", 'if [ "$1" = - ]; then cat >/dev/null; exit 0; fi\n'
                            'while [ "$1" != --cells-dir ]; do shift; done\n'
                            'mkdir -p "$2/cells/dense" && head -c 40000000 /dev/urandom > "$2/cells/dense/p0-b0-s42.c.json"\n')
    cells = f"benchmarks/cells/test_killed_pack_{os.getpid()}_{time.time_ns()}"
    env = {**base_env, "COMMIT": "abc1234", "BLOCKS": "1", "CELLS": cells, "PACKED_DIR": str(tmp_path / "packed")}
    try:
        proc = subprocess.Popen(["bash", "scripts/gpu/matched_cells.sh"], cwd=root, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.time() + 60
        while not any(f.stat().st_size > 0 for f in out.glob("cells.tgz*")) and proc.poll() is None:
            assert time.time() < end
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        shutil.rmtree(Path("/tmp/cells") / Path(cells).name, ignore_errors=True)
    tarball = out / "cells.tgz"
    if tarball.exists():
        with tarfile.open(tarball) as t:        # whole: every member reads to its end
            assert [m.size for m in t.getmembers() if m.isfile()] == [40_000_000]


def _quality_call(tmp_path, **env) -> tuple[int, str, list[str]]:
    """Run scripts/gpu/quality_evals.sh in a scratch root with stand-ins (nvidia-smi: one GPU; timeout: passes
    its limit on; python3: records the limit and its arguments, one line a call, and the warm-up calls take 2 s);
    (exit code, output, the recorded calls in the order they started)."""
    root, bin_, out, base_env = _device_root(tmp_path, "quality_evals.sh")
    for a in ("kda", "gdn"):
        (tmp_path / "models" / a).mkdir(parents=True)
        (tmp_path / "models" / a / "config.json").write_text("{}")
    log = tmp_path / "calls"
    _stub(bin_ / "timeout", 'export LIMIT_S="$1"; shift; exec "$@"\n')
    _stub(bin_ / "python3", f'case "$*" in *"--tasks niah_single_1 "*) sleep 2;; esac\n'
                            f'printf "T=%s %s\\n" "${{LIMIT_S:-none}}" "$*" >> {log}\n')
    env = {**base_env, "COMMIT": "abc1234", "MODELS": str(tmp_path / "models"), "EV_DIR": str(tmp_path / "ev"), "PACKED_DIR": str(tmp_path / "packed"),
           "PROCS": "2", "ARMS": "precision", "LENGTHS": "1024,4096", "INSTANCES": "8", "EVAL_LIMIT": "460", **env}
    proc = subprocess.run(["bash", "scripts/gpu/quality_evals.sh"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, proc.stdout + proc.stderr, calls


def test_quality_evals_warms_the_kernels_before_the_shards_and_gives_them_the_rest(tmp_path):
    # 12-05: sixteen shards compiling the same kernels at once lost a cold machine's whole KDA half to the limit
    rc, output, calls = _quality_call(tmp_path)
    assert rc == 0, output
    runs = [c for c in calls if "-m trtllm_dasc.evals.run --model" in c]
    warm, shards = runs[:2], runs[2:]
    # the warm-up runs the shards' instance count: the same batches, so the same autotuned kernel keys
    assert len(shards) == 4 and all("--instances 8 " in c and "--tasks niah_single_1 " in c for c in warm)
    assert {c.split("--out ")[1].split()[0].rsplit("/", 1)[1] for c in warm} == {"kda.json", "gdn.json"}
    for c in warm:   # an arm of each codec the arm sets use, at the run's lengths, under a limit of its own:
        # WARM_LIMIT (300 s) or half the shards' limit, whichever is less
        assert c.startswith("T=230 ") and "--arms dense,nr16+int8,nr16+horizon+conv-int8 " in c
        assert "--lengths 1024,4096 " in c and "--device cuda" in c
    limits = {int(c.split()[0][2:]) for c in shards}
    assert len(limits) == 1 and 460 - 10 <= limits.pop() <= 460 - 2      # the warm-up's seconds come off
    assert all("--arms precision " in c and "--instances 8 " in c for c in shards)
    assert "kernels warmed in" in output


def test_quality_evals_starts_no_shard_when_the_warm_up_left_too_little(tmp_path):
    # `timeout 0` is no limit at all, and a negative one runs nothing: either way not what the caller asked
    rc, output, calls = _quality_call(tmp_path, EVAL_LIMIT="20")
    runs = [c for c in calls if "-m trtllm_dasc.evals.run --model" in c]
    assert rc == 4 and "not starting them" in output
    assert len(runs) == 2 and all(c.startswith("T=10 ") for c in runs)      # the two warm-ups, half of 20 s


def test_quality_evals_without_warm_up_gives_the_shards_the_whole_limit(tmp_path):
    rc, output, calls = _quality_call(tmp_path, WARM="0")
    assert rc == 0, output
    runs = [c for c in calls if "-m trtllm_dasc.evals.run --model" in c]
    assert len(runs) == 4 and all(c.startswith("T=460 ") for c in runs)


def _train_call(tmp_path, carry: dict[str, str] | None = None, **env) -> tuple[int, str, list[str]]:
    """Run scripts/gpu/train_quality.sh in the scratch root (kept between calls, as the device keeps ignored
    folders) with ``carry`` ({path: text}) written into it first, and stand-ins: python3 -m trtllm_dasc.evals.train
    records its arguments and writes a stage "T[<the stage it resumed, or fresh>]"."""
    root, bin_, out, base_env = _device_root(tmp_path, "train_quality.sh")
    log = tmp_path / "train_args"
    for path, text in (carry or {}).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    # python3 -c: the import check passes; any other (the joined stage's zip check) runs in the real interpreter
    _stub(bin_ / "python3", f"""if [ "$1" = -c ]; then case "$2" in *transformers*) echo versions; exit 0;; esac
  exec {sys.executable} "$@"; fi
[ "$2" = benchmarks ] && echo "$*" >> {log}
if [ "$2" = trtllm_dasc.evals.train ]; then
  echo "$*" >> {log}
  stage=$(echo "$*" | sed 's/.*--stage \\([^ ]*\\).*/\\1/'); mkdir -p "$stage"
  resume=$(echo "$*" | grep -o -- '--resume [^ ]*' | cut -d' ' -f2)
  if [ -n "$resume" ] && [ "$(head -c 2 "$resume")" = PK ]; then from=zip:$(md5sum < "$resume" | cut -c1-12)
  else from=$([ -n "$resume" ] && cat "$resume" || echo fresh); fi
  printf 'T[%s]' "$from" > "$stage/train_state.pt"
  [ -n "${{STAGE_PAD:-}}" ] && head -c "$STAGE_PAD" /dev/zero >> "$stage/train_state.pt"
fi
""")
    env = {**base_env, "TRAIN_TMP": str(tmp_path / "w"),
           "KEPT": str(tmp_path / "kept"), "PACKED_DIR": str(tmp_path / "packed"), "QUICK": "0",
           "VARIANTS": "kda kda", "MINUTES": "0.01", **env}
    proc = subprocess.run(["bash", "scripts/gpu/train_quality.sh"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return proc.returncode, proc.stdout + proc.stderr, calls


def _returned_stage(tmp_path) -> str:
    return (tmp_path / "out" / "kda_stage.pt").read_text()


def test_training_resumes_from_the_newest_stage_whether_carried_or_kept_on_the_warm_machine(tmp_path):
    # a large stage (37 MB) and the tree (35 MB) do not fit one call's carry: the next call finds it on the machine
    kept = tmp_path / "kept" / "kda_stage.pt"
    rc, output, calls = _train_call(tmp_path)
    assert rc == 0, output
    assert len(calls) == 1 and "--resume" not in calls[0] and "--size large" in calls[0]
    assert _returned_stage(tmp_path) == "T[fresh]"                          # returned as always
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 0 and f"--resume {kept}" in calls[0], output
    assert _returned_stage(tmp_path) == "T[T[fresh]]"
    # a carried stage is the one asked for: it wins over the kept one, once
    rc, output, calls = _train_call(tmp_path, {".stage/kda_stage.pt": "C"}, RESUME="1")
    assert rc == 0 and _returned_stage(tmp_path) == "T[C]", output
    # the device keeps the ignored .stage folder: the next call must not go back to that older stage
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 0 and _returned_stage(tmp_path) == "T[T[C]]", output


def _zip_stage_parts() -> tuple[str, list[bytes]]:
    """A stand-in stage as torch.save writes one (a zip archive): its md5 prefix and three parts of it."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", os.urandom(3000))
    data = buf.getvalue()
    third = len(data) // 3
    return hashlib.md5(data).hexdigest()[:12], [data[:third], data[third:2 * third], data[2 * third:]]


def _carry_parts(root: Path, folder: str, parts: dict[str, bytes]) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    for suffix, data in parts.items():
        (root / folder / f"kda_stage.pt.part-{suffix}").write_bytes(data)


def test_a_stage_carried_in_parts_over_two_calls_is_joined_by_the_training_call(tmp_path):
    root = tmp_path / "root"
    md5, (p1, p2, p3) = _zip_stage_parts()
    _carry_parts(root, ".stage_1", {"aa": p1})
    rc, output, calls = _train_call(tmp_path, INSTALL_ONLY="1")
    assert rc == 0 and calls == [], output                                 # staged only
    _carry_parts(root, ".stage_2", {"ab": p2, "ac": p3})
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 0 and "joined 3 carried parts" in output, output
    assert _returned_stage(tmp_path) == f"T[zip:{md5}]"
    rc, output, calls = _train_call(tmp_path, RESUME="1")           # the parts are not joined again
    assert rc == 0 and _returned_stage(tmp_path) == f"T[T[zip:{md5}]]", output
    # a staging folder carried again (the last carry list repeated): its parts were joined already, so they are
    # dropped; they stayed unjoinable and refused every later RESUME call (a review helper)
    _carry_parts(root, ".stage_2", {"ab": p2, "ac": p3})
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 0 and "already joined: ignored" in output, output
    assert _returned_stage(tmp_path) == f"T[T[T[zip:{md5}]]]"


def test_parts_that_do_not_join_into_a_whole_stage_are_refused_and_the_kept_stage_survives(tmp_path):
    # the machine went cold between the calls that carried them: the first part never reached this one
    root = tmp_path / "root"
    rc, output, calls = _train_call(tmp_path, VARIANTS="gdn gdn;kda kda")   # kept stages, T[fresh]
    assert rc == 0, output
    md5, (p1, p2, p3) = _zip_stage_parts()
    _carry_parts(root, ".stage_2", {"ab": p2, "ac": p3})
    rc, output, calls = _train_call(tmp_path, VARIANTS="gdn gdn;kda kda", RESUME="1")
    # refused before any variant starts: gdn, whose stage is fine, would otherwise have run on unsaved
    assert rc == 2 and calls == [] and "do not join into a whole stage" in output, output
    assert (tmp_path / "kept" / "kda_stage.pt").read_text() == "T[fresh]"
    _carry_parts(root, ".stage_1", {"aa": p1})                            # the missing part comes: now whole
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 0 and _returned_stage(tmp_path) == f"T[zip:{md5}]", output


def test_parts_carried_without_resume_or_install_only_are_refused_and_removed(tmp_path):
    root = tmp_path / "root"
    _carry_parts(root, ".stage_1", {"aa": b"old"})
    rc, output, calls = _train_call(tmp_path)
    assert rc == 2 and calls == [] and "refused and removed" in output, output
    assert not list((root / ".stage_1").iterdir())


def test_a_stage_past_the_calls_return_limit_stays_kept_and_the_next_call_brings_it_back(tmp_path):
    # 12-06: two 37 MB stages and the kernels were more than a call brings back, and parts were left out at random
    out = tmp_path / "out"
    rc, output, calls = _train_call(tmp_path, VARIANTS="kda kda;gdn gdn", STAGE_PAD="100000",
                                    RETURN_BYTES="180000")
    assert rc == 0 and len(calls) == 2, output
    assert (out / "kda_stage.pt").stat().st_size == 100008 and not list(out.glob("gdn_stage*"))
    assert "gdn: stage not returned" in output and 'RETURN_ONLY=1 VARIANTS="gdn ...' in output
    rc, output, calls = _train_call(tmp_path, VARIANTS="gdn gdn", RETURN_ONLY="1")
    assert rc == 0 and calls == [], output                                  # no training, only the return
    assert (out / "gdn_stage.pt").read_bytes() == b"T[fresh]" + bytes(100000)
    rc, output, calls = _train_call(tmp_path, VARIANTS="gdn gdn", RETURN_ONLY="1", RETURN_BYTES="1000")
    assert rc == 4 and "gdn: stage not returned" in output, output          # a stage not brought back is an error


def test_a_forked_variant_starts_from_a_copy_of_its_sources_stage_then_keeps_its_own(tmp_path):
    # session 31: kdaqa was to start from the kda stage that same call joined; a cp before the call found nothing
    root = tmp_path / "root"
    md5, (p1, p2, p3) = _zip_stage_parts()
    _carry_parts(root, ".stage_1", {"aa": p1, "ab": p2, "ac": p3})
    variants = "kda kda;kdadrill kda --qa-drill 16"
    rc, output, calls = _train_call(tmp_path, VARIANTS=variants, FORK="other=gdn,kdadrill=kda", RESUME="1")
    assert rc == 0 and "kdadrill: starts from a copy of kda's stage" in output, output
    kept = tmp_path / "kept"
    assert len(calls) == 2 and any(c.endswith(f"--resume {kept}/kdadrill_stage.pt --qa-drill 16") for c in calls)
    assert (kept / "kdadrill_stage.pt").read_text() == f"T[zip:{md5}]"    # trained on from the source's weights
    # from then on it resumes its own stage, not another copy of its source's
    rc, output, calls = _train_call(tmp_path, VARIANTS=variants, FORK="kdadrill=kda", RESUME="1")
    assert rc == 0 and "starts from a copy" not in output, output
    assert (kept / "kdadrill_stage.pt").read_text() == f"T[T[zip:{md5}]]"
    # a fork whose source has no stage either is the usual refusal, before anything trains
    rc, output, calls = _train_call(tmp_path, VARIANTS="gdnx gdn", FORK="gdnx=gdn", RESUME="1")
    assert rc == 2 and calls == [] and "nor kept here" in output, output


def test_training_resume_with_no_stage_anywhere_stops_before_training(tmp_path):
    rc, output, calls = _train_call(tmp_path, RESUME="1")
    assert rc == 2 and calls == [] and "nor kept here" in output


def test_bench_only_runs_the_step_benchmark_and_trains_nothing(tmp_path):
    rc, output, calls = _train_call(tmp_path, BENCH_ONLY="1", COMMIT="abc1234", BENCH_ARGS="--steps 3")
    out = tmp_path / "out"
    assert rc == 0 and calls == [f"-m benchmarks train_step --commit abc1234 --out {out}/train_step.json --steps 3"], output
    assert not (tmp_path / "w" / "train_logs").exists()          # returned before the training's setup


def _lengths_call(tmp_path, eval_seconds: int = 0, **env) -> tuple[int, str, list[str]]:
    """Run scripts/gpu/quality_lengths.sh in a scratch root whose quality_evals.sh is a stand-in that records
    the length, limit, shard folder and $OUT it was given (one line a run) and takes ``eval_seconds``."""
    root, bin_, out, base_env = _device_root(tmp_path, "quality_lengths.sh")
    log = tmp_path / "runs"
    _stub(root / "scripts" / "gpu" / "quality_evals.sh",
          f'echo "$LENGTHS $EVAL_LIMIT $EV_DIR $OUT" >> {log}; sleep {eval_seconds}\n')
    proc = subprocess.run(["bash", "scripts/gpu/quality_lengths.sh"], cwd=root, env={**base_env, **env},
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr, log.read_text().splitlines() if log.exists() else []


def test_quality_lengths_runs_each_length_apart_and_gives_the_last_one_what_is_left(tmp_path):
    rc, output, runs = _lengths_call(tmp_path, eval_seconds=2, CALL_LIMIT="1060", MARGIN_S="60")
    assert rc == 0, output
    first, last = (r.split() for r in runs)
    out = str(tmp_path / "out")
    assert first == ["4096", "600", "/tmp/evq/4096", f"{out}/4096"]      # 60% of (1060 - 60)
    assert last[0] == "8192" and last[2:] == ["/tmp/evq/8192", f"{out}/8192"]
    assert 1000 - 4 <= int(last[1]) <= 1000 - 2        # all that is left: the first's 2 s, not its 600 s limit


def test_quality_lengths_stops_when_too_little_is_left_for_a_length_and_says_so(tmp_path):
    rc, output, runs = _lengths_call(tmp_path, CALL_LIMIT="150", MARGIN_S="60", LENGTH_LIST="4096 8192")
    assert runs == [] and "54 s left for 4096 tokens: stopping" in output      # 60% of (150 - 60)
    assert rc != 0 and "ran no length of 4096 8192" in output


def test_quality_lengths_takes_commas_and_puts_the_shards_under_cells_root(tmp_path):
    rc, output, runs = _lengths_call(tmp_path, CALL_LIMIT="1060", LENGTH_LIST="4096,8192", CELLS_ROOT="/tmp/x")
    assert rc == 0, output
    assert [r.split()[0] for r in runs] == ["4096", "8192"]
    assert [r.split()[2] for r in runs] == ["/tmp/x/4096", "/tmp/x/8192"]


def test_wr_fixed_slots_cold_call_can_start_its_first_w(tmp_path):
    """wr_fixed_slots.sh on a machine with no .kernel_cache carried (a cold kernel cache): the deadline and start
    estimate it passes must let the driver's own gate (clients/fixed_slots.UnitDeadline, built as
    serve_wr_fixed_slots.run_call builds it) start the first W, whose nr server then compiles the kernels and
    measures the start the seeds are gated on. It passed --ready-estimate-s 300, charged to both of a W's servers:
    735 s owed against a deadline of at most 540, so a cold call started nothing, and then marked the machine
    warm (/tmp/wr_fixed.warm) for the next call, whose server found the kernel cache as cold as before."""
    import time
    from benchmarks import serve_wr_fixed_slots as mod
    from clients.fixed_slots import UnitDeadline
    # the old script's marker, left on this machine by an earlier run: it would hide the cold path
    Path("/tmp/wr_fixed.warm").unlink(missing_ok=True)
    root, bin_, out, base_env = _device_root(tmp_path, "wr_fixed_slots.sh")
    log = tmp_path / "client_args"
    _stub(bin_ / "python3", f'if [ "$1" = - ]; then cat >/dev/null; exit 0; fi\nprintf "%s\\n" "$@" > {log}\n')
    cells = f"benchmarks/cells/test_wr_cold_{os.getpid()}_{time.time_ns()}"
    env = {**base_env, "COMMIT": "abc1234", "CELLS": cells, "PACKED_DIR": str(tmp_path / "packed")}
    try:
        proc = subprocess.run(["bash", "scripts/gpu/wr_fixed_slots.sh"], cwd=root, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        shutil.rmtree(Path("/tmp/cells") / Path(cells).name, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = log.read_text().splitlines()[2:]           # past "-m benchmarks"
    assert args[0] == "serve_wr_fixed_slots"
    a, mode = mod.parse(args[1:]), mod.GPU
    gate = UnitDeadline(a.call_deadline_s, mode["turns"], {}, a.request_estimate_s or mode["request_s"],
                        a.ready_estimate_s or mode["ready_s"], mode["build_s"], clock=lambda: 0.0)
    first = int(a.wmax.split(",")[0])
    assert 0 < a.call_deadline_s <= 540
    assert gate.fits_w(first, mode["seeds"][0]), (a.call_deadline_s, a.ready_estimate_s)
