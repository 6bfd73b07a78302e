"""The OpenAI completions API, as much of it as minillm serves: parse and check a request, build
the replies. Every problem is an ApiError: an HTTP status and an OpenAI-style error body naming
the field at fault."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from ..engine.sequence import SamplingParams

MAX_STOPS = 4

# Fields a client may send that change nothing here (accepted and ignored), and fields whose
# non-default values minillm cannot honour (refused, so a client never gets silently other output).
IGNORED = {"model", "user", "stream_options", "logit_bias"}
UNSUPPORTED = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None,
               "presence_penalty": 0, "frequency_penalty": 0}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


@dataclass
class CompletionRequest:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def _number(body: dict, name: str, default, *, integer: bool = False, lo=None, hi=None, lo_open=False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not math.isfinite(value):
        raise ApiError(400, f"{name} must be finite, got {value!r}", name)
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ApiError(400, f"{name} must be {'>' if lo_open else '>='} {lo}, got {value!r}", name)
    if hi is not None and value > hi:
        raise ApiError(400, f"{name} must be <= {hi}, got {value!r}", name)
    return value


def parse_completion(body, encode, vocab_size: int, n_ctx: int) -> CompletionRequest:
    """Check a /v1/completions body and turn it into token ids and settings."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    for name, default in UNSUPPORTED.items():
        if name in body and body[name] not in (default, None):
            raise ApiError(400, f"{name}={body[name]!r} is not supported by minillm serve (leave it out)", name)
    if "prompt" not in body:
        raise ApiError(400, "prompt is required: a string, or a list of token ids", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                            # the client libraries' one-prompt batch
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt is empty", "prompt")
        ids = encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"prompt: token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", "prompt")
    else:
        raise ApiError(400, "prompt must be a non-empty string or a list of token ids (one prompt per request)",
                       "prompt")
    if len(ids) >= n_ctx:
        raise ApiError(400, f"prompt: {len(ids)} tokens do not fit the context of {n_ctx} (at most {n_ctx - 1})",
                       "prompt")
    max_tokens = _number(body, "max_tokens", 16, integer=True, lo=1)
    if len(ids) + max_tokens > n_ctx:
        raise ApiError(400, f"max_tokens: {max_tokens} new tokens after a {len(ids)}-token prompt do not fit the "
                       f"context of {n_ctx}; at most {n_ctx - len(ids)}", "max_tokens")
    temperature = _number(body, "temperature", 1.0, lo=0)
    top_p = _number(body, "top_p", None, lo=0, lo_open=True, hi=1)
    top_k = _number(body, "top_k", None, integer=True, lo=-1)
    if top_k in (-1, 0):                              # vLLM's "no top-k"
        top_k = None
    seed = _number(body, "seed", None, integer=True, lo=0)
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise ApiError(400, "stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS or any(not s for s in stops):
        raise ApiError(400, f"stop: at most {MAX_STOPS} non-empty strings", "stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    return CompletionRequest(ids, max_tokens, SamplingParams(float(temperature), top_k,
                                                             None if top_p is None else float(top_p), seed),
                             stops, stream, include_usage)


def new_id() -> str:
    return "cmpl-" + uuid.uuid4().hex[:24]


def completion(cid: str, model: str, text: str, finish: str | None, usage: dict | None, created: int) -> dict:
    body = {"id": cid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def models(name: str, n_ctx: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "minillm", "max_model_len": n_ctx}]}
