"""Independent numpy references of horizon precision (issue 35), shared by the state and engine tests:
the paper's horizons from a checkpoint's decay tensors, and what a load of each codec must give back."""
from __future__ import annotations

import glob
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_codecs_fp8_int4 import fake_fp8, fake_fp8_decode, fake_int4  # noqa: E402


def fake_quant(x: np.ndarray, codec: str) -> np.ndarray:
    """Rows [..., V] fp32 -> the rows a load must write: native unchanged; int8 paper Eq. 10; fp8 the
    nearest e4m3 value (table); int4 round half even to [-7, 7]; each times its per-row fp32 scale."""
    x = x.astype(np.float32)
    if codec == "native":
        return x
    if codec == "fp8":
        return fake_fp8_decode(*fake_fp8(x))
    if codec == "int4":
        _, s, q = fake_int4(x)
        return (q.astype(np.float32) * s[..., None]).astype(np.float32)
    s = (np.maximum(np.abs(x).max(-1), np.float32(1e-8)) / np.float32(127)).astype(np.float32)
    return (np.clip(np.rint(x / s[..., None]), -127, 127).astype(np.float32) * s[..., None]).astype(np.float32)


def horizons_from_arrays(A_log: np.ndarray, dt_bias: np.ndarray, a: float = -0.3, eps: float = 1e-3) -> np.ndarray:
    """Paper Eqs. 2-3, one horizon per unit: H = ln(eps) / (-exp(A_log) softplus(a + dt_bias)); A_log per
    head, repeated over the head's units (kda: its key channels; gdn: one unit a head)."""
    A = np.repeat(np.asarray(A_log, np.float64).reshape(-1), dt_bias.size // np.asarray(A_log).size)
    g = -np.exp(A) * np.log1p(np.exp(a + np.asarray(dt_bias, np.float64).reshape(-1)))
    return np.log(eps) / g


def checkpoint_horizons(model_dir) -> list[np.ndarray]:
    """Per linear layer (in layer order), the horizons of a saved checkpoint, read with safetensors."""
    from safetensors.numpy import load_file
    found: dict[int, dict[str, np.ndarray]] = {}
    for f in glob.glob(str(Path(model_dir) / "*.safetensors")):
        for name, v in load_file(f).items():
            m = re.search(r"layers\.(\d+)\..*(A_log|dt_bias)$", name)
            if m:
                found.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return [horizons_from_arrays(found[l]["A_log"], found[l]["dt_bias"]) for l in sorted(found)]


def unit_rows(x: np.ndarray, n_units: int) -> np.ndarray:
    """One request's temporal state [L, H, K, V] -> [L, n_units, R, V] (fla's layout: a unit is a value
    head (gdn, R = K rows) or a (head, key) channel (kda, R = 1))."""
    return x.reshape(x.shape[0], n_units, -1, x.shape[-1])
