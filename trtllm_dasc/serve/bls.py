"""BLS calls from our Python models to the tensorrt_llm model: a stream with cancellation forwarded as a stop.

Triton 2.51's Python backend has no way to cancel a BLS request (its response iterator has no cancel()),
so a client's cancellation of the calling model would leave the engine generating. The calling model
polls its own response sender instead and, once the client cancelled, sends tensorrt_llm a `stop` naming
the forwarded request's id (TensorRT-LLM's stop signal, scoped to that id). A request without an id is
forwarded under a fresh unique one, so the stop can never reach another client's request.

Used by model_repo/dasc_hybrid (the earlier name of tensorrt_llm, forwarding to it) and
model_repo/tensorrt_llm_bls (preprocessing -> tensorrt_llm -> postprocessing).
"""
from __future__ import annotations

import json
import re
import threading
import uuid

import numpy as np

from trtllm_dasc.errors import UserError

POLL_S = 0.05


# a forwarded request's id: the client's id, this mark, a unique suffix. tensorrt_llm answers a stop naming the
# client's id for it too (TensorRT-LLM's rule: a stop names a request by the id its client gave), and the
# cancellation watch's stop names the whole id, so it ends this request only, never another client's under
# the same id (the newest with that id, which the client's id alone named)
FORWARD_MARK = "#dasc-fwd-"


def forward_id(request_id: str, prefix: str) -> str:
    """The id a forwarded request carries: the client's with a unique suffix (FORWARD_MARK), or a unique one
    (an empty id matches no stop)."""
    return f"{request_id}{FORWARD_MARK}{uuid.uuid4().hex}" if request_id else f"{prefix}-{uuid.uuid4().hex}"


# the suffix forward_id adds (its uuid4 hex): a client's own id that merely holds the mark is no forwarded id
_SUFFIX = re.compile(re.escape(FORWARD_MARK) + r"[0-9a-f]{32}\Z")


def forwarded_ids(request_id: str) -> list[str]:
    """The ids a forwarded request was known by, its own first: a forwarder whose core is itself a forwarder
    (tensorrt_llm_bls over dasc_hybrid) adds a suffix each, and a stop naming any of them (the client's, or
    an outer forwarder's cancellation, passed on unchanged) must find it."""
    ids = [request_id]
    while (m := _SUFFIX.search(ids[-1])) is not None and m.start() > 0:
        ids.append(ids[-1][:m.start()])
    return ids


def client_id(request_id: str) -> str:
    """The id the client gave a forwarded request (forward_id's inverse, however many times it was
    forwarded); any other id unchanged."""
    return forwarded_ids(request_id)[-1]


def send_stop(pb_utils, target: str, request_id: str, decoupled: bool = True) -> None:
    """TensorRT-LLM's stop signal (dummy inputs, stop true) for the request ``request_id`` of ``target``."""
    inputs = [pb_utils.Tensor("input_ids", np.zeros((1, 1), np.int32)),
              pb_utils.Tensor("input_lengths", np.zeros((1, 1), np.int32)),
              pb_utils.Tensor("request_output_len", np.zeros((1, 1), np.int32)),
              pb_utils.Tensor("stop", np.ones((1, 1), bool))]
    req = pb_utils.InferenceRequest(model_name=target, inputs=inputs, requested_output_names=["output_ids"],
                                    request_id=request_id)
    if decoupled:
        for _ in req.exec(decoupled=True):
            pass
    else:
        req.exec()


class CancelWatch:
    """While a forwarded stream runs: poll ``cancelled()``; on a cancellation send ``target`` a stop for
    ``request_id`` (once). Stop it (``close``) before the caller's final response: a response sender must
    not be asked anything after its final response."""

    def __init__(self, pb_utils, target: str, request_id: str, cancelled):
        self.pb_utils, self.target, self.request_id, self.cancelled = pb_utils, target, request_id, cancelled
        self.done = threading.Event()
        self.fired = False
        self.thread = threading.Thread(target=self._run, name="dasc-bls-cancel", daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.wait(POLL_S):
            if self.cancelled():
                self.fired = True
                try:
                    send_stop(self.pb_utils, self.target, self.request_id)
                except Exception:  # noqa: BLE001 - the stream ends anyway; nothing to report to
                    pass
                return

    def close(self):
        self.done.set()
        self.thread.join()


def stream(pb_utils, target: str, inputs: list, outputs: list[str], request_id: str, cancelled=None):
    """Responses of a decoupled BLS request to ``target`` (those with tensors or an error), with a client
    cancellation (``cancelled()`` true) forwarded as a stop while it runs."""
    req = pb_utils.InferenceRequest(model_name=target, inputs=inputs, requested_output_names=outputs,
                                    request_id=request_id)
    watch = CancelWatch(pb_utils, target, request_id, cancelled) if cancelled is not None else None
    try:
        for response in req.exec(decoupled=True):
            if response.has_error() or response.output_tensors():
                yield response
    finally:
        if watch is not None:
            watch.close()


# parameters stock clients send that say nothing an input does not (TensorRT-LLM's
# inflight_batcher_llm_client.py sends `Streaming` beside the `streaming` input): accepted, unread
KNOWN_PARAMETERS = frozenset({"Streaming"})


def refuse_parameters(request, model: str) -> None:
    """Triton's HTTP generate turns every JSON key that is no input of the model into a request parameter;
    our models read none, so one is a client's mistake (a misspelt name, an input this model lacks): refused
    in one line naming them rather than silently ignored."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (AttributeError, ValueError):
        return
    unknown = sorted(set(params) - KNOWN_PARAMETERS)
    if unknown:
        names = ", ".join(unknown)
        raise UserError(f"{model}: unknown input(s) or parameter(s) {names} (not inputs of this model)")
