"""A forwarding model's final response comes after its cancellation watch has stopped.

After a decoupled model's final response its response sender belongs to Triton again: asking it anything
(the watch polls sender.is_cancelled()) reads freed memory, a segfault seen under load
(model_repo/tensorrt_llm/1/model.py, DecoupledSink). When tensorrt_llm answered with an error, dasc_hybrid
and the text models (tensorrt_llm_bls, ensemble) sent their final error response while the watch of the
forwarded stream still ran. These tests run the real model code against a stand-in for Triton's Python
backend module whose sender records any question asked after the final response, and holds the final send
open long enough for a running watch to poll it.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest

from trtllm_dasc.serve import bls

REPO = Path(__file__).resolve().parents[2]
FINAL = 1


class Tensor:
    def __init__(self, name, value):
        self._name, self._value = name, np.asarray(value)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._value


class TritonError:
    def __init__(self, message):
        self._message = message

    def message(self):
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self._tensors, self._error = list(output_tensors or []), error

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def output_tensors(self):
        return self._tensors


def fake_backend(core_responses):
    """A triton_python_backend_utils stand-in: BLS calls to the core model stream ``core_responses``;
    preprocessing answers fixed ids; a stop is answered with nothing."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse = Tensor, TritonError, InferenceResponse
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    pb.using_decoupled_model_transaction_policy = lambda config: True
    pb.get_output_tensor_by_name = lambda r, name: next(t for t in r.output_tensors() if t.name() == name)

    class InferenceRequest:
        def __init__(self, model_name, inputs, requested_output_names, request_id=""):
            self.model_name, self.inputs = model_name, inputs

        def exec(self, decoupled=False):
            if self.model_name == "preprocessing":
                ids = {"INPUT_ID": [[5, 6]], "REQUEST_INPUT_LEN": [[2]], "REQUEST_OUTPUT_LEN": [[4]]}
                return InferenceResponse([Tensor(k, np.array(v, np.int32)) for k, v in ids.items()])
            if any(t.name() == "stop" for t in self.inputs):
                return iter(())
            return iter(list(core_responses))
    pb.InferenceRequest = InferenceRequest
    return pb


class RecordingSender:
    """A response sender that notes any question asked after its final response; the final send lasts
    50 ms, as a loaded server's may, so a watch still running polls within it."""

    def __init__(self):
        self.final_sent = False
        self.asked_after_final = 0
        self.responses = []

    def send(self, response=None, flags=0):
        self.responses.append((response, flags))
        if flags & FINAL:
            self.final_sent = True
            time.sleep(0.05)

    def is_cancelled(self):
        if self.final_sent:
            self.asked_after_final += 1
        return False


class Request:
    def __init__(self, tensors, sender):
        self._tensors, self._sender = tensors, sender

    def request_id(self):
        return "client-1"

    def inputs(self):
        return self._tensors

    def parameters(self):
        return "{}"

    def get_response_sender(self):
        return self._sender


ERROR_STREAM = [InferenceResponse(error=TritonError("engine refused the request"))]


@pytest.fixture
def fast_watch(monkeypatch):
    # the watch polls every millisecond: a running watch surely polls during the 50 ms final send
    monkeypatch.setattr(bls, "POLL_S", 0.001)


def load_dasc_hybrid(monkeypatch, pb):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("dasc_hybrid_model_under_test",
                                                  REPO / "model_repo/dasc_hybrid/1/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dasc_hybrid_stops_its_watch_before_the_final_error(monkeypatch, fast_watch):
    module = load_dasc_hybrid(monkeypatch, fake_backend(ERROR_STREAM))
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps({"name": "dasc_hybrid", "output": [{"name": "output_ids"}]})})
    sender = RecordingSender()
    request = Request([Tensor("input_ids", [[5, 6]]), Tensor("input_lengths", [2]),
                       Tensor("request_output_len", [4])], sender)
    stream_and_check(model, request, sender)


def test_text_model_stops_its_watch_before_the_final_error(monkeypatch, fast_watch):
    from trtllm_dasc.serve import text_bls
    monkeypatch.setattr(text_bls, "pb_utils", fake_backend(ERROR_STREAM))
    model = text_bls.TextModel()
    model.initialize({"model_config": json.dumps({"name": "tensorrt_llm_bls",
                                                  "output": [{"name": "text_output"}]})})
    sender = RecordingSender()
    request = Request([Tensor("text_input", np.array([["hello"]], dtype=object)),
                       Tensor("max_tokens", np.array([[4]], np.int32))], sender)
    stream_and_check(model, request, sender)


def stream_and_check(model, request, sender):
    """Run the model's stream thread body here; one final error response, and no question after it."""
    model.threads.add(threading.current_thread())
    model._stream(request)
    assert sender.final_sent
    (response, flags), = sender.responses
    assert flags == FINAL and response.has_error() and "refused" in response.error().message()
    assert sender.asked_after_final == 0
