"""Hostile inputs to the engine API, sampling and `dasc logits` (issue 9; the config.json, checkpoint-file
and `dasc plan`/`dasc synth` rows live in tests/test_bad_inputs_config_cli.py): each is one UserError line
(API) or exit code 2 with one line (CLI) naming the field, nothing is allocated, and the engine serves the
next good request correctly."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine_helpers import VOCAB, greedy, make_engine, reference_greedy
from trtllm_dasc.engine.config import EngineConfig
from trtllm_dasc.engine.request import GenerationRequest
from trtllm_dasc.engine.sampling import SamplingParams
from trtllm_dasc.errors import UserError

CONFIG_ROWS = [
    ("replay-window-float", dict(replay_window=5.5), "replay_window"),
    ("replay-window-negative", dict(replay_window=-1), "replay_window"),
    ("wmax-string", dict(wmax="16"), "wmax"),
    ("policy-unknown", dict(policy="xr"), "policy"),
    # fla's kernels on the cpu: dasc-build wrote an engine that no machine could serve (from a review helper)
    ("fla-on-cpu", dict(backend="fla", device="cpu"), "need a CUDA device"),
    ("fla-unfused-on-cpu", dict(backend="fla-unfused", device="cpu"), "need a CUDA device"),
    ("out-of-vocab-unknown", dict(out_of_vocab_inputs="clamp"), "out_of_vocab_inputs"),
    ("codec-unknown", dict(codec="fp4"), "codec"),
    ("layout-unknown", dict(layout="dense"), "layout"),
    ("dtype-unknown", dict(dtype="int4"), "dtype"),
    ("device-foo", dict(device="foo"), "device"),
    ("backend-unknown", dict(backend="tensorrt"), "backend"),
    ("block-size-huge", dict(block_size=999999999999), "block_size"),
    ("block-size-zero", dict(block_size=0), "block_size"),
    ("max-batch-bool", dict(max_batch=True), "max_batch"),
    ("kv-blocks-float", dict(num_kv_blocks=2.0), "num_kv_blocks"),
    ("budget-zero", dict(state_budget_bytes=0), "state_budget_bytes"),
    ("prompt-only-string", dict(prompt_only="yes"), "prompt_only"),
    ("interval-negative", dict(interval=-4), "interval"),
]

SAMPLING_ROWS = [
    ("top-k-fraction", dict(temperature=1.0, top_k=2.5), "top_k"),
    ("top-k-negative", dict(top_k=-1), "top_k"),
    ("top-p-zero", dict(top_p=0.0), "top_p"),
    ("top-p-above-one", dict(top_p=1.5), "top_p"),
    ("temperature-negative", dict(temperature=-0.1), "temperature"),
    ("temperature-nan", dict(temperature=float("nan")), "temperature"),
    ("temperature-string", dict(temperature="hot"), "temperature"),
    ("seed-overflow", dict(seed=2 ** 64), "seed"),
    ("seed-negative", dict(seed=-1), "seed"),
    ("seed-float", dict(seed=1.5), "seed"),
]

REQUEST_ROWS = [
    ("empty-prompt", dict(prompt=[]), "prompt is empty"),
    ("id-too-big", dict(prompt=[1, VOCAB]), "outside the vocabulary"),
    ("id-negative", dict(prompt=[1, -1]), "outside the vocabulary"),
    ("id-float", dict(prompt=[1, 2.0]), "not an integer"),
    ("id-bool", dict(prompt=[True, 2]), "not an integer"),
    ("prompt-string", dict(prompt="hello"), "input_ids"),
    ("prompt-2d", dict(prompt=np.ones((2, 3), dtype=np.int64)), "one-dimensional"),
    ("too-long", dict(prompt=[1] * 600), "max context"),
    ("output-zero", dict(max_new_tokens=0), "request_output_len"),
    ("output-negative", dict(max_new_tokens=-2), "request_output_len"),
    ("output-float", dict(max_new_tokens=2.5), "request_output_len"),
    ("end-id-outside", dict(end_id=VOCAB + 1), "end_id"),
    ("request-id-none", dict(request_id=None), "request_id"),
    ("request-id-list", dict(request_id=[1]), "request_id"),
    ("sampling-dict", dict(sampling={"temperature": 1.0}), "sampling"),
    ("context-logits-int", dict(return_context_logits=1), "return_context_logits"),
]


@pytest.fixture(scope="module")
def engine(tiny_models):
    return make_engine(tiny_models["gdn"][0], wmax=16, max_context=512)


def _serves(engine, hf):
    prompt = [5, 6, 7, 8]
    assert engine.generate([greedy(("good", id(engine)), prompt, 2)]) == [reference_greedy(hf, prompt, 2)]


@pytest.mark.parametrize("over,field", [r[1:] for r in CONFIG_ROWS], ids=[r[0] for r in CONFIG_ROWS])
def test_bad_engine_config(tiny_models, over, field):
    with pytest.raises(UserError) as e:
        EngineConfig(model=str(tiny_models["gdn"][0]), **over)
    msg = str(e.value)
    assert field in msg and "\n" not in msg


@pytest.mark.parametrize("over,field", [r[1:] for r in SAMPLING_ROWS], ids=[r[0] for r in SAMPLING_ROWS])
def test_bad_sampling(over, field):
    with pytest.raises(UserError) as e:
        SamplingParams(**over)
    assert field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("over,needle", [r[1:] for r in REQUEST_ROWS], ids=[r[0] for r in REQUEST_ROWS])
def test_bad_request_is_refused_and_the_engine_serves_on(engine, tiny_models, over, needle):
    kw = dict(request_id="bad", prompt=[1, 2, 3], max_new_tokens=2)
    kw.update(over)
    before = engine.stats()
    with pytest.raises(UserError) as e:
        engine.submit(GenerationRequest(**kw))
    assert needle in str(e.value) and "\n" not in str(e.value)
    after = engine.stats()
    for k in ("kv_blocks_free", "checkpoint_slots_free", "state_rows_free", "queued", "running"):
        assert after[k] == before[k], k
    engine.sanity_check()
    _serves(engine, tiny_models["gdn"][1])


def test_duplicate_request_id_in_flight_is_refused(engine, tiny_models):
    engine.submit(greedy("dup", [1, 2, 3], 2))
    with pytest.raises(UserError, match="request_id 'dup' is already in flight"):
        engine.submit(greedy("dup", [4, 5, 6], 2))
    engine.run_until_idle()
    # once finished, the id is free again
    assert len(engine.generate([greedy("dup", [4, 5, 6], 2)])[0]) == 2
    _serves(engine, tiny_models["gdn"][1])


def test_numpy_and_torch_prompts_are_accepted(engine, tiny_models):
    prompt = [9, 8, 7, 6]
    ref = reference_greedy(tiny_models["gdn"][1], prompt, 2)
    for p in (np.array(prompt, dtype=np.int64), torch.tensor(prompt), [np.int64(t) for t in prompt]):
        assert engine.generate([GenerationRequest(("np", type(p).__name__), p, np.int32(2))]) == [ref]


def _logits_cli(path, *flags):
    return subprocess.run([sys.executable, "-m", "trtllm_dasc.cli", "logits", "--model", str(path), *map(str, flags)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags,needle", [
    (("--ids", "1,,2", "--out", "{tmp}/o.npy"), "--ids"),
    (("--ids", "1,a", "--out", "{tmp}/o.npy"), "--ids"),
    (("--ids", ",", "--out", "{tmp}/o.npy"), "--ids is empty"),
    (("--ids", "1,2", "--out", "{tmp}/o.npy", "--device", "foo"), "device"),
    (("--ids", "1,2", "--out", "{tmp}/o.npy", "--block-size", "999999999999"), "block_size"),
    (("--ids", "1,2", "--out", "{tmp}/missing/o.npy"), "does not exist"),
    (("--ids", "1,2", "--out", "{tmp}"), "is a directory"),
    (("--ids", "1,2", "--out", "/proc/o.npy"), "not writable"),
    (("--ids", "1,500", "--out", "{tmp}/o.npy"), "outside the vocabulary"),
    (("--ids", "1,2,3", "--out", "{tmp}/o.npy", "--split", "3"), "--split must be in 1..2"),
    (("--ids", "1,2,3", "--out", "{tmp}/o.npy", "--split", "1", "--replay-window", "-3"), "replay_window"),
], ids=["ids-gap", "ids-letter", "ids-empty", "device-foo", "block-size-huge", "out-dir-missing", "out-is-dir",
        "out-unwritable", "ids-vocab", "split-range", "replay-negative"])
def test_bad_logits_flags(tiny_models, tmp_path, flags, needle):
    proc = _logits_cli(tiny_models["gdn"][0], *(f.replace("{tmp}", str(tmp_path)) for f in flags))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and needle in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_logits_out_is_written_exactly_where_asked(tiny_models, tmp_path):
    out = tmp_path / "o.txt"
    proc = _logits_cli(tiny_models["gdn"][0], "--ids", "1,2,3", "--out", out)
    assert proc.returncode == 0 and f"wrote {out}" in proc.stdout
    assert out.exists() and not (tmp_path / "o.txt.npy").exists()
    assert np.load(out).shape == (3, VOCAB)
