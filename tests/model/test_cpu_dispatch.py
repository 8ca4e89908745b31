"""A CPU model on a GPU machine: every Triton path is chosen by the tensors' device, never by whether a GPU
exists (Triton's nvidia launcher refuses CPU tensors: "cannot be accessed from Triton (cpu tensor?)").
Here torch.cuda.is_available is made to say True while every tensor stays on the CPU, and any Triton launch
raises: the recurrence backend, the MoE experts, the linears, the attention and the checkpoint store / load
must all take their torch paths."""
from __future__ import annotations

import pytest
import torch

from hybrid_tiny import build
from trtllm_dasc.errors import UserError
from trtllm_dasc.model.recurrence import fla as fla_mod
from trtllm_dasc.model.recurrence import get_backend
from trtllm_dasc.model.recurrence import naive


@pytest.fixture
def gpu_machine(monkeypatch):
    """torch.cuda.is_available() True and fla importable; any Triton kernel launch (compiled or
    interpreted) raises."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fla_mod, "IMPORT_ERROR", None)
    launches = []

    def refuse(self, *a, **kw):
        launches.append(getattr(self, "__name__", repr(self)))
        raise AssertionError(f"a Triton launch on CPU tensors: {launches[-1]}")
    pytest.importorskip("triton")
    from triton.runtime import interpreter, jit
    monkeypatch.setattr(jit.JITFunction, "run", refuse)
    monkeypatch.setattr(interpreter.InterpretedFunction, "run", refuse)
    return launches


def test_recurrence_backend_follows_the_device(gpu_machine):
    assert get_backend("auto", "cpu") is naive
    assert get_backend("torch", "cpu") is naive
    for name in ("fla", "fla-unfused"):
        with pytest.raises(UserError, match="device is cpu"):
            get_backend(name, "cpu")
    # the same machine with a CUDA device takes fla (its import faked available here)
    assert get_backend("auto", "cuda") is fla_mod and get_backend("fla", "cuda:0") is fla_mod


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_cpu_model_and_checkpoints_launch_no_triton_kernel(tmp_path, arch, gpu_machine):
    from trtllm_dasc.model import HybridModel
    from trtllm_dasc.model.direct import DirectRunner
    from trtllm_dasc.state import CheckpointPool, StateLayout
    build(tmp_path, arch, seed=3)                     # the tiny models mix MoE layers in
    model = HybridModel.from_pretrained(str(tmp_path), device="cpu")
    assert model.backend is naive
    r = DirectRunner(model, rows=2, max_tokens=32, block_size=4)
    g = torch.Generator().manual_seed(3)
    for row, n in enumerate((9, 5)):
        r.run(torch.randint(0, 97, (n,), generator=g), row=row, logits="none")
    # a batched decode step (the paged kernel's case on a GPU) and a short chunk
    out = r.forward([r.seq(torch.tensor([4]), 0), r.seq(torch.tensor([7, 8]), 1)], "last").logits
    assert out.shape[0] == 2 and not out.isnan().any()
    # the checkpoint store / load (backend "auto") on the CPU state
    lay = StateLayout.from_retained([[0, 2], [1]], units_per_layer=3, unit_elements=8, value_dim=8, codec="int8",
                                    conv_dim=4, conv_width=3, conv_codec="int8")
    pool = CheckpointPool(lay, 4 * lay.slot_bytes())
    t, c = torch.randn(2, 2, 3, 1, 8), torch.randn(2, 2, 4, 3)
    pool.store(t, c, [1], [2])
    pool.load([2], torch.zeros_like(t), torch.zeros_like(c), [0])
    assert gpu_machine == []
