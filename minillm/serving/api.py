"""The OpenAI completions API, as much of it as minillm serves: parse and check a request, build
the replies. Every problem is an ApiError: an HTTP status and an OpenAI-style error body naming
the field at fault."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from ..engine.sequence import SamplingParams

MAX_STOPS = 4

MAX_SEED = 2 ** 63 - 1
MAX_TEMPERATURE = 100.0

# The fields minillm reads; fields that change nothing here and are accepted (`model`: there is one
# model; `user`: an end-user id for the provider's abuse monitoring); fields whose non-default values
# minillm cannot honour: refused with a 400 naming them, so a client never silently gets other output
# than it asked for. Any other field is refused too (a typo must not pass as a default).
USED = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options"}
IGNORED = {"model", "user"}
UNSUPPORTED = {"n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None,
               "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {},
               "min_tokens": 0, "ignore_eos": False, "min_p": 0}


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
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {_short(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"{name} must be finite, got {value!r}", name)
    if isinstance(value, int) and abs(value) > 2 ** 63:      # compared exactly; never turned into a float
        raise ApiError(400, f"{name} is out of range ({len(str(abs(value)))} digits)", name)
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ApiError(400, f"{name} must be {'>' if lo_open else '>='} {lo}, got {value!r}", name)
    if hi is not None and value > hi:
        raise ApiError(400, f"{name} must be <= {hi}, got {value!r}", name)
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_fields(body: dict) -> None:
    unknown = sorted(k for k in body if k not in USED and k not in IGNORED and k not in UNSUPPORTED)
    if unknown:
        names = ", ".join(_short(k)[1:-1] for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ApiError(400, f"unknown field{'s' if len(unknown) > 1 else ''} {names}: minillm serve reads "
                       f"{', '.join(sorted(USED))} (and accepts {', '.join(sorted(IGNORED))})", unknown[0][:100])
    refused = [k for k, default in UNSUPPORTED.items()
               if k in body and body[k] not in (default, None) and not (k == "logprobs" and body[k] is False)]
    if refused:
        raise ApiError(400, f"{', '.join(f'{k}={_short(body[k])}' for k in refused)}: not supported by minillm "
                       "serve (leave it out, or send the default)", refused[0])


def parse_completion(body, encode, vocab_size: int, n_ctx: int) -> CompletionRequest:
    """Check a /v1/completions body and turn it into token ids and settings."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    _check_fields(body)
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
    max_tokens = _number(body, "max_tokens", 16, integer=True, lo=1, hi=n_ctx)
    if len(ids) + max_tokens > n_ctx:
        raise ApiError(400, f"max_tokens: {max_tokens} new tokens after a {len(ids)}-token prompt do not fit the "
                       f"context of {n_ctx}; at most {n_ctx - len(ids)}", "max_tokens")
    temperature = _number(body, "temperature", 1.0, lo=0, hi=MAX_TEMPERATURE)
    top_p = _number(body, "top_p", None, lo=0, lo_open=True, hi=1)
    top_k = _number(body, "top_k", None, integer=True, lo=-1, hi=vocab_size)
    if top_k in (-1, 0):                              # vLLM's "no top-k"
        top_k = None
    seed = _number(body, "seed", None, integer=True, lo=0, hi=MAX_SEED)
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
    if not isinstance(opts, dict) or set(opts) - {"include_usage"} or not isinstance(
            opts.get("include_usage", False), bool):
        raise ApiError(400, 'stream_options must be {"include_usage": true or false}', "stream_options")
    include_usage = opts.get("include_usage", False)
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


def parse_json(raw: bytes):
    """The request body as JSON, or a 400 saying why not (never an exception from the parser: bad
    UTF-8, nesting too deep, an integer of more digits than Python converts, a bare NaN)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not UTF-8 text") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(400, "the body is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except ValueError as e:                 # e.g. an integer of more than 4,300 digits
        raise ApiError(400, f"the body cannot be read as JSON ({str(e)[:80]})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def error_body(status: int, message: str, kind: str | None = None) -> dict:
    """An OpenAI-style error body for any status."""
    kind = kind or ("invalid_request_error" if 400 <= status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}
