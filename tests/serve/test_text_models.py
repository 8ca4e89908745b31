"""preprocessing / postprocessing / ensemble on the real tritonserver, checked through tritonclient (gRPC).

References are independent of the models' code: the `tokenizers` library called directly on the default
model's tokenizer.json, and TensorRT-LLM's word-list format written out by hand. The ensemble runs with a
stub core model (written here, in a temp repository) that has the core's I/O and echoes the prompt.
"""
from __future__ import annotations

import json
import os
import queue
import re
import textwrap
from functools import partial

import numpy as np
import pytest

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.repository import TEMPLATES, fill_model
from trtllm_dasc.serve.tokenizer import DEFAULT_MODEL_DIR, TEMPLATE_VARIABLES, text_model_values
from trtllm_dasc.serve.tritonserver import start_server

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

PROMPTS = ["Passage 1. Read the passage and answer the questions that follow.",
           "Question 2: According to the passage, why did Maria describe the northern harbor? Answer: B"]
STUB = "echo_core"


@pytest.fixture(scope="module")
def ref():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(DEFAULT_MODEL_DIR, "tokenizer.json"))


def _serve(repo, work):
    # no model here answers the drain (only the core model does): stop() would wait the default 10 s drain
    # for a ".drained" that never comes, twice per module
    server = start_server(str(repo), str(work), drain_seconds=0)
    try:
        server.wait_ready(120)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    """tritonserver with only preprocessing and postprocessing."""
    root = tmp_path_factory.mktemp("text")
    values = text_model_values(max_batch_size=4)
    for name in ("preprocessing", "postprocessing"):
        fill_model(name, root / "repo", values[name])
    server = _serve(root / "repo", root / "work")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()
    server.stop()


def _tensor(name, value):
    value = np.asarray(value)
    t = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    t.set_data_from_numpy(value)
    return t


def _text(rows):
    return np.array([[s.encode() if isinstance(s, str) else s for s in row] for row in rows], dtype=object)


def _pre(client, prompts, **extra):
    inputs = [_tensor("QUERY", _text([[p] for p in prompts])),
              _tensor("REQUEST_OUTPUT_LEN", np.full((len(prompts), 1), 16, np.int32))]
    inputs += [_tensor(k, v) for k, v in extra.items()]
    return client.infer("preprocessing", inputs)


# ---- template variables -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TEMPLATE_VARIABLES))
def test_template_variables_listed(name):
    with open(os.path.join(TEMPLATES, name, "config.pbtxt")) as f:
        found = set(re.findall(r"\$\{(\w+)\}", f.read()))
    assert found == set(TEMPLATE_VARIABLES[name])
    assert set(text_model_values()[name]) == found


def test_template_values_checked(tmp_path):
    assert text_model_values()["ensemble"]["core_model"] == "tensorrt_llm"
    with pytest.raises(UserError, match="tokenizer.json"):
        text_model_values(str(tmp_path))
    with pytest.raises(UserError, match="core_model"):
        text_model_values(core_model='a"b')
    with pytest.raises(UserError, match="max_batch_size"):
        text_model_values(max_batch_size=0)
    with pytest.raises(UserError, match="core_model"):
        fill_model("ensemble", str(tmp_path), {"max_batch_size": 4})


# ---- preprocessing ----------------------------------------------------------------------------------

def test_text_to_ids_equals_tokenizers(text_server, ref):
    out = _pre(text_server, PROMPTS)
    want = [ref.encode(p).ids for p in PROMPTS]
    assert want[0][0] == 1 and len(want[0]) != len(want[1])          # <|bos|> added, lengths differ
    lengths = out.as_numpy("REQUEST_INPUT_LEN")
    ids = out.as_numpy("INPUT_ID")
    assert lengths.tolist() == [[len(w)] for w in want]
    assert ids.shape == (2, max(map(len, want))) and ids.dtype == np.int32
    for row, w in zip(ids, want):
        assert row[:len(w)].tolist() == w and set(row[len(w):].tolist()) <= {0}      # right-padded with <|pad|>
    assert out.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[16], [16]]
    # ids from the tokenizer unless given: <|eos|> = 2, <|pad|> = 0
    assert out.as_numpy("OUT_END_ID").tolist() == [[2], [2]]
    assert out.as_numpy("OUT_PAD_ID").tolist() == [[0], [0]]
    given = _pre(text_server, PROMPTS[:1], END_ID=np.array([[-1]], np.int32), PAD_ID=np.array([[7]], np.int32))
    assert given.as_numpy("OUT_END_ID").tolist() == [[-1]] and given.as_numpy("OUT_PAD_ID").tolist() == [[7]]


