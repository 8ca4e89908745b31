"""Where weights come from: a Hugging Face safetensors checkpoint, or random tensors (benchmarks).

CheckpointReader understands what `save_pretrained` writes: a single `model.safetensors`, or shards listed
in `model.safetensors.index.json` (weight_map: tensor name -> shard file); the files are read by the one
checkpoint reader (checkpoint_files.py) the planner uses too. Tensor names are the original checkpoint
names transformers 5.x writes back (e.g. kimi `self_attn.q_conv1d.weight`,
`block_sparse_moe.experts.{e}.w1.weight`). Every problem is a UserError naming the file or tensor.
"""
from __future__ import annotations

import hashlib
import math

import torch

from trtllm_dasc.checkpoint_files import INDEX, CheckpointFileError, SafetensorsCheckpoint
from trtllm_dasc.plan.synthetic import DEFAULT_PROFILE, profile_decay_params

# safetensors dtype -> torch dtype of the same bits (bf16 and fp8 arrive from numpy as unsigned ints)
_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "I64": torch.int64,
                 "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U64": torch.uint64,
                 "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool}


class WeightError(CheckpointFileError):
    """A checkpoint that does not hold the tensors the config describes (missing shard/tensor, bad shape)."""


class CheckpointReader:
    """Lazy reader: tensors are read one at a time from their shard when `get` asks for them."""

    def __init__(self, path: str):
        self.path = path
        self.files = SafetensorsCheckpoint(path)
        missing = self.files.missing_shards()
        if missing:
            raise WeightError(f"checkpoint {path!r} is missing shard file(s) {', '.join(missing)} "
                              f"listed in {INDEX}")
        self.weight_map: dict[str, str] = self.files.weight_map

    def has(self, name: str) -> bool:
        return self.files.has(name)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The stored tensor (stored dtype, CPU), checked against the shape the config implies."""
        if not self.files.has(name):
            raise WeightError(f"checkpoint {self.path!r} lacks tensor {name!r}")
        # the shape is checked from the header, before any data is read
        info = self.files.info(name)
        if tuple(info.shape) != tuple(shape):
            raise WeightError(f"tensor {name!r} has shape {list(info.shape)} but the config implies {list(shape)}")
        return torch.from_numpy(self.files.read(name)[0]).view(_TORCH_DTYPES[info.dtype])


class RandomWeights:
    """Random tensors of the requested shapes, with sane decays (fla's init), for benchmarks and tests."""

    def __init__(self, seed: int = 0, std: float = 0.02, device: str | torch.device = "cpu"):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.std, self.device = std, device

    def has(self, name: str) -> bool:
        return not name.endswith(".bias") or "e_score_correction_bias" in name or "dt_bias" in name

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name.endswith(("A_log", "dt_bias")):
            return self._decay(name, shape)
        if "norm" in name:
            return self._norm(name, shape)
        if name.endswith("e_score_correction_bias"):
            return torch.zeros(shape, device=self.device)
        return self._normal(name, shape)

    def _decay(self, name: str, shape) -> torch.Tensor:
        def uniform(lo, hi):
            return torch.rand(shape, generator=self.gen, device=self.device) * (hi - lo) + lo
        if name.endswith("A_log"):
            return uniform(1.0, 16.0).log()
        dt = uniform(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        return dt + torch.log(-torch.expm1(-dt))

    def _norm(self, name: str, shape) -> torch.Tensor:
        return torch.ones(shape, device=self.device)

    def _normal(self, name: str, shape) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, device=self.device) * self.std


class DummyWeights(RandomWeights):
    """`dasc-build --load-format dummy`: full-size random weights made on the device at load time, nothing read.

    Every tensor is a function of (seed, tensor name) alone: its own generator is seeded from a hash of both,
    so the values depend on neither the order of loading nor the TP degree, and a rank's slice (the loader
    cuts the full tensor, weights.load) is the slice of the full tensor. One device type gives one set of
    values (CUDA's generator differs from the CPU's). Matrices are N(0, 1/fan_in): each projection keeps its
    input's scale, so activations stay O(1) through any depth (the norms re-centre the residual stream) and
    the logits come out O(1); norms are neutral (qwen3_next's 1 + w norms get w = 0); the correction bias 0;
    A_log / dt_bias are the paper-shaped decay profile the planner uses (plan/synthetic.py), so the engine's
    state capacities equal `dasc plan`'s for the synthetic checkpoint of the same seed."""

    dummy = True

    def __init__(self, cfg, seed: int = 0, device: str | torch.device = "cpu", profile: str = DEFAULT_PROFILE):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
            raise WeightError(f"dummy weights' seed must be a non-negative integer, got {seed!r}")
        super().__init__(seed=seed, device=device)
        self.seed, self.path = seed, f"dummy weights (seed {seed})"
        self.offset_norm = cfg.family.norm_offset
        self.linear_prefix = cfg.family.linear_prefix
        self.decay = {}
        for p in profile_decay_params(cfg, seed, profile):
            self.decay[f"model.layers.{p.layer}.{cfg.family.linear_prefix}A_log"] = p.A_log
            self.decay[f"model.layers.{p.layer}.{cfg.family.linear_prefix}dt_bias"] = p.dt_bias

    def tensor_seed(self, name: str) -> int:
        digest = hashlib.blake2b(f"{self.seed}:{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1

    def _decay(self, name: str, shape) -> torch.Tensor:
        values = self.decay.get(name)
        if values is None or values.size != math.prod(shape):
            raise WeightError(f"dummy weights have no decay profile for {name!r} of shape {list(shape)}")
        return torch.tensor(values, dtype=torch.float32, device=self.device).view(shape)

    def _norm(self, name: str, shape) -> torch.Tensor:
        # qwen3_next's decoder and q/k norms scale by (1 + w); its gated linear-attention norm by w
        offset = self.offset_norm and f".{self.linear_prefix}norm" not in name
        return (torch.zeros if offset else torch.ones)(shape, device=self.device)

    def _normal(self, name: str, shape) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(self.tensor_seed(name))
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        return torch.randn(shape, generator=gen, device=self.device) * (1.0 / math.sqrt(max(fan_in, 1)))


def load(src, name: str, shape: tuple[int, ...], dtype: torch.dtype, device, rows=None, cols=None) -> torch.Tensor:
    """src.get(name, shape), optionally index-selected along dim 0 (rows) / dim 1 (cols), cast and moved.
    A NaN/Inf weight (a corrupt file, or a value the cast overflows) is refused here, naming the tensor,
    instead of turning every logit into NaN later."""
    if getattr(src, "sliced", False):
        # a source that cuts itself (rank_weights.py: recorded at build, or a rank's file at run time)
        t = src.get_slice(name, shape, rows, cols)
    else:
        t = src.get(name, shape)
        if rows is not None:
            t = t.index_select(0, rows.to(t.device))
        if cols is not None:
            t = t.index_select(1, cols.to(t.device))
    if t.device.type == "meta":
        # shapes only (model/footprint.py counts the bytes a load would take): nothing to check or move
        return t.to(dtype=dtype).contiguous()
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        where = f" in {src.path}" if isinstance(getattr(src, "path", None), str) else ""
        raise WeightError(f"tensor {name!r}{where} holds NaN or Inf values: the checkpoint is corrupt")
    out = t.to(device=device, dtype=dtype).contiguous()
    if out.is_floating_point() and out.dtype != t.dtype and not bool(torch.isfinite(out).all()):
        raise WeightError(f"tensor {name!r} overflows {str(dtype).removeprefix('torch.')}: load it in a wider dtype")
    return out
