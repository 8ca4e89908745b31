"""dasc-build's host-tier flags reach the engine config it records (default: off, lru, write-back)."""
import argparse

import pytest

from build_scripts.dasc_build import add_arguments, engine_options
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.errors import UserError


def options(*flags):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return engine_options(p.parse_args(["--model", "m", "--output", "o", *flags]))


def test_default_is_off_and_lru():
    opts = options()
    assert opts["host_cache_bytes"] == 0 and opts["eviction"] == "lru"
    assert opts["host_write_policy"] == "write-back" and opts["host_kv_blocks"] == 0


def test_flags_are_recorded_and_validated():
    opts = options("--host-cache-bytes", "1048576", "--eviction", "cost", "--host-write-policy", "write-through",
                   "--host-kv-blocks", "256")
    assert opts["host_cache_bytes"] == 1 << 20 and opts["eviction"] == "cost"
    assert opts["host_write_policy"] == "write-through" and opts["host_kv_blocks"] == 256
    with pytest.raises(UserError, match="host_kv_blocks"):
        EngineConfig(model="m", host_kv_blocks=-1)
    cfg = EngineConfig(**{**opts, "model": "m"})
    assert cfg.to_dict()["host_cache_bytes"] == 1 << 20
    with pytest.raises(UserError, match="host_cache_bytes"):
        EngineConfig(model="m", host_cache_bytes=-1)
    with pytest.raises(UserError, match="eviction must be one of lru|cost"):
        EngineConfig(model="m", eviction="lfu")
