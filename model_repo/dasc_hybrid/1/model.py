"""dasc_hybrid: the earlier name of the tensorrt_llm model, kept so existing clients keep working.

tritonserver 2.51 has no model name aliases, and a second copy of tensorrt_llm's model would load the
engine twice; so this model is a thin BLS forwarder: each request goes to tensorrt_llm (parameter
`alias_of`) with its inputs and id unchanged, and every streamed response comes back as it is. Its
config.pbtxt is tensorrt_llm's filled one under this name (dasc-build writes it:
trtllm_dasc.serve.repository.add_alias). A client's cancellation reaches the engine as a stop for the
forwarded request (trtllm_dasc.serve.bls).
"""
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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.target = config.get("parameters", {}).get("alias_of", {}).get("string_value", "tensorrt_llm")
        self.outputs = [o["name"] for o in config.get("output", [])]
        self.threads = set()
        self.lock = threading.Lock()

    def execute(self, requests):
        if not self.decoupled:
            return [self._plain(r) for r in requests]
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
        try:
            bls.refuse_parameters(request, "dasc_hybrid")
        except UserError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        response = self._request(request).exec()
        if response.has_error():
            return pb_utils.InferenceResponse(error=response.error())
        return pb_utils.InferenceResponse(response.output_tensors())

    def _stream(self, request):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        sender = request.get_response_sender()
        rid = bls.forward_id(request.request_id(), "dasc_hybrid")
        try:
            bls.refuse_parameters(request, "dasc_hybrid")
            for response in bls.stream(pb_utils, self.target, _inputs(request), self.outputs, rid,
                                       cancelled=sender.is_cancelled):
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=response.error()), flags=final)
                    return
                sender.send(pb_utils.InferenceResponse(response.output_tensors()))
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
