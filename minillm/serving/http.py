"""`minillm serve`'s HTTP side: Starlette on uvicorn (the ASGI stack vLLM and SGLang serve with).

Handlers parse and check a request, hand it to the engine loop (serving/loop.py, one thread that
owns the model) and stream back what the loop sends (serving/stream.py); they never touch the
model. Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /health, /metrics.
Every request passes serving/guard.py first; uvicorn's protocol, with this server's connection
cap, timeouts and shutdown, is serving/protocol.py.

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
                (minillm.chat), awaited from a thread: the event loop never runs one; which chat
                renders next, and what is refused or dropped, is serving/renders.py's
  shutdown      at SIGTERM new requests get 503, and so does at once every request that has not
                reached the engine (reading its body, waiting for or running its render); running
                ones have `grace` seconds to finish, and shortly before it ends the engine cancels
                what is left, so every client still gets a proper ending: a plain request a JSON
                503, a stream a last chunk with finish_reason "abort" (vLLM's name for a request the
                server ended) and `data: [DONE]`
  descriptors   out of file descriptors, a failed accept() is logged once per `FD_LOG_INTERVAL`
                seconds with a count (asyncio would log a traceback for every try)
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..bpe import tokenizer
from ..chat_pool import RENDER_WORKERS
from ..errors import MiniLLMError
from .api import ApiError, completion, error_body, models, new_id, parse_completion, parse_json, usage
from .chat_api import chat_completion, chat_parts, chat_prompt, chat_request, new_chat_id, template_error
from .guard import Guard, is_loopback_host, json_response, printable
from .loop import EngineLoop
from .protocol import Uvicorn, listen_socket, protocol_for
from .renders import RenderQueue, shutting_down
from .stream import ClientGone, Events, Reply, next_event, until_disconnect

GONE = 499                          # nginx's "client closed request": logged, never sent, not a rejection


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
    renders_waiting: int = 64         # chats waiting for a render slot; more get 429
    renders_per_client: int = 8       # of them from one client; more get 429
    render_trip_after: int = 3        # a client's renders past their budget in a row, then...
    render_refuse_for: float = 30.0   # ...its chats are refused (429) for this many seconds


def api_error(e: ApiError) -> Response:
    return json_response(e.status, e.body(), e.headers)


class Front:
    """The API as a Starlette app, with the checks every request passes first (`guard`)."""

    def __init__(self, loop: EngineLoop, model_name: str, *, limits: Limits, api_key: str | None,
                 metrics_key: bool, loopback: bool, log=None, special_in_messages: bool = False) -> None:
        self.loop, self.model_name, self.limits, self.log = loop, model_name, limits, log
        self.special_in_messages = special_in_messages
        self.stopping = False
        self.closing = asyncio.Event()                   # set when shutdown begins (bound on first use)
        self.guard = Guard(limits, api_key=api_key, metrics_key=metrics_key, loopback=loopback)
        self.renders = RenderQueue(RENDER_WORKERS, max_waiting=limits.renders_waiting,
                                   per_client=limits.renders_per_client, trip_after=limits.render_trip_after,
                                   refuse_for=limits.render_refuse_for, metrics=loop.metrics)
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
        """Admit the request (`admit`: read, check, render, submit), racing the start of shutdown:
        one that has not reached the engine when shutdown begins is answered 503 at once. Then
        answer it from its events."""
        admit = asyncio.ensure_future(self.admit(request, chat))
        closing = asyncio.ensure_future(self.closing.wait())
        try:
            await asyncio.wait({admit, closing}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            admit.cancel()
            raise
        finally:
            closing.cancel()
        if not admit.done():
            admit.cancel()
            return api_error(shutting_down())
        try:
            creq, served, events, gone = admit.result()
        except ClientGone:
            return Response(status_code=GONE)         # nobody reads it
        except ApiError as e:
            return api_error(e)
        return await self.answer(Reply(self, served, creq, events, chat), gone)

    async def admit(self, request, chat: bool):
        """-> (the API request, the loop's entry, its events, a future done when the client leaves)."""
        loop, limits = self.loop, self.limits
        body = parse_json(await self.read_body(request))
        gone = asyncio.ensure_future(until_disconnect(request.receive))
        try:
            cfg = loop.model.config
            if chat:
                messages, rest = chat_parts(body, self.enc)
                client = (request.client.host if request.client else None) or "-"
                try:
                    ids = await self.renders.run(client, gone, lambda stop: chat_prompt(
                        messages, self.enc, special_in_content=self.special_in_messages, stop=stop))
                except MiniLLMError as e:
                    raise template_error(e) from None
                req = chat_request(rest, ids, self.enc, cfg.vocab_size, cfg.n_ctx)
            else:
                req = parse_completion(body, self.encode, cfg.vocab_size, cfg.n_ctx)
            wait = loop.metrics.get("queue_expected_wait_seconds")
            if wait > limits.max_queue_wait:
                shown = f"{wait:.0f}" if wait >= 10 else f"{wait:.2g}"      # 250, 1.8, 0.012
                raise ApiError(429, f"the queue's expected wait is {shown} s, over this server's limit of "
                               f"{limits.max_queue_wait:g} s: try again later", kind="rate_limit_error",
                               headers=self.retry_after(wait - limits.max_queue_wait))
            events = Events(asyncio.get_running_loop())
            try:
                served = loop.submit(req, events)
            except ApiError as e:
                if e.status == 429:
                    e.headers = self.retry_after(wait)
                raise
            return req, served, events, gone
        except BaseException:
            gone.cancel()
            raise

    async def answer(self, reply: Reply, gone: asyncio.Future) -> Response:
        loop, limits, served = self.loop, self.limits, reply.served
        pieces, finish, ended = [], None, False
        try:
            try:
                first = await next_event(reply.events, gone, limits.max_queue_wait)
            except TimeoutError:
                loop.cancel(served)
                ended = True
                wait = loop.metrics.get("queue_expected_wait_seconds")
                return api_error(ApiError(503, f"the request waited {limits.max_queue_wait:g} s without starting "
                                          "(the server is at capacity): try again later", kind="server_error",
                                          headers=self.retry_after(wait)))
            if first[0] == "done" and first[1] not in ("stop", "length"):
                ended = True              # cancelled (a shutdown) or failed before its first token
                return api_error(self.failure(first[1]))
            if reply.creq.stream:
                gone.cancel()
                ended = True              # from here the stream's generator owns the request
                return StreamingResponse(reply.sse(first), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            event = first
            while True:
                piece, finish, ended = reply.take(event)
                pieces.append(piece)
                if ended:
                    break
                event = await next_event(reply.events, gone, None)
        except ClientGone:
            loop.cancel(served)
            ended = True
            loop.metrics.inc("client_disconnects_total")
            return Response(status_code=GONE)         # the client has gone: nobody reads it
        finally:
            gone.cancel()
            if not ended:
                loop.cancel(served)
        if finish not in ("stop", "length"):
            return api_error(self.failure(finish))
        used = usage(len(reply.creq.prompt_ids), served.request.n_tokens)
        if reply.chat:
            return json_response(200, chat_completion(new_chat_id(), self.model_name, "".join(pieces), finish,
                                                      used, int(time.time())))
        return json_response(200, completion(new_id(), self.model_name, "".join(pieces), finish, used,
                                             int(time.time())))

    def failure(self, reason: str) -> ApiError:
        if reason == "cancelled":
            return ApiError(503, "the server is shutting down: the request was cancelled", kind="server_error",
                            headers={"Retry-After": "5"})
        return ApiError(500, f"the engine failed this request ({self.loop.last_error or reason})", kind="server_error")

    def begin_shutdown(self) -> None:
        """Shutdown begins: new requests, and every request not at the engine yet, get 503 now."""
        self.loop.accepting = False
        self.closing.set()
        self.renders.close()

    def stop_running(self) -> None:
        """At shutdown, shortly before the grace period ends: cancel every running request, so its
        handler answers (503, or a stream's last chunk) before uvicorn would cancel the handler."""
        self.stopping = True
        for served in list(self.loop.live.values()):
            self.loop.cancel(served)


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
