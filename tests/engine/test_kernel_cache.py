"""The kernel cache an engine uses (engine/kernel_cache.py): Triton is pointed at it before anything compiles,
on a GPU it is seeded with the shipped autotune records, never over a record already there, and every
shipped record is one Triton's autotuner reads (its check_disk_cache: json "configs_timings", each entry a
triton.Config's fields and its timings)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine_helpers import make_engine

from trtllm_dasc.engine import kernel_cache as kc


def test_the_shipped_records_are_what_tritons_autotuner_reads():
    triton = pytest.importorskip("triton")
    shipped = kc.records()
    assert len(shipped) >= 14
    for path in shipped:
        assert len(path.parent.name) == 52, path          # Triton's cache keys: base32 of a sha256
        data = json.loads(path.read_text())
        # what Autotuner.check_disk_cache does with the file, then its choice: the least timing
        timings = {triton.Config(**config): timing for config, timing in data["configs_timings"]}
        assert len(timings) >= 2 and all(len(t) == 3 and min(t) > 0 for t in timings.values()), path
        assert path.name == f"{path.name.split('.')[0]}{kc.SUFFIX}" and isinstance(data["key"], list)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_seeding_copies_each_record_once_and_keeps_a_machines_own(tmp_path):
    cache = tmp_path / "cache"
    mine = cache / kc.records()[0].relative_to(kc.RECORDS)
    mine.parent.mkdir(parents=True)
    mine.write_text('{"key": [], "configs_timings": []}')          # this machine's own tuning
    assert kc.seed(cache) == len(kc.records()) - 1
    assert kc.seed(cache) == 0
    tree = _tree(cache)
    assert tree.pop(str(mine.relative_to(cache))) == b'{"key": [], "configs_timings": []}'
    # every other record, byte for byte at its own path
    shipped = {k: v for k, v in _tree(kc.RECORDS).items() if k.endswith(kc.SUFFIX)}
    shipped.pop(str(mine.relative_to(cache)))
    assert tree == shipped


def test_collect_adds_only_the_records_the_assets_lack(tmp_path):
    assets, cache = tmp_path / "assets", tmp_path / "cache"
    kc.seed(cache)
    (cache / "OTHERKEY" / "kernel.json").parent.mkdir()
    (cache / "OTHERKEY" / "kernel.json").write_text("{}")          # a compiled kernel's metadata: not a record
    new = kc.collect(cache, assets)
    assert sorted(p.relative_to(assets) for p in new) == sorted(p.relative_to(kc.RECORDS) for p in kc.records())
    assert kc.collect(cache, assets) == []


def test_the_runner_points_triton_at_the_engine_cache_and_seeds_nothing_on_a_cpu(tiny_models, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    make_engine(tiny_models["gdn"][0], kernel_cache_dir=str(tmp_path / "kernels"))
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "kernels")
    assert (tmp_path / "kernels").is_dir() and not any((tmp_path / "kernels").iterdir())
