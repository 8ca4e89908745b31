import pytest
import torch

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError
from state_helpers import KIMI, QWEN
from trtllm_dasc.state import LayoutError, StateLayout


def test_ragged_and_padded_positions():
    ret = [[0, 2], [], [1, 3, 4]]
    rag = StateLayout.from_retained(ret, units_per_layer=5, unit_elements=8, value_dim=4)
    assert rag.offsets.tolist() == [0, 2, 2, 5] and rag.width == 5 and rag.slot_pos.tolist() == [0, 1, 2, 3, 4]
    assert rag.retained_counts == [2, 0, 3] and rag.rows_per_unit == 2 and rag.num_omitted == 10
    pad = StateLayout.from_retained(ret, units_per_layer=5, unit_elements=8, value_dim=4, layout="padded")
    # R_max = 3 positions per layer: layer 0 at 0.., layer 2 at 6..
    assert pad.width == 9 and pad.slot_pos.tolist() == [0, 1, 6, 7, 8]
    ix = pad.index("cpu")
    assert ix.pos_of_unit.view(3, 5).tolist() == [[0, -1, 1, -1, -1], [-1] * 5, [-1, 6, -1, 7, 8]]
    assert list(zip(ix.omit_layer.tolist(), ix.omit_local.tolist()))[:4] == [(0, 1), (0, 3), (0, 4), (1, 0)]
    wide = StateLayout.from_retained(ret, units_per_layer=5, unit_elements=8, value_dim=4, layout="padded", width=12)
    assert wide.slot_pos.tolist() == [0, 1, 8, 9, 10]


@pytest.mark.parametrize("bad, match", [
    (dict(width=4), "smaller than"),
    (dict(codec="fp6"), "codec"),
    (dict(codec="int4", unit_elements=6, value_dim=3), "even"),
    (dict(layout="paged"), "layout"),
    (dict(value_dim=3), "multiple"),
    (dict(conv_dim=4), "conv shape"),
])
def test_layout_rejects(bad, match):
    kw = dict(units_per_layer=5, unit_elements=8, value_dim=4) | bad
    with pytest.raises(LayoutError, match=match):
        StateLayout.from_retained([[0, 2], [1, 3, 4]], **kw)


def test_float16_cannot_hold_scaled_codec_scales():
    """Why float16 is refused for a scaled codec's scales: Eq. 10's scale of a row whose largest value is
    1e7 (brute force, numpy) overflows float16 and the row would load as inf and NaN (0 * inf); one of a row
    at 1e-6 rounds to zero. bfloat16 (fp32's exponent range) holds both."""
    import numpy as np
    from trtllm_dasc.state import codec_ops, ops
    big, small = np.float32(1e7) / np.float32(127), np.float32(1e-6) / np.float32(127)
    assert np.isinf(np.float16(big)) and np.float16(small) == 0
    assert np.isfinite(float(torch.tensor(big).to(torch.bfloat16))) and float(torch.tensor(small).to(torch.bfloat16)) > 0
    for codec in ("int8", "fp8", "int4"):
        with pytest.raises(LayoutError, match="float16"):
            StateLayout.from_retained([[0, 2], [1]], units_per_layer=5, unit_elements=8, value_dim=4, codec=codec,
                                      temporal_dtype=torch.float16)
        StateLayout.from_retained([[0, 2], [1]], units_per_layer=5, unit_elements=8, value_dim=4, codec=codec,
                                  temporal_dtype=torch.bfloat16)
    StateLayout.from_retained([[0, 2], [1]], units_per_layer=5, unit_elements=8, value_dim=4,
                              temporal_dtype=torch.float16)      # native: no scales
    rows = torch.ones(2, 4)
    with pytest.raises(ValueError, match="float16"):
        ops.quantize_int8(rows, torch.float16, backend="naive")
    with pytest.raises(ValueError, match="float16"):
        codec_ops.quantize(rows, "fp8", torch.float16)


def test_layout_rejects_unsorted_and_bad_offsets():
    with pytest.raises(UserError, match="sorted"):
        StateLayout.from_retained([[2, 0]], units_per_layer=5, unit_elements=4, value_dim=4)
    with pytest.raises(UserError, match="outside"):
        StateLayout.from_retained([[5]], units_per_layer=5, unit_elements=4, value_dim=4)
    with pytest.raises(UserError, match="offsets"):
        StateLayout(num_layers=2, units_per_layer=3, unit_elements=4, value_dim=4, layer_of_unit=[0, 1],
                    unit_in_layer=[0, 0], offsets=[0, 2, 2], width=2)


@pytest.mark.parametrize("raw, dense", [(KIMI, 5_427_200), (QWEN, 9_658_368)], ids=["kimi48b", "qwen80b"])
def test_bytes_match_config_to_the_byte(raw, dense):
    cfg = HybridConfig.from_dict(raw)
    tp = 8
    lay = StateLayout.from_config(cfg, tp)
    assert lay.slot_bytes() == dense == cfg.dense_checkpoint_bytes_per_rank(tp)
    assert lay.conv_bytes_per_slot() == cfg.conv_bytes_per_rank(tp)
    n = cfg.shard(tp).units
    ret = [[u for u in range(n) if (u * 7 + l) % 5 < 2] for l in range(cfg.num_linear_layers)]
    for codec in ("native", "int8"):
        for kind in ("ragged", "padded"):
            lay = StateLayout.from_config(cfg, tp, ret, codec=codec, layout=kind)
            assert lay.unit_bytes() == cfg.unit_bytes(codec)
            assert lay.slot_bytes() == lay.width * cfg.unit_bytes(codec) + cfg.conv_bytes_per_rank(tp)
            assert (lay.payload_bytes_per_slot() + lay.scale_bytes_per_slot() + lay.conv_bytes_per_slot()
                    == lay.slot_bytes())


def test_index_cached_per_device():
    lay = StateLayout.from_retained([[0], [1]], units_per_layer=2, unit_elements=4, value_dim=4)
    assert lay.index("cpu") is lay.index(torch.device("cpu"))
    assert lay.index("cpu").unit_layer.dtype == torch.int64
