"""Where weights come from: a Hugging Face safetensors checkpoint, or random tensors (benchmarks).

CheckpointReader understands what `save_pretrained` writes: a single `model.safetensors`, or shards listed
in `model.safetensors.index.json` (weight_map: tensor name -> shard file). Tensor names are the original
checkpoint names transformers 5.x writes back (e.g. kimi `self_attn.q_conv1d.weight`,
`block_sparse_moe.experts.{e}.w1.weight`). Every problem is a UserError naming the file or tensor.
"""
from __future__ import annotations

import glob
import json
import math
import os

import torch

from trtllm_dasc.errors import UserError


class WeightError(UserError):
    """A checkpoint that does not hold the tensors the config describes (missing shard/tensor, bad shape)."""


class CheckpointReader:
    """Lazy reader: tensors are read one at a time from their shard when `get` asks for them."""

    def __init__(self, path: str):
        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise WeightError(f"{index} is not a valid safetensors index ({e})") from None
        else:
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
            if not files:
                raise WeightError(f"no model.safetensors or model.safetensors.index.json in {path!r}")
            weight_map = {}
            for file in files:
                for name in self._open(os.path.basename(file)).keys():
                    weight_map[name] = os.path.basename(file)
        missing = sorted({f for f in weight_map.values() if not os.path.isfile(os.path.join(path, f))})
        if missing:
            raise WeightError(f"checkpoint {path!r} is missing shard file(s) {', '.join(missing)} "
                              "listed in model.safetensors.index.json")
        self.weight_map: dict[str, str] = dict(weight_map)
        self._handles: dict[str, object] = {}

    def _open(self, file: str):
        from safetensors import safe_open
        try:
            return safe_open(os.path.join(self.path, file), framework="pt")
        except Exception as e:  # noqa: BLE001 - safetensors raises several types for a bad file
            raise WeightError(f"cannot read shard {file!r} in {self.path!r}: {e}") from None

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The stored tensor (stored dtype, CPU), checked against the shape the config implies."""
        file = self.weight_map.get(name)
        if file is None:
            raise WeightError(f"checkpoint {self.path!r} lacks tensor {name!r}")
        if file not in self._handles:
            self._handles[file] = self._open(file)
        tensor = self._handles[file].get_tensor(name)
        if tuple(tensor.shape) != tuple(shape):
            raise WeightError(f"tensor {name!r} has shape {list(tensor.shape)} but the config implies {list(shape)}")
        return tensor


class RandomWeights:
    """Random tensors of the requested shapes, with sane decays (fla's init), for benchmarks and tests."""

    def __init__(self, seed: int = 0, std: float = 0.02, device: str | torch.device = "cpu"):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.std, self.device = std, device

    def has(self, name: str) -> bool:
        return not name.endswith(".bias") or "e_score_correction_bias" in name or "dt_bias" in name

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        def uniform(lo, hi):
            return torch.rand(shape, generator=self.gen, device=self.device) * (hi - lo) + lo
        if name.endswith("A_log"):
            return uniform(1.0, 16.0).log()
        if name.endswith("dt_bias"):
            dt = uniform(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
            return dt + torch.log(-torch.expm1(-dt))
        if "norm" in name:
            return torch.ones(shape, device=self.device)
        if name.endswith("e_score_correction_bias"):
            return torch.zeros(shape, device=self.device)
        return torch.randn(shape, generator=self.gen, device=self.device) * self.std


def load(src, name: str, shape: tuple[int, ...], dtype: torch.dtype, device, rows=None, cols=None) -> torch.Tensor:
    """src.get(name, shape), optionally index-selected along dim 0 (rows) / dim 1 (cols), cast and moved."""
    t = src.get(name, shape)
    if rows is not None:
        t = t.index_select(0, rows.to(t.device))
    if cols is not None:
        t = t.index_select(1, cols.to(t.device))
    return t.to(device=device, dtype=dtype).contiguous()
