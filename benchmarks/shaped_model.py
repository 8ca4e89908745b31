"""Write a full-size-shaped checkpoint (random weights, the paper's decay profile) for GPU benchmarks.

Real Kimi-Linear-48B weights are out of reach, so GPU figures use a model with the released shapes where
they decide the cost: 27 layers, 20 KDA with 32 heads x 128 at the real positions, 7 MLA, hidden 2304,
a dense MLP of 9216 (the active width; MoE routing is not what is measured) and the paper's KDA decay
profile (so the planner keeps what it would keep on real weights). The vocabulary is cut to 32k to keep
the file small. Tensor names and shapes are exactly those our loader reads, recorded by loading the
config through it with a random source, and written with safetensors in bf16.

    python -m benchmarks shaped_model OUT_DIR [--arch kda|gdn] [--vocab 32000] [--device cuda]
    python -m benchmarks shaped_model OUT_DIR --arch gdn --layers 4 --hidden 256 --intermediate 512 --vocab 4096

--layers/--hidden/--intermediate make a reduced model for CPU ranks: the released linear-attention heads
(Kimi 32 x 128 channels, Qwen 16 key x 32 value heads of 128) and attention heads, so each TP8 rank holds the
real per-layer state and the planner balances the real units, in the first N layers of the released
pattern (at least one full-attention layer) with a narrow residual stream and MLP.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.model import HybridModel, RandomWeights
from trtllm_dasc.plan.synthetic import KIMI_48B, QWEN3_NEXT_80B, decay_tensors, synthetic_decay


def shaped_config(arch: str, vocab: int, layers: int | None = None, hidden: int | None = None,
                  intermediate: int | None = None) -> dict:
    raw = json.loads(json.dumps(KIMI_48B if arch == "kda" else QWEN3_NEXT_80B))
    raw["vocab_size"] = vocab
    if layers is not None:
        _first_layers(raw, arch, layers)
    if hidden is not None:
        raw["hidden_size"] = hidden
    if intermediate is not None:
        raw["intermediate_size"] = intermediate
    if arch == "kda":
        raw["mlp_layer_types"] = ["dense"] * raw["num_hidden_layers"]
        raw["first_k_dense_replace"] = raw["num_hidden_layers"]
    else:
        # the dense MLP of the active width (10 experts x 512 + a 512 shared expert)
        raw.update(num_experts=0, intermediate_size=5632, mlp_only_layers=list(range(raw["num_hidden_layers"])))
    raw["tie_word_embeddings"] = False
    if intermediate is not None:
        raw["intermediate_size"] = intermediate       # gdn's dense width above replaced it
    return raw


def _first_layers(raw: dict, arch: str, layers: int) -> None:
    """Keep the released stack's first `layers` layers (its pattern: three linear, then full attention)."""
    if layers < 1:
        raise ValueError(f"--layers must be >= 1, got {layers}")
    raw["num_hidden_layers"] = layers
    if arch == "kda":
        lin = raw["linear_attn_config"]         # 1-based layer numbers
        lin["kda_layers"] = [i for i in lin["kda_layers"] if i <= layers]
        lin["full_attn_layers"] = [i for i in lin["full_attn_layers"] if i <= layers]
    else:
        raw["layer_types"] = raw["layer_types"][:layers]


class Recorder:
    """A weight source that hands out RandomWeights' tensors and records what it handed out: every
    tensor's shape, and the tensors themselves unless ``keep_tensors`` is off (a benchmark that only
    counts FLOPs would otherwise hold a second copy of the weights)."""

    def __init__(self, device: str, keep_tensors: bool = True):
        self.random = RandomWeights(seed=0, std=0.02, device=device)
        self.keep_tensors = keep_tensors
        self.tensors: dict[str, torch.Tensor] = {}
        self.shapes: dict[str, tuple] = {}

    def has(self, name: str) -> bool:
        return self.random.has(name)

    def get(self, name: str, shape):
        t = self.random.get(name, shape)
        self.shapes[name] = tuple(shape)
        if self.keep_tensors:
            self.tensors[name] = t
        return t


def write_shaped_model(out_dir: str, arch: str = "kda", vocab: int = 32000, device: str = "cpu",
                       layers: int | None = None, hidden: int | None = None, intermediate: int | None = None) -> str:
    raw = shaped_config(arch, vocab, layers, hidden, intermediate)
    cfg = HybridConfig.from_dict(raw)
    rec = Recorder(device)
    model = HybridModel.from_source(cfg, rec, dtype="bfloat16", device=device)
    del model
    per_head = cfg.key_head_dim if arch == "kda" else 1
    heads = cfg.num_key_heads if arch == "kda" else cfg.num_value_heads
    alpha = synthetic_decay(arch, cfg.num_linear_layers, heads, per_head, seed=0)
    A_log, dt_bias = decay_tensors(alpha, per_head, seed=0)
    module = "self_attn" if arch == "kda" else "linear_attn"
    for i, layer in enumerate(cfg.linear_layers):
        for name, values in (("A_log", A_log[i]), ("dt_bias", dt_bias[i])):
            key = f"model.layers.{layer}.{module}.{name}"
            rec.tensors[key] = torch.tensor(values, dtype=torch.float32).view(rec.tensors[key].shape)
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    out = {k: (v if k.endswith(("A_log", "dt_bias")) else v.to(torch.bfloat16)).contiguous().cpu()
           for k, v in rec.tensors.items()}
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(raw, f, indent=1)
    return out_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--arch", default="kda", choices=["kda", "gdn"])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=None, help="the released stack's first N layers (reduced model)")
    ap.add_argument("--hidden", type=int, default=None, help="residual width (reduced model)")
    ap.add_argument("--intermediate", type=int, default=None, help="dense MLP width (reduced model)")
    a = ap.parse_args()
    print(f"wrote {write_shaped_model(a.out, a.arch, a.vocab, a.device, a.layers, a.hidden, a.intermediate)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
