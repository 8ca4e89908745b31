"""Fixtures of tests/model; the helpers live in hybrid_tiny.py."""
from __future__ import annotations

import pytest
from hybrid_tiny import build


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """tiny(arch, variant='base') -> (dir, transformers model); built once per session."""
    cache = {}

    def get(arch: str, variant: str = "base"):
        key = (arch, variant)
        if key not in cache:
            path = tmp_path_factory.mktemp(f"{arch}-{variant}")
            over = dict(q_lora_rank=12) if variant == "qlora" else {}
            shard = "40KB" if variant == "sharded" else None
            cache[key] = (str(path), build(path, arch, seed=len(cache), long=(variant == "long"),
                                           max_shard_size=shard, **over))
        return cache[key]
    return get
