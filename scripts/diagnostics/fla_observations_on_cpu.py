"""Horizon validation's observations through fla's kernels on the CPU, under Triton's interpreter, against the
torch reference: the CPU twin of tests/evals/test_horizon_validation.py's GPU-only
test_observations_on_the_fla_backend_equal_the_reference (same tiny checkpoint, seed and prompt).

    python scripts/diagnostics/fla_observations_on_cpu.py --fla-wheel fla_core-0.6.0-py3-none-any.whl \
        [--einops-wheel einops-*.whl] [--arch gdn kda]

Three things make fla 0.6.0 run here, none of them in the product: the wheel is unpacked into a scratch folder
with its loop counters cast for the interpreter (`i_t.to(tl.int64)` -> `tl.cast(i_t, tl.int64)`: under the
interpreter a range() counter is a Python int), every autotuned kernel keeps its first config (the interpreter
has no benchmarker), and the fla backend is allowed on a CPU model. The interpreter runs fp32 dots exactly, so
what is left is the recording itself: it prints each signal's largest error over its largest value, per layer.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def unpack(wheels: list[str], dest: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", dest, *wheels], check=True)
    for path in pathlib.Path(dest, "fla", "ops").rglob("*.py"):
        text = path.read_text()
        new = re.sub(r"\bi_t\.to\(tl\.int64\)", "tl.cast(i_t, tl.int64)", text)
        if new != text:
            path.write_text(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fla-wheel", required=True)
    ap.add_argument("--einops-wheel", default=None, help="fla imports einops; give its wheel when not installed")
    ap.add_argument("--arch", nargs="+", default=["gdn", "kda"])
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="fla-interp-")
    unpack([args.fla_wheel] + ([args.einops_wheel] if args.einops_wheel else []), scratch)
    os.environ["TRITON_INTERPRET"] = "1"            # before triton is imported
    sys.path[:0] = [scratch, str(ROOT / "tests" / "model"), str(ROOT)]
    import numpy as np
    import torch
    import triton.runtime.autotuner as autotuner
    first_init = autotuner.Autotuner.__init__

    def first_config_only(self, *a, **kw):
        first_init(self, *a, **kw)
        self.configs = self.configs[:1]
    autotuner.Autotuner.__init__ = first_config_only
    from trtllm_dasc.model.recurrence import fla as fla_backend
    fla_backend.available = lambda device=None: (fla_backend.IMPORT_ERROR is None, "the interpreter")
    from hybrid_tiny import build
    from trtllm_dasc.evals.horizon_validation import observe
    from trtllm_dasc.model import HybridModel
    for arch in args.arch:
        path = tempfile.mkdtemp(prefix=f"hv-{arch}-")
        build(path, arch, seed=3)                      # the test's checkpoint and prompt
        prompt = torch.randint(3, 90, (200,), generator=torch.Generator().manual_seed(1)).tolist()
        (ref,) = observe(HybridModel.from_pretrained(path), [prompt])
        (fla,) = observe(HybridModel.from_pretrained(path, backend="fla"), [prompt])
        worst = 0.0
        for layer, (a, b) in enumerate(zip(ref, fla)):
            for name in ("g_mean", "state_norm", "readout"):
                x, y = getattr(a, name), getattr(b, name)
                rel = float(np.abs(x - y).max() / max(float(np.abs(x).max()), 1e-30))
                worst = max(worst, rel)
                print(f"{arch} layer {layer} {name}: max |ref - fla| / max |ref| = {rel:.2e}")
        print(f"{arch}: worst {worst:.2e} over {len(ref)} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
