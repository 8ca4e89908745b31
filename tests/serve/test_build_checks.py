"""dasc-build refuses a checkpoint the engine would fail on or serve wrong, before writing anything: each
defect of issue 29 (a NaN weight, an Inf LM head, a missing tensor, a wrongly shaped q_proj or embedding, a
config vocabulary that disagrees with the weights, an int8 k_proj) in a tiny transformers checkpoint is
one error line naming the tensor, exit code 2, and no file beside the checkpoint."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from build_scripts import dasc_build
from build_scripts.checkpoint_check import needed_tensors
from serve_helpers import VOCAB, build
from trtllm_dasc.checkpoint_files import SafetensorsCheckpoint

WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny qwen3_next checkpoint (float32) and the same saved in bfloat16, written by transformers."""
    root = tmp_path_factory.mktemp("ckpts")
    model = build(root / "gdn", "gdn", seed=3)
    model.to(torch.bfloat16).save_pretrained(str(root / "gdn-bf16"))
    return root


def _copy(tiny, tmp_path, name="gdn"):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny / name, dst)
    return dst


def _edit(ckpt, fn):
    tensors = load_file(str(ckpt / WEIGHTS))
    fn(tensors)
    save_file(tensors, str(ckpt / WEIGHTS), metadata={"format": "pt"})


def _build(ckpt, tmp_path, capfd, *flags) -> tuple[int, str]:
    rc = dasc_build.main(["--model", str(ckpt), "--output", str(tmp_path / "engine"), "--device", "cpu", *flags])
    return rc, capfd.readouterr().err


def _assert_refused(rc, err, tmp_path, *needles):
    errors = [line for line in err.splitlines() if "error" in line]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert all(n in errors[0] for n in needles), errors[0]
    # nothing written: no engine, no temporary sibling, no lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _poison(name, value, index=(0, 0)):
    def fn(t):
        t[name][index] = value
    return fn


LM_HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"
Q_PROJ, K_PROJ = "model.layers.1.self_attn.q_proj.weight", "model.layers.4.self_attn.k_proj.weight"
IN_PROJ = "model.layers.2.linear_attn.in_proj_qkvz.weight"
EXPERT = "model.layers.3.mlp.experts.4.down_proj.weight"
NORM = "model.layers.3.post_attention_layernorm.weight"


@pytest.mark.parametrize("stored", ["gdn", "gdn-bf16"], ids=["f32", "bf16"])
@pytest.mark.parametrize("edit,tensor,needle", [
    (_poison(IN_PROJ, float("nan"), (5, 7)), IN_PROJ, "NaN or Inf"),
    (_poison(EXPERT, float("nan"), (47, 23)), EXPERT, "NaN or Inf"),
    (_poison(LM_HEAD, float("inf"), (96, 47)), LM_HEAD, "NaN or Inf"),
    (_poison(NORM, float("-inf"), (0,)), NORM, "NaN or Inf"),
], ids=["nan-linear-attn", "nan-expert", "inf-lm-head", "inf-norm"])
def test_non_finite_weight_is_refused(tiny, tmp_path, capfd, stored, edit, tensor, needle):
    ckpt = _copy(tiny, tmp_path, stored)
    _edit(ckpt, edit)
    rc, err = _build(ckpt, tmp_path, capfd)
    _assert_refused(rc, err, tmp_path, repr(tensor), needle)


def _drop(name):
    def fn(t):
        del t[name]
    return fn


def _resize(name, rows):
    def fn(t):
        t[name] = t[name][:rows].clone()
    return fn


def _int8(name):
    def fn(t):
        t[name] = (t[name] * 100).round().to(torch.int8)
    return fn


@pytest.mark.parametrize("edit,tensor,needles", [
    (_drop(NORM), NORM, ["missing"]),
    (_drop(LM_HEAD), LM_HEAD, ["missing"]),
    (_resize(Q_PROJ, -1), Q_PROJ, ["shape [143, 48]", "[144, 48]"]),
    (_resize(EMBED, VOCAB - 1), EMBED, [f"{VOCAB - 1} rows", f"vocab_size {VOCAB}"]),
    (_int8(K_PROJ), K_PROJ, ["I8", "not a float"]),
], ids=["missing-norm", "missing-lm-head", "q-proj-shape", "embed-rows", "int8-k-proj"])
def test_malformed_checkpoint_is_refused(tiny, tmp_path, capfd, edit, tensor, needles):
    ckpt = _copy(tiny, tmp_path)
    _edit(ckpt, edit)
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    _assert_refused(rc, err, tmp_path, repr(tensor), *needles)


