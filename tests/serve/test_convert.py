"""TensorRT-LLM's request conventions, as our converter reads them (pure numpy, no server): sampling
switches, word lists, lengths, unsupported inputs, streaming without decoupling, output shapes."""
import numpy as np
import pytest

from trtllm_dasc.engine.request import RequestOutput, RequestStats
from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.convert import Control, parse_request, response_tensors
from trtllm_dasc.serve.io_spec import render_config


def req(**extra):
    inputs = {"input_ids": np.array([[5, 6, 7, 8]], np.int32), "input_lengths": np.array([4], np.int32),
              "request_output_len": np.array([3], np.int32)}
    inputs.update({k: np.asarray(v) for k, v in extra.items()})
    return inputs


def one(**extra):
    (r,) = parse_request(req(**extra), "id", decoupled=True)
    return r


@pytest.mark.parametrize("extra,greedy,top_k,top_p,temp", [
    ({}, True, 0, 1.0, 0.0),                                             # nothing given: greedy
    (dict(runtime_top_k=[1], runtime_top_p=[0.0], temperature=[1.0]), True, 0, 1.0, 0.0),   # the stock client
    (dict(runtime_top_k=[0], runtime_top_p=[0.0], temperature=[0.7]), True, 0, 1.0, 0.0),   # both off
    (dict(runtime_top_k=[5], temperature=[0.7]), False, 5, 1.0, 0.7),
    (dict(runtime_top_p=[0.9]), False, 0, 0.9, 1.0),                     # temperature defaults to 1
    (dict(runtime_top_k=[4], runtime_top_p=[0.5], temperature=[2.0]), False, 4, 0.5, 2.0),
])
def test_sampling_switches(extra, greedy, top_k, top_p, temp):
    s = one(**extra).gen.sampling
    assert s.greedy == greedy
    if not greedy:
        assert (s.top_k, s.top_p, s.temperature) == (top_k, top_p, temp)


def test_lengths_end_id_seed_and_word_lists():
    r = one(input_lengths=[2], end_id=[-1], seed=np.array([2 ** 63 + 5], np.uint64), runtime_top_k=[3],
            stop_words_list=np.array([[[9, 10, 11, 0], [2, 3, -1, -1]]], np.int32),
            bad_words_list=np.array([[[4, 0], [1, -1]]], np.int32), min_tokens=[2])
    g = r.gen
    assert g.prompt == [5, 6] and g.end_id is None and g.sampling.seed == 2 ** 63 + 5
    assert g.stop_words == [[9, 10], [11]] and g.bad_words == [[4]] and g.min_tokens == 2
    assert one(end_id=[7]).gen.end_id == 7


@pytest.mark.parametrize("extra,needle", [
    (dict(input_lengths=[9]), "input_lengths"), (dict(request_output_len=[0]), "request_output_len"),
    (dict(beam_width=[2]), "beam_width"), (dict(num_return_sequences=[3]), "num_return_sequences"),
    (dict(lora_task_id=np.array([1], np.uint64)), "lora_task_id"),
    # penalties are served now: a value outside their domain still names the input
    (dict(repetition_penalty=np.array([0.0], np.float32)), "repetition_penalty"),
    (dict(presence_penalty=np.array([np.inf], np.float32)), "presence_penalty"),
    (dict(embedding_bias=np.array([[0.0, np.nan]], np.float32)), "embedding_bias"),
    (dict(min_tokens=[2], min_length=[3]), "min_length"),
    (dict(len_penalty=np.array([0.5], np.float32)), "len_penalty"),
    (dict(guided_decoding_guide_type=np.array([[b"json"]], object)), "guided_decoding"),
    (dict(prompt_embedding_table=np.ones((1, 2, 4), np.float16)), "prompt_embedding_table"),
    (dict(runtime_top_k=[-1]), "runtime_top_k"),
    (dict(runtime_top_p=[1.5]), "runtime_top_p"), (dict(temperature=[-1.0], runtime_top_k=[5]), "temperature"),
    (dict(stop_words_list=np.array([[[1, 2], [5, -1]]], np.int32)), "stop_words_list"),
    (dict(input_ids=np.array([[1.5, 2.0]], np.float32)), "input_ids"),
    (dict(cache_control=np.array([[b"reboot"]], object)), "cache_control"),
    (dict(bogus=[1]), "bogus"),
])
def test_bad_inputs_name_themselves(extra, needle):
    with pytest.raises(UserError, match=needle):
        parse_request(req(**extra), "id", decoupled=True)


def test_neutral_values_of_unsupported_inputs_pass():
    # what TensorRT-LLM's clients send by default must not be refused
    r = one(beam_width=[1], repetition_penalty=np.array([1.0], np.float32), return_log_probs=[False],
            presence_penalty=np.array([0.0], np.float32), early_stopping=[True], pad_id=[2],
            embedding_bias=np.zeros((1, 0), np.float32))
    assert r.gen.prompt == [5, 6, 7, 8]


