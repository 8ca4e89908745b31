"""The OpenAI frontend's side of HTTP/1.1 (stdlib asyncio): reading a request, its body by Content-Length or
in the chunked transfer coding (RFC 9112 7.1: what clients send for a streamed body, e.g. curl with
`-H "Transfer-Encoding: chunked"`, http.client with an iterable body, httpx with a generator), and answering
a request whose body cannot be read.

A body past the frontend's limit is a 413, a malformed one a 400, another transfer coding a 501, each with
OpenAI's error JSON. The body was then not read to its end, and its rest cannot be told from a next request,
so the connection closes after the answer. A request head (request line and header fields) past MAX_HEAD, or
one line of it past the reader's buffer, is a 431 the same way (h11's, uvicorn's answer to an oversize head).
"""
from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from trtllm_dasc.serve.openai_protocol import APIError

MAX_BODY = 64 << 20
# the largest request head (request line + header fields, in bytes); one line is also bounded by the reader's
# buffer (asyncio.start_server's limit, 64 KiB)
MAX_HEAD = 64 << 10
REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           413: "Payload Too Large", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable"}
# a chunk size is hex digits, then optional ";extensions" (ignored); 16 digits already pass any limit
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
# after refusing a body: how long the client may go on sending it before the connection closes
LINGER_S = 1.0


@dataclass(slots=True)
class Request:
    method: str
    path: str
    body: bytes
    # the connection closes after the answer, which then says `Connection: close` (RFC 9112 9.6): a request with
    # both Transfer-Encoding and Content-Length, a client's `Connection: close`, HTTP/1.0 without keep-alive
    close: bool = False


def response(status: int, payload: dict, close: bool = False) -> bytes:
    """A whole JSON response."""
    data = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n" + ("Connection: close\r\n" if close else "") + "\r\n").encode() + data


async def read_request(reader, writer=None, limit: int = MAX_BODY, head_limit: int = MAX_HEAD) -> Request | None:
    """The next request on the connection (None: the client closed it). A head past ``head_limit`` raises
    APIError 431, a body that cannot be read APIError (413, 400 or 501); ``writer`` answers a client's
    `Expect: 100-continue` before its body is read."""
    seen = [0]
    line = await _head_line(reader, seen, head_limit)
    if not line:
        return None
    parts = line.decode("latin-1").split()
    if len(parts) != 3:
        raise ConnectionError("not an HTTP request")
    headers: dict[str, list[str]] = {}
    while True:
        h = await _head_line(reader, seen, head_limit)
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    method, path = parts[0].upper(), parts[1]
    tokens = {t.strip().lower() for v in headers.get("connection", []) for t in v.split(",")}
    # RFC 9112 9.3: HTTP/1.1 persists unless the client says close; HTTP/1.0 only with keep-alive
    close = "close" in tokens or (parts[2].upper() == "HTTP/1.0" and "keep-alive" not in tokens)
    codings = [c.strip().lower() for v in headers.get("transfer-encoding", []) for c in v.split(",") if c.strip()]
    if codings:
        if codings != ["chunked"]:
            raise APIError(f"the request's Transfer-Encoding {', '.join(codings)!r} is not supported (only chunked)",
                           None, 501)
        await _continue(headers, writer)
        body = await _chunked(reader, limit)
        # RFC 9112 6.3: Transfer-Encoding overrides a Content-Length, and the connection closes after the answer
        return Request(method, path, body, close=close or "content-length" in headers)
    length = _content_length(headers.get("content-length", []), limit)
    if length:
        await _continue(headers, writer)
    return Request(method, path, await reader.readexactly(length) if length else b"", close)


async def _head_line(reader, seen: list[int], limit: int) -> bytes:
    """One line of the request head; ``seen[0]`` counts the head's bytes so far. A line past the reader's
    buffer raised ValueError out of the handler, and the connection dropped with no answer."""
    try:
        line = await reader.readline()
    except ValueError:        # longer than the reader's buffer (64 KiB): readline dropped what it held
        raise _head_too_large(limit) from None
    seen[0] += len(line)
    if seen[0] > limit:
        raise _head_too_large(limit)
    return line


def _head_too_large(limit: int) -> APIError:
    return APIError(f"the request's header fields are too large; this server takes at most {limit} bytes of "
                    "request line and headers", None, 431)


def _too_large(size: str, limit: int) -> APIError:
    return APIError(f"the request body has {size} bytes; this server takes at most {limit}", None, 413)


def _content_length(values: list[str], limit: int) -> int:
    if not values:
        return 0
    # one value, or repeats of the same one (RFC 9112 6.3); anything else is a 400 (it raised out of the handler)
    if len(set(values)) != 1 or not re.fullmatch(r"[0-9]{1,20}", values[0]):
        raise APIError(f"the request's Content-Length {', '.join(values)!r} is not a byte count", None)
    length = int(values[0])
    if length > limit:
        raise _too_large(str(length), limit)
    return length


async def _continue(headers: dict, writer) -> None:
    # curl asks before sending a large or chunked body (Expect: 100-continue) and waits a second for this
    if writer is not None and any(v.lower() == "100-continue" for v in headers.get("expect", [])):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()


async def _line(reader) -> bytes:
    try:
        line = await reader.readline()
    except ValueError:        # longer than the reader's buffer (64 KiB)
        raise APIError("a line of the chunked request body is too long", None) from None
    if not line.endswith(b"\n"):
        raise asyncio.IncompleteReadError(line, None)      # the client left mid-body
    return line


async def _chunked(reader, limit: int) -> bytes:
    """A chunked body, de-chunked: size line, data, CRLF, ..., a zero size line, trailer fields (ignored)."""
    body = bytearray()
    while True:
        size = (await _line(reader)).split(b";", 1)[0].strip()
        if not _CHUNK_SIZE.fullmatch(size):
            raise APIError(f"the chunked request body has a malformed chunk size line {size[:32]!r}", None)
        n = int(size, 16)
        if n == 0:
            break
        if len(body) + n > limit:
            raise _too_large(f"more than {limit}", limit)
        body += await reader.readexactly(n)
        if await _line(reader) not in (b"\r\n", b"\n"):
            raise APIError("a chunk of the request body is longer than its size line says", None)
    while await _line(reader) not in (b"\r\n", b"\n"):
        pass
    return bytes(body)


async def refuse(reader, writer, error: APIError) -> None:
    """Answer a request whose head or body was not read to its end, then close (lingering: see linger)."""
    try:
        writer.write(response(error.status, error.body(), close=True))
        await writer.drain()
    except OSError:
        return
    await linger(reader, writer)


async def linger(reader, writer) -> None:
    """Before closing a connection that the client may still be sending on (the rest of a refused body, a
    pipelined next request): its data is read and dropped for up to LINGER_S, since closing a socket with
    unread data resets it, and the client would see the reset instead of the answer (nginx's lingering close)."""
    loop = asyncio.get_running_loop()
    try:
        if writer.can_write_eof():
            writer.write_eof()
        end = loop.time() + LINGER_S
        while loop.time() < end and await asyncio.wait_for(reader.read(1 << 16), end - loop.time()):
            pass
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        pass
