"""tensorrt_llm_bls: TensorRT-LLM's BLS model (text in, text out) as Python calls:
preprocessing -> tensorrt_llm -> postprocessing.

Like TensorRT-LLM's tensorrt_llm_bls (accumulate_tokens false): with `stream` every token response of
tensorrt_llm becomes one text_output of the new tokens; without, one response with the whole text.
TensorRT-LLM's BLS names map to tensorrt_llm's (top_k -> runtime_top_k, random_seed -> seed, ...); an
input tensorrt_llm does not honour is refused there in one line naming it; a neutral value (false) is
dropped. A client's cancellation reaches the engine as a stop for this request (trtllm_dasc.serve.bls).
cached_tokens and dasc_policy come through from tensorrt_llm.
"""
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve import bls

# TensorRT-LLM's BLS input -> tensorrt_llm input
NAME_MAP = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "temperature": "temperature",
            "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty", "min_length": "min_tokens",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "random_seed": "seed",
            "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
            "return_generation_logits": "return_generation_logits", "beam_width": "beam_width",
            "stream": "streaming", "prompt_embedding_table": "prompt_embedding_table",
            "prompt_vocab_size": "prompt_vocab_size"}
# BLS inputs with no tensorrt_llm counterpart here: refused unless empty / zero / false
REFUSED = ("decoder_text_input", "embedding_bias_words", "embedding_bias_weights", "num_draft_tokens",
           "use_draft_logits")
PRE_IN = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
          "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
PRE_OUT = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths", "REQUEST_OUTPUT_LEN": "request_output_len",
           "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id",
           "OUT_PAD_ID": "pad_id"}
CORE_OUT = ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs", "context_logits",
            "generation_logits", "batch_index", "cached_tokens", "dasc_policy"]
PASSED = ("cum_log_probs", "output_log_probs", "context_logits", "generation_logits", "batch_index", "cached_tokens",
          "dasc_policy")


def _neutral(value: np.ndarray) -> bool:
    if value.size == 0:
        return True
    if value.dtype == object:
        return all(not v for v in value.reshape(-1))
    return not np.any(value)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        params = config.get("parameters", {})
        self.core = params.get("tensorrt_llm_model_name", {}).get("string_value") or "tensorrt_llm"
        self.outputs = {o["name"] for o in config.get("output", [])}
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            return [self._plain(r) for r in requests]
        for request in requests:
            t = threading.Thread(target=self._stream, args=(request,), name="dasc-bls", daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()
        return None

    def _plain(self, request):
        try:
            last = None
            for tensors in self._generate(request, request.request_id(), None):
                last = tensors
            return pb_utils.InferenceResponse(last or [])
        except UserError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))

    def _stream(self, request):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        rid = bls.forward_id(request.request_id(), "tensorrt_llm_bls")
        try:
            for tensors in self._generate(request, rid, sender.is_cancelled):
                sender.send(pb_utils.InferenceResponse(tensors))
            sender.send(flags=final)
        except Exception as e:  # noqa: BLE001 - the request fails in one line, the model keeps serving
            text = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(text)), flags=final)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _generate(self, request, rid, cancelled):
        """The text responses of one request, as lists of pb_utils.Tensor."""
        given = {t.name(): t.as_numpy() for t in request.inputs()}
        if given["text_input"].shape[0] != 1:
            raise UserError(f"tensorrt_llm_bls takes one prompt per request (text_input has a batch of "
                            f"{given['text_input'].shape[0]})")
        for name in REFUSED:
            if name in given and not _neutral(given[name]):
                raise UserError(f"input '{name}' is not supported by tensorrt_llm_bls")
        pre = pb_utils.InferenceRequest(
            model_name="preprocessing", requested_output_names=list(PRE_OUT),
            inputs=[pb_utils.Tensor(PRE_IN[k], v) for k, v in given.items() if k in PRE_IN]).exec()
        if pre.has_error():
            raise UserError(pre.error().message())
        inputs = [pb_utils.Tensor(PRE_OUT[t.name()], t.as_numpy()) for t in pre.output_tensors()]
        for name, value in given.items():
            # a false flag is TensorRT-LLM's default: dropped, so a model without that input still serves
            if name in NAME_MAP and not (value.dtype == bool and not value.any()):
                if value.ndim < 2 and name != "prompt_embedding_table":
                    value = value.reshape(-1, 1)
                inputs.append(pb_utils.Tensor(NAME_MAP[name], value))
        if self.decoupled:
            responses = bls.stream(pb_utils, self.core, inputs, CORE_OUT, rid, cancelled)
        else:
            responses = [pb_utils.InferenceRequest(model_name=self.core, inputs=inputs, requested_output_names=CORE_OUT,
                                                   request_id=rid).exec()]
        for response in responses:
            if response.has_error():
                raise UserError(response.error().message())
            out = {t.name(): t for t in response.output_tensors()}
            if "output_ids" not in out:
                continue
            post = pb_utils.InferenceRequest(
                model_name="postprocessing", requested_output_names=["OUTPUT"],
                inputs=[pb_utils.Tensor("TOKENS_BATCH", out["output_ids"].as_numpy()),
                        pb_utils.Tensor("SEQUENCE_LENGTH", out["sequence_length"].as_numpy())]).exec()
            if post.has_error():
                raise UserError(post.error().message())
            text = pb_utils.get_output_tensor_by_name(post, "OUTPUT").as_numpy()
            yield [pb_utils.Tensor("text_output", text)] + [out[k] for k in PASSED if k in out and k in self.outputs]

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=30)