def test_embedding_bias_as_trtllms_preprocessing_makes_it(text_server, ref):
    """EMBEDDING_BIAS_WORDS / _WEIGHTS -> EMBEDDING_BIAS [batch, vocab], each word's weight at each of its
    tokens (TensorRT-LLM's preprocessing; its tensorrt_llm_bls always asks for the output, which was an
    unknown output here: from a review helper). Recomputed from tokenizers' own encoding."""
    def enc(w):
        return ref.encode(w, add_special_tokens=False).ids
    words = _text([["the passage", " why"], [" why", ""]])
    weights = np.array([[1.5, -2.0], [0.25, 4.0]], np.float32)
    got = _pre(text_server, PROMPTS, EMBEDDING_BIAS_WORDS=words, EMBEDDING_BIAS_WEIGHTS=weights) \
        .as_numpy("EMBEDDING_BIAS")
    # a row of the model's vocabulary (its config.json), which the engine requires as TensorRT-LLM does
    with open(os.path.join(DEFAULT_MODEL_DIR, "config.json")) as f:
        want = np.zeros((2, json.load(f)["vocab_size"]), np.float32)
    for b, (row_words, row_weights) in enumerate([(["the passage", " why"], [1.5, -2.0]), ([" why", ""], [0.25, 4.0])]):
        for w, x in zip(row_words, row_weights):
            for t in enc(w):
                want[b, t] += x
    assert got.dtype == np.float32 and got.tolist() == want.tolist() and want.any()
    # without both inputs: [batch, 0], as TensorRT-LLM answers
    assert _pre(text_server, PROMPTS).as_numpy("EMBEDDING_BIAS").shape == (2, 0)
    assert _pre(text_server, PROMPTS, EMBEDDING_BIAS_WORDS=words).as_numpy("EMBEDDING_BIAS").shape == (2, 0)
    with pytest.raises(Exception, match="same length"):
        _pre(text_server, PROMPTS, EMBEDDING_BIAS_WORDS=words, EMBEDDING_BIAS_WEIGHTS=weights[:, :1])


def test_word_lists_trtllm_format(text_server, ref):
    def enc(w):
        return ref.encode(w, add_special_tokens=False).ids
    a, b, c = enc("the passage"), enc(" Answer:"), enc(" why")
    assert len(a) == 2 and len(b) == 2 and len(c) == 1
    # request 0: two words (the empty one is dropped); request 1: one word
    stop = _text([["the passage", " Answer:", ""], [" why", "", ""]])
    out = _pre(text_server, PROMPTS, STOP_WORDS_DICT=stop, BAD_WORDS_DICT=_text([[" why"], [""]]))
    got = out.as_numpy("STOP_WORDS_IDS")
    want = np.array([[a + b, [2, 4, -1, -1]],
                     [c + [0, 0, 0], [1, -1, -1, -1]]], np.int32)
    assert got.dtype == np.int32 and got.tolist() == want.tolist()
    # a request whose words all encode to nothing still gets one column: id 0, offset -1
    assert out.as_numpy("BAD_WORDS_IDS").tolist() == [[c, [1]], [[0], [-1]]]
    # no words at all: [batch, 2, 0]
    assert _pre(text_server, PROMPTS).as_numpy("STOP_WORDS_IDS").shape == (2, 2, 0)


def test_bad_text_is_an_error_naming_the_field(text_server):
    with pytest.raises(InferenceServerException, match="QUERY"):
        _pre(text_server, [b"\xff\xfe broken"])
    with pytest.raises(InferenceServerException, match="STOP_WORDS_DICT"):
        _pre(text_server, PROMPTS[:1], STOP_WORDS_DICT=_text([[b"\xc3"]]))
    # the model serves on
    assert _pre(text_server, PROMPTS[:1]).as_numpy("REQUEST_INPUT_LEN")[0, 0] > 1


