"""scripts/gpu/split_carry.py: the parts of each file, taken from every folder in name order, are the file again
(checked against the original bytes, not against the script's own bookkeeping), and no folder holds more than
its call's room."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu" / "split_carry.py"


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, capture_output=True, text=True)


def test_parts_join_back_into_each_file_and_each_folder_fits_its_call(tmp_path):
    originals = {"kda_stage.pt": os.urandom(2_500), "gdn_stage.pt": os.urandom(1_700)}
    for name, data in originals.items():
        (tmp_path / name).write_bytes(data)
    proc = _run(tmp_path, "--first-bytes", "700", "--rest-bytes", "1000", "--prefix", ".stage_", *originals)
    assert proc.returncode == 0, proc.stderr
    folders = sorted(tmp_path.glob(".stage_*"), key=lambda p: int(p.name.split("_")[-1]))
    assert [p.name for p in folders] == [f".stage_{k}" for k in range(1, 6)]        # 4,200 B = 700 + 3x1000 + 500
    sizes = [sum(f.stat().st_size for f in p.iterdir()) for p in folders]
    assert sizes == [700, 1000, 1000, 1000, 500]
    for name, data in originals.items():
        parts = sorted((f for p in folders for f in p.glob(f"{name}.part-*")), key=lambda f: f.name)
        assert b"".join(f.read_bytes() for f in parts) == data
    assert "call 1: carry .stage_1 (700 B), INSTALL_ONLY=1" in proc.stdout
    assert "call 5: carry .stage_5 (500 B)\n" in proc.stdout


def test_a_file_that_fills_its_folder_exactly_opens_no_empty_one(tmp_path):
    (tmp_path / "a.pt").write_bytes(os.urandom(30))
    proc = _run(tmp_path, "--first-bytes", "10", "--rest-bytes", "20", "a.pt")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.glob(".stage_*")) == [".stage_1", ".stage_2"]


def test_empty_files_and_too_many_parts_are_refused_before_anything_is_written(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "a.pt").write_bytes(b"x" * 700)
    proc = _run(tmp_path, "--first-bytes", "1", "--rest-bytes", "1", "a.pt")
    assert proc.returncode == 2 and "700 parts" in proc.stderr
    proc = _run(tmp_path, "--first-bytes", "100", "--rest-bytes", "100", "a.pt", "empty.pt")
    assert proc.returncode == 2 and "empty" in proc.stderr
    assert not list(tmp_path.glob(".stage_*"))


def test_a_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "a.pt").write_bytes(b"x" * 10)
    (tmp_path / ".stage_1").mkdir()
    (tmp_path / ".stage_1" / "old.part-aa").write_bytes(b"stale")
    proc = _run(tmp_path, "--first-bytes", "5", "--rest-bytes", "5", "a.pt")
    assert proc.returncode == 2 and "not empty" in proc.stderr
