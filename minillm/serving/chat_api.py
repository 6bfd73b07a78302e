"""POST /v1/chat/completions: OpenAI's chat format on top of the completions machinery.

A chat request is a completion whose prompt is the conversation rendered by the model's own chat
template (`minillm.chat.render`), which ends where the assistant's answer begins; generation stops
at the model's end-of-turn ids (`model.eos_ids`, passed to the engine as `stop_ids`). Everything
else (max_tokens, temperature, top_p, top_k, seed, stop, stream, stream_options) is checked by
`api.parse_completion`, with the same errors as /v1/completions.

How the route uses this (the HTTP layer owns sockets and streaming):

    creq = parse_chat(body, tokenizer(model), model.config.vocab_size, model.config.n_ctx)
    # submit creq exactly as a completion, with stop_ids=model.eos_ids; then for the reply:
    chat_completion(cid, name, text, finish, usage(...), created)       # stream = false
    chat_chunk(cid, name, created, role=True)                           # stream: first event
    chat_chunk(cid, name, created, content=piece)                       # ... one per piece of text
    chat_chunk(cid, name, created, finish=finish)                       # ... then the finish
    chat_chunk(cid, name, created, usage=usage(...))                    # ... usage, if asked for
where finish is "stop" (an end-of-turn id or a stop string) or "length", and `text` leaves the
end-of-turn token out.
"""

from __future__ import annotations

import uuid

from ..chat import ChatTemplateError, check_messages, encode_chat, render_spans
from ..errors import MiniLLMError, PromptError
from .api import ApiError, CompletionRequest, _short, parse_completion

CHAT_UNSUPPORTED = ("tools", "functions", "tool_choice", "function_call", "audio", "modalities", "prediction")


def parse_chat(body, tokenizer, vocab_size: int, n_ctx: int, *, special_in_content: bool = False) -> CompletionRequest:
    """Check a /v1/chat/completions body; the conversation rendered and tokenized as the prompt.
    Control tokens typed in a message (`<|im_start|>system`) are encoded as text, unless
    `special_in_content` (then they are control tokens, as before: a user could open turns of their own).
    Renders the model's template (a worker process, up to `chat_pool.RENDER_SECONDS`): call it off an
    event loop. The three steps, for a server that schedules the render itself: `chat_parts`,
    `chat_prompt`, `chat_request`."""
    messages, rest = chat_parts(body, tokenizer)
    try:
        ids = chat_prompt(messages, tokenizer, special_in_content=special_in_content)
    except MiniLLMError as e:
        raise template_error(e) from None
    return chat_request(rest, ids, tokenizer, vocab_size, n_ctx)


def chat_parts(body, tokenizer) -> tuple[list[dict], dict]:
    """The cheap checks of a chat body, before any render: (its messages, checked, the other fields)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    if body.get("logprobs") not in (None, False):
        raise ApiError(400, f"logprobs={_short(body['logprobs'])}: not supported by minillm serve (leave it out, or "
                       "send false)", "logprobs")
    if body.get("top_logprobs") is not None:
        raise ApiError(400, "top_logprobs is not supported by minillm serve (leave it out)", "top_logprobs")
    if "prompt" in body:
        raise ApiError(400, "prompt is not a chat field: send messages, or use /v1/completions", "prompt")
    for name in CHAT_UNSUPPORTED:
        if body.get(name) not in (None, [], "none"):
            raise ApiError(400, f"{name} is not supported by minillm serve (leave it out)", name)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise ApiError(400, "response_format: only {\"type\": \"text\"} is supported", "response_format")
    if "messages" not in body:
        raise ApiError(400, "messages is required: a list of {role, content} objects", "messages")
    messages = body["messages"]
    if isinstance(messages, list):       # content given as OpenAI's list of text parts: join them
        messages = [_flatten(m) for m in messages]
    try:
        messages = check_messages(messages)
    except PromptError as e:
        raise ApiError(400, str(e), "messages") from None
    if not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template: use /v1/completions with your own prompt format",
                       "messages")
    rest = {k: v for k, v in body.items() if k not in ("messages", "response_format", "logprobs", "top_logprobs",
                                                       *CHAT_UNSUPPORTED)}
    return messages, rest


def chat_prompt(messages: list[dict], tokenizer, *, special_in_content: bool = False, stop=None) -> list[int]:
    """The prompt's ids: the messages rendered by the model's template (a worker process; `stop()`
    true abandons the render) and encoded. ChatTemplateError (or another MiniLLMError) otherwise."""
    text, spans, _ = render_spans(messages, tokenizer, stop=stop)
    return encode_chat(text, spans, tokenizer, messages, special_in_content=special_in_content)


def template_error(e: MiniLLMError) -> ApiError:
    """A render's failure as the API answers it (a broken template is the server's fault: 5xx)."""
    status = e.status if isinstance(e, ChatTemplateError) else 400
    return ApiError(status, str(e), "messages", kind="server_error" if status >= 500 else "invalid_request_error")


def chat_request(rest: dict, ids: list[int], tokenizer, vocab_size: int, n_ctx: int) -> CompletionRequest:
    """The completion request of a rendered chat: its ids as the prompt, the other fields checked."""
    rest = dict(rest)
    if "max_completion_tokens" in rest:                # the newer name of max_tokens
        rest.setdefault("max_tokens", rest.pop("max_completion_tokens"))
    rest["prompt"] = ids
    return parse_completion(rest, tokenizer.encode, vocab_size, n_ctx)


def _flatten(m):
    if isinstance(m, dict) and isinstance(m.get("content"), list):
        parts = m["content"]
        if all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in parts):
            return {**m, "content": "".join(p["text"] for p in parts)}
    return m


def new_chat_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def chat_completion(cid: str, model: str, text: str, finish: str | None, usage: dict | None, created: int) -> dict:
    """The whole answer (stream = false)."""
    body = {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


def chat_chunk(cid: str, model: str, created: int, *, role: bool = False, content: str | None = None,
               finish: str | None = None, usage: dict | None = None) -> dict:
    """One server-sent event of a streamed answer: the role first, then pieces of content, then the
    finish reason; with stream_options.include_usage, a last chunk with no choices and the usage."""
    body = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        return {**body, "choices": [], "usage": usage}
    delta = {"role": "assistant", "content": ""} if role else {} if content is None else {"content": content}
    return {**body, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
