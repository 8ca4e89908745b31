"""The text models tensorrt_llm_bls and ensemble: preprocessing -> tensorrt_llm -> postprocessing as BLS
calls in one decoupled Python model (TensorRT-LLM's tensorrt_llm_bls, accumulate_tokens false).

The ensemble is this model too, not Triton's ensemble platform: Triton 2.51 does not pass an ensemble's
cancellation on to its running step, so a cancelled ensemble stream left the engine generating to
max_tokens. Here a client's cancellation reaches the engine as a stop for the forwarded request (bls.py).

With `stream` every token response of tensorrt_llm becomes one text_output of the new tokens; without, one
response with the whole text. TensorRT-LLM's text names map to tensorrt_llm's (top_k -> runtime_top_k,
random_seed -> seed, ...); an input tensorrt_llm does not honour is refused there in one line naming it;
a neutral value (false) is dropped. embedding_bias_words / _weights become tensorrt_llm's embedding_bias
(preprocessing's EMBEDDING_BIAS: each word's token ids get the word's weight added, per prompt). A request
parameter (over HTTP generate: a JSON key that is no input of the model) is refused, never ignored.
"""
from __future__ import annotations

import contextlib
import json
import threading

import numpy as np
try:
    import triton_python_backend_utils as pb_utils
except ImportError:
    # outside the Python backend (tests reading the name maps): the model itself cannot run there
    pb_utils = None

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve import bls

# a text model's input -> tensorrt_llm input (the union of tensorrt_llm_bls's and the ensemble's names:
# an input a model does not declare never reaches it)
NAME_MAP = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "temperature": "temperature",
            "length_penalty": "len_penalty", "repetition_penalty": "repetition_penalty", "min_length": "min_tokens",
            "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "random_seed": "seed",
            "return_log_probs": "return_log_probs", "return_context_logits": "return_context_logits",
            "return_generation_logits": "return_generation_logits", "return_perf_metrics": "return_perf_metrics",
            "beam_width": "beam_width", "stream": "streaming", "prompt_embedding_table": "prompt_embedding_table",
            "prompt_vocab_size": "prompt_vocab_size", "prompt_table_extra_id": "prompt_table_extra_ids",
            "num_return_sequences": "num_return_sequences", "exclude_input_in_output": "exclude_input_in_output",
            "lora_task_id": "lora_task_id", "lora_weights": "lora_weights", "lora_config": "lora_config",
            "guided_decoding_guide_type": "guided_decoding_guide_type", "guided_decoding_guide": "guided_decoding_guide",
            # ours, kept from the earlier platform ensemble: tensorrt_llm's own names
            "min_tokens": "min_tokens", "seed": "seed"}
# inputs with no tensorrt_llm counterpart here: refused unless empty / zero / false (the multimodal ones are
# declared by tensorrt_llm_bls as TensorRT-LLM's is, so a client sending one is told why, not "unexpected input")
REFUSED = ("decoder_text_input", "num_draft_tokens", "use_draft_logits", "image_input", "image_bytes_input",
           "image_url_input", "video_bytes_input")
# kept as they are (a per-request matrix), not reshaped to [batch, 1]
MATRICES = ("prompt_embedding_table", "lora_weights", "lora_config")
PRE_IN = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
          "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID",
          "embedding_bias_words": "EMBEDDING_BIAS_WORDS", "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS"}
PRE_OUT = {"INPUT_ID": "input_ids", "REQUEST_INPUT_LEN": "input_lengths", "REQUEST_OUTPUT_LEN": "request_output_len",
           "BAD_WORDS_IDS": "bad_words_list", "STOP_WORDS_IDS": "stop_words_list", "OUT_END_ID": "end_id",
           "OUT_PAD_ID": "pad_id", "EMBEDDING_BIAS": "embedding_bias"}


def _neutral(value: np.ndarray) -> bool:
    if value.size == 0:
        return True
    if value.dtype == object:
        return all(not v for v in value.reshape(-1))
    return not np.any(value)


