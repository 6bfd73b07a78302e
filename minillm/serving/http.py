"""`minillm serve`'s HTTP side: the standard library's threading HTTP server. Handlers parse and
check a request, hand it to the engine loop, and stream back what the loop sends; they never touch
the model. Routes: POST /v1/completions, GET /v1/models, /health, /metrics."""

from __future__ import annotations

import codecs
import json
import queue
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from ..tokenizer import tokenizer
from .api import ApiError, completion, models, new_id, parse_completion, usage
from .loop import EngineLoop

MAX_BODY = 1 << 20          # bytes; a larger body gets 413
EVENT_TIMEOUT = 120.0       # seconds a handler waits for the next token before giving up (500)
ROUTES = {"/v1/completions": "POST", "/v1/models": "GET", "/health": "GET", "/metrics": "GET"}


class Text:
    """Token ids to text as they come: whole UTF-8 characters only, and stop strings cut off.
    `push(id)` returns the text that may be shown now; text that could still turn into a stop
    string is held back until it cannot."""

    def __init__(self, stops: list[str]) -> None:
        self.enc = tokenizer()
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


class Handler(BaseHTTPRequestHandler):
    server: "Server"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args) -> None:
        if self.server.log:
            self.server.log(f"{self.address_string()} {fmt % args}")

    # -- plumbing ------------------------------------------------------------------------------

    def send_json(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_error_body(self, e: ApiError) -> None:
        self.send_json(e.status, e.body(), e.headers)

    def route(self, method: str):
        path = self.path.split("?", 1)[0]
        if path not in ROUTES:
            raise ApiError(404, f"no route {path}: try POST /v1/completions, GET /v1/models, /health or /metrics",
                           kind="not_found_error")
        if ROUTES[path] != method:
            raise ApiError(405, f"{method} {path}: use {ROUTES[path]}", headers={"Allow": ROUTES[path]})
        return path

    def read_json(self):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ApiError(411 if length is None else 400, "send the body with a Content-Length header")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the body is {int(length):,} bytes; at most {MAX_BODY:,}")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the body is not valid JSON ({e.__class__.__name__}: {e})") from None

    # -- methods ---------------------------------------------------------------------------------

    def do_GET(self) -> None:
        try:
            path = self.route("GET")
        except ApiError as e:
            return self.send_error_body(e)
        if path == "/health":
            self.send_json(200, {"status": "ok" if self.server.loop.thread.is_alive() else "engine stopped"})
        elif path == "/v1/models":
            self.send_json(200, models(self.server.model_name, self.server.loop.model.config.n_ctx))
        else:
            data = self.server.loop.metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def do_POST(self) -> None:
        try:
            self.route("POST")
            model = self.server.loop.model
            req = parse_completion(self.read_json(), self.server.encode, model.config.vocab_size, model.config.n_ctx)
            r = self.server.loop.submit(req)
        except ApiError as e:
            return self.send_error_body(e)
        (self.stream if req.stream else self.reply)(r)

    def do_PUT(self) -> None:
        self.other("PUT")

    def do_DELETE(self) -> None:
        self.other("DELETE")

    def do_PATCH(self) -> None:
        self.other("PATCH")

    def other(self, method: str) -> None:
        try:
            self.route(method)
        except ApiError as e:
            self.send_error_body(e)

    # -- completions ----------------------------------------------------------------------------

    def events(self, r):
        """(text, finish_reason or None) as tokens arrive; cancels the sequence at a stop string."""
        text = Text(r.api.stop)
        while True:
            try:
                what, value = r.events.get(timeout=EVENT_TIMEOUT)
            except queue.Empty:
                self.server.loop.cancel(r)
                yield text.finish(), "error"
                return
            if what == "token":
                if value in r.seq.stop_ids:        # an end-of-sequence token ends the text; it is not part of it
                    continue
                piece = text.push(value)
                if text.stopped:
                    self.server.loop.cancel(r)
                    yield piece + text.finish(), "stop"
                    return
                if piece:
                    yield piece, None
            else:
                yield text.finish(), {"cancelled": "abort"}.get(value, value)
                return

    def reply(self, r) -> None:
        cid, created, parts, finish = new_id(), int(time.time()), [], None
        for piece, finish in self.events(r):
            parts.append(piece)
        self.send_json(200, completion(cid, self.server.model_name, "".join(parts), finish,
                                       usage(len(r.seq.prompt), r.n_tokens), created))

    def stream(self, r) -> None:
        cid, created, name = new_id(), int(time.time()), self.server.model_name
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for piece, finish in self.events(r):
                if piece or finish:
                    self.sse(completion(cid, name, piece, finish, None, created))
            if r.api.include_usage:
                body = completion(cid, name, "", None, usage(len(r.seq.prompt), r.n_tokens), created)
                body["choices"] = []
                self.sse(body)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.server.loop.cancel(r)            # the client left: free its sequence and blocks now

    def sse(self, body: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, loop: EngineLoop, model_name: str, log=None) -> None:
        super().__init__(address, Handler)
        self.loop, self.model_name, self.log = loop, model_name, log
        enc = tokenizer()
        self.encode = lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})
