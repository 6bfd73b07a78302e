"""`minillm serve`'s HTTP side: Starlette on uvicorn (the ASGI stack vLLM and SGLang serve with).

Handlers parse and check a request, hand it to the engine loop (serving/loop.py, one thread that
owns the model) and stream back what the loop sends; they never touch the model. Routes:
POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health, /metrics.

What the stack is trusted with, and what this module adds on top (`Limits`):
  parsing       h11 (uvicorn's HTTP/1.1 parser): one Content-Length, digits only; chunked bodies;
                an unread body is discarded, never read as the next request; headers over
                `max_header` bytes get 431 (414 when the request line alone is too long)
  timeouts      `request_timeout`: from a connection's first byte (or its opening) to the whole
                request, headers and body, read: slow or silent clients are closed (408 if they
                had started a request); `keep_alive`: idle seconds between requests
  connections   past `max_connections` open at once, a new connection is answered 503 (JSON,
                Retry-After) and closed, after at most one second of waiting for its request
  backlog       `backlog` connections may wait in the kernel to be accepted
  errors        every status, the parser's own included, is an OpenAI-style JSON body
  work          a request waits for its first token at most `max_queue_wait` seconds (else 503
                and its sequence is cancelled); one whose expected wait is already longer is
                refused at once with 429 and Retry-After; a client that leaves, streaming or not,
                has its sequence cancelled at the engine's next step
  who           an API key (Bearer, compared in constant time); bound to loopback, a Host that is
                not a loopback name is refused (DNS rebinding), and so is any request whose Origin
                is not the Host it was sent to (a web page posting cross-site); POST bodies must be
                application/json (a form or text/plain post from a page is refused)
  templates     a chat template renders in a worker process with a time and size budget
                (minillm.chat), awaited from a thread: the event loop never runs one
  shutdown      at SIGTERM new requests get 503; running ones have `grace` seconds to finish, and
                shortly before it ends the engine cancels what is left, so every client still gets a
                proper ending: a plain request a JSON 503, a stream a last chunk with finish_reason
                "abort" (vLLM's name for a request the server ended) and `data: [DONE]`
  descriptors   out of file descriptors, a failed accept() is logged once per `FD_LOG_INTERVAL`
                seconds with a count (asyncio would log a traceback for every try)
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import hmac
import ipaddress
import json
import math
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..bpe import tokenizer
from .chat_api import chat_chunk, chat_completion, new_chat_id, parse_chat
from .api import ApiError, completion, error_body, models, new_id, parse_completion, parse_json, usage
from .loop import EngineLoop

GONE = 499                          # nginx's "client closed request": logged, never sent, not a rejection
METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
FD_LOG_INTERVAL = 10.0             # seconds between two "out of file descriptors" lines
SHUTDOWN_MARGIN = 1.0              # seconds before the grace period ends that running requests are ended
PHRASES = {400: "Bad Request", 408: "Request Timeout", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           501: "Not Implemented", 503: "Service Unavailable"}


@dataclass
class Limits:
    max_connections: int = 512        # open connections; more get 503
    request_timeout: float = 10.0     # seconds to read one whole request (headers and body)
    keep_alive: float = 5.0           # idle seconds a connection is kept between requests
    max_body: int = 1 << 20           # bytes; a larger body gets 413
    max_header: int = 16 << 10        # bytes of request line and headers; more gets 431 (414)
    max_url: int = 4096               # characters of the path and query; more gets 414
    max_queue_wait: float = 60.0      # seconds a request may wait for its first token
    backlog: int = 1024               # connections the kernel holds until they are accepted
    grace: float = 5.0                # seconds running requests get to finish at shutdown


def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a log line: control characters (ANSI escapes included) shown as \\xNN."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


class Text:
    """Token ids to text as they come: whole UTF-8 characters only, and stop strings cut off.
    `push(id)` returns the text that may be shown now; text that could still turn into a stop
    string is held back until it cannot."""

    def __init__(self, stops: list[str], enc) -> None:
        self.enc = enc
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.text += self.utf8.decode(self.enc.decode_single_token_bytes(token))
        return self._release(final=False)

    def finish(self) -> str:
        if not self.stopped:
            self.text += self.utf8.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if not self.stopped:
            cut = min((i for i in (self.text.find(s) for s in self.stops) if i >= 0), default=-1)
            if cut >= 0:
                self.text, self.stopped = self.text[:cut], True
        end = len(self.text) if (final or self.stopped) else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent:end], end
        return out


class Events(queue.Queue):
    """A request's events: the engine thread puts (a plain queue.Queue to it), an asyncio handler
    awaits `get_async()`. Each put wakes the handler's event loop once; nothing polls, and no
    thread waits per request."""

    def __init__(self, aloop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.aloop = aloop
        self.ready = asyncio.Event()

    def _put(self, item) -> None:
        super()._put(item)
        try:
            self.aloop.call_soon_threadsafe(self.ready.set)
        except RuntimeError:                  # the event loop has closed: nobody is waiting
            pass

    async def get_async(self):
        while True:
            try:
                return self.get_nowait()
            except queue.Empty:
                pass
            self.ready.clear()
            try:                              # a put between the first try and clear() is not lost
                return self.get_nowait()
            except queue.Empty:
                pass
            await self.ready.wait()


class ClientGone(Exception):
    pass


async def until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def next_event(events: Events, gone: asyncio.Future, timeout: float | None):
    """The next event, or ClientGone if the client left first, or TimeoutError after `timeout`."""
    get = asyncio.ensure_future(events.get_async())
    done, _ = await asyncio.wait({get, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    if gone in done:
        raise ClientGone
    raise TimeoutError


def json_response(status: int, body: dict, headers: dict | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


def api_error(e: ApiError) -> Response:
    return json_response(e.status, e.body(), e.headers)


def raw_error(status: int, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 error response as bytes, for the parser's errors (written before closing)."""
    body = json.dumps(error_body(status, message)).encode()
    return (f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + extra + b"\r\n" + body


def is_loopback_host(host: str) -> bool:
    if host in LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(value: str) -> str:
    """The host name of a Host header value (`name`, `name:port`, `[v6]:port`), lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[:value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Front:
    """The API as a Starlette app, with the checks every request passes first (`guard`)."""

    def __init__(self, loop: EngineLoop, model_name: str, *, limits: Limits, api_key: str | None,
                 metrics_key: bool, loopback: bool, log=None, special_in_messages: bool = False) -> None:
        self.loop, self.model_name, self.limits, self.log = loop, model_name, limits, log
        self.special_in_messages = special_in_messages
        self.stopping = False
        self.api_key = api_key.encode() if api_key else None
        self.metrics_key, self.loopback = metrics_key, loopback
        self.enc = enc = tokenizer(loop.model)            # the model's own tokenizer
        self.encode = lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})
        routes = [Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.metrics, methods=["GET"])]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self.http_error,
                                                                Exception: self.server_error})

    # -- what every request passes -----------------------------------------------------------------

    def reject(self, code: int) -> None:
        self.loop.metrics.inc("requests_rejected_total", code=code)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = [0]

        async def send_seen(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if 400 <= status[0] != GONE:
                    self.reject(status[0])
            await send(message)

        refusal = self.guard(scope)
        try:
            if refusal is not None:
                await refusal(scope, receive, send_seen)
            else:
                await self.app(scope, receive, send_seen)
        finally:
            if self.log is not None:
                client = scope.get("client") or ("-", 0)
                path = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
                self.log(f"{client[0]}:{client[1]} {printable(scope['method'], 20)} {printable(path)} "
                         f"{status[0] or '-'} {time.perf_counter() - started:.3f}s")

    def guard(self, scope) -> Response | None:
        """The refusal for a request that may not go further, or None."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        if method not in METHODS:
            return json_response(501, error_body(501, f"method {printable(method, 20)} is not implemented"))
        if len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) > self.limits.max_url:
            return json_response(414, error_body(414, f"the URL is longer than {self.limits.max_url} characters"),
                                 {"Connection": "close"})
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > self.limits.max_header:
            return json_response(431, error_body(431, f"the request's headers are longer than "
                                                 f"{self.limits.max_header:,} bytes"), {"Connection": "close"})
        if "transfer-encoding" in headers and "content-length" in headers:     # a smuggling attempt, or a bug
            return json_response(400, error_body(400, "send Content-Length or Transfer-Encoding, not both"),
                                 {"Connection": "close"})
        host = host_of(headers.get("host", ""))
        if self.loopback and "host" in headers and not is_loopback_host(host):
            return json_response(403, error_body(403, f"Host {printable(host, 60)!r} is not this machine: a server "
                                                 "bound to loopback answers only localhost, 127.0.0.1 or ::1"))
        origin = headers.get("origin")
        if origin is not None and origin != "null":
            o = urlsplit(origin)
            if (o.hostname or "") != host.strip("[]") and not (self.loopback and is_loopback_host(o.hostname or "")
                                                                 and is_loopback_host(host)):
                return json_response(403, error_body(403, f"Origin {printable(origin, 60)!r} is another site: "
                                                     "requests from web pages of other origins are refused"))
        elif origin == "null":
            return json_response(403, error_body(403, "Origin null is refused (a sandboxed page or a file)"))
        public = path == "/health" or (path == "/metrics" and not self.metrics_key)
        if self.api_key is not None and not public:
            auth = headers.get("authorization", "")
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("latin-1"), self.api_key):
                return json_response(401, error_body(401, "send the server's API key as 'Authorization: Bearer KEY'",
                                                     "authentication_error"), {"WWW-Authenticate": "Bearer"})
        if method == "POST":
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return json_response(415, error_body(415, "send the body as JSON with 'Content-Type: "
                                                     f"application/json' (got {printable(ctype, 60) or 'none'!r})"))
        return None

    async def http_error(self, request, exc: HTTPException) -> Response:
        messages = {404: f"no route {printable(request.url.path)}: try POST /v1/completions, GET /v1/models, "
                         "/health or /metrics",
                    405: f"{request.method} {request.url.path}: use {(exc.headers or {}).get('Allow', 'another method')}"}
        kind = "not_found_error" if exc.status_code == 404 else None
        return json_response(exc.status_code, error_body(exc.status_code, messages.get(exc.status_code, exc.detail),
                                                         kind), exc.headers)

    async def server_error(self, request, exc: Exception) -> Response:
        return json_response(500, error_body(500, f"internal error: {exc.__class__.__name__}"))

    # -- routes --------------------------------------------------------------------------------

    async def health(self, request) -> Response:
        alive = self.loop.thread.is_alive()
        return json_response(200 if alive else 503, {"status": "ok" if alive else "engine stopped"})

    async def models(self, request) -> Response:
        return json_response(200, models(self.model_name, self.loop.model.config.n_ctx))

    async def metrics(self, request) -> Response:
        return Response(self.loop.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def read_body(self, request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and int(length) > self.limits.max_body:      # h11 has checked it is digits
            raise ApiError(413, f"the body is {int(length):,} bytes; at most {self.limits.max_body:,}",
                           headers={"Connection": "close"})
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > self.limits.max_body:
                    raise ApiError(413, f"the body is over {self.limits.max_body:,} bytes",
                                   headers={"Connection": "close"})
        except ClientDisconnect:
            raise ClientGone from None
        return bytes(body)

    def retry_after(self, wait: float) -> dict:
        return {"Retry-After": str(max(1, math.ceil(wait)))}

    async def chat_completions(self, request) -> Response:
        """POST /v1/chat/completions: messages rendered with the model's chat template, then served
        as a completion; the answer in the chat format."""
        return await self.completions(request, chat=True)

    async def completions(self, request, chat: bool = False) -> Response:
        loop, limits = self.loop, self.limits
        try:
            body = parse_json(await self.read_body(request))
            cfg = loop.model.config
            if chat:                  # the template runs in a worker process: wait for it off the event loop
                req = await asyncio.to_thread(parse_chat, body, self.enc, cfg.vocab_size, cfg.n_ctx,
                                              special_in_content=self.special_in_messages)
            else:
                req = parse_completion(body, self.encode, cfg.vocab_size, cfg.n_ctx)
            wait = loop.metrics.get("queue_expected_wait_seconds")
            if wait > limits.max_queue_wait:
                raise ApiError(429, f"the queue's expected wait is {wait:.0f} s, over this server's limit of "
                               f"{limits.max_queue_wait:g} s: try again later", kind="rate_limit_error",
                               headers=self.retry_after(wait - limits.max_queue_wait))
            events = Events(asyncio.get_running_loop())
            try:
                r = loop.submit(req, events)
            except ApiError as e:
                if e.status == 429:
                    e.headers = self.retry_after(wait)
                raise
        except ClientGone:
            return Response(status_code=GONE)         # nobody reads it
        except ApiError as e:
            return api_error(e)
        gone = asyncio.ensure_future(until_disconnect(request.receive))
        text, pieces, finish, ended = Text(req.stop, self.enc), [], None, False
        try:
            try:
                first = await next_event(events, gone, limits.max_queue_wait)
            except TimeoutError:
                loop.cancel(r)
                ended = True
                wait = loop.metrics.get("queue_expected_wait_seconds")
                return api_error(ApiError(503, f"the request waited {limits.max_queue_wait:g} s without starting "
                                          "(the server is at capacity): try again later", kind="server_error",
                                          headers=self.retry_after(wait)))
            if first[0] == "done" and first[1] not in ("stop", "length"):
                ended = True              # cancelled (a shutdown) or failed before its first token
                return api_error(self.failure(first[1]))
            if req.stream:
                gone.cancel()
                ended = True              # from here the stream's generator owns the request
                return StreamingResponse(self.sse(r, events, text, first, chat), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            event = first
            while True:
                piece, finish, ended = self.take(r, text, event)
                pieces.append(piece)
                if ended:
                    break
                event = await next_event(events, gone, None)
        except ClientGone:
            loop.cancel(r)
            ended = True
            loop.metrics.inc("client_disconnects_total")
            return Response(status_code=GONE)         # the client has gone: nobody reads it
        finally:
            gone.cancel()
            if not ended:
                loop.cancel(r)
        if finish not in ("stop", "length"):
            return api_error(self.failure(finish))
        used = usage(len(req.prompt_ids), r.n_tokens)
        if chat:
            return json_response(200, chat_completion(new_chat_id(), self.model_name, "".join(pieces), finish,
                                                      used, int(time.time())))
        return json_response(200, completion(new_id(), self.model_name, "".join(pieces), finish, used,
                                             int(time.time())))

    def failure(self, reason: str) -> ApiError:
        if reason == "cancelled":
            return ApiError(503, "the server is shutting down: the request was cancelled", kind="server_error",
                            headers={"Retry-After": "5"})
        return ApiError(500, f"the engine failed this request ({self.loop.last_error or reason})", kind="server_error")

    def stop_running(self) -> None:
        """At shutdown, shortly before the grace period ends: cancel every running request, so its
        handler answers (503, or a stream's last chunk) before uvicorn would cancel the handler."""
        self.stopping = True
        for r in list(self.loop.live.values()):
            self.loop.cancel(r)

    def take(self, r, text: Text, event) -> tuple[str, str | None, bool]:
        """One event: (text to show, finish reason or None, whether the request has ended)."""
        what, value = event
        if what == "token":
            if value in r.seq.stop_ids:       # an end-of-sequence token ends the text; it is not part of it
                return "", None, False
            piece = text.push(value)
            if text.stopped:
                self.loop.cancel(r)           # a stop string: the rest is not wanted
                return piece + text.finish(), "stop", True
            return piece, None, False
        return text.finish(), value, True

    async def sse(self, r, events: Events, text: Text, event, chat: bool = False):
        cid, created, name = (new_chat_id() if chat else new_id()), int(time.time()), self.model_name
        ended = False
        try:
            if chat:
                yield self.chunk(chat_chunk(cid, name, created, role=True))
            while True:
                piece, finish, ended = self.take(r, text, event)
                if ended and finish == "cancelled" and self.stopping:
                    finish = "abort"          # the server is stopping: the stream still ends as streams end
                elif ended and finish not in ("stop", "length"):
                    e = self.failure(finish)
                    yield b"data: " + json.dumps(e.body()).encode() + b"\n\n"
                    return                    # no [DONE]: the stream did not complete
                if chat and (piece or finish):
                    if piece:
                        yield self.chunk(chat_chunk(cid, name, created, content=piece))
                    if finish:
                        yield self.chunk(chat_chunk(cid, name, created, finish=finish))
                elif piece or finish:
                    yield self.chunk(completion(cid, name, piece, finish, None, created))
                if ended:
                    break
                event = await events.get_async()
            if r.api.include_usage:
                used = usage(len(r.seq.prompt), r.n_tokens)
                if chat:
                    yield self.chunk(chat_chunk(cid, name, created, usage=used))
                else:
                    body = completion(cid, name, "", None, used, created)
                    body["choices"] = []
                    yield self.chunk(body)
            yield b"data: [DONE]\n\n"
        finally:
            if not ended:                     # the client left (Starlette cancelled us): stop the work
                self.loop.cancel(r)
                self.loop.metrics.inc("client_disconnects_total")

    @staticmethod
    def chunk(body: dict) -> bytes:
        return b"data: " + json.dumps(body).encode() + b"\n\n"


async def refuse_over_cap(scope, receive, send) -> None:
    body = json.dumps(error_body(503, "too many open connections: try again shortly")).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def protocol_for(front: Front):
    """uvicorn's h11 protocol with this server's connection cap, request timeout and JSON errors."""
    limits = front.limits

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.deadline = None
            self.line_done = False
            if len(self.connections) > limits.max_connections:
                self.app = refuse_over_cap
                self._arm(min(1.0, limits.request_timeout))
            else:
                self._arm(limits.request_timeout)

        def _arm(self, seconds: float) -> None:
            if self.deadline is None:
                self.deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def data_received(self, data: bytes) -> None:
            if b"\n" in data:
                self.line_done = True
            super().data_received(data)
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self._arm(limits.request_timeout)      # a request has begun and is not all here yet
            else:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.line_done = False
            if self.conn.their_state is h11.SEND_BODY:     # answered before the body came: it must still end
                self._arm(limits.request_timeout)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _expire(self) -> None:
            self.deadline = None
            if self.transport.is_closing():
                return
            started = self.cycle is not None and self.cycle.response_started
            began = self.conn.their_state is not h11.IDLE or self.line_done or self.conn.trailing_data[0]
            if began and not started:
                front.reject(408)
                self.transport.write(raw_error(408, f"the request was not all sent within "
                                                    f"{limits.request_timeout:g} s"))
            if self.cycle is not None:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            exc = sys.exc_info()[1]
            status = getattr(exc, "error_status_hint", 400) or 400
            if status == 431 and not self.line_done:
                status = 414
            reason = {414: f"the request line is longer than {limits.max_header:,} bytes",
                      431: f"the request's headers are longer than {limits.max_header:,} bytes"}.get(
                status, f"malformed HTTP request ({printable(str(exc) if exc else msg, 120)})")
            front.reject(status)
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(raw_error(status, reason))
                self.transport.close()

    return Protocol


def listen_socket(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    infos = socket.getaddrinfo(host, port, family if host not in ("", "localhost") else 0, socket.SOCK_STREAM)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(backlog)                    # connecting clients queue from now on, before uvicorn runs
    return sock


class AcceptErrors:
    """The event loop's exception handler: running out of file descriptors (EMFILE and kin, on
    accept) is logged once per `interval` with a count, not as a traceback per try (asyncio tries
    up to `backlog` accepts per wake-up and schedules a retry of the listener for each failure);
    the retries that fire after the listener has closed are dropped; the rest go to asyncio's own
    handler."""

    RESOURCE = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

    def __init__(self, interval: float = FD_LOG_INTERVAL, write=None) -> None:
        self.interval, self.count, self.last = interval, 0, -math.inf
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))

    def __call__(self, aloop, context) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in self.RESOURCE:
            self.count += 1
            now = time.monotonic()
            if now - self.last >= self.interval:
                self.write(f"minillm serve: cannot accept connections ({exc.strerror or exc}): "
                           f"{self.count} failed accept() tries since the last such line (waiting clients stay "
                           f"in the backlog); raise the open-file limit (ulimit -n) or lower --max-connections "
                           f"(next such line in {self.interval:g} s at the soonest)")
                self.last, self.count = now, 0
            return
        callback = getattr(context.get("handle"), "_callback", None)
        if getattr(callback, "__name__", "") == "_start_serving" and isinstance(exc, (ValueError, OSError)):
            return                # asyncio's retry of an accept (one per failed try) after the listener closed
        aloop.default_exception_handler(context)


class Uvicorn(uvicorn.Server):
    """uvicorn's server, with this server's shutdown (`Front.stop_running` before the grace period
    ends) and exception handler (`AcceptErrors`)."""

    def __init__(self, config, front: "Front") -> None:
        super().__init__(config)
        self.front = front

    async def startup(self, sockets=None) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptErrors())
        await super().startup(sockets)

    async def shutdown(self, sockets=None) -> None:
        self.front.loop.accepting = False             # new requests get 503 from now on
        grace = self.config.timeout_graceful_shutdown or 0.0
        timer = asyncio.get_running_loop().call_later(max(0.0, grace - min(SHUTDOWN_MARGIN, grace / 2)),
                                                      self.front.stop_running)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


class Server:
    """The API served by uvicorn on one listening socket. `serve()` blocks (the command, main
    thread: uvicorn's SIGINT/SIGTERM handling applies); `start()` runs it on a thread (tests)."""

    def __init__(self, address: tuple[str, int], loop: EngineLoop, model_name: str, *, limits: Limits | None = None,
                 api_key: str | None = None, metrics_key: bool = False, log=None,
                 special_in_messages: bool = False) -> None:
        self.limits = limits or Limits()
        self.sock = listen_socket(*address, self.limits.backlog)
        self.server_address = self.sock.getsockname()[:2]
        self.loopback = is_loopback_host(address[0])
        self.loop = loop
        self.front = Front(loop, model_name, limits=self.limits, api_key=api_key, metrics_key=metrics_key,
                           loopback=self.loopback, log=log, special_in_messages=special_in_messages)
        config = uvicorn.Config(self.front, http=protocol_for(self.front), ws="none", lifespan="off",
                                loop="asyncio", backlog=self.limits.backlog, timeout_keep_alive=self.limits.keep_alive,
                                timeout_graceful_shutdown=self.limits.grace, h11_max_incomplete_event_size=
                                self.limits.max_header, log_config=None, access_log=False, server_header=False,
                                log_level="warning")
        self.uvicorn = Uvicorn(config, self.front)
        self.thread: threading.Thread | None = None

    def serve(self) -> None:
        self.uvicorn.run(sockets=[self.sock])

    def start(self, timeout: float = 30.0) -> "Server":
        self.thread = threading.Thread(target=self.serve, name="minillm-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.uvicorn.started and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.01)
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)

    def server_close(self) -> None:
        self.sock.close()
