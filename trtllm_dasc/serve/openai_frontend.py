"""An OpenAI-compatible HTTP frontend in front of the Triton server (as Triton's OpenAI frontend and
`trtllm-serve` offer one): /v1/completions, /v1/chat/completions (SSE streaming: `data: {...}` chunks,
then `data: [DONE]`), /v1/models, /health.

Stdlib asyncio only, on its own thread. It tokenizes with the engine's own tokenizer (the one the
ensemble's preprocessing loads, same special tokens) and streams from the core model's generate_stream
(Triton HTTP, SSE) on loopback, so it knows token counts, the finish reason and `cached_tokens`
(reported as usage.prompt_tokens_details.cached_tokens). Text is detokenized incrementally (a piece that
ends inside a UTF-8 character waits for the next token); stop strings are matched on the text, held back
until they cannot start a stop string, and end the request by closing its upstream stream, which cancels
it in the engine. Request validation lives in openai_protocol.py, chat templates in openai_chat.py, reading
HTTP requests (Content-Length or chunked bodies) in openai_http.py.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid

from trtllm_dasc.engine_dir import read as read_engine_dir
from trtllm_dasc.errors import UserError
from trtllm_dasc.serve.openai_chat import ChatTemplate, chat_options
from trtllm_dasc.serve.openai_http import MAX_BODY, MAX_HEAD, linger, read_request, refuse, response
from trtllm_dasc.serve.openai_protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS, APIError, GenRequest, common_fields, max_tokens, prompts)
from trtllm_dasc.serve.repository import streaming_model
from trtllm_dasc.serve.token_bytes import TokenBytes
from trtllm_dasc.serve.tokenizer import TextTokenizer

# the Triton model names a client may also put in 'model' (Triton's OpenAI frontend lists those)
ALIASES = ("ensemble", "tensorrt_llm", "dasc_hybrid")


class Frontend:
    def __init__(self, engine_dir: str, triton_http: str, name: str | None = None):
        found = read_engine_dir(engine_dir)
        self.max_context = int(found.engine.get("max_context", 4096))
        # a --no-decoupled engine's tensorrt_llm answers plain requests only: stream from the engine's own model
        self.core_model = streaming_model(found.serving["decoupled"])
        tok_dir = found.model_dir
        self.tok = TextTokenizer(tok_dir)
        self.token_bytes = TokenBytes(self.tok.tok)
        self.template = ChatTemplate(tok_dir)
        self.name = name or os.path.basename(os.path.normpath(found.source or engine_dir))
        self.created = int(os.path.getmtime(found.config_path))
        host, _, port = triton_http.rpartition(":")
        self.upstream = (host.strip("[]"), int(port))
        # the largest request body taken (a larger one is a 413)
        self.max_body = MAX_BODY
        # the largest request head taken (a larger one is a 431)
        self.max_head = MAX_HEAD

    # --- upstream: the core model's generate_stream --------------------------------------------------------
    async def generate(self, req: GenRequest):
        """Yields (new text, new token count, cached_tokens, finish_reason or None, log-prob entries) per
        upstream response; an entry is (token id, log prob or None, [(id, log prob)] alternatives or None)."""
        try:
            reader, writer = await asyncio.open_connection(*self.upstream)
        except OSError as e:
            raise APIError(f"the Triton server at {self.upstream[0]}:{self.upstream[1]} is not reachable "
                           f"({e.strerror or e})", None, 503, "server_error") from None
        try:
            body = json.dumps(req.triton_inputs(self.tok.end_id)).encode()
            writer.write(f"POST /v2/models/{self.core_model}/generate_stream HTTP/1.1\r\nHost: localhost\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
            try:
                status, headers = await _read_head(reader)
            except (OSError, asyncio.IncompleteReadError):
                raise APIError("the Triton server closed the connection", None, 503, "server_error") from None
            if status != 200:
                raise _upstream_error((await _read_body(reader, headers)).decode(errors="replace"), status)
            ids, emitted, text, hold = [], 0, "", max((len(s) for s in req.stop), default=1) - 1
            # echo: the prompt's text leads the first piece; its tokens' log probs lead the first entries
            lead, prompt_lps = [req.echo_text or ""], req.prompt_logprobs
            async for event in _sse(reader, headers.get("transfer-encoding", "") == "chunked"):
                if "error" in event:
                    raise _upstream_error(json.dumps(event), 400)
                # max_tokens 0 (echo): the one token generated for the prompt's logits is not the client's
                new = _flat(event.get("output_ids")) if req.max_tokens > 0 else []
                lps = []
                if prompt_lps and event.get("context_logits") is not None:
                    lps, prompt_lps = self.prompt_logprobs(req, event["context_logits"]), False
                if req.logprobs is not None and new:
                    lps += self.token_logprobs(new, event.get("generation_logits"), req.logprobs)
                ids += new
                cached = _first(event.get("cached_tokens"))
                reason = _first(event.get("finish_reason"))
                text = self.tok.decode(ids)

                def out(piece, reason):
                    first, lead[0] = lead[0], ""
                    return first + piece, len(new), cached, reason, lps
                if text.endswith("\ufffd") and reason is None:
                    # the last token ends inside a UTF-8 character: wait for the rest of it
                    yield out("", None)
                    continue
                cut = min((i for i in (text.find(s) for s in req.stop) if i >= 0), default=-1)
                if cut >= 0 and cut >= emitted:
                    yield out(text[emitted:cut], "stop")
                    return
                safe = len(text) if reason is not None else max(emitted, len(text) - hold)
                piece, emitted = text[emitted:safe], max(emitted, safe)
                if reason is not None:
                    # the engine's 'length' and 'stop' (end_id / stop words) are OpenAI's; 'cancelled' stays
                    yield out(piece, reason)
                    return
                yield out(piece, None)
            raise APIError("the server ended the stream without a final response", None, 500, "server_error")
        finally:
            # closing an unfinished stream cancels the request in the engine
            writer.close()

    # --- log probs: log-softmax of the engine's raw logits, in float64 -----------------------------------
    def prompt_logprobs(self, req: GenRequest, logits) -> list:
        """The prompt's entries from its context logits (row j predicts token j + 1); the first has none."""
        ids = req.prompt_ids
        rows = _log_softmax(logits, len(ids))
        return [(ids[0], None, None)] + [_entry(ids[j], rows[j - 1], req.logprobs) for j in range(1, len(ids))]

    def token_logprobs(self, new: list[int], logits, top: int) -> list:
        """The generated tokens' entries from their generation logits (one row per token of the event)."""
        if logits is None:
            raise APIError("the engine returned no generation logits for a log-prob request", None, 500, "server_error")
        rows = _log_softmax(logits, len(new))
        return [_entry(t, rows[k], top) for k, t in enumerate(new)]

    def token_text(self, token: int) -> str:
        return self.tok.decode([token], skip_special_tokens=False)

    def completion_logprobs(self, entries: list, offset: int) -> tuple[dict, int]:
        """OpenAI's completions form: tokens, token_logprobs, top_logprobs ({text: log prob}, the chosen
        token included, as vLLM), text_offset (continuing from offset); and the next offset."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, lp, top in entries:
            text = self.token_text(token)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["top_logprobs"].append(None if top is None else
                                       {**{self.token_text(t): v for t, v in top}, text: lp})
            out["text_offset"].append(offset)
            # a special token (BOS) is not in the choice's text
            offset += len(self.tok.decode([token]))
        return out, offset

    def chat_logprobs(self, entries: list) -> dict:
        """OpenAI's chat form: content = [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}];
        bytes are the token's own (a byte token's raw byte, not its text's U+FFFD: token_bytes.py)."""
        def one(t, v):
            text = self.token_text(t)
            return {"token": text, "logprob": v, "bytes": list(self.token_bytes(t, text))}
        return {"content": [{**one(t, lp), "top_logprobs": [one(a, v) for a, v in top or []]}
                            for t, lp, top in entries]}

    # --- request handlers ----------------------------------------------------------------------------------
    def check_model(self, body: dict) -> str:
        model = body.get("model")
        if model is not None and model != self.name and model not in ALIASES:
            raise APIError(f"the model '{model}' does not exist (this server has '{self.name}')", "model", 404,
                           code="model_not_found")
        return self.name

    def requests(self, body: dict, chat: bool) -> tuple[dict, list[GenRequest]]:
        fields = common_fields(body, chat)
        self.check_model(body)
        if chat:
            add, cont = chat_options(body)
            text, special = self.template.render(body.get("messages"), add, cont)
            # the reply's role, as vLLM's get_chat_request_role: the assistant's after a generation prompt,
            # else the last message's (the turn the model writes on; messages were checked by render)
            fields["role"] = "assistant" if add else body["messages"][-1]["role"]
            ids_list = [self.tok.encode(text, add_special_tokens=special)]
        else:
            ids_list = prompts(body, self.tok)
        default = None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
        reqs = [GenRequest(ids, max_tokens(body, len(ids), self.max_context, default, fields["echo"]),
                           **fields["sampling"]) for ids in ids_list]
        if fields["echo"]:
            # the prompt as the client sent it (text), else its tokens decoded
            given = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            for r, p in zip(reqs, given if all(isinstance(p, str) for p in given) else [None] * len(reqs)):
                r.echo_text = p if p is not None else self.tok.decode(r.prompt_ids)
        return fields, reqs

    async def run_all(self, reqs):
        """Merges every prompt's stream: (choice index, piece, new tokens, cached, finish_reason)."""
        queue: asyncio.Queue = asyncio.Queue()

        async def one(i, req):
            try:
                async for item in self.generate(req):
                    await queue.put((i, *item))
            except BaseException as e:   # noqa: BLE001  (re-raised by the consumer)
                await queue.put((i, e))

        tasks = [asyncio.create_task(one(i, r)) for i, r in enumerate(reqs)]
        done = 0
        try:
            while done < len(reqs):
                item = await queue.get()
                if isinstance(item[1], BaseException):
                    raise item[1]
                if item[4] is not None:
                    done += 1
                yield item
        finally:
            for t in tasks:
                t.cancel()

    async def completion(self, body: dict, chat: bool, send, reader=None):
        fields, reqs = self.requests(body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        head = {"id": rid, "object": obj + (".chunk" if chat and fields["stream"] else ""), "created": created,
                "model": self.name}
        usage = {"prompt": sum(len(r.prompt_ids) for r in reqs), "completion": 0, "cached": [0] * len(reqs)}

        def usage_json():
            return {"prompt_tokens": usage["prompt"], "completion_tokens": usage["completion"],
                    "total_tokens": usage["prompt"] + usage["completion"],
                    "prompt_tokens_details": {"cached_tokens": sum(usage["cached"])}}

        offsets = [0] * len(reqs)

        def choice(i, piece, reason, entries):
            lp = None
            if reqs[i].logprobs is not None:
                if chat:
                    lp = self.chat_logprobs(entries)
                else:
                    lp, offsets[i] = self.completion_logprobs(entries, offsets[i])
            if chat:
                key = "delta" if fields["stream"] else "message"
                msg = {"content": piece} if fields["stream"] else {"role": fields["role"], "content": piece}
                return {"index": i, key: msg, "logprobs": lp, "finish_reason": reason}
            return {"index": i, "text": piece, "logprobs": lp, "finish_reason": reason}

        stream = self.run_all(reqs)
        try:
            await self._answer(stream, fields, head, usage, usage_json, choice, len(reqs), chat, send, reader)
        finally:
            # a client gone mid-stream: close the upstream streams now (which cancels them in the engine)
            await stream.aclose()

    async def _answer(self, stream, fields, head, usage, usage_json, choice, n_reqs, chat, send, reader=None):
        if not fields["stream"]:
            texts, reasons, entries = [""] * n_reqs, [None] * n_reqs, [[] for _ in range(n_reqs)]

            async def collect():
                async for i, piece, n, cached, reason, lps in stream:
                    texts[i] += piece
                    entries[i] += lps
                    usage["completion"] += n
                    usage["cached"][i] = cached if cached is not None else usage["cached"][i]
                    reasons[i] = reason or reasons[i]
            await _unless_client_leaves(collect(), reader)
            await send(200, {**head, "choices": [choice(i, t, r, e) for i, (t, r, e) in
                                                         enumerate(zip(texts, reasons, entries))],
                             "usage": usage_json()})
            return
        # the first upstream response decides whether the request is good (a 400) or streams (200 + SSE)
        first = await stream.__anext__()
        events = await send(200, None)
        if chat:
            for i in range(n_reqs):
                await events({**head, "choices": [{"index": i, "delta": {"role": fields["role"], "content": ""},
                                                   "logprobs": None, "finish_reason": None}],
                              # include_usage: every chunk but the last has usage null (OpenAI's reference)
                              **({"usage": None} if fields["include_usage"] else {})})
        item = first
        while item is not None:
            i, piece, n, cached, reason, lps = item
            usage["completion"] += n
            usage["cached"][i] = cached if cached is not None else usage["cached"][i]
            if piece or lps or reason is not None:
                await events({**head, "choices": [choice(i, piece, reason, lps)],
                              **({"usage": None} if fields["include_usage"] else {})})
            item = await anext(stream, None)
        if fields["include_usage"]:
            await events({**head, "choices": [], "usage": usage_json()})
        await events(None)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                            "owned_by": "trtllm-dasc", "max_model_len": self.max_context}]}

    # --- HTTP ------------------------------------------------------------------------------------------------
    async def handle(self, reader, writer):
        try:
            while True:
                try:
                    request = await read_request(reader, writer, self.max_body, self.max_head)
                except APIError as e:   # a head or body too large or malformed: answered, then the connection closes
                    await refuse(reader, writer, e)
                    return
                if request is None:
                    return
                keep = await self.respond(writer, request.method, request.path, request.body, reader=reader,
                                          close=request.close)
                if request.close:
                    await linger(reader, writer)
                    return
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # stop(): the frontend is closing; ending quietly keeps asyncio from logging the cancel
            pass
        finally:
            writer.close()

    async def respond(self, writer, method, path, body, reader=None, close: bool = False) -> bool:
        """Serves one request; False when the connection must close (after a stream). ``reader``: the
        connection's, watched for the client leaving while a non-streaming answer is generated. ``close``: the
        connection closes after this answer, so it says `Connection: close` (a client reading to the end of a
        kept connection would otherwise see a reset or wait for a next answer that never comes)."""
        state = {"streamed": False}

        async def send(status, payload):
            if payload is not None:
                writer.write(response(status, payload, close))
                await writer.drain()
                return None
            state["streamed"] = True
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                         b"Connection: close\r\n\r\n")

            async def event(obj):
                writer.write(b"data: [DONE]\n\n" if obj is None else b"data: " + json.dumps(obj).encode() + b"\n\n")
                await writer.drain()
            return event

        path = path.split("?", 1)[0].rstrip("/")
        try:
            if path in ("/v1/completions", "/v1/chat/completions"):
                if method != "POST":
                    raise APIError(f"{path} takes POST", None, 405)
                try:
                    payload = json.loads(body or b"null")
                except ValueError as e:
                    raise APIError(f"the request body is not JSON ({e})", None) from None
                await self.completion(payload, path.endswith("chat/completions"), send, reader)
            elif path == "/v1/models" and method == "GET":
                await send(200, self.models())
            elif path.startswith("/v1/models/") and method == "GET":
                model = path[len("/v1/models/"):]
                self.check_model({"model": model})
                await send(200, self.models()["data"][0])
            elif path in ("/health", "/v1/health") and method == "GET":
                await send(200, {"status": "ok"})
            else:
                raise APIError(f"no route {method} {path}", None, 404, code="not_found")
        except APIError as e:
            if state["streamed"]:
                # headers are out: the error goes in the stream, as OpenAI's servers do
                writer.write(b"data: " + json.dumps(e.body()).encode() + b"\n\ndata: [DONE]\n\n")
            else:
                await send(e.status, e.body())
        except ConnectionError:
            return False
        except Exception as e:  # noqa: BLE001  an unexpected failure is this request's, not the server's
            err = APIError(f"internal error: {type(e).__name__}: {e}".splitlines()[0], None, 500, "server_error")
            if state["streamed"]:
                writer.write(b"data: " + json.dumps(err.body()).encode() + b"\n\n")
            else:
                await send(500, err.body())
        return not state["streamed"]


