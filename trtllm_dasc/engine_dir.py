"""The engine directory (`dasc-build`'s output): its layout, and the one writer and reader of its config.json.

    ENGINE_DIR/
      config.json   {"dasc_engine_version": N, "built_at", "source", "engine": {EngineConfig fields, paths
                    relative to the directory}, "serving": {decoupled, exclude_input_in_output, max_batch_size,
                    max_queue_delay_microseconds}, "checkpoint_check", "model_config", "weights", "memory_per_rank"}
      plan.json     the dasc plan;  model/  the checkpoint's files;  weights/  per-rank weights (TP);
      kernels/      Triton's kernel cache;  model_repo/  the Triton model repository

``dasc_engine_version`` is both the marker an engine is recognised by (dasc serve, dasc plan, --force) and the
format version: every engine written so far is version 1 (a config.json without the key reads as 1, though
``is_engine_dir`` does not recognise it); a newer one is refused in one line. ``read``
checks the file once (its sections' types, the version, the arm through EngineConfig's own checks where
the caller builds one) and fills the defaults of fields older engines lack. Imports nothing of the package
but errors, so the planner may ask whether a path is an engine.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from trtllm_dasc.errors import UserError

FORMAT_VERSION = 1
# what a config.json without the version key is read as
UNVERSIONED = 1
VERSION_KEY = "dasc_engine_version"
CONFIG = "config.json"
PLAN = "plan.json"
MODEL = "model"
RANK_WEIGHTS = "weights"
KERNELS = "kernels"
REPOSITORY = "model_repo"
# EngineConfig fields naming a path: written relative to the directory (it can move), read back absolute
PATH_FIELDS = ("model", "plan_path", "kernel_cache_dir", "rank_weights")
# the record of engines built before dasc-build wrote one: their weights were the checkpoint's
DEFAULT_WEIGHTS = {"load_format": "safetensors"}
# the serving options of engines built before dasc-build wrote them (TensorRT-LLM's defaults)
DEFAULT_SERVING = {"decoupled": True}


@dataclass(slots=True)
class EngineDir:
    path: str                           # the directory, absolute
    version: int
    engine: dict                        # EngineConfig fields, paths absolute
    serving: dict = field(default_factory=lambda: dict(DEFAULT_SERVING))
    weights: dict = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    source: str | None = None           # the checkpoint it was built from
    meta: dict = field(default_factory=dict, repr=False)    # the whole config.json

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, CONFIG)

    @property
    def model_dir(self) -> str:
        return os.path.join(self.path, MODEL)


def _load(path: str) -> dict:
    with open(os.path.join(path, CONFIG)) as f:
        return json.load(f)


def refuse_engine_as_checkpoint(path: str, flag: str = "--model") -> None:
    """A dasc engine directory given where a checkpoint is expected: one line saying so (its config.json has
    no model_type, and the model's parser said "unsupported model_type None")."""
    if is_engine_dir(path):
        raise UserError(f"{flag} {path!r} is a dasc engine directory, not a checkpoint: pass its model/ "
                        f"({os.path.join(path, MODEL)}) or the original checkpoint")


def is_engine_dir(path: str) -> bool:
    """A directory written by dasc-build: its config.json carries the version marker."""
    try:
        meta = _load(path)
    except (OSError, ValueError):
        return False
    return os.path.isdir(path) and isinstance(meta, dict) and VERSION_KEY in meta


def model_dir_of(path: str) -> str:
    """An engine directory stands for its model/ checkpoint; any other path for itself."""
    if os.path.isdir(os.path.join(path, MODEL)) and is_engine_dir(path):
        return os.path.join(path, MODEL)
    return path


def read(path: str) -> EngineDir:
    """The engine directory at ``path``, checked once: one UserError line for anything not an engine of a
    format this dasc reads."""
    config = os.path.join(path, CONFIG)
    try:
        meta = _load(path)
        version = meta.get(VERSION_KEY, UNVERSIONED)
        engine = dict(meta["engine"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"{config} is not a dasc engine config ({e}); build one with dasc-build") from None
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UserError(f"{config}: {VERSION_KEY} must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise UserError(f"{config} is a dasc engine of format version {version}, newer than this dasc reads "
                        f"({FORMAT_VERSION}): rebuild it with this dasc-build")
    for key in PATH_FIELDS:
        if engine.get(key) is not None and not isinstance(engine[key], str):
            raise UserError(f"{config}: engine field {key} must be a path, got {engine[key]!r}")
        if engine.get(key) and not os.path.isabs(engine[key]):
            engine[key] = os.path.join(path, engine[key])
    _check_model_config(path, engine, meta.get("model_config"))
    serving, weights = meta.get("serving"), meta.get("weights")
    _check_dummy_record(engine, weights)
    return EngineDir(path=os.path.abspath(path), version=version, engine=engine,
                     serving={**DEFAULT_SERVING, **serving} if isinstance(serving, dict) else dict(DEFAULT_SERVING),
                     weights=weights if isinstance(weights, dict) else dict(DEFAULT_WEIGHTS),
                     source=meta.get("source"), meta=meta)


# model/dummy_weights.json (checkpoint_files.DUMMY_MARKER; named here, as this module imports nothing of the package)
DUMMY_RECORD = "dummy_weights.json"


def _check_dummy_record(engine: dict, weights) -> None:
    """A dummy engine's model/dummy_weights.json must be the weights record its config.json holds: the loader
    makes the weights (decay tensors included) from that file's seed and profile, and the plan was made for
    the recorded ones, so a file deleted or edited after the build served other weights than the plan's."""
    model = engine.get("model")
    if not isinstance(weights, dict) or weights.get("load_format") != "dummy" or not isinstance(model, str):
        return
    # a record without a seed (no dasc-build writes one) has nothing to compare; a missing model directory is
    # the loader's to report in its own words
    if "seed" not in weights or not os.path.isdir(model):
        return
    file = os.path.join(model, DUMMY_RECORD)
    try:
        with open(file) as f:
            now = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{file} is missing: this engine was built with dummy weights (seed "
                        f"{weights.get('seed')}) and makes them from that file; rebuild it with dasc-build") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{file} cannot be read ({e}); rebuild the engine with dasc-build") from None
    if now != weights:
        diff = (sorted(k for k in set(now) | set(weights) if now.get(k) != weights.get(k)) if isinstance(now, dict)
                else ["the whole file"])
        raise UserError(f"{file} differs from the weights record this engine was built with (in "
                        f"{', '.join(diff[:5])}): it was edited after the build; rebuild the engine with dasc-build")


def _check_model_config(path: str, engine: dict, recorded) -> None:
    """The model's config.json must be the one the engine was built from (config.json's model_config): the
    plan, the rank weights and the checks were made for it. An engine whose model/config.json was edited
    (or, before the build copied it, edited in place in the source checkpoint through a hard link) served a
    model its plan does not describe. Engines that did not record it (older builds) are not checked."""
    model = engine.get("model")
    if not isinstance(recorded, dict) or not isinstance(model, str):
        return
    file = os.path.join(model, "config.json")
    try:
        with open(file) as f:
            now = json.load(f)
    except (OSError, ValueError):
        return          # missing or unreadable: the model loader says so in its own words
    if now != recorded:
        diff = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
        raise UserError(f"{file} differs from the config this engine was built from (in {', '.join(diff[:5])}"
                        f"{' ...' if len(diff) > 5 else ''}): it was edited after the build; rebuild the engine "
                        "with dasc-build")


def write(path: str, *, engine: dict, serving: dict, source: str, weights: dict, model_config: dict,
          checkpoint_check: dict, memory_per_rank: dict | None) -> None:
    """config.json of the engine being built in ``path`` (the EngineConfig fields with paths relative)."""
    for key in PATH_FIELDS:
        if engine.get(key) and os.path.isabs(engine[key]):
            raise ValueError(f"engine field {key} must be relative to the engine directory, got {engine[key]!r}")
    meta = {VERSION_KEY: FORMAT_VERSION, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "source": source,
            "engine": engine, "serving": serving, "checkpoint_check": checkpoint_check, "model_config": model_config,
            "weights": weights, "memory_per_rank": memory_per_rank}
    with open(os.path.join(path, CONFIG), "w") as f:
        json.dump(meta, f, indent=1)
