"""The one reader of a checkpoint directory's files: config.json, model.safetensors(.index.json), shards.

Used by the planner (plan/horizons.py, numpy only: planning imports no torch) and by the model loader
(model/weights.py, which turns the arrays into torch tensors). Safetensors layout: an 8-byte little-endian
header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": ...},
then the data. Headers are parsed and checked here, so a truncated, empty, random or renamed (pickle)
file, a bad index or a missing shard is one UserError naming the file, never a library traceback.
"""
from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from trtllm_dasc.errors import UserError

INDEX = "model.safetensors.index.json"
# json files we read are small; a bigger one is not a config (and would take the memory of one)
MAX_JSON_BYTES = 64 << 20
# the safetensors library's own header limit
MAX_HEADER_BYTES = 100 << 20
# stored dtype -> numpy dtype of its bits (bf16 / fp8 have none in numpy: read as raw unsigned ints)
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1",
          "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2",
          "U8": "u1", "BOOL": "?"}
FLOATS = ("F64", "F32", "F16", "BF16")


class CheckpointFileError(UserError):
    """A checkpoint file that cannot be read (message names the file)."""


def read_json(path: str, error=CheckpointFileError):
    """The parsed JSON of a small file; any unreadable, non-UTF-8 or non-JSON file raises ``error``."""
    try:
        if os.path.getsize(path) > MAX_JSON_BYTES:
            raise error(f"{path} is larger than {MAX_JSON_BYTES >> 20} MiB: not a config/index file")
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise error(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{path} nests JSON too deeply") from None
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    file: str                       # absolute path of the shard
    dtype: str                      # safetensors dtype, e.g. "BF16"
    shape: tuple[int, ...]
    start: int                      # absolute byte offset in the file
    nbytes: int


def read_header(path: str) -> dict[str, TensorInfo]:
    """Every tensor of one safetensors file, checked against the file's size."""
    def bad(why: str) -> CheckpointFileError:
        return CheckpointFileError(f"{path} is not a readable safetensors file: {why}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None:
                raise bad(f"it has {size} bytes, fewer than the 8-byte header length")
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise bad(f"its header length field says {n} bytes but the file has {size} (truncated, or "
                          "not safetensors: e.g. a renamed pickle)")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointFileError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise bad("its header is not UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _tensor_info(path, name, entry, data_start, data_len, bad)
    return out


def _naturals(value, lengths) -> bool:
    """A JSON list of non-negative integers whose length is in ``lengths``."""
    return isinstance(value, list) and len(value) in lengths and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)


def _tensor_info(path, name, entry, data_start, data_len, bad) -> TensorInfo:
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    shape, offsets = (entry.get("shape"), entry.get("data_offsets")) if dtype in DTYPES else (None, None)
    if not (_naturals(shape, range(65)) and _naturals(offsets, (2,))):
        raise bad(f"tensor {name!r} has a malformed entry")
    begin, end = offsets
    # python ints: a hostile shape cannot overflow the byte count
    numel = int(np.prod(shape, dtype=object)) if shape else 1
    if end - begin != numel * np.dtype(DTYPES[dtype]).itemsize:
        raise bad(f"tensor {name!r}: {end - begin} bytes cannot hold {dtype} {shape}")
    if end > data_len:
        raise bad(f"tensor {name!r} ends at data byte {end} but the file holds {data_len} (truncated)")
    return TensorInfo(path, dtype, tuple(shape), data_start + begin, end - begin)


# written by `dasc-build --load-format dummy` beside config.json: the checkpoint's weights are random, made at
# load time from this seed (model/weights.py DummyWeights; its decay tensors: plan/synthetic.py)
DUMMY_MARKER = "dummy_weights.json"


def dummy_marker(model_dir: str) -> dict | None:
    """The dummy-weights record of a checkpoint directory ({"load_format": "dummy", "seed": S, ...}), or None."""
    path = os.path.join(model_dir, DUMMY_MARKER)
    if not os.path.isdir(model_dir) or not os.path.isfile(path):
        return None
    meta = read_json(path)
    seed = meta.get("seed") if isinstance(meta, dict) else None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise CheckpointFileError(f"{path} must hold a JSON object with a non-negative integer 'seed'")
    # its "decay_profile" is checked where it is used (plan/synthetic.profile_of_record: one line): the planner
    # sits above this module
    return meta


def has_weights(model_dir: str) -> bool:
    return os.path.isfile(os.path.join(model_dir, INDEX)) or bool(glob.glob(os.path.join(model_dir, "*.safetensors")))


class SafetensorsCheckpoint:
    """tensor name -> shard of a checkpoint directory: from the index when sharded, else from the headers
    of its *.safetensors files. Shard headers are read lazily, when a tensor of the shard is first asked
    for, so planning an 80B checkpoint opens only the shards that hold the decay tensors."""

    def __init__(self, model_dir: str):
        self.dir = model_dir
        self._headers: dict[str, dict[str, TensorInfo]] = {}
        index = os.path.join(model_dir, INDEX)
        if os.path.isfile(index):
            self.weight_map = self._read_index(index)
            return
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise CheckpointFileError(f"no model.safetensors or {INDEX} in {model_dir!r}")
        self.weight_map = {}
        for file in files:
            for name in self._header(os.path.basename(file)):
                if name in self.weight_map:
                    raise CheckpointFileError(f"tensor {name!r} is stored twice in {model_dir!r}: in "
                                              f"{self.weight_map[name]} and {os.path.basename(file)}")
                self.weight_map[name] = os.path.basename(file)

    @staticmethod
    def _read_index(index: str) -> dict[str, str]:
        doc = read_json(index)
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointFileError(f"{index} is not a safetensors index: it needs a 'weight_map' object "
                                      "(tensor name -> shard file)")
        for name, shard in weight_map.items():
            # shards live beside the index: a path elsewhere is a broken (or hostile) index
            if not isinstance(shard, str) or not shard or os.path.basename(shard) != shard:
                raise CheckpointFileError(f"{index}: tensor {name!r} maps to {shard!r}, not a shard file name")
        return dict(weight_map)

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def missing_shards(self) -> list[str]:
        return sorted({f for f in self.weight_map.values() if not os.path.isfile(os.path.join(self.dir, f))})

    def _header(self, shard: str) -> dict[str, TensorInfo]:
        if shard not in self._headers:
            path = os.path.join(self.dir, shard)
            if not os.path.isfile(path):
                raise CheckpointFileError(f"shard {path} is missing (listed in {INDEX})")
            self._headers[shard] = read_header(path)
        return self._headers[shard]

    def info(self, name: str) -> TensorInfo:
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointFileError(f"checkpoint {self.dir!r} lacks tensor {name!r}")
        info = self._header(shard).get(name)
        if info is None:
            raise CheckpointFileError(f"{os.path.join(self.dir, shard)} does not hold tensor {name!r} "
                                      f"that {INDEX} places there")
        return info

    def read(self, name: str) -> tuple[np.ndarray, TensorInfo]:
        """The stored bits as a writable numpy array of the stored shape (bf16/fp8 as unsigned ints)."""
        info = self.info(name)
        dtype = np.dtype(DTYPES[info.dtype])
        try:
            with open(info.file, "rb") as f:
                f.seek(info.start)
                arr = np.frombuffer(bytearray(f.read(info.nbytes)), dtype=dtype)
        except OSError as e:
            raise CheckpointFileError(f"cannot read {info.file}: {e.strerror or e}") from None
        if arr.nbytes != info.nbytes:
            raise CheckpointFileError(f"{info.file} ended while reading tensor {name!r} (truncated)")
        return arr.reshape(info.shape), info

    def read_float64(self, name: str) -> np.ndarray:
        """A floating tensor as float64 (exact for every stored float dtype), refused if not finite."""
        arr, info = self.read(name)
        if info.dtype not in FLOATS:
            raise CheckpointFileError(f"tensor {name!r} in {info.file} is {info.dtype}, not a float tensor")
        if info.dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        # a signalling NaN's bits make the cast warn (two lines before the error below): quiet, then refused
        with np.errstate(invalid="ignore"):
            out = arr.astype(np.float64)
        if not np.isfinite(out).all():
            raise CheckpointFileError(f"tensor {name!r} in {info.file} holds NaN or Inf values")
        return out