def test_config_vocabulary_disagreeing_with_the_weights_is_refused(tiny, tmp_path, capfd):
    ckpt = _copy(tiny, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["vocab_size"] = VOCAB + 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, err = _build(ckpt, tmp_path, capfd)
    _assert_refused(rc, err, tmp_path, repr(EMBED), f"{VOCAB} rows", f"vocab_size {VOCAB + 3}")


def test_tokenizer_larger_than_the_vocabulary_is_refused(tiny, tmp_path, capfd):
    ckpt = _copy(tiny, tmp_path)
    tok = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
           "added_tokens": [{"id": VOCAB, "content": "<extra>", "special": True}]}
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    rc, err = _build(ckpt, tmp_path, capfd)
    _assert_refused(rc, err, tmp_path, "tokenizer.json", f"token id {VOCAB}", f"vocab_size {VOCAB}")


def test_value_the_load_dtype_overflows_is_refused_only_for_that_dtype(tiny, tmp_path, capfd):
    ckpt = _copy(tiny, tmp_path)
    # float16 holds at most 65504; bfloat16 and float32 hold 1e5
    _edit(ckpt, _poison(Q_PROJ, 1e5, (3, 3)))
    rc, err = _build(ckpt, tmp_path, capfd, "--dtype", "float16")
    _assert_refused(rc, err, tmp_path, repr(Q_PROJ), "1e+05")
    rc, err = _build(ckpt, tmp_path, capfd, "--dtype", "bfloat16")
    assert rc == 0, err


def test_skip_finite_check_is_recorded_and_a_clean_build_records_the_check(tiny, tmp_path, capfd):
    ckpt = _copy(tiny, tmp_path)
    rc, err = _build(ckpt, tmp_path, capfd)
    assert rc == 0, err
    meta = json.loads((tmp_path / "engine" / "config.json").read_text())["checkpoint_check"]
    assert meta["finite_checked"] is True and meta["tensors"] == len(load_file(str(ckpt / WEIGHTS)))
    _edit(ckpt, _poison(IN_PROJ, float("nan")))
    rc, err = _build(ckpt, tmp_path, capfd, "--force", "--skip-finite-check")
    assert rc == 0, err
    assert json.loads((tmp_path / "engine" / "config.json").read_text())["checkpoint_check"]["finite_checked"] is False


@pytest.mark.parametrize("arch", ["gdn", "kda"])
def test_needed_tensors_are_what_transformers_saves(tmp_path, arch):
    """The loaders' requests (meta device) list every tensor transformers writes, at its saved shape."""
    build(tmp_path, arch, seed=1)
    saved = {k: tuple(v.shape) for k, v in load_file(str(tmp_path / WEIGHTS)).items()}
    needed = needed_tensors(str(tmp_path), SafetensorsCheckpoint(str(tmp_path)), "bfloat16")
    assert {n.name: n.shape for n in needed} == saved
    # the decay parameters are loaded in float32 whatever the engine's dtype; projections in the engine's
    fp32 = {n.name for n in needed if n.load_dtype == "float32"}
    assert {k for k in saved if k.endswith(("A_log", "dt_bias"))} <= fp32
    assert not any(k.endswith("_proj.weight") for k in fp32)


def test_values_are_streamed_in_chunks_with_progress_lines(tiny, tmp_path, monkeypatch, capsys):
    """A NaN far inside a tensor read in many small chunks is still found; a large checkpoint gets
    progress lines ending at 100%."""
    from build_scripts import checkpoint_check
    monkeypatch.setattr(checkpoint_check, "CHUNK_BYTES", 256)
    monkeypatch.setattr(checkpoint_check, "PROGRESS_MIN_BYTES", 0)
    ckpt = _copy(tiny, tmp_path)
    report = checkpoint_check.check_checkpoint(str(ckpt), "bfloat16")
    lines = [line for line in capsys.readouterr().err.splitlines() if "finite check" in line]
    assert report["finite_checked"] and lines and "(100%" in lines[-1]
    # the last element of the embedding: its chunk is the tensor's last of many
    _edit(ckpt, _poison(EMBED, float("nan"), (VOCAB - 1, 47)))
    with pytest.raises(checkpoint_check.CheckpointCheckError, match="model.embed_tokens.weight.*NaN"):
        checkpoint_check.check_checkpoint(str(ckpt), "bfloat16")


