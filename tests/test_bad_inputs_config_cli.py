"""Hostile inputs (issue 9): every bad config.json field, checkpoint file and `dasc plan` / `dasc synth` flag
is one UserError line naming the field or file: never a traceback, never a silently different model.

Config rows go through both parsers' entry points (HybridConfig.from_dict and ModelSpec.from_config), file
rows through the model loader and the planner CLI, CLI rows through the real console entry in a subprocess.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trtllm_dasc.config import HybridConfig
from trtllm_dasc.errors import UserError
from trtllm_dasc.model.spec import ModelSpec

DATA = Path(__file__).resolve().parent / "data"


def _qwen() -> dict:
    return json.loads((DATA / "qwen3-next-80b-a3b.config.json").read_text())


def _kimi() -> dict:
    # the released config plus the router fields it needs for MoE layers (the reference omits them)
    raw = json.loads((DATA / "kimi-linear-48b-a3b.config.json").read_text())
    raw.update(num_experts=8, num_experts_per_token=2, routed_scaling_factor=2.446)
    return raw


BASES = {"qwen": _qwen, "kimi": _kimi}


def _set(**fields):
    return lambda raw: raw.update(fields)


def _del(name):
    return lambda raw: raw.pop(name)


def _lac(**fields):
    return lambda raw: raw["linear_attn_config"].update(fields)


# (id, base, mutation, words the one-line message must contain)
CONFIG_ROWS = [
    ("tie-string", "qwen", _set(tie_word_embeddings="false"), ["tie_word_embeddings", "'false'"]),
    ("norm-topk-string", "qwen", _set(norm_topk_prob="false"), ["norm_topk_prob", "'false'"]),
    ("eps-negative", "qwen", _set(rms_norm_eps=-1), ["rms_norm_eps", "-1"]),
    ("eps-string", "qwen", _set(rms_norm_eps="abc"), ["rms_norm_eps", "'abc'"]),
    ("eps-nan", "kimi", _set(rms_norm_eps=math.nan), ["rms_norm_eps", "nan"]),
    ("eps-inf", "qwen", _set(rms_norm_eps=math.inf), ["rms_norm_eps", "inf"]),
    ("eps-zero", "kimi", _set(rms_norm_eps=0), ["rms_norm_eps", "0"]),
    ("rope-string", "qwen", _set(rope_parameters="x"), ["rope_parameters", "'x'"]),
    ("rope-type", "qwen", _set(rope_parameters={"rope_type": "yarn"}), ["rope_type", "'yarn'"]),
    ("rotary-factor", "qwen", _set(partial_rotary_factor=1.5), ["partial_rotary_factor", "1.5"]),
    ("theta-inf", "qwen", _set(rope_theta=math.inf), ["rope_theta", "inf"]),
    ("mlp-only-int", "qwen", _set(mlp_only_layers=5), ["mlp_only_layers", "5"]),
    ("mlp-only-range", "qwen", _set(mlp_only_layers=[48]), ["mlp_only_layers", "48"]),
    ("interval-zero", "qwen", lambda r: (r.pop("layer_types"), r.update(full_attention_interval=0)),
     ["full_attention_interval", "0"]),
    ("mlp-type-unknown", "kimi", _set(mlp_layer_types=["dense"] * 26 + ["moe"]), ["mlp_layer_types", "'moe'"]),
    ("mlp-type-length", "kimi", _set(mlp_layer_types=["dense"] * 3), ["mlp_layer_types", "3 entries"]),
    ("layers-float", "qwen", _set(num_hidden_layers=1e9), ["num_hidden_layers", "1000000000.0"]),
    ("layers-huge", "kimi", _set(num_hidden_layers=10 ** 9), ["num_hidden_layers", "1000000000"]),
    ("heads-float", "qwen", _set(linear_num_key_heads=16.0), ["linear_num_key_heads", "16.0"]),
    ("heads-bool", "qwen", _set(linear_num_value_heads=True), ["linear_num_value_heads", "True"]),
    ("kernel-zero", "qwen", _set(linear_conv_kernel_dim=0), ["linear_conv_kernel_dim", "0"]),
    ("hidden-zero", "qwen", _set(hidden_size=0), ["hidden_size", "0"]),
    ("vocab-negative", "kimi", _set(vocab_size=-5), ["vocab_size", "-5"]),
    ("vocab-huge", "qwen", _set(vocab_size=2 ** 40), ["vocab_size", str(2 ** 40)]),
    ("layer-type-unknown", "qwen", lambda r: r["layer_types"].__setitem__(0, "sliding_attention"),
     ["layer_types", "'sliding_attention'"]),
    ("layer-types-length", "qwen", lambda r: r["layer_types"].pop(), ["layer_types", "47 entries"]),
    ("model-type-unknown", "qwen", _set(model_type="llama"), ["model_type", "'llama'", "qwen3_next"]),
    ("model-type-missing", "kimi", _del("model_type"), ["model_type", "kimi_linear"]),
    ("act-gelu", "qwen", _set(hidden_act="gelu"), ["hidden_act", "'gelu'"]),
    ("lac-string", "kimi", _set(linear_attn_config="x"), ["linear_attn_config", "'x'"]),
    ("kda-layers-zero-based", "kimi", _lac(kda_layers=[0, 1]), ["kda_layers", "1-indexed"]),
    ("kda-head-dim-disagree", "kimi", _set(linear_head_dim=64), ["head_dim", "linear_head_dim", "disagree"]),
    ("q-lora-zero", "kimi", _set(q_lora_rank=0), ["q_lora_rank", "0"]),
    ("mla-rope", "kimi", _set(mla_use_nope=False), ["mla_use_nope"]),
    ("top-k-aliases-disagree", "kimi", _set(num_experts_per_tok=3),
     ["num_experts_per_tok", "num_experts_per_token", "disagree"]),
    ("routed-scale-string", "kimi", _set(routed_scaling_factor="2"), ["routed_scaling_factor", "'2'"]),
    ("renormalize-string", "kimi", _set(moe_renormalize="true"), ["moe_renormalize", "'true'"]),
    ("top-k-above-experts", "kimi", _set(num_experts_per_token=9), ["experts per token", "9"]),
    ("kv-heads-not-divisor", "qwen", _set(num_key_value_heads=3), ["num_key_value_heads", "3"]),
    ("experts-float", "qwen", _set(num_experts=512.0), ["num_experts", "512.0"]),
    # every field in range, their product absurd (the planner would list 335M units)
    ("state-too-large", "kimi", _lac(num_heads=4096, head_dim=4096), ["too large", "num_hidden_layers"]),
]


def _assert_one_line(message: str, needles) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    for n in needles:
        assert n in message, f"{n!r} not in {message!r}"


@pytest.mark.parametrize("base,mutate,needles", [r[1:] for r in CONFIG_ROWS], ids=[r[0] for r in CONFIG_ROWS])
def test_bad_config_field(base, mutate, needles):
    good = BASES[base]()
    ModelSpec.from_config(HybridConfig.from_dict(good))          # the unmodified base parses completely
    bad = copy.deepcopy(good)
    mutate(bad)
    with pytest.raises(UserError) as e:
        HybridConfig.from_dict(bad)
    _assert_one_line(str(e.value), needles)
    # the runtime's path: ModelSpec parses raw through the registry when no schema came with the config
    cfg = HybridConfig.from_dict(good)
    cfg.raw, cfg.schema = bad, None
    with pytest.raises(UserError) as e:
        ModelSpec.from_config(cfg)
    _assert_one_line(str(e.value), needles)


def test_config_root_must_be_an_object():
    with pytest.raises(UserError, match="JSON object"):
        HybridConfig.from_dict([_qwen()])


# ---- checkpoint files ------------------------------------------------------------------------------
def dasc(*args):
    """The real console entry in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def assert_cli_error(result, command: str, needles) -> None:
    code, _, err = result
    assert code == 2, err
    assert err.startswith(f"dasc {command}: error:"), err
    _assert_one_line(err, needles)


