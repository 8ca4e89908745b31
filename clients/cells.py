"""Resumable measurements: a manifest fixed before any run, and one JSON file per cell of work.

A paper-scale matrix is far longer than one device call. Its unit of work is a cell (an arm and a unit:
for the matched-HBM protocol a (phase, block, seed), for the fixed-slot study a seed); the manifest names
every cell before the first one runs (arms, phases, the blocks each phase uses, seeds, and every setting
the figures depend on). A call picks up cells not yet done and writes each one's JSON as soon as it ends,
so a run split over many calls and merged holds exactly the cells of one unsplit run.

Layout of a cells directory:
    manifest.json                         the manifest, with its id (a hash of its canonical JSON)
    calls/<call>.json                     one per call: command, commit, device, start time, its arms
    cells/<arm>/<unit>.<call>.json        one per cell and call that ran it
A baseline cell may be measured by several calls (the baseline runs in every call beside the arms it is
compared with); every other arm's cell is measured once.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import time

from trtllm_dasc.errors import UserError

MANIFEST = "manifest.json"


def manifest_id(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "id"}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def first_difference(a: dict, b: dict) -> str | None:
    """The first top-level key (sorted) whose values differ, None when equal."""
    for key in sorted(set(a) | set(b)):
        if key != "id" and a.get(key) != b.get(key):
            return key
    return None


def new_call_id() -> str:
    # sortable by start time; the pid tells two calls of one second apart
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}"


def _dump(path: str, obj: dict) -> None:
    from clients.compact_json import write
    write(path, obj)        # atomic; per-request lists on one line each


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None


class CellStore:
    """One cells directory. ``manifest``: the measurement's; an existing directory must hold the same one."""

    def __init__(self, root: str, manifest: dict, fresh: bool = False):
        self.root = os.path.abspath(root)
        self.manifest = {**manifest, "id": manifest_id(manifest)}
        path = os.path.join(self.root, MANIFEST)
        if fresh:
            for sub in ("cells", "calls"):
                for f in glob.glob(os.path.join(self.root, sub, "**", "*.json"), recursive=True):
                    os.remove(f)
            if os.path.exists(path):
                os.remove(path)
        if os.path.exists(path):
            old = _load(path)
            if old.get("id") != self.manifest["id"]:
                raise UserError(f"{self.root} holds the cells of another manifest (they differ in "
                                f"{first_difference(old, self.manifest)!r}): use a new --cells-dir")
        elif glob.glob(os.path.join(glob.escape(self.root), "cells", "*", "*.json")):
            # cells without their manifest (it was deleted, or only cells/ was copied) would count as done for
            # this one, whatever they measured
            raise UserError(f"{self.root} holds cells but no manifest ({MANIFEST}): they cannot be checked against "
                            "this measurement's (use a new --cells-dir, or bring back the manifest they were run with)")
        else:
            _dump(path, self.manifest)

    def _arm_dir(self, arm: str) -> str:
        return os.path.join(self.root, "cells", arm.replace("/", "_"))

    def cell_files(self, arm: str, unit: str) -> list[str]:
        return sorted(glob.glob(os.path.join(glob.escape(self._arm_dir(arm)), f"{glob.escape(unit)}.*.json")))

    def done(self, arm: str, unit: str) -> bool:
        return bool(self.cell_files(arm, unit))

    def done_in_call(self, arm: str, unit: str, call: str) -> bool:
        """Whether ``call`` wrote this arm's cell of ``unit`` (cells are named UNIT.CALL.json)."""
        return any(os.path.basename(f) == f"{unit}.{call}.json" for f in self.cell_files(arm, unit))

    def begin_call(self, call: str, record: dict) -> None:
        """Record a call before it measures; refuses a commit other than the cells already here."""
        commits = {c.get("commit") for c in self.calls()}
        if commits and record.get("commit") not in commits:
            raise UserError(f"{self.root} holds cells measured at commit {sorted(map(str, commits))[0]}, this call "
                            f"runs {record.get('commit')}: one measurement, one commit (use a new --cells-dir)")
        _dump(os.path.join(self.root, "calls", f"{call}.json"), {"call": call, **record})

    def update_call(self, call: str, **fields) -> None:
        path = os.path.join(self.root, "calls", f"{call}.json")
        _dump(path, {**_load(path), **fields})

    def calls(self) -> list[dict]:
        return [_load(p) for p in sorted(glob.glob(os.path.join(self.root, "calls", "*.json")))]

    def write(self, arm: str, unit: str, call: str, commit: str | None, record: dict) -> str:
        path = os.path.join(self._arm_dir(arm), f"{unit}.{call}.json")
        _dump(path, {"manifest_id": self.manifest["id"], "commit": commit, "call": call, "arm": arm, "unit": unit,
                     **record})
        return path

    def cells(self) -> list[dict]:
        return [_load(p) for p in sorted(glob.glob(os.path.join(self.root, "cells", "*", "*.json")))]


def load_dirs(dirs: list[str]) -> tuple[dict, list[dict], list[dict]]:
    """Manifest, calls and cells of one or more cells directories of ONE measurement. Refuses mixed
    manifests (naming the first field that differs), cells of another manifest, and mixed commits."""
    if not dirs:
        raise UserError("no cells directory to merge")
    manifest, calls, cells = None, [], []
    for d in dirs:
        m = _load(os.path.join(d, MANIFEST))
        if manifest_id(m) != m.get("id"):
            raise UserError(f"{d}: its manifest was edited after the run (its id does not match its content)")
        if manifest is not None and m["id"] != manifest["id"]:
            raise UserError(f"{d} and {dirs[0]} have different manifests (they differ in "
                            f"{first_difference(manifest, m)!r}): not one measurement")
        manifest = manifest or m
        calls += [_load(p) for p in sorted(glob.glob(os.path.join(d, "calls", "*.json")))]
        cells += [_load(p) for p in sorted(glob.glob(os.path.join(d, "cells", "*", "*.json")))]
    for c in cells:
        if c.get("manifest_id") != manifest["id"]:
            raise UserError(f"cell {c.get('arm')}/{c.get('unit')} of call {c.get('call')} belongs to manifest "
                            f"{c.get('manifest_id')}, not {manifest['id']}")
    # the same directory given twice, or copies of it from several machines: each call counts once (a call's
    # id names one call; its cells are already taken once each by assemble)
    calls = list({c.get("call"): c for c in calls}.values())
    commits = sorted({str(c.get("commit")) for c in [*calls, *cells]})
    if len(commits) > 1:
        raise UserError(f"the cells were measured at different commits ({', '.join(commits)}): one measurement, "
                        "one commit")
    return manifest, calls, cells