def _add(name, like):
    def fn(t):
        t[name] = t[like].clone()
    return fn


@pytest.mark.parametrize("edit,needle", [
    (_add("lm_head.bias", NORM), "'lm_head.bias'"),
    (_add("model.layers.9.post_attention_layernorm.weight", NORM), "'model.layers.9.post_attention_layernorm.weight'"),
], ids=["extra-bias", "extra-layer"])
def test_a_tensor_nothing_loads_is_refused_unless_allowed(tiny, tmp_path, capfd, edit, needle):
    """A tensor no loader asks for (the weights of a layer config.json does not count, an extra bias) built an
    engine that served another model than the checkpoint, without a word. Refused in one line naming it;
    --allow-unused-tensors builds and records the count; an MTP head (Qwen3-Next's released mtp.*) passes.
    From a review helper; fails on the old code."""
    ckpt = _copy(tiny, tmp_path)
    _edit(ckpt, edit)
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    _assert_refused(rc, err, tmp_path, needle, "1 tensor(s)", "--allow-unused-tensors")
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check", "--allow-unused-tensors")
    assert rc == 0 and "1 tensor(s) nothing loads" in err, err
    meta = json.loads((tmp_path / "engine" / "config.json").read_text())["checkpoint_check"]
    assert meta["unused_tensors"] == 1
    shutil.rmtree(tmp_path / "engine")
    _edit(ckpt, lambda t: t.pop(needle.strip("'")))
    _edit(ckpt, _add("mtp.fc.weight", NORM))
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    assert rc == 0, err