class TextModel:
    """TritonPythonModel of tensorrt_llm_bls and ensemble (model_repo/<name>/1/model.py subclass it)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config.get("name", "tensorrt_llm_bls")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        params = config.get("parameters", {})
        core = params.get("tensorrt_llm_model_name", {}).get("string_value", "")
        self.core = core if core and not core.startswith("${") else "tensorrt_llm"
        self.outputs = [o["name"] for o in config.get("output", [])]
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            return [self._plain(r) for r in requests]
        for request in requests:
            t = threading.Thread(target=self._stream, args=(request,), name=f"dasc-{self.name}", daemon=True)
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
        rid = bls.forward_id(request.request_id(), self.name)
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

    def _preprocess(self, given: dict) -> list:
        """One preprocessing call: the prompt's ids, the word lists, the end / pad ids and the embedding bias."""
        words, weights = given.get("embedding_bias_words"), given.get("embedding_bias_weights")
        if (words is None or _neutral(words)) and weights is not None and weights.size:
            # TensorRT-LLM's preprocessing ignores weights without words; a client meant something by them
            raise UserError(f"{self.name}: embedding_bias_weights given without embedding_bias_words")
        pre = pb_utils.InferenceRequest(
            model_name="preprocessing", requested_output_names=list(PRE_OUT),
            inputs=[pb_utils.Tensor(PRE_IN[k], v) for k, v in given.items() if k in PRE_IN]).exec()
        if pre.has_error():
            raise UserError(pre.error().message())
        # EMBEDDING_BIAS is [batch, 0] unless words and weights were both given: then no bias at all
        return [pb_utils.Tensor(PRE_OUT[t.name()], t.as_numpy()) for t in pre.output_tensors()
                if t.name() != "EMBEDDING_BIAS" or t.as_numpy().size]

    def _generate(self, request, rid, cancelled):
        """The text responses of one request, as lists of pb_utils.Tensor."""
        bls.refuse_parameters(request, self.name)
        given = {t.name(): t.as_numpy() for t in request.inputs()}
        if given["text_input"].shape[0] != 1 and not self.decoupled:
            # a decoupled model streams a batch's sequences as the engine's responses, each with its batch_index
            # (as TensorRT-LLM's ensemble over tensorrt_llm); a plain response holds one sequence
            raise UserError(f"{self.name} takes one prompt per plain request (text_input has a batch of "
                            f"{given['text_input'].shape[0]}): send them one by one, or use the decoupled build")
        for name in REFUSED:
            if name in given and not _neutral(given[name]):
                raise UserError(f"input '{name}' is not supported by {self.name}")
        inputs = self._preprocess(given)
        seen = {}
        for name, value in given.items():
            # a false flag is TensorRT-LLM's default: dropped, so a model without that input still serves
            if name in NAME_MAP and not (value.dtype == bool and not value.any()):
                core = NAME_MAP[name]
                if core in seen:
                    raise UserError(f"{self.name}: inputs '{seen[core]}' and '{name}' both set {core}: give one")
                seen[core] = name
                if value.ndim < 2 and name not in MATRICES:
                    value = value.reshape(-1, 1)
                inputs.append(pb_utils.Tensor(core, value))
        # every output of tensorrt_llm (an empty list asks for all): those this model declares pass on
        if self.decoupled:
            responses = bls.stream(pb_utils, self.core, inputs, [], rid, cancelled)
        else:
            responses = [pb_utils.InferenceRequest(model_name=self.core, inputs=inputs, requested_output_names=[],
                                                   request_id=rid).exec()]
        # the stream's cancellation watch polls the caller's sender: it stops (close) before an error leaves
        # here, since the caller then sends its final response, after which the sender must not be asked
        # anything (the raised error's traceback would keep this frame, and the stream open, meanwhile)
        with contextlib.closing(responses) if hasattr(responses, "close") else contextlib.nullcontext():
            yield from self._texts(responses)

    def _texts(self, responses):
        """tensorrt_llm's responses -> text responses (postprocessing per token response)."""
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
            yield [pb_utils.Tensor("text_output", text)] + [out[k] for k in self.outputs
                                                             if k != "text_output" and k in out]

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=30)