def _upstream_error(text: str, status: int) -> APIError:
    try:
        message = json.loads(text).get("error", text)
    except (ValueError, AttributeError):
        message = text
    message = str(message).strip().splitlines()[0] if str(message).strip() else f"HTTP {status}"
    # the core model names its own input ('input_ids', 'runtime_top_k', ...): a bad request's error
    return APIError(message, None, 400 if status < 500 or "input" in message else 500,
                    "invalid_request_error" if status < 500 else "server_error")


def _log_softmax(logits, n_rows: int):
    """Rows of log-probabilities from Triton's JSON logits (nested or flat lists) of n_rows rows."""
    import numpy as np
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if n_rows < 1 or x.size % n_rows:
        raise APIError(f"the engine returned {x.size} logits for {n_rows} tokens", None, 500, "server_error")
    x = x.reshape(n_rows, -1)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def _entry(token: int, row, top: int | None) -> tuple:
    """(token, its log prob, the top alternatives); -inf becomes -9999.0 as vLLM (JSON has no infinity)."""
    import numpy as np
    best = np.argsort(-row, kind="stable")[:top or 0]
    return token, max(float(row[token]), -9999.0), [(int(t), max(float(row[t]), -9999.0)) for t in best]


def _flat(value) -> list[int]:
    out = []
    stack = [value] if value is not None else []
    while stack:
        v = stack.pop(0)
        if isinstance(v, list):
            stack[:0] = v
        else:
            out.append(int(v))
    return out


