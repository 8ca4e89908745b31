"""dasc_hybrid: the earlier name of the tensorrt_llm model, kept so existing clients keep working; with
--no-decoupled also tensorrt_llm itself (a non-decoupled forwarder to tensorrt_llm_engine, one instance per
batch slot, each gathering one request's stream).

tritonserver 2.51 has no model name aliases, and a second copy of tensorrt_llm's model would load the
engine twice; so this model is a thin BLS forwarder: each request goes to tensorrt_llm (parameter
`alias_of`) with its inputs and id unchanged, and every streamed response comes back as it is. Its
config.pbtxt is tensorrt_llm's filled one under this name (dasc-build writes it:
trtllm_dasc.serve.repository.add_alias). A client's cancellation reaches the engine as a stop for the
forwarded request (trtllm_dasc.serve.bls).
"""
import contextlib
import json
import threading

import triton_python_backend_utils as pb_utils

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve import bls


def _inputs(request):
    """The request's inputs as a client sends them: a per-request scalar (config reshape [ ]) reaches this
    model as [batch] and must go on as [batch, 1]."""
    out = []
    for t in request.inputs():
        value = t.as_numpy()
        out.append(pb_utils.Tensor(t.name(), value.reshape(-1, 1)) if value.ndim < 2 else t)
    return out


def _is_stop(inputs) -> bool:
    """TensorRT-LLM's stop signal: the input `stop` true."""
    return any(t.name() == "stop" and t.as_numpy().any() for t in inputs)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.target = config.get("parameters", {}).get("alias_of", {}).get("string_value", "tensorrt_llm")
        self.outputs = [o["name"] for o in config.get("output", [])]
        self.name = config.get("name", "dasc_hybrid")
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            # each request on its own thread: a batch the dynamic batcher hands one instance runs in the
            # engine's batch together, not one after another
            answers = [None] * len(requests)

            def one(i):
                answers[i] = self._plain(requests[i])
            threads = [threading.Thread(target=one, args=(i,), name="dasc-alias-plain", daemon=True)
                       for i in range(len(requests))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return answers
        for request in requests:
            t = threading.Thread(target=self._stream, args=(request,), name="dasc-alias", daemon=True)
            with self.lock:
                self.threads.add(t)
            t.start()
        return None

    def _request(self, request):
        return pb_utils.InferenceRequest(model_name=self.target, inputs=_inputs(request),
                                         requested_output_names=self.outputs, request_id=request.request_id())

    def _plain(self, request):
        """One plain (non-decoupled) request: the engine model's stream gathered into one response (a
        non-streaming request has one), a client's cancellation forwarded as a stop for its id."""
        try:
            bls.refuse_parameters(request, self.name)
            inputs = _inputs(request)
            for t in inputs:
                if t.name() == "streaming" and t.as_numpy().any():
                    raise UserError("input 'streaming': streaming needs the decoupled model "
                                    "(build without --no-decoupled)")
                if t.name() == "input_ids" and t.as_numpy().ndim > 1 and t.as_numpy().shape[0] > 1:
                    # one response holds one sequence: the engine model answers each entry of a batch on its
                    # own (batch_index), and only its last answer would come back here
                    raise UserError(f"input_ids: a batch of {t.as_numpy().shape[0]} sequences needs the decoupled "
                                    "model (build without --no-decoupled), or send one request per sequence")
            # a stop names the request to end: forwarded with its id unchanged
            is_stop = _is_stop(inputs)
            rid = request.request_id() if is_stop else bls.forward_id(request.request_id(), self.name)
            # Triton 2.51's python backend: InferenceRequest.is_cancelled() in non-decoupled models
            cancelled = getattr(request, "is_cancelled", None)
            last = None
            for response in bls.stream(pb_utils, self.target, inputs, self.outputs, rid,
                                       cancelled=None if is_stop else cancelled):
                if response.has_error():
                    return pb_utils.InferenceResponse(error=response.error())
                last = response
            return pb_utils.InferenceResponse(last.output_tensors() if last is not None else [])
        except Exception as e:  # noqa: BLE001 - the request fails in one line, the model keeps serving
            text = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(text))

    def _stream(self, request):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        try:
            bls.refuse_parameters(request, self.name)
            inputs = _inputs(request)
            # a stop names the request to end: its id goes on unchanged (an empty one is refused there)
            is_stop = _is_stop(inputs)
            rid = request.request_id() if is_stop else bls.forward_id(request.request_id(), self.name)
            error = None
            # closing: the stream's cancellation watch polls sender.is_cancelled() and must stop before the
            # final response (a sender asked anything after it reads freed memory); leaving the loop on an
            # error would keep the watch running until this frame is gone
            with contextlib.closing(bls.stream(pb_utils, self.target, inputs, self.outputs, rid,
                                               cancelled=None if is_stop else sender.is_cancelled)) as responses:
                for response in responses:
                    if response.has_error():
                        error = response.error()
                        break
                    sender.send(pb_utils.InferenceResponse(response.output_tensors()))
            if error is not None:
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            sender.send(flags=final)
        except Exception as e:  # noqa: BLE001 - the request fails in one line, the model keeps serving
            text = str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(text)),
                        flags=final)
        finally:
            with self.lock:
                self.threads.discard(threading.current_thread())

    def finalize(self):
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=30)
