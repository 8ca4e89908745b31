"""The footprint's shape-only concatenation of meta tensors (model/footprint.py _MetaConcat) against torch.cat
on real CPU tensors, and the reason it exists: counting a model's footprint must not import torch._dynamo
(3-7 s of every engine start on a 2-core CPU)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_dasc.model.footprint import _MetaConcat

ROOT = str(Path(__file__).resolve().parents[2])

CASES = [
    ([(3, 4), (5, 4)], 0, [torch.float32, torch.float32]),
    ([(2, 3, 4), (2, 1, 4), (2, 2, 4)], 1, [torch.bfloat16, torch.float32, torch.bfloat16]),
    ([(2, 3), (2, 5)], -1, [torch.float16, torch.float16]),
    ([(0,), (4, 2), (1, 2)], 0, [torch.float32, torch.bfloat16, torch.bfloat16]),      # cat skips 1-D empties
    ([(6,), (2,)], 0, [torch.int64, torch.int64]),
]


@pytest.mark.parametrize("shapes,dim,dtypes", CASES)
def test_meta_concat_has_torch_cats_shape_and_dtype(shapes, dim, dtypes):
    real = torch.cat([torch.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)], dim)
    for cat in (torch.cat, torch.concat):
        with _MetaConcat():
            meta = cat([torch.empty(s, dtype=d, device="meta") for s, d in zip(shapes, dtypes)], dim=dim)
        assert (meta.device.type, tuple(meta.shape), meta.dtype) == ("meta", tuple(real.shape), real.dtype)
    # tensors off the meta device go to torch.cat itself
    with _MetaConcat():
        again = torch.cat([torch.ones(s, dtype=d) for s, d in zip(shapes, dtypes)], dim)
    assert torch.equal(again, torch.ones_like(real))


def test_footprint_does_not_import_dynamo():
    code = ("import sys\n"
            "from trtllm_dasc.config import HybridConfig\n"
            "from trtllm_dasc.model import DummyWeights\n"
            "from trtllm_dasc.model.footprint import model_footprint\n"
            "from trtllm_dasc.plan.synthetic import tiny_moe_config\n"
            "cfg = HybridConfig.from_dict(tiny_moe_config('kda'))\n"
            "fp = model_footprint(cfg, DummyWeights(cfg), dtype='bfloat16', tp_rank=0, tp_size=1, bundle_order=None,"
            " state_rows=2, kv_blocks=2, block_size=4, pool_bytes=0)\n"
            "assert fp.weights > 0\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    # nor sympy: the meta kernels of some ops (advanced indexing) import it on their first call, ~1 s of
    # every rank's start (model/linear_attn.py loads KDA's A_log by index_select for this)
    assert out.stdout.split()[-2:] == ["False", "False"], out.stdout