# ---- postprocessing ---------------------------------------------------------------------------------

def _post(client, tokens, lengths):
    out = client.infer("postprocessing", [_tensor("TOKENS_BATCH", np.asarray(tokens, np.int32)),
                                          _tensor("SEQUENCE_LENGTH", np.asarray(lengths, np.int32))])
    return out.as_numpy("OUTPUT")


def test_ids_to_text_equals_tokenizers(text_server, ref):
    ids = [ref.encode(p).ids for p in PROMPTS]
    T = max(map(len, ids)) + 3
    tokens = np.full((2, 2, T), 2, np.int32)          # <|eos|> padding past each sequence length
    lengths = np.zeros((2, 2), np.int32)
    for b in range(2):
        for beam in range(2):
            seq = ids[(b + beam) % 2][: 30 - 10 * beam]
            tokens[b, beam, :len(seq)] = seq
            lengths[b, beam] = len(seq)
    out = _post(text_server, tokens, lengths)
    # flat [batch * beam], batch-major, as TensorRT-LLM's postprocessing returns it
    assert out.shape == (4,)
    for b in range(2):
        for beam in range(2):
            want = ref.decode(tokens[b, beam, :lengths[b, beam]].tolist(), skip_special_tokens=True)
            assert out[2 * b + beam].decode() == want
    # whole prompts come back as the prompt text (bos skipped)
    assert out[0].decode() == PROMPTS[0][:len(out[0])]
    assert _post(text_server, [[ids[1]]], [[len(ids[1])]]).tolist() == [PROMPTS[1].encode()]


def test_streamed_pieces_concatenate(text_server, ref):
    ids = ref.encode(PROMPTS[1], add_special_tokens=False).ids
    pieces = [_post(text_server, [[[i]]], [[1]])[0].decode() for i in ids]
    assert "".join(pieces) == PROMPTS[1]


def test_out_of_range_id_is_an_error(text_server):
    with pytest.raises(InferenceServerException, match="TOKENS_BATCH"):
        _post(text_server, [[[5, 1 << 20]]], [[2]])
    assert _post(text_server, [[[5, 6]]], [[2]]).shape == (1,)


# ---- ensemble with a stub core model ----------------------------------------------------------------

# the core tensors the ensemble maps, as TensorRT-LLM's tensorrt_llm model declares them
CORE_INPUTS = {"input_ids": ("TYPE_INT32", "-1", "ragged"), "input_lengths": ("TYPE_INT32", "1", "req"),
               "request_output_len": ("TYPE_INT32", "1", "req"), "end_id": ("TYPE_INT32", "1", ""),
               "pad_id": ("TYPE_INT32", "1", ""), "stop_words_list": ("TYPE_INT32", "2, -1", "ragged"),
               "bad_words_list": ("TYPE_INT32", "2, -1", "ragged"), "num_return_sequences": ("TYPE_INT32", "1", ""),
               "exclude_input_in_output": ("TYPE_BOOL", "1", ""), "runtime_top_k": ("TYPE_INT32", "1", ""),
               "runtime_top_p": ("TYPE_FP32", "1", ""), "temperature": ("TYPE_FP32", "1", ""),
               "min_tokens": ("TYPE_INT32", "1", ""), "seed": ("TYPE_UINT64", "1", ""),
               "return_context_logits": ("TYPE_BOOL", "1", ""), "return_perf_metrics": ("TYPE_BOOL", "1", ""),
               "beam_width": ("TYPE_INT32", "1", ""), "streaming": ("TYPE_BOOL", "1", "")}
CORE_OUTPUTS = {"output_ids": ("TYPE_INT32", "-1, -1"), "sequence_length": ("TYPE_INT32", "-1"),
                "context_logits": ("TYPE_FP32", "-1, -1"), "batch_index": ("TYPE_INT32", "1"),
                "sequence_index": ("TYPE_INT32", "1"), "cached_tokens": ("TYPE_INT32", "1"), "dasc_policy": ("TYPE_STRING", "1"),
                **{n: ("TYPE_INT32", "1") for n in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                                                     "kv_cache_alloc_total_blocks", "total_accepted_draft_tokens",
                                                     "total_draft_tokens")},
                **{n: ("TYPE_INT64", "1") for n in ("arrival_time_ns", "first_scheduled_time_ns",
                                                     "first_token_time_ns", "last_token_time_ns")},
                "acceptance_rate": ("TYPE_FP32", "1")}