@pytest.fixture(scope="session")
def tiny_kda(tmp_path_factory) -> Path:
    """A complete tiny kimi_linear model written by transformers (3 linear layers x 4 heads x 32)."""
    from trtllm_dasc.plan.synthetic import write_tiny_model
    return Path(write_tiny_model(str(tmp_path_factory.mktemp("tiny") / "kda"), "kda", seed=0))


def _data_start(path: Path) -> int:
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


def _shard(ck: Path) -> None:
    """Split model.safetensors into two shards + index, as save_pretrained does for big models."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(ck / "model.safetensors"))
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        file = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, str(ck / file))
        weight_map.update(dict.fromkeys(part, file))
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _truncate(ck):
    data = (ck / "model.safetensors").read_bytes()
    (ck / "model.safetensors").write_bytes(data[:len(data) // 2])


def _random_bytes(ck):
    (ck / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))


def _pickle(ck):
    import pickle
    (ck / "model.safetensors").write_bytes(pickle.dumps({"model.norm.weight": [1.0] * 64}))


def _noise_in_data(ck):
    """100 kB of random bytes inside the data part of a valid file: some fp32 words become NaN/Inf."""
    path = ck / "model.safetensors"
    data = bytearray(path.read_bytes())
    start = _data_start(path) + 1000
    data[start:start + 100_000] = np.random.default_rng(1).bytes(100_000)
    path.write_bytes(bytes(data))


def _nan_a_log(ck):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(ck / "model.safetensors"))
    tensors["model.layers.1.self_attn.A_log"][..., 2, :] = np.nan
    save_file(tensors, str(ck / "model.safetensors"), metadata={"format": "pt"})


def _snan_a_log(ck):
    """A signalling NaN's bits (numpy's cast to float64 warned about it, two lines before the error)."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(ck / "model.safetensors"))
    a = tensors["model.layers.1.self_attn.A_log"]
    assert a.dtype == np.float32
    a.view(np.uint32)[..., 2, :] = 0x7FA00000
    save_file(tensors, str(ck / "model.safetensors"), metadata={"format": "pt"})