def _first(value):
    while isinstance(value, list):
        value = value[0] if value else None
    return value


async def _unless_client_leaves(work, reader, poll_s: float = 0.1) -> None:
    """Await ``work`` (a non-streaming answer being generated); if the client closes its connection first,
    cancel it and raise ConnectionError (the caller's close of the upstream streams then cancels the requests
    in the engine, as a streaming client's failed write does). A non-streaming client that timed out used to
    hold its batch slot and KV until max_tokens. The reader's EOF is polled, not read: a pipelined next request
    stays in its buffer."""
    task = asyncio.ensure_future(work)
    if reader is None:
        await task
        return
    while not task.done():
        await asyncio.wait({task}, timeout=poll_s)
        if not task.done() and reader.at_eof():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            raise ConnectionError("the client closed the connection before the answer")
    task.result()


async def _read_head(reader) -> tuple[int, dict]:
    line = await reader.readline()
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        raise APIError("the Triton server closed the connection", None, 503, "server_error")
    headers = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip().lower()
    return int(parts[1]), headers


async def _pieces(reader, chunked: bool):
    """A response body's bytes as they arrive, the chunked transfer encoding removed."""
    while True:
        if chunked:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
        else:
            data = await reader.read(65536)
            if not data:
                return
            yield data


async def _read_body(reader, headers: dict) -> bytes:
    """A whole (error) response body, at most MAX_BODY bytes: de-chunked (Triton chunks its error bodies
    too: read raw, the message was the chunk's size line), by Content-Length, or what arrives at once."""
    out = b""
    try:
        if headers.get("transfer-encoding", "") == "chunked":
            async for data in _pieces(reader, True):
                out += data
                if len(out) >= MAX_BODY:
                    break
            return out[:MAX_BODY]
        if headers.get("content-length", "").isdigit():
            return await reader.readexactly(min(int(headers["content-length"]), MAX_BODY))
        return await reader.read(MAX_BODY)
    except asyncio.IncompleteReadError as e:       # cut short: what came is still the best message
        return out + e.partial
    except ValueError:                             # a malformed chunk size line
        return out