# echoes the prompt as the generated tokens (one response per token when streaming), and reports what
# reached it: cached_tokens = input_lengths, sequence_index = end_id, kv_cache_reused_blocks = stop words
STUB_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def get(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(get(request, "input_lengths").reshape(-1)[0])
            ids = get(request, "input_ids").reshape(-1)[:n].astype(np.int32)
            stream = get(request, "streaming")
            stop = get(request, "stop_words_list")
            extra = {"cached_tokens": [[n]], "sequence_index": [[int(get(request, "end_id").reshape(-1)[0])]],
                     "kv_cache_reused_blocks": [[int((stop[0, 1] >= 0).sum()) if stop.shape[-1] else 0]]}
            extra = [pb_utils.Tensor(k, np.array(v, np.int32)) for k, v in extra.items()]
            chunks = [ids[i:i + 1] for i in range(n)] if stream is not None and stream.reshape(-1)[0] else [ids]
            for chunk in chunks:
                out = [pb_utils.Tensor("output_ids", chunk.reshape(1, 1, -1)),
                       pb_utils.Tensor("sequence_length", np.array([[len(chunk)]], np.int32))]
                sender.send(pb_utils.InferenceResponse(out + extra))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def _stub_config() -> str:
    def tensor(name, dtype, dims, kind=None):
        lines = [f'name: "{name}"', f"data_type: {dtype}", f"dims: [ {dims} ]"]
        if kind == "ragged":
            lines.append("allow_ragged_batch: true")
        elif kind is not None and dims == "1":
            lines.append("reshape: { shape: [ ] }")
        if kind not in (None, "req"):
            lines.append("optional: true")
        return "{ " + " ".join(lines) + " }"
    inputs = ",\n".join(tensor(n, d, dims, kind) for n, (d, dims, kind) in CORE_INPUTS.items())
    outputs = ",\n".join(tensor(n, d, dims) for n, (d, dims) in CORE_OUTPUTS.items())
    return textwrap.dedent(f'''\
        name: "{STUB}"
        backend: "python"
        max_batch_size: 4
        model_transaction_policy {{ decoupled: true }}
        ''') + f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"


@pytest.fixture(scope="module")
def ensemble_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    repo = root / "repo"
    values = text_model_values(max_batch_size=4, core_model=STUB)
    for name in ("preprocessing", "postprocessing", "ensemble"):
        fill_model(name, repo, values[name])
    (repo / STUB / "1").mkdir(parents=True)
    (repo / STUB / "config.pbtxt").write_text(_stub_config())
    (repo / STUB / "1" / "model.py").write_text(STUB_MODEL)
    server = _serve(repo, root / "work")
    yield server
    server.stop()


def _ensemble(server, text, errors=None, **extra):
    """All responses of one request through the gRPC stream (the ensemble is decoupled); errors, when a
    list, collects error responses instead of failing."""
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), results))
    inputs = [_tensor("text_input", _text([[text]])), _tensor("max_tokens", np.array([[8]], np.int32))]
    inputs += [_tensor(k, v) for k, v in extra.items()]
    client.async_stream_infer("ensemble", inputs, enable_empty_final_response=True)
    responses = []
    while True:
        result, error = results.get(timeout=30)
        if error is not None and errors is not None:
            errors.append(str(error))
            break
        assert error is None, error
        if result.get_response().outputs:
            responses.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return responses


def test_ensemble_text_in_text_out(ensemble_server, ref):
    [r] = _ensemble(ensemble_server, PROMPTS[1])
    # text_output[0] is the text, as TensorRT-LLM's clients read it
    assert r.as_numpy("text_output").tolist() == [PROMPTS[1].encode()]
    assert r.as_numpy("cached_tokens").tolist() == [[len(ref.encode(PROMPTS[1]).ids)]]
    assert r.as_numpy("sequence_index").tolist() == [[2]]           # end_id filled from the tokenizer
    assert r.as_numpy("kv_cache_reused_blocks").tolist() == [[0]]
    [r] = _ensemble(ensemble_server, PROMPTS[0], end_id=np.array([[7]], np.int32),
                    stop_words=_text([["the passage", " why"]]))
    assert r.as_numpy("sequence_index").tolist() == [[7]]
    assert r.as_numpy("kv_cache_reused_blocks").tolist() == [[2]]


