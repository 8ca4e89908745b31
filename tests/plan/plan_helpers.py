"""Shared helpers of the planner tests (imported by name; conftest only holds fixtures)."""
import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

DATA = Path(__file__).resolve().parents[1] / "data"
KIMI_REF = DATA / "kimi-linear-48b-a3b.config.json"
QWEN_REF = DATA / "qwen3-next-80b-a3b.config.json"


def run_dasc(*args):
    """Run the real console entry point in a subprocess: exit code, stdout, stderr."""
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def tiny_config(arch: str, heads=4, key_heads=2, dk=8, dv=8, layer_types=None) -> dict:
    layer_types = layer_types or ["linear_attention", "full_attention", "linear_attention"]
    if arch == "gdn":
        return {"model_type": "qwen3_next", "num_hidden_layers": len(layer_types), "layer_types": layer_types,
                "linear_num_key_heads": key_heads, "linear_num_value_heads": heads, "linear_key_head_dim": dk,
                "linear_value_head_dim": dv, "linear_conv_kernel_dim": 4}
    kda = [i + 1 for i, t in enumerate(layer_types) if t == "linear_attention"]
    full = [i + 1 for i, t in enumerate(layer_types) if t == "full_attention"]
    return {"model_type": "kimi_linear", "num_hidden_layers": len(layer_types),
            "linear_attn_config": {"head_dim": dk, "num_heads": heads, "short_conv_kernel_size": 4,
                                   "kda_layers": kda, "full_attn_layers": full}}


def write_decay_checkpoint(path: Path, raw: dict, decay: dict, extra=None) -> Path:
    """decay: model layer id -> (A_log list, dt_bias list), stored under the released names."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw))
    module = "linear_attn" if raw["model_type"] == "qwen3_next" else "self_attn"
    tensors = {}
    for layer, (a_log, dt_bias) in decay.items():
        a = torch.tensor(a_log, dtype=torch.float32)
        tensors[f"model.layers.{layer}.{module}.A_log"] = a.view(1, 1, -1, 1) if module == "self_attn" else a
        tensors[f"model.layers.{layer}.{module}.dt_bias"] = torch.tensor(dt_bias, dtype=torch.float32)
    tensors.update(extra or {})
    save_file(tensors, str(path / "model.safetensors"))
    return path
