"""`minillm serve`'s guard: the checks every HTTP request passes before a route sees it, each
refusal an OpenAI-style JSON error (the table of what the server trusts is in serving/http.py).

    method     one HTTP knows (else 501)
    size       the URL (414) and the headers (431) within the server's limits
    framing    Content-Length or Transfer-Encoding, never both (a smuggling attempt: 400)
    who        bound to loopback, a Host that is not a loopback name (DNS rebinding: 403); an Origin
               that is not the Host the request was sent to (a web page posting cross-site: 403);
               the API key as a Bearer token, compared in constant time (401)
    body       POSTs as application/json (a form or text/plain post from a page: 415)
"""

from __future__ import annotations

import hmac
import ipaddress
from urllib.parse import urlsplit

from starlette.responses import JSONResponse, Response

from .api import error_body

METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def printable(text: str, limit: int = 200) -> str:
    """`text` safe for a log line: control characters (ANSI escapes included) shown as \\xNN."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


def json_response(status: int, body: dict, headers: dict | None = None) -> Response:
    return JSONResponse(body, status_code=status, headers=headers)


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


class Guard:
    """`guard(scope)`: the refusal for a request that may not go further, or None."""

    def __init__(self, limits, *, api_key: str | None, metrics_key: bool, loopback: bool) -> None:
        self.limits = limits
        self.api_key = api_key.encode() if api_key else None
        self.metrics_key, self.loopback = metrics_key, loopback

    def __call__(self, scope) -> Response | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method, path, limits = scope["method"], scope["path"], self.limits
        if method not in METHODS:
            return json_response(501, error_body(501, f"method {printable(method, 20)} is not implemented"))
        if len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) > limits.max_url:
            return json_response(414, error_body(414, f"the URL is longer than {limits.max_url} characters"),
                                 {"Connection": "close"})
        if sum(len(k) + len(v) + 4 for k, v in scope["headers"]) > limits.max_header:
            return json_response(431, error_body(431, f"the request's headers are longer than "
                                                 f"{limits.max_header:,} bytes"), {"Connection": "close"})
        if "transfer-encoding" in headers and "content-length" in headers:     # a smuggling attempt, or a bug
            return json_response(400, error_body(400, "send Content-Length or Transfer-Encoding, not both"),
                                 {"Connection": "close"})
        return self.who(headers, path) or self.body_type(headers, method)

    def who(self, headers: dict, path: str) -> Response | None:
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
        return None

    @staticmethod
    def body_type(headers: dict, method: str) -> Response | None:
        if method == "POST":
            ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if ctype != "application/json":
                return json_response(415, error_body(415, "send the body as JSON with 'Content-Type: "
                                                     f"application/json' (got {printable(ctype, 60) or 'none'!r})"))
        return None