def test_ensemble_streams(ensemble_server, ref):
    responses = _ensemble(ensemble_server, PROMPTS[0], stream=np.array([[True]]))
    assert len(responses) == len(ref.encode(PROMPTS[0]).ids)        # one per token, bos included
    assert "".join(r.as_numpy("text_output")[0].decode() for r in responses) == PROMPTS[0]


def test_ensemble_bad_text_is_an_error(ensemble_server):
    errors = []
    assert _ensemble(ensemble_server, b"\xff bad", errors) == [] and "QUERY (text_input)" in errors[0]
    assert len(_ensemble(ensemble_server, PROMPTS[0])) == 1


# TensorRT-LLM's ensemble I/O (all_models/inflight_batcher_llm/ensemble/config.pbtxt, written out by hand)
TRTLLM_ENSEMBLE_INPUTS = (
    "text_input", "decoder_text_input", "max_tokens", "num_return_sequences", "bad_words", "stop_words",
    "exclude_input_in_output", "end_id", "pad_id", "top_k", "top_p", "temperature", "length_penalty",
    "repetition_penalty", "min_length", "presence_penalty", "frequency_penalty", "random_seed", "return_log_probs",
    "return_context_logits", "return_generation_logits", "return_perf_metrics", "beam_width", "stream",
    "prompt_embedding_table", "prompt_table_extra_id", "prompt_vocab_size", "embedding_bias_words",
    "embedding_bias_weights", "lora_task_id", "lora_weights", "lora_config", "guided_decoding_guide_type",
    "guided_decoding_guide")
TRTLLM_ENSEMBLE_OUTPUTS = (
    "text_output", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits", "batch_index",
    "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks",
    "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens")


def _io(path):
    with open(path) as f:
        text = f.read()
    inputs, outputs = text.split("\noutput [")
    pattern = r'name: "(\w+)"\s+data_type: (\w+)'
    return dict(re.findall(pattern, inputs)), dict(re.findall(pattern, outputs))


def test_ensemble_maps_the_real_core_io():
    """The ensemble has TensorRT-LLM's ensemble I/O (and the names it had before: min_tokens, seed, ours);
    every input the text model forwards names an input of model_repo/tensorrt_llm, every output but
    text_output is one of its outputs with the same dtype."""
    from trtllm_dasc.serve.text_bls import NAME_MAP, PRE_IN, PRE_OUT, REFUSED
    core_in, core_out = _io(os.path.join(TEMPLATES, "tensorrt_llm", "config.pbtxt"))
    ens_in, ens_out = _io(os.path.join(TEMPLATES, "ensemble", "config.pbtxt"))
    assert set(TRTLLM_ENSEMBLE_INPUTS) | {"min_tokens", "seed"} == set(ens_in)
    assert set(TRTLLM_ENSEMBLE_OUTPUTS) | {"cached_tokens", "dasc_policy"} == set(ens_out)
    bias = {"embedding_bias_words", "embedding_bias_weights"}
    assert set(ens_in) <= set(NAME_MAP) | set(PRE_IN) | set(REFUSED) | bias
    assert {NAME_MAP[n] for n in ens_in if n in NAME_MAP} | set(PRE_OUT.values()) | {"embedding_bias"} <= set(core_in)
    assert {n: core_out.get(n) for n in ens_out if n != "text_output"} == \
        {n: t for n, t in ens_out.items() if n != "text_output"}
    # the BLS model forwards through the same maps
    bls_in, bls_out = _io(os.path.join(TEMPLATES, "tensorrt_llm_bls", "config.pbtxt"))
    assert set(bls_in) <= set(NAME_MAP) | set(PRE_IN) | set(REFUSED) | bias
    assert set(bls_out) - {"text_output"} <= set(core_out)
