"""dasc-build --tensorrt refuses, in one line, every codec the codec graphs do not implement (plugins/codec.py:
temporal native or int8, one codec for every unit, conv state native; a graph for another would store raw
floats under its name), before it looks for TensorRT: the refusal is the same on a machine without it."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from build_scripts import dasc_build
from plugins.codec import codec_graphs
from trtllm_dasc.state.layout import StateLayout

TINY = "trtllm_dasc/assets/tiny-kimi-linear"
BAD = [(["--codec", "int4"], "--codec int4"), (["--codec", "fp8"], "--codec fp8"),
       (["--conv-codec", "int8"], "--conv-codec int8"),
       (["--precision", "horizon"], "--precision horizon:128,1024:int4,int8,int8"),
       # all-native bands are still mixed segments, which the graphs do not lay out
       (["--precision", "horizon:64:native,native"], "--precision horizon:64:native,native")]


def _argv(tmp_path, flags):
    return ["--model", TINY, "--output", str(tmp_path / "e"), "--device", "cpu", "--dtype", "float32", "--tensorrt",
            *flags]


@pytest.mark.parametrize("flags, named", BAD, ids=[b[1].split()[-1] for b in BAD])
def test_a_codec_the_graphs_lack_is_one_line_without_tensorrt(tmp_path, monkeypatch, capsys, flags, named):
    import plugins.trt_network as trt_network

    def no_tensorrt(prefer=None):
        raise ImportError("no TensorRT Python module is importable (test)")
    monkeypatch.setattr(trt_network, "load_tensorrt", no_tensorrt)
    assert dasc_build.main(_argv(tmp_path, flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dasc-build: error: --tensorrt builds codec engines for"), err
    assert named in err[0] and "no TensorRT" not in err[0]
    assert not (tmp_path / "e").exists()


def test_the_console_command_says_it_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "build_scripts.dasc_build",
                           *_argv(tmp_path, ["--codec", "int4", "--conv-codec", "int8"])],
                          capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "--codec int4" in err[0] and "--conv-codec int8" in err[0]
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("codec, conv", [("int4", "native"), ("fp8", "native"), ("native", "int8")])
def test_the_graphs_refuse_a_layout_of_another_codec(codec, conv):
    lay = StateLayout.from_retained([[0, 2], [1]], units_per_layer=4, unit_elements=8, value_dim=4, codec=codec,
                                    conv_dim=3, conv_width=2, temporal_dtype=torch.float32,
                                    conv_dtype=torch.float32, conv_codec=conv)
    with pytest.raises(ValueError, match="codec graphs implement"):
        codec_graphs(lay, "nr", 2, 4)