def test_streaming_needs_decoupled_and_control_requests():
    with pytest.raises(UserError, match="decoupled"):
        parse_request(req(streaming=[True]), "id", decoupled=False)
    assert parse_request({"cache_control": np.array([[b"flush"]], object)}, "c", decoupled=True) == Control("flush")


def test_batch_entries_become_separate_requests():
    inputs = req(input_ids=np.array([[1, 2, 3], [4, 5, 6]], np.int32), input_lengths=[3, 2],
                 request_output_len=[2, 4])
    a, b = parse_request(inputs, "id", decoupled=True)
    assert (a.gen.prompt, b.gen.prompt, a.gen.max_new_tokens, b.gen.max_new_tokens) == ([1, 2, 3], [4, 5], 2, 4)
    assert (a.batch_index, b.batch_index, a.batch_size) == (0, 1, 2)


def test_response_shapes_streaming_and_whole():
    stats = RequestStats(cached_tokens=3)
    stream = one(streaming=[True])
    t = response_tensors(stream, RequestOutput("id", [42], False, stats=stats))
    assert t["output_ids"].shape == (1, 1, 1) and t["output_ids"][0, 0, 0] == 42
    assert t["cached_tokens"].tolist() == [[3]]
    whole = one()
    assert response_tensors(whole, RequestOutput("id", [42], False, stats=stats)) is None
    t = response_tensors(whole, RequestOutput("id", [43], True, "length", stats=stats))
    assert t["output_ids"].tolist() == [[[5, 6, 7, 8, 42, 43]]] and t["sequence_length"].tolist() == [[6]]
    excl = one(exclude_input_in_output=[True])
    t = response_tensors(excl, RequestOutput("id", [9], True, "length", stats=stats))
    assert t["output_ids"].tolist() == [[[9]]]


def test_committed_template_is_the_rendered_table():
    from trtllm_dasc.serve.repository import TEMPLATES
    with open(f"{TEMPLATES}/tensorrt_llm/config.pbtxt") as f:
        assert f.read() == render_config(), "run: python -m trtllm_dasc.serve.io_spec > model_repo/tensorrt_llm/config.pbtxt"


def test_the_table_matches_tensorrt_llms_names_dtypes_and_dims():
    """Every TensorRT-LLM input and output we declare has its name, dtype and dims (from its config.pbtxt,
    transcribed here as the spec our clients rely on)."""
    from trtllm_dasc.serve.io_spec import INPUTS, OUTPUTS
    spec = {t.name: (t.dtype, t.dims) for t in INPUTS + OUTPUTS}
    expected = {"input_ids": ("TYPE_INT32", (-1,)), "input_lengths": ("TYPE_INT32", (1,)),
                "request_output_len": ("TYPE_INT32", (1,)), "end_id": ("TYPE_INT32", (1,)),
                "pad_id": ("TYPE_INT32", (1,)), "beam_width": ("TYPE_INT32", (1,)),
                "temperature": ("TYPE_FP32", (1,)), "runtime_top_k": ("TYPE_INT32", (1,)),
                "runtime_top_p": ("TYPE_FP32", (1,)), "seed": ("TYPE_UINT64", (1,)),
                "min_tokens": ("TYPE_INT32", (1,)), "streaming": ("TYPE_BOOL", (1,)), "stop": ("TYPE_BOOL", (1,)),
                "stop_words_list": ("TYPE_INT32", (2, -1)), "bad_words_list": ("TYPE_INT32", (2, -1)),
                "exclude_input_in_output": ("TYPE_BOOL", (1,)), "return_perf_metrics": ("TYPE_BOOL", (1,)),
                "output_ids": ("TYPE_INT32", (-1, -1)), "sequence_length": ("TYPE_INT32", (-1,)),
                "sequence_index": ("TYPE_INT32", (1,)), "kv_cache_reused_blocks": ("TYPE_INT32", (1,)),
                "kv_cache_alloc_new_blocks": ("TYPE_INT32", (1,)), "kv_cache_alloc_total_blocks": ("TYPE_INT32", (1,)),
                "arrival_time_ns": ("TYPE_INT64", (1,)), "first_scheduled_time_ns": ("TYPE_INT64", (1,)),
                "first_token_time_ns": ("TYPE_INT64", (1,)), "last_token_time_ns": ("TYPE_INT64", (1,))}
    for name, want in expected.items():
        assert spec[name] == want, name


def test_a_bad_sequence_of_a_batch_is_named():
    """One error answers a whole request: with several sequences it says which one is wrong (a reviewer could
    not tell from "input 'input_lengths' = 0 disagrees with ..." which entry of a batch it meant); a single
    sequence's error stays as it was."""
    batch = {"input_ids": np.array([[5, 6, 7, 8], [5, 6, 7, 8]], np.int32), "input_lengths": np.array([[4], [0]], np.int32),
             "request_output_len": np.array([[3], [3]], np.int32)}
    with pytest.raises(UserError, match=r"^sequence 1 of the batch of 2: input 'input_lengths' = 0 disagrees"):
        parse_request(batch, "id", decoupled=True)
    with pytest.raises(UserError, match=r"^input 'input_lengths' = 0 disagrees"):
        parse_request(req(input_lengths=[0]), "id", decoupled=True)
