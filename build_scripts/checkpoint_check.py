"""The checkpoint check of `dasc-build`: everything the runtime will load is present, shaped as config.json
says, stored as floats, finite, and the vocabularies agree, before a single byte of the engine is written.

The list of tensors is not written down here: the runtime's own loaders (HybridModel.from_source and the
layer classes' ``load``) are run against a shape-only source on the meta device, so the check asks for
exactly the names, shapes and dtypes the server will ask for, whatever the family. The values are then
streamed shard by shard, in file order, a bounded chunk at a time (a progress line on large checkpoints).
Every defect is one UserError naming the tensor.
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass

import numpy as np

from trtllm_dasc.checkpoint_files import FLOATS, CheckpointFileError, SafetensorsCheckpoint, TensorInfo, read_json
from trtllm_dasc.errors import UserError

# values are read this many bytes at a time: memory stays bounded on an 80B checkpoint's largest tensor
CHUNK_BYTES = 64 << 20
# below this many bytes a progress line is noise
PROGRESS_MIN_BYTES = 256 << 20
# a stored float type's largest finite value (bf16 shares float32's exponent range)
_STORED_MAX = {"F64": np.finfo(np.float64).max, "F32": np.finfo(np.float32).max,
               "BF16": np.finfo(np.float32).max, "F16": np.finfo(np.float16).max}


class CheckpointCheckError(UserError):
    """A checkpoint the engine would fail on (or silently serve wrong): names the tensor and the defect."""


@dataclass(frozen=True, slots=True)
class Needed:
    """One tensor a runtime loader asks for: its checkpoint shape and the dtype it is cast to."""
    name: str
    shape: tuple[int, ...]
    load_dtype: str              # torch dtype name, e.g. "bfloat16"


def needed_tensors(model_dir: str, files: SafetensorsCheckpoint, dtype: str) -> list[Needed]:
    """What HybridModel.from_source asks its weight source for at TP 1 (every tensor, uncut), found by
    running it on the meta device: no value is read or allocated."""
    import torch
    from torch.overrides import TorchFunctionMode

    from trtllm_dasc.config import HybridConfig
    from trtllm_dasc.model.model import HybridModel

    asked: dict[str, list] = {}
    # id -> (name, tensor): the tensor is kept so that its id is never reused by another
    handed: dict[int, tuple] = {}

    class ShapeSource:
        # the loaders' sliced-source protocol (weights.load): shapes in, meta tensors out
        sliced, path = True, model_dir

        def has(self, name):
            return files.has(name)

        def get(self, name, shape):
            return self.get_slice(name, shape)

        def get_slice(self, name, shape, rows=None, cols=None):
            asked[name] = [tuple(int(s) for s in shape), None]
            cut = list(shape)
            if rows is not None:
                cut[0] = len(rows)
            if cols is not None:
                cut[1] = len(cols)
            t = torch.empty(cut, dtype=torch.float32, device="meta")
            handed[id(t)] = (name, t)
            return t

    class MetaValues(TorchFunctionMode):
        """weights.load asks whether values are finite; a meta tensor has none (the stream below checks
        the real ones), and the dtype each tensor is cast to is noted for the overflow check."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.isfinite and args and args[0].is_meta:
                return finite
            if func is torch.Tensor.to and args and id(args[0]) in handed and "dtype" in kwargs:
                asked[handed[id(args[0])][0]][1] = str(kwargs["dtype"]).removeprefix("torch.")
            if func in (torch.cat, torch.stack) and not kwargs and len(args) <= 2:
                # meta cat / stack run python meta kernels whose first call imports torch._dynamo (seconds):
                # only the result's shape matters here
                return _joined(func is torch.stack, *args)
            return func(*args, **kwargs)

    def _joined(stack, parts, dim=0):
        parts = list(parts)
        shape = list(parts[0].shape)
        if stack:
            shape.insert(dim % (len(shape) + 1), len(parts))
        else:
            shape[dim] = sum(p.shape[dim] for p in parts)
        return torch.empty(shape, dtype=parts[0].dtype, device="meta")

    finite = torch.ones((), dtype=torch.bool)
    cfg = HybridConfig.from_path(model_dir)
    with MetaValues():
        HybridModel.from_source(cfg, ShapeSource(), dtype=dtype, device="meta", backend="torch")
    return [Needed(n, shape, d or dtype) for n, (shape, d) in asked.items()]


