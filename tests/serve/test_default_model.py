"""The embedded default model (trtllm_dasc/assets/tiny-kimi-linear): reproducible, small, loadable by our
runtime with transformers' logits, its tokenizer loadable offline by AutoTokenizer, plannable."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from trtllm_dasc.serve.tokenizer import DEFAULT_MODEL_DIR, TextTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "make_default_model.py")
TEXTS = ["Passage 12. Read the passage and answer the questions that follow. The ancient merchant traded "
         "salt for iron in 1642; his northern harbor grew quickly.",
         "Question 3: Which of the following best describes the author's attitude toward the scientist?\n"
         "A) careful\nB) surprising\nAnswer: B",
         "Unicode survives: café, naïve, 東京, ∑ and emoji 🙂 — and   spaces\ttabs.", ""]


def _hashes(d: str) -> dict:
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def config():
    with open(os.path.join(DEFAULT_MODEL_DIR, "config.json")) as f:
        return json.load(f)


def test_committed_model_is_what_the_script_makes(tmp_path):
    """Every file but the weights to the byte; the weights by name, dtype and shape, and their values within
    a bf16 rounding step: torch's randn takes a vectorised path (its own log / sin / cos) on AVX2 CPUs and a
    scalar one on AVX-512 or older ones, so a regenerated value may differ in its last bits (and round to
    the neighbouring bf16) on another machine."""
    from safetensors.torch import load_file
    out = tmp_path / "tiny"
    subprocess.run([sys.executable, SCRIPT, "--out", str(out)], check=True, capture_output=True, timeout=120)
    made, committed = _hashes(str(out)), _hashes(DEFAULT_MODEL_DIR)
    assert sorted(made) == sorted(committed)
    weights = "model.safetensors"
    assert {k: v for k, v in made.items() if k != weights} == {k: v for k, v in committed.items() if k != weights}, \
        "the committed default model differs from what scripts/make_default_model.py writes: rerun it"
    new, old = load_file(str(out / weights)), load_file(os.path.join(DEFAULT_MODEL_DIR, weights))
    assert {k: (t.dtype, t.shape) for k, t in new.items()} == {k: (t.dtype, t.shape) for k, t in old.items()}
    for name, t in old.items():
        torch.testing.assert_close(new[name].float(), t.float(), rtol=2 ** -7, atol=1e-5, msg=name)


def test_size_under_5mb():
    total = sum(os.path.getsize(os.path.join(DEFAULT_MODEL_DIR, f)) for f in os.listdir(DEFAULT_MODEL_DIR))
    assert total < 5_000_000


def test_shape(config):
    assert config["model_type"] == "kimi_linear" and config["architectures"] == ["KimiLinearForCausalLM"]
    kinds = config["layer_types"]
    # a full-attention (MLA) layer with KDA layers on both sides
    full = kinds.index("full_attention")
    assert 0 < full < len(kinds) - 1 and kinds.count("linear_attention") >= 4


def test_tokenizer_matches_config(config):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(DEFAULT_MODEL_DIR, "tokenizer.json"))
    assert tok.get_vocab_size() == config["vocab_size"]
    ids = {t: tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>", "<|unk|>")}
    assert (ids["<|pad|>"], ids["<|bos|>"], ids["<|eos|>"]) == \
        (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"])
    ours = TextTokenizer(DEFAULT_MODEL_DIR)
    assert (ours.end_id, ours.pad_id, ours.vocab_size) == (ids["<|eos|>"], ids["<|pad|>"], config["vocab_size"])


def test_autotokenizer_offline_round_trip(monkeypatch):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from tokenizers import Tokenizer
    ref = Tokenizer.from_file(os.path.join(DEFAULT_MODEL_DIR, "tokenizer.json"))
    # the way TensorRT-LLM's clients load a --tokenizer-dir and derive end_id / pad_id from it
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, legacy=False, padding_side="left", trust_remote_code=True)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.encode(tok.eos_token, add_special_tokens=False) == [2]
    assert tok.encode(tok.pad_token, add_special_tokens=False) == [0]
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id and ids == ref.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_workload_text_tokenizes_into_words():
    tok = TextTokenizer(DEFAULT_MODEL_DIR)
    # exam phrasing is mostly one token per word (with its leading space), not a byte soup
    words = re.findall(r"[A-Za-z]{3,}", " ".join(TEXTS[:2]))
    whole = [w for w in words if len(tok.encode(" " + w, add_special_tokens=False)) == 1]
    assert len(whole) >= 0.8 * len(words), sorted(set(words) - set(whole))


def test_runtime_logits_equal_transformers():
    from transformers import KimiLinearForCausalLM

    from trtllm_dasc.model import HybridModel
    ids = TextTokenizer(DEFAULT_MODEL_DIR).encode(" ".join(TEXTS[:3]) * 2)
    assert len(ids) > 64          # more than one 64-token chunk of the recurrence
    hf = KimiLinearForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0].float()
    out = HybridModel.from_pretrained(DEFAULT_MODEL_DIR).prefill(ids)
    assert out.shape == ref.shape == (len(ids), hf.config.vocab_size)
    err, scale = (out - ref).abs().max().item(), ref.abs().max().item()
    assert err <= 1e-4 * scale, (err, scale)
    # random weights, yet not degenerate: greedy continuations depend on the prompt
    assert len(set(ref.argmax(-1).tolist())) > 5


def test_plan_keeps_some_kda_channels():
    run = subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "plan", "--model", DEFAULT_MODEL_DIR,
                          "--wmax", "16", "--tp", "1", "--json"], check=True, capture_output=True, text=True,
                         timeout=120)
    plan = json.loads(run.stdout)
    assert plan["arch"] == "kda" and plan["num_linear_layers"] == 5
    kept, units = sum(plan["retained_per_layer"]), sum(plan["units_per_layer"])
    assert 0 < kept < units and plan["compression_ckpt"] > 1