def _grow_header_tensor(ck):
    """Edit one header entry so the tensor claims more bytes than the file holds."""
    path = ck / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    begin, end = header[last]["data_offsets"]
    header[last].update(shape=[(end - begin)], dtype="F64", data_offsets=[begin, begin + 8 * (end - begin)])
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def _index(doc):
    def mutate(ck):
        _shard(ck)
        (ck / "model.safetensors.index.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return mutate


def _missing_shard(ck):
    _shard(ck)
    (ck / "model-00002-of-00002.safetensors").unlink()


def _config_bytes(data: bytes):
    return lambda ck: (ck / "config.json").write_bytes(data)


# (id, corruption, words of the message, whether `dasc plan --wmax 16` must fail too)
FILE_ROWS = [
    ("truncated", _truncate, ["model.safetensors", "truncated"], True),
    ("empty", lambda ck: (ck / "model.safetensors").write_bytes(b""), ["model.safetensors", "0 bytes"], True),
    ("random-bytes", _random_bytes, ["model.safetensors", "not a readable safetensors"], True),
    ("pickle-renamed", _pickle, ["model.safetensors", "not a readable safetensors"], True),
    ("header-overruns-file", _grow_header_tensor, ["model.safetensors", "truncated"], True),
    ("nan-in-data", _noise_in_data, ["holds NaN or Inf"], False),
    ("nan-a-log", _nan_a_log, ["model.layers.1.self_attn.A_log", "NaN or Inf"], True),
    ("snan-a-log", _snan_a_log, ["model.layers.1.self_attn.A_log", "NaN or Inf"], True),
    ("index-weight-map-list", _index({"weight_map": [["a", "b"]]}), ["model.safetensors.index.json", "weight_map"],
     True),
    ("index-not-object", _index([1, 2]), ["model.safetensors.index.json", "weight_map"], True),
    ("index-not-json", _index("{weight_map:"), ["model.safetensors.index.json", "not valid JSON"], True),
    ("index-path-escape", _index({"weight_map": {"model.norm.weight": "../x.safetensors"}}),
     ["model.safetensors.index.json", "../x.safetensors"], True),
    ("missing-shard", _missing_shard, ["model-00002-of-00002.safetensors", "missing"], True),
    ("config-not-utf8", _config_bytes(b'{"model_type": "kimi_linear\xff\xfe"}'), ["config.json", "UTF-8"], True),
    ("config-not-json", _config_bytes(b"model_type: kimi_linear"), ["config.json", "not valid JSON"], True),
    ("config-list", _config_bytes(b"[1, 2, 3]"), ["config.json", "JSON object"], True),
    ("config-deep", _config_bytes(b"[" * 100_000 + b"]" * 100_000), ["config.json", "nests"], True),
]


@pytest.mark.parametrize("corrupt,needles,cli", [r[1:] for r in FILE_ROWS], ids=[r[0] for r in FILE_ROWS])
def test_bad_checkpoint_file(tiny_kda, tmp_path, corrupt, needles, cli):
    from trtllm_dasc.model import HybridModel
    ck = tmp_path / "ck"
    shutil.copytree(tiny_kda, ck)
    corrupt(ck)
    with pytest.raises(UserError) as e:
        HybridModel.from_pretrained(str(ck))
    _assert_one_line(str(e.value), needles)
    if cli:
        assert_cli_error(dasc("plan", "--model", ck, "--wmax", "16"), "plan", needles)


# ---- dasc plan / dasc synth flags ---------------------------------------------------------------------
CLI_ROWS = [
    ("a-nan", ["plan", "--model", "{kda}", "--wmax", "16", "--a", "nan", "--json"], ["--a", "nan"]),
    ("a-inf", ["plan", "--model", "{kda}", "--wmax", "16", "--a", "inf"], ["--a", "inf"]),
    ("eps-nan", ["plan", "--model", "{kda}", "--wmax", "16", "--eps", "nan", "--json"], ["--eps", "nan"]),
    ("eps-inf", ["plan", "--model", "{kda}", "--wmax", "16", "--eps", "inf"], ["--eps", "inf"]),
    ("eps-one", ["plan", "--model", "{kda}", "--wmax", "16", "--eps", "1"], ["--eps", "1.0"]),
    # issue 29: every numeric option of dasc plan range-checked (--a 5 printed an infinite compression)
    ("a-five", ["plan", "--model", "{kda}", "--wmax", "16", "--a", "5"], ["--a", "[-3, 3]", "5.0"]),
    ("a-minus-fifty", ["plan", "--model", "{kda}", "--wmax", "16", "--a", "-50", "--json"], ["--a", "-50.0"]),
    ("eps-subnormal", ["plan", "--model", "{kda}", "--wmax", "16", "--eps", "1e-320"], ["--eps", "1e-320"]),
    ("eps-large", ["plan", "--model", "{kda}", "--wmax", "16", "--eps", "0.9"], ["--eps", "0.5]", "0.9"]),
    ("wmax-huge", ["plan", "--model", "{kda}", "--wmax", str(10**23)], ["--wmax", "at most", str(10**23)]),
    ("wmax-list-negative", ["plan", "--model", "{kda}", "--wmax", "16,-1"], ["--wmax", "-1"]),
    ("budget-huge", ["plan", "--model", "{kda}", "--wmax", "0", "--budget-bytes", str(2**63)],
     ["budget", "2^63", str(2**63)]),
    ("mask-seed-huge", ["plan", "--model", "{kda}", "--selection", "random", "--mask-seed", str(2**64)],
     ["--mask-seed", str(2**64)]),
    ("tp-huge", ["plan", "--model", "{kda}", "--wmax", "0", "--tp", "1000000"], ["TP degree 1000000"]),
    ("plot-missing-dir", ["plan", "--model", "{kda}", "--wmax", "16", "--plot", "{tmp}/no/such/dir/p.png"],
     ["--plot", "no/such/dir", "does not exist"]),
    ("plot-empty", ["plan", "--model", "{kda}", "--wmax", "16", "--plot", ""], ["--plot", "empty"]),
    ("plot-unwritable", ["plan", "--model", "{kda}", "--wmax", "16", "--plot", "/proc/p.png"],
     ["--plot", "/proc/p.png"]),
    ("plot-format", ["plan", "--model", "{kda}", "--wmax", "16", "--plot", "{tmp}/p.nosuchformat"],
     ["--plot", "p.nosuchformat", "'nosuchformat'"]),
    ("plot-is-dir", ["plan", "--model", "{kda}", "--wmax", "16", "--plot", "{tmp}"], ["--plot", "directory"]),
    ("budget-text", ["plan", "--model", "{kda}", "--wmax", "0", "--budget-bytes", "lots"],
     ["--budget-bytes", "'lots'"]),
    ("budget-negative", ["plan", "--model", "{kda}", "--wmax", "0", "--budget-bytes", "-5"], ["budget", "-5"]),
    ("tp-zero", ["plan", "--model", "{kda}", "--wmax", "0", "--tp", "0"], ["--tp", "0"]),
    ("wmax-float", ["plan", "--model", "{kda}", "--wmax", "1.5"], ["--wmax", "'1.5'"]),
    ("model-missing", ["plan", "--model", "{tmp}/nope", "--wmax", "0"], ["no config.json", "nope"]),
    ("placement-unknown", ["plan", "--model", "{kda}", "--placement", "best"], ["--placement", "'best'"]),
    ("synth-out-unwritable", ["synth", "--arch", "kda", "--out", "/proc/dasc-synth"], ["--out", "/proc/dasc-synth"]),
    ("synth-out-is-file", ["synth", "--arch", "kda", "--out", "{kda}/config.json"], ["--out", "not a directory"]),
    ("synth-seed-negative", ["synth", "--arch", "gdn", "--out", "{tmp}/s", "--seed", "-1"], ["--seed", "-1"]),
    ("synth-shards-zero", ["synth", "--arch", "gdn", "--out", "{tmp}/s", "--shards", "0"], ["--shards", "0"]),
    ("synth-arch-unknown", ["synth", "--arch", "rwkv", "--out", "{tmp}/s"], ["--arch", "'rwkv'"]),
]


@pytest.mark.parametrize("argv,needles", [r[1:] for r in CLI_ROWS], ids=[r[0] for r in CLI_ROWS])
def test_bad_cli_input(tiny_kda, tmp_path, argv, needles):
    args = [a.format(kda=tiny_kda, tmp=tmp_path) for a in argv]
    assert_cli_error(dasc(*args), args[0], [n.format(kda=tiny_kda, tmp=tmp_path) for n in needles])


def test_plan_range_edges_are_accepted(tiny_kda):
    """The ends of every range are valid plans (the checks refuse only what lies outside)."""
    for flags in (["--a", "3", "--eps", "0.5"], ["--a", "-3", "--eps", "1e-12"], ["--wmax", str(2**31 - 1)],
                  ["--budget-bytes", str(2**63 - 1)], ["--selection", "random", "--mask-seed", str(2**63 - 1)]):
        code, out, err = dasc("plan", "--model", tiny_kda, *flags, "--json")
        assert code == 0, (flags, err)
        assert json.loads(out)["units_per_layer"]


def test_synth_refuses_to_overwrite_a_model(tiny_kda, tmp_path):
    ck = tmp_path / "model"
    shutil.copytree(tiny_kda, ck)
    before = {p.name: p.read_bytes() for p in ck.iterdir()}
    assert_cli_error(dasc("synth", "--arch", "gdn", "--out", ck), "synth", ["--out", str(ck), "--force"])
    assert {p.name: p.read_bytes() for p in ck.iterdir()} == before
    # --force replaces it, leaving no weights of the old model behind
    code, _, err = dasc("synth", "--arch", "gdn", "--out", ck, "--force", "--shards", "2")
    assert code == 0, err
    assert not (ck / "model.safetensors").exists()
    assert HybridConfig.from_path(str(ck)).model_type == "qwen3_next"


def test_budget_message_quotes_the_asked_plans_slot(tiny_kda):
    # W=16 keeps 36% of this model: its slot is 24,832 B against 56,064 B dense
    assert_cli_error(dasc("plan", "--model", tiny_kda, "--wmax", "16", "--budget-bytes", "40000"), "plan",
                     ["holds no deployable slot", "W_max=16", "24832", "49664"])
    code, out, err = dasc("plan", "--model", tiny_kda, "--wmax", "16", "--budget-bytes", "80000", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert (r["bottleneck_slot_bytes"], r["dense_slot_bytes_per_rank"]) == (24_832, 56_064)
    assert (r["slots"], r["dense_slots"], r["capacity_ratio"]) == (2, 0, None)