def test_fewer_layers_in_config_than_in_the_weights_is_refused(tiny, tmp_path, capfd):
    """The review helper's case: config.json cut to one layer less than the checkpoint holds."""
    ckpt = _copy(tiny, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    cfg["num_hidden_layers"] = n - 1
    for key in ("layer_types", "mlp_only_layers"):
        if isinstance(cfg.get(key), list) and len(cfg[key]) == n:
            cfg[key] = cfg[key][:n - 1]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    _assert_refused(rc, err, tmp_path, f"'model.layers.{n - 1}.", "no part of this model loads")


def test_the_engine_keeps_its_config_and_refuses_an_edited_one(tiny, tmp_path, capfd):
    """config.json was hard-linked into the engine: editing the source checkpoint's config in place after the
    build changed the engine's model (top-k, eps), and any edit of model/config.json was served without a
    word. Now the engine holds its own copy, and a config.json that differs from the one it was built from
    is refused in one line naming the field. From a review helper; fails on the old code."""
    from trtllm_dasc.engine.config import engine_config
    from trtllm_dasc.errors import UserError
    ckpt = _copy(tiny, tmp_path)
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    assert rc == 0, err
    with open(ckpt / "config.json", "r+") as f:          # in place, the same inode
        cfg = json.load(f)
        cfg["rms_norm_eps"] = 0.5
        f.seek(0), f.truncate(), f.write(json.dumps(cfg))
    engine = tmp_path / "engine"
    assert json.loads((engine / "model" / "config.json").read_text())["rms_norm_eps"] != 0.5
    assert engine_config(str(engine)).model == str(engine / "model")
    (engine / "model" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="rms_norm_eps.*rebuild") as e:
        engine_config(str(engine))
    assert "\n" not in str(e.value)


def test_shards_the_index_names_are_copied_whatever_their_name(tiny, tmp_path, capfd):
    """An index naming a shard "part-a.bin": the build passed its checks and wrote an engine without that file,
    which then failed to load. From a review helper; fails on the old code."""
    from trtllm_dasc.checkpoint_files import SafetensorsCheckpoint as Files
    ckpt = _copy(tiny, tmp_path)
    tensors = load_file(str(ckpt / WEIGHTS))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(ckpt / "part-a.bin"), metadata={"format": "pt"})
    save_file({k: tensors[k] for k in names[half:]}, str(ckpt / "model-2.safetensors"), metadata={"format": "pt"})
    (ckpt / WEIGHTS).unlink()
    index = {"metadata": {}, "weight_map": {k: "part-a.bin" if i < half else "model-2.safetensors"
                                            for i, k in enumerate(names)}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    assert rc == 0, err
    assert (tmp_path / "engine" / "model" / "part-a.bin").exists()
    assert not Files(str(tmp_path / "engine" / "model")).missing_shards()


@pytest.mark.parametrize("edit", [
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}},
    {"rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_scaling": {"rope_type": "default", "rope_theta": 1e6}},
], ids=["yarn", "linear", "theta"])
def test_rope_scaling_beside_rope_parameters_is_read(tiny, tmp_path, capfd, edit):
    """transformers merges a config's rope_scaling into its rope_parameters (YaRN then applies), but the parser
    read rope_scaling only when rope_parameters was absent or empty: a YaRN or linear rope_scaling added to a
    transformers-5 config.json (which writes rope_parameters) built an engine serving plain RoPE, other logits
    than transformers', without a word. Now both objects are read: another rope type, or a theta that disagrees,
    is refused in one line. From a review helper; fails on the old code."""
    ckpt = _copy(tiny, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "default"
    cfg.update(edit)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    _assert_refused(rc, err, tmp_path, "rope_scaling")


def test_a_default_rope_scaling_beside_rope_parameters_builds(tiny, tmp_path, capfd):
    ckpt = _copy(tiny, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "default", "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check")
    assert rc == 0, err


def test_a_context_past_the_trained_positions_is_built_with_a_warning(tiny, tmp_path, capfd):
    """--max-context above config.json's max_position_embeddings built without a word (vLLM refuses it by
    default): it builds, and says so in one warning line; at or below it, no warning."""
    ckpt = _copy(tiny, tmp_path)
    trained = json.loads((ckpt / "config.json").read_text())["max_position_embeddings"]
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check", "--max-context", str(trained))
    assert rc == 0 and "max_position_embeddings" not in err, err
    rc, err = _build(ckpt, tmp_path, capfd, "--skip-finite-check", "--max-context", str(trained + 1), "--force")
    warnings = [line for line in err.splitlines() if "max_position_embeddings" in line]
    assert rc == 0 and len(warnings) == 1 and f"--max-context {trained + 1}" in warnings[0], err


@pytest.mark.parametrize("backend", ["fla", "fla-unfused"])
def test_fla_on_the_cpu_is_refused_before_anything_is_written(tiny, tmp_path, capfd, backend):
    """--device cpu --backend fla built an engine (exit 0) that `dasc serve` could never load ("fla's Triton
    kernels need a CUDA device"). From a review helper; fails on the old code."""
    rc, err = _build(_copy(tiny, tmp_path), tmp_path, capfd, "--backend", backend)
    _assert_refused(rc, err, tmp_path, f"backend {backend}", "need a CUDA device")


def test_a_step_cap_that_cannot_hold_a_replay_beside_the_decodes_is_warned(tiny, tmp_path, capfd):
    """--max-num-tokens below (max batch - 1) decode tokens + the wr window: a hit's replay runs whole in its
    admission step, so it (and the queue behind it) waits until every running decode has ended. dasc-build
    says so; at a cap that holds it, nothing."""
    ck = _copy(tiny, tmp_path)
    rc, err = _build(ck, tmp_path, capfd, "--policy", "wr", "--wmax", "64", "--max-batch-size", "4")
    assert rc == 0 and "warning: --max-num-tokens" not in err, err
    window = json.loads((tmp_path / "engine" / "plan.json").read_text())["wr_window"]
    assert window > 4
    for cap, warned in ((3 + window - 1, True), (3 + window, False)):
        rc, err = _build(ck, tmp_path, capfd, "--policy", "wr", "--wmax", "64", "--max-batch-size", "4",
                         "--max-num-tokens", str(cap), "--force")
        assert rc == 0 and ("warning: --max-num-tokens" in err) == warned, err
        assert not warned or f"give --max-num-tokens >= {3 + window}" in err
    # nr replays nothing: no warning at any cap
    rc, err = _build(ck, tmp_path, capfd, "--wmax", "64", "--max-batch-size", "4", "--max-num-tokens", "4", "--force")
    assert rc == 0 and "warning: --max-num-tokens" not in err, err