def _check_headers(files: SafetensorsCheckpoint, needed: list[Needed], config: dict) -> list[TensorInfo]:
    """Presence, shape and stored dtype of every needed tensor, from the shard headers only."""
    vocab = config.get("vocab_size")
    infos = []
    for n in needed:
        if not files.has(n.name):
            raise CheckpointCheckError(f"tensor {n.name!r} is missing from the checkpoint (the model needs it, "
                                       f"shape {list(n.shape)})")
        info = files.info(n.name)
        if info.shape != n.shape:
            if n.name in ("model.embed_tokens.weight", "lm_head.weight") and info.shape[1:] == n.shape[1:]:
                raise CheckpointCheckError(f"tensor {n.name!r} has {info.shape[0]} rows but config.json says "
                                           f"vocab_size {vocab}: the config and the weights disagree")
            raise CheckpointCheckError(f"tensor {n.name!r} has shape {list(info.shape)} but config.json implies "
                                       f"{list(n.shape)}")
        if info.dtype not in FLOATS:
            quant = config.get("quantization_config")
            why = (f"config.json's quantization_config ({quant.get('quant_method', '?')}) is not a format dasc "
                   "loads" if isinstance(quant, dict) else "quantised weights are not supported")
            raise CheckpointCheckError(f"tensor {n.name!r} is stored as {info.dtype}, not a float "
                                       f"({'/'.join(FLOATS)}): {why}; the runtime would cast it silently")
        infos.append(info)
    return infos


def _token_ids(tok: dict) -> list[int]:
    """Every id tokenizer.json can produce: its model's vocabulary and its added tokens."""
    ids = [t["id"] for t in tok.get("added_tokens") or [] if isinstance(t, dict) and isinstance(t.get("id"), int)]
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids += [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):
        # unigram: a list of [piece, score], the id is the position
        ids.append(len(vocab) - 1)
    return ids


def _check_tokenizer(model_dir: str, vocab: int) -> None:
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return
    tok = read_json(path, CheckpointCheckError)
    ids = _token_ids(tok) if isinstance(tok, dict) else []
    if ids and max(ids) >= vocab:
        raise CheckpointCheckError(f"tokenizer.json has token id {max(ids)} but config.json says vocab_size {vocab} "
                                   "(the embedding's rows): the tokenizer belongs to another model")


