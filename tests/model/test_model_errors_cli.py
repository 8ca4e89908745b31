"""Bad checkpoints and bad input give one clear UserError; `dasc logits` writes what transformers computes."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from hybrid_tiny import assert_logits_close, hf_logits
from safetensors.torch import load_file, save_file

from trtllm_dasc.cli import main
from trtllm_dasc.errors import UserError
from trtllm_dasc.model import HybridModel


def _copy(src, tmp_path, name="ckpt"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_missing_shard(tiny, tmp_path):
    path = _copy(tiny("kda", "sharded")[0], tmp_path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    os.remove(path / victim)
    with pytest.raises(UserError, match=f"missing shard file.*{victim}"):
        HybridModel.from_pretrained(str(path))


def test_shape_mismatch(tiny, tmp_path):
    path = _copy(tiny("gdn")[0], tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.0.linear_attn.A_log"
    tensors[name] = torch.zeros(5)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"A_log.*shape \[5\].*\[6\]"):
        HybridModel.from_pretrained(str(path))


def test_missing_tensor(tiny, tmp_path):
    path = _copy(tiny("kda")[0], tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_conv1d.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="lacks tensor 'model.layers.1.self_attn.k_conv1d.weight'"):
        HybridModel.from_pretrained(str(path))


def test_unsupported_model_type(tiny, tmp_path):
    path = _copy(tiny("gdn")[0], tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "llama"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="unsupported model_type 'llama'"):
        HybridModel.from_pretrained(str(path))


def test_no_weights(tiny, tmp_path):
    path = _copy(tiny("gdn")[0], tmp_path)
    os.remove(path / "model.safetensors")
    with pytest.raises(UserError, match="no model.safetensors"):
        HybridModel.from_pretrained(str(path))


def test_bad_bundle_order(tiny):
    path = tiny("kda")[0]
    with pytest.raises(UserError, match="permutation"):
        HybridModel.from_pretrained(path, bundle_order=[[0, 0, 1]] * 3)
    with pytest.raises(UserError, match="does not divide"):
        HybridModel.from_pretrained(path, tp_size=2)


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_cli_logits_and_split(tiny, tmp_path, arch, capsys):
    path, hf = tiny(arch)
    ids = [3, 50, 7, 7, 90, 1, 0, 12, 33, 64, 21]
    text = ",".join(map(str, ids))
    assert main(["logits", "--model", path, "--ids", text, "--out", str(tmp_path / "a.npy")]) == 0
    assert main(["logits", "--model", path, "--ids", text, "--out", str(tmp_path / "b.npy"), "--split", "4",
                 "--block-size", "2"]) == 0
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.dtype == np.float32 and a.shape == (len(ids), 97)
    assert_logits_close(torch.from_numpy(a), hf_logits(hf, ids))
    assert_logits_close(torch.from_numpy(b), torch.from_numpy(a), rel=1e-5)
    assert main(["logits", "--model", path, "--ids", text, "--out", str(tmp_path / "c.npy"), "--dtype",
                 "bfloat16", "--split", "5"]) == 0
    assert_logits_close(torch.from_numpy(np.load(tmp_path / "c.npy")), torch.from_numpy(a), rel=0.1)


@pytest.mark.parametrize("argv, message", [
    (["--ids", "1,x"], "--ids must be comma-separated integers"),
    (["--ids", ""], "--ids is empty"),
    (["--ids", "1,2,3", "--split", "3"], "--split must be in 1..2"),
    (["--ids", "1,2,500"], "outside the vocabulary"),
    (["--ids", "1,2", "--out", "/nonexistent-dir/x.npy"], "does not exist"),
])
def test_cli_bad_input(tiny, tmp_path, capsys, argv, message):
    args = ["logits", "--model", tiny("gdn")[0], "--out", str(tmp_path / "x.npy"), *argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("dasc logits: error:")


def test_cli_bad_model_dir(tmp_path, capsys):
    assert main(["logits", "--model", str(tmp_path), "--ids", "1", "--out", str(tmp_path / "x.npy")]) == 2
    assert "no config.json" in capsys.readouterr().err
