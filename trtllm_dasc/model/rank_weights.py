"""Per-rank weight files of a TP engine (`dasc-build --tp T`): every rank's tensors already cut and in the
planner's bundle order, so a rank reads its share only, never the whole checkpoint (TensorRT-LLM's
per-rank engines, for the same reason).

    weights/rank{r}.safetensors   what rank r loads, in the checkpoint's dtype, already sliced; its safetensors
                                  metadata records tp_rank and build_id (checked against the manifest)
    weights/rank{r}.json          its manifest: tp_size, tp_rank, the bundle order, the build's id (the
                                  engine's config.json records it: a rank file of another build is refused,
                                  same shapes or not), and per tensor the full shape and a digest of the
                                  row/column indices it was cut with

The cut is made by the loaders themselves: the build runs each rank's model construction against a
``SliceRecorder`` (the checkpoint, cut as asked, every piece kept), and at run time ``RankWeights``
answers the same requests from the file, checking each against its manifest, so a file made for another
TP degree, placement or model is refused, never silently used.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import torch

from trtllm_dasc.errors import UserError
from trtllm_dasc.model.weights import CheckpointReader, WeightError
from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model.model import HybridModel

MANIFEST_VERSION = 1


def _digest(index) -> str | None:
    if index is None:
        return None
    return hashlib.sha1(torch.as_tensor(index, dtype=torch.int64).cpu().numpy().tobytes()).hexdigest()


def rank_paths(weights_dir: str, rank: int) -> tuple[str, str]:
    return (os.path.join(weights_dir, f"rank{rank}.safetensors"), os.path.join(weights_dir, f"rank{rank}.json"))


class SliceRecorder:
    """A weight source for the build: reads the checkpoint, cuts what the loaders ask for, keeps it."""

    sliced = True

    def __init__(self, reader: CheckpointReader):
        self.reader, self.path = reader, reader.path
        self.tensors: dict[str, torch.Tensor] = {}
        self.manifest: dict[str, dict] = {}

    def has(self, name: str) -> bool:
        return self.reader.has(name)

    def get_slice(self, name: str, shape, rows=None, cols=None) -> torch.Tensor:
        t = self.reader.get(name, shape)
        if rows is not None:
            t = t.index_select(0, rows.to(t.device))
        if cols is not None:
            t = t.index_select(1, cols.to(t.device))
        t = t.contiguous()
        self.tensors[name] = t
        self.manifest[name] = {"shape": list(shape), "rows": _digest(rows), "cols": _digest(cols)}
        return t


class RankWeights:
    """Rank ``tp_rank``'s file as a weight source; every request is checked against the manifest."""

    sliced = True

    def __init__(self, weights_dir: str, tp_rank: int, tp_size: int, bundle_order: list[list[int]],
                 build_id: str | None = None):
        from safetensors import SafetensorError, safe_open
        self.path, meta_path = rank_paths(weights_dir, tp_rank)
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            # a truncated or corrupt file raises SafetensorError, neither an OSError nor a ValueError
            self._file = safe_open(self.path, framework="pt")
        except (OSError, ValueError, SafetensorError) as e:
            raise UserError(f"rank {tp_rank}'s weights in {weights_dir!r} cannot be read ({e}); rebuild the "
                            "engine with dasc-build") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("tensors"), dict):
            raise UserError(f"{meta_path} is not a rank weight manifest (no tensors table): rebuild the engine "
                            "with dasc-build")
        want = {"manifest_version": MANIFEST_VERSION, "tp_size": tp_size, "tp_rank": tp_rank,
                "bundle_order": bundle_order}
        if build_id is not None:
            want["build_id"] = build_id
        for key, value in want.items():
            if meta.get(key) != value:
                what = "another build of an engine" if key == "build_id" else f"{key}={meta.get(key)!r}"
                raise UserError(f"{meta_path} was written for {what}, this engine needs {value!r}: rebuild the "
                                "engine with dasc-build")
        # the file's own record (files written since it was added): another rank's or build's file beside
        # this manifest was served as this rank's weights
        stamp = self._file.metadata() or {}
        for key, value in (("tp_rank", tp_rank), ("build_id", meta.get("build_id"))):
            if key in stamp and stamp[key] != str(value):
                raise UserError(f"{self.path} was written as {key} {stamp[key]}, its manifest {meta_path} says "
                                f"{value}: the files were mixed up after the build; rebuild the engine with dasc-build")
        self.manifest: dict[str, dict] = meta["tensors"]

    def has(self, name: str) -> bool:
        return name in self.manifest

    def get(self, name: str, shape) -> torch.Tensor:
        return self.get_slice(name, shape)

    def get_slice(self, name: str, shape, rows=None, cols=None) -> torch.Tensor:
        entry = self.manifest.get(name)
        if entry is None:
            raise WeightError(f"{self.path} lacks tensor {name!r}: rebuild the engine")
        asked = {"shape": list(shape), "rows": _digest(rows), "cols": _digest(cols)}
        if entry != asked:
            raise WeightError(f"tensor {name!r} in {self.path} was cut for another layout than this engine asks "
                              "for: rebuild the engine")
        from safetensors import SafetensorError
        try:
            t = self._file.get_tensor(name)
        except SafetensorError as e:
            raise WeightError(f"{self.path} cannot give tensor {name!r} its manifest lists ({e}): the file was "
                              "changed after the build; rebuild the engine") from None
        # the file itself, not only its manifest: a tensor of another shape was loaded as it was (an lm_head
        # one row short served), an integer one cast silently
        cut = list(shape)
        if rows is not None:
            cut[0] = len(rows)
        if cols is not None:
            cut[1] = len(cols)
        if list(t.shape) != cut or not t.is_floating_point():
            raise WeightError(f"tensor {name!r} in {self.path} is {str(t.dtype).removeprefix('torch.')} "
                              f"{list(t.shape)}, this engine expects a float tensor of shape {cut}: the file was "
                              "changed after the build; rebuild the engine")
        return t


