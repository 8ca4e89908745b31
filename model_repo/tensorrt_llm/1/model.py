"""tensorrt_llm: the Triton Python model that serves a dasc engine directory (TensorRT-LLM's tensorrt_llm
model, name and I/O; model_repo/dasc_hybrid, its earlier name, forwards to it). Thin, like TensorRT-LLM's tensorrt_llm/1/model.py: convert each request, hand it to the
engine host, send its events back through the response sender; cancellations become aborts; finalize
drains. Everything else lives in trtllm_dasc.serve (host.py, convert.py, metrics.py).
"""
import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.bls import refuse_parameters
from trtllm_dasc.serve.host import EngineHost, engine_config
from trtllm_dasc.serve.metrics import EngineMetrics


def _param(config: dict, key: str, default: str = "") -> str:
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("${") else value


def _policy(engine_dir: str) -> str:
    from trtllm_dasc.serve.repository import cache_policy
    cfg = engine_config(engine_dir)
    return cache_policy(cfg.wmax, cfg.policy, cfg.codec, cfg.precision, cfg.conv_codec)


class DecoupledSink:
    """Responses through the request's response sender (decoupled mode). After the final response the
    sender belongs to Triton again: asking it anything then reads freed memory (a segfault seen under
    load when the cancellation watcher polled a just-finished request), so a lock orders the final send
    against every later question."""

    def __init__(self, request, extra=None):
        self.extra = extra or {}
        self.sender = request.get_response_sender()
        self.lock = threading.Lock()
        self.closed = False

    def send(self, tensors, error, final):
        with self.lock:
            if self.closed:
                return
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            if error is not None:
                self.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), flags=flags)
            elif tensors is not None and not (final and self.sender.is_cancelled()):
                tensors = {**tensors, **self.extra}
                self.sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in tensors.items()]),
                                 flags=flags)
            else:
                # nothing to say, or the client cancelled (it reads no more): the final flag alone
                self.sender.send(flags=flags)
            self.closed = final

    def cancelled(self):
        with self.lock:
            return not self.closed and self.sender.is_cancelled()


class CollectSink:
    """One response returned from execute (non-decoupled mode, for clients using plain infer)."""

    def __init__(self, extra=None):
        self.extra = extra or {}
        self.done, self.response = threading.Event(), None

    def send(self, tensors, error, final):
        if error is not None:
            self.response = pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
        elif tensors is not None:
            tensors = {**tensors, **self.extra}
            self.response = pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in tensors.items()])
        if final:
            if self.response is None:
                self.response = pb_utils.InferenceResponse([])
            self.done.set()

    def cancelled(self):
        return False


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        engine_dir = _param(config, "engine_dir")
        if not os.path.isabs(engine_dir):
            # relative to this model's directory (an engine directory holds its own repository)
            engine_dir = os.path.join(args["model_repository"], engine_dir)
        exclude = _param(config, "exclude_input_in_output", "false").lower() == "true"
        # how a cached prefix is restored (lossy unless W_max 0 and the native codec), on every response
        # whose config declares dasc_policy (an engine directory built before it does not)
        self.extra = {}
        if any(o["name"] == "dasc_policy" for o in config.get("output", [])):
            # the engine runs what its config.json says; the build wrote the same line into config.pbtxt, where
            # Triton's model config shows it. They differ only when one was edited after the build: a response
            # would then name a policy the engine does not run, so the model refuses to load (before the engine
            # loads and warms up)
            policy, baked = _policy(os.path.normpath(engine_dir)), _param(config, "dasc_policy")
            if baked and baked != policy:
                raise UserError(f"the engine's config.json serves '{policy}' but this model's config.pbtxt says "
                                f"dasc_policy '{baked}': the engine directory was edited after its build; "
                                "rebuild it with dasc-build")
            self.extra["dasc_policy"] = np.array([[policy.encode()]], dtype=object)
        self.host = EngineHost(os.path.normpath(engine_dir), decoupled=self.decoupled,
                               exclude_input_default=exclude)
        # TensorRT-LLM's nv_trt_llm_* series carry the model's name and version as its backend sets them
        self.metrics = EngineMetrics(pb_utils, self.host, model=args["model_name"], version=args["model_version"])

    def execute(self, requests):
        sinks = []
        for request in requests:
            inputs = {t.name(): t.as_numpy() for t in request.inputs()}
            sink = DecoupledSink(request, self.extra) if self.decoupled else CollectSink(self.extra)
            try:
                # over HTTP generate a JSON key that is no input arrives as a parameter: refused, not ignored
                refuse_parameters(request, "tensorrt_llm")
            except UserError as e:
                sink.send(None, str(e), True)
            else:
                self.host.submit(inputs, request.request_id(), sink)
            sinks.append(sink)
        if self.decoupled:
            return None
        for sink in sinks:
            sink.done.wait()
        return [sink.response for sink in sinks]

    def finalize(self):
        self.metrics.stop()
        self.host.shutdown()
        # the stub's interpreter exits next, and Triton waits for it (the unload, so the server's stop): its
        # final garbage collections walk every object torch and the engine made (1.5-3 s on a 2-core CPU,
        # 0.3 s frozen). Nothing of this process is used after finalize, and nothing we rely on is freed by
        # the collector at exit (the server removes its shared-memory regions itself)
        import gc
        gc.freeze()
