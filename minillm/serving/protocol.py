"""`minillm serve` on uvicorn: the listening socket, uvicorn's h11 protocol with this server's
connection cap, request timeout and JSON errors for what the parser refuses, the event loop's
handler for running out of file descriptors, and the server's shutdown order.

    connections   past `max_connections` open at once, a new connection is answered 503 (JSON,
                  Retry-After) and closed, after at most one second of waiting for its request
    timeouts      `request_timeout` from a connection's first byte (or its opening) to the whole
                  request read: a slow or silent client is closed (408 if it had started a request)
    parser        h11's refusals (a malformed request 400, a request line over `max_header` 414,
                  headers over it 431) written as JSON before the connection closes
    descriptors   out of file descriptors, a failed accept() is logged once per `FD_LOG_INTERVAL`
                  seconds with a count (asyncio would log a traceback for every try)
    shutdown      the front is told first (`Front.begin_shutdown`: what has not reached the engine
                  is answered 503 at once), then uvicorn's own shutdown; `SHUTDOWN_MARGIN` seconds
                  before the grace period ends, the engine's requests are ended (`Front.stop_running`)
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import socket
import sys
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .api import error_body
from .guard import printable

FD_LOG_INTERVAL = 10.0             # seconds between two "out of file descriptors" lines
SHUTDOWN_MARGIN = 1.0              # seconds before the grace period ends that running requests are ended
PHRASES = {400: "Bad Request", 408: "Request Timeout", 414: "URI Too Long", 431: "Request Header Fields Too Large",
           501: "Not Implemented", 503: "Service Unavailable"}


def raw_error(status: int, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP/1.1 error response as bytes, for the parser's errors (written before closing)."""
    body = json.dumps(error_body(status, message)).encode()
    return (f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + extra + b"\r\n" + body


async def refuse_over_cap(scope, receive, send) -> None:
    body = json.dumps(error_body(503, "too many open connections: try again shortly")).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def protocol_for(front):
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
    """uvicorn's server, with this server's shutdown (`Front.begin_shutdown` first, then
    `Front.stop_running` before the grace period ends) and exception handler (`AcceptErrors`)."""

    def __init__(self, config, front) -> None:
        super().__init__(config)
        self.front = front

    async def startup(self, sockets=None) -> None:
        asyncio.get_running_loop().set_exception_handler(AcceptErrors())
        await super().startup(sockets)

    async def shutdown(self, sockets=None) -> None:
        self.front.begin_shutdown()                   # new requests, and those not at the engine, get 503
        grace = self.config.timeout_graceful_shutdown or 0.0
        timer = asyncio.get_running_loop().call_later(max(0.0, grace - min(SHUTDOWN_MARGIN, grace / 2)),
                                                      self.front.stop_running)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