def _read_chunks(info: TensorInfo):
    """The tensor's stored values, CHUNK_BYTES at a time (whole elements)."""
    from trtllm_dasc.checkpoint_files import DTYPES
    dt = np.dtype(DTYPES[info.dtype])
    step = max(CHUNK_BYTES // dt.itemsize, 1) * dt.itemsize
    with open(info.file, "rb") as f:
        f.seek(info.start)
        left = info.nbytes
        while left > 0:
            buf = f.read(min(step, left))
            if not buf:
                raise CheckpointFileError(f"{info.file} ended while reading its tensors (truncated)")
            left -= len(buf)
            yield np.frombuffer(buf, dtype=dt)


def _chunk_defect(arr: np.ndarray, stored: str, limit: float | None) -> str | None:
    """'NaN or Inf' / an overflow description, or None for a clean chunk."""
    if stored == "BF16":
        # exponent bits all ones: Inf or NaN (numpy has no bfloat16)
        if ((arr & 0x7F80) == 0x7F80).any():
            return "holds NaN or Inf values"
        vals = (arr.astype(np.uint32) << 16).view(np.float32) if limit is not None else None
    else:
        if not np.isfinite(arr).all():
            return "holds NaN or Inf values"
        vals = arr if limit is not None else None
    if vals is not None and vals.size:
        amax = float(np.abs(vals).max())
        if amax > limit:
            return f"has values up to {amax:.3g}, beyond the {limit:.3g} its load dtype holds"
    return None


def _check_values(needed: list[Needed], infos: list[TensorInfo], out=None) -> None:
    """Stream every needed tensor (file order) and refuse NaN / Inf, and values the cast would overflow."""
    import torch
    out = out or sys.stderr
    order = sorted(zip(needed, infos), key=lambda p: (p[1].file, p[1].start))
    total, done, t0, last = sum(i.nbytes for i in infos), 0, time.time(), 0.0
    live = total >= PROGRESS_MIN_BYTES
    for n, info in order:
        target = torch.finfo(getattr(torch, n.load_dtype)).max
        limit = float(target) if target < _STORED_MAX[info.dtype] else None
        try:
            for arr in _read_chunks(info):
                defect = _chunk_defect(arr, info.dtype, limit)
                if defect:
                    if live:
                        print(file=out)
                    raise CheckpointCheckError(f"tensor {n.name!r} in {os.path.basename(info.file)} {defect}: "
                                               "the checkpoint is corrupt")
                done += arr.nbytes
                now = time.time()
                # a live line on a terminal, a line every 10 s in a log
                if live and (now - last > (0.5 if out.isatty() else 10.0) or done == total):
                    last = now
                    end = "\r" if out.isatty() and done < total else "\n"
                    print(f"[dasc-build] finite check {done / 2**30:7.2f} / {total / 2**30:.2f} GiB "
                          f"({100 * done / total:3.0f}%, {now - t0:.0f} s)", end=end, file=out, flush=True)
        except OSError as e:
            raise CheckpointFileError(f"cannot read {info.file}: {e.strerror or e}") from None


# tensors a checkpoint may hold that this runtime does not serve, by name: multi-token-prediction heads
# (Qwen3-Next's released checkpoint has mtp.*) and rotary tables older exports saved as weights
IGNORABLE_UNUSED = (re.compile(r"^mtp\."), re.compile(r"(^|\.)rotary_emb\.inv_freq$"))


def unused_tensors(files: SafetensorsCheckpoint, needed) -> list[str]:
    """The checkpoint's tensors no loader asks for and no IGNORABLE_UNUSED pattern names, sorted."""
    asked = {n.name for n in needed}
    return sorted(n for n in files.weight_map if n not in asked and not any(p.search(n) for p in IGNORABLE_UNUSED))


def check_checkpoint(model_dir: str, dtype: str, finite: bool = True, allow_unused: bool = False) -> dict:
    """Refuse a checkpoint the engine cannot serve correctly (CheckpointCheckError naming the tensor);
    returns what was checked, for the engine's metadata. A tensor nothing loads is refused too unless
    ``allow_unused``: a config.json with fewer layers than the weights (34 tensors of a sixth layer), a trained
    lm_head beside tie_word_embeddings, an extra bias, all built an engine that served another model than the
    checkpoint without a word."""
    config = read_json(os.path.join(model_dir, "config.json"), CheckpointCheckError)
    files = SafetensorsCheckpoint(model_dir)
    missing = files.missing_shards()
    if missing:
        raise CheckpointCheckError(f"checkpoint {model_dir!r} is missing shard file(s) {', '.join(missing)}")
    t0 = time.time()
    needed = needed_tensors(model_dir, files, dtype)
    infos = _check_headers(files, needed, config)
    unused = unused_tensors(files, needed)
    if unused and not allow_unused:
        shown = ", ".join(repr(n) for n in unused[:4]) + (f" and {len(unused) - 4} more" if len(unused) > 4 else "")
        raise CheckpointCheckError(f"checkpoint {model_dir!r} holds {len(unused)} tensor(s) that no part of this "
                                   f"model loads ({shown}): does config.json describe these weights (layer "
                                   "count, tie_word_embeddings)? --allow-unused-tensors builds anyway")
    embed = next(n for n in needed if n.name == "model.embed_tokens.weight")
    _check_tokenizer(model_dir, embed.shape[0])
    if finite:
        _check_values(needed, infos)
    return {"tensors": len(needed), "bytes": sum(i.nbytes for i in infos), "finite_checked": finite,
            "unused_tensors": len(unused), "seconds": round(time.time() - t0, 3)}