def write_rank_weights(model_dir: str, weights_dir: str, tp_size: int, bundle_order: list[list[int]],
                       progress=None, build_id: str | None = None) -> list[int]:
    """Cut the checkpoint for every rank (each rank's model construction, recorded); returns each rank's
    file size in bytes. ``progress(rank, bytes)`` is called after each rank; ``build_id`` goes into every
    manifest (the engine's EngineConfig.rank_weights_id)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    os.makedirs(weights_dir, exist_ok=True)
    cfg = HybridConfig.from_path(model_dir)
    sizes = []
    for rank in range(tp_size):
        rec = SliceRecorder(CheckpointReader(model_dir))
        # the model is built only to make the loaders ask for exactly what this rank holds
        HybridModel.from_source(cfg, rec, dtype="bfloat16", device="cpu", tp_rank=rank, tp_size=tp_size,
                                bundle_order=bundle_order, backend="torch")
        path, meta_path = rank_paths(weights_dir, rank)
        try:
            save_file(rec.tensors, path, metadata={"tp_rank": str(rank), "build_id": str(build_id)})
        except SafetensorError as e:
            # a full disk or a failing write: safetensors raises its own error, neither an OSError nor one line
            code = re.search(r"\(os error (\d+)\)", str(e))
            why = os.strerror(int(code.group(1))) if code else str(e)
            raise UserError(f"cannot write rank {rank}'s weights {path}: {why}") from None
        with open(meta_path, "w") as f:
            json.dump({"manifest_version": MANIFEST_VERSION, "tp_size": tp_size, "tp_rank": rank,
                       "bundle_order": bundle_order, "build_id": build_id, "tensors": rec.manifest}, f)
        sizes.append(os.path.getsize(path))
        if progress is not None:
            progress(rank, sizes[-1])
    return sizes