async def _sse(reader, chunked: bool):
    """Triton's generate_stream events as dicts."""
    buf = b""
    async for data in _pieces(reader, chunked):
        buf += data
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            for line in block.split(b"\n"):
                if line.startswith(b"data:"):
                    yield json.loads(line[5:])


class FrontendThread:
    """The frontend on its own event loop thread; `stop()` closes the listening socket and the loop."""

    def __init__(self, frontend: Frontend, host: str, port: int):
        self.frontend, self.loop = frontend, asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(frontend.handle, host, port))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, name="openai-frontend", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if not self.loop.is_running():
            return

        async def close():
            self.server.close()
            # the open connections' handlers (keep-alive clients) end here, not at exit on a closed loop
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()
        asyncio.run_coroutine_threadsafe(close(), self.loop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()


def start_frontend(engine_dir: str, triton_http: str, host: str = "127.0.0.1", port: int = 0,
                   name: str | None = None) -> FrontendThread:
    """Serve the OpenAI API on host:port (0: a free port; see .port) for the engine tritonserver serves."""
    frontend = Frontend(engine_dir, triton_http, name)
    try:
        return FrontendThread(frontend, host, port)
    except OSError as e:
        raise UserError(f"--openai-port {port}: cannot listen on {host}:{port} ({e.strerror or e})") from None
