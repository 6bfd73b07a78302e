"""Chat: a list of messages -> the prompt text the model was trained on, by its own chat template.

The template is a Jinja program shipped with the model (`tokenizer_config.json`'s `chat_template`,
or a GGUF's `tokenizer.chat_template`). It is rendered as transformers renders it: jinja2's
immutable sandbox (a template cannot reach Python objects or change anything), blocks trimmed,
`raise_exception` and `tojson` available, `add_generation_prompt` set so the text ends where the
assistant's answer begins. Generation stops at the model's end-of-turn ids (`eos_ids`).

A template is a program that came with a file, run on text that came from a client, so it runs
with a budget: in a separate worker process (minillm/chat_worker.py, started by path with `python -I`,
importing nothing of minillm), at most `RENDER_MEMORY` bytes of memory, for at most `RENDER_SECONDS`,
writing at most `RENDER_CHARS` characters, `range` and `tojson` bounded (minillm/chat_pool.py). A
render past its budget is killed and refused with one line; the caller's thread only waits on a
pipe, so a server's event loop, its /health and its shutdown never wait on a template.

Text a user typed is text: `encode_chat` encodes the control tokens the template wrote
(`<|im_start|>`) as their ids, and the same characters inside a message as ordinary text, so a
message cannot open a turn of its own (`special_in_content=True` restores the old reading).

A model without a template gets a plain `role: content` layout, with a note saying so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import chat_pool
from .errors import MiniLLMError, PromptError

ROLES = ("system", "user", "assistant", "tool", "developer")
AS_ROLE = {"developer": "system"}     # OpenAI's newer name for the system message, mapped as OpenAI maps it
PLAIN_NOTE = "this model has no chat template; using a plain 'role: text' layout"



class ChatTemplateError(MiniLLMError):
    """A chat template that refused the messages (status 400), ran past its budget (400), or broke (500)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class TemplateOverBudget(ChatTemplateError):
    """A render stopped for running past its time, or killed for its memory (status 400)."""


class RenderStopped(ChatTemplateError):
    """A render abandoned because its caller asked (`stop`): nobody waits for it (status 503)."""


def check_messages(messages) -> list[dict]:
    """[{"role": ..., "content": str}, ...], or PromptError naming the first bad one. The
    `developer` role becomes `system`."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise PromptError(f"messages[{i}]: expected {{\"role\": one of {', '.join(ROLES)}, "
                              "\"content\": a string}")
        out.append({"role": AS_ROLE.get(m["role"], m["role"]), "content": m["content"]})
    return out


def render(messages, tokenizer, *, add_generation_prompt: bool = True) -> tuple[str, str | None]:
    """-> (the prompt text, a note or None). `tokenizer` carries `chat_template` (None: plain layout)."""
    text, _, note = render_spans(messages, tokenizer, add_generation_prompt=add_generation_prompt)
    return text, note


def render_spans(messages, tokenizer, *, add_generation_prompt: bool = True, stop=None):
    """-> (text, spans, note): spans are the (start, end) of each message's content in the text, or
    None when the template changes a message's text (then where the user's text lies is unknown).
    stop: a function of no arguments, asked while the template runs; true abandons the render
    (RenderStopped) and kills its worker (a server whose client has gone)."""
    messages = check_messages(messages)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        text, spans = "", []
        for m in messages:
            text += f"{m['role']}: "
            spans.append((len(text), len(text) + len(m["content"])))
            text += m["content"] + "\n"
        return text + ("assistant:" if add_generation_prompt else ""), spans, PLAIN_NOTE
    special = {}
    for key, tid in (("bos_token", getattr(tokenizer, "bos_id", None)),
                     ("eos_token", (getattr(tokenizer, "eos_ids", ()) or (None,))[0])):
        special[key] = tokenizer.decode([tid]) if tid is not None else ""
    reply = chat_pool.pool().render({"template": template, "messages": messages,
                                     "add_generation_prompt": add_generation_prompt, **special}, stop=stop)
    if "error" in reply:
        kind = (TemplateOverBudget if reply.get("over_budget") else RenderStopped if reply.get("stopped")
                else ChatTemplateError)
        raise kind(reply["error"], reply.get("status", 400))
    spans = reply["spans"]
    return reply["text"], None if spans is None else [tuple(s) for s in spans], None


# -- encoding: the template's control tokens as ids, the user's text as text ------------------------

def special_tokens(tokenizer) -> dict[str, int]:
    """The control tokens a tokenizer reads in text: {text: id}."""
    if isinstance(getattr(tokenizer, "special", None), dict):
        return tokenizer.special
    names = getattr(tokenizer, "special_tokens_set", None)          # tiktoken
    return {t: tokenizer.encode_single_token(t) for t in names} if names else {}


def encode_chat(text: str, spans, tokenizer, messages=None, *, special_in_content: bool = False) -> list[int]:
    """The ids of a rendered conversation: control tokens outside the messages' text (`spans`) as their
    ids; everything else, a control token's characters typed in a message included, as ordinary text."""
    specials = special_tokens(tokenizer)
    if special_in_content or not specials:
        if hasattr(tokenizer, "special_tokens_set"):                     # tiktoken: say so, or it refuses
            return tokenizer.encode(text, allowed_special="all")
        return tokenizer.encode(text)
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
    if spans is None:
        for i, m in enumerate(messages or []):
            found = pattern.search(m["content"])
            if found:
                raise PromptError(f"messages[{i}]: its text contains {found.group()!r}, a control token of this "
                                  "model, and its chat template rewrites message text, so minillm cannot keep it "
                                  "as plain text: remove it")
        spans = []
    inside = sorted(spans)
    ids, start = [], 0
    for found in pattern.finditer(text):
        a, b = found.span()
        if any(s < b and a < e for s, e in inside):                    # typed by the user: text
            continue
        if a > start:
            ids += tokenizer.encode_ordinary(text[start:a])
        ids.append(specials[found.group()])
        start = b
    if start < len(text):
        ids += tokenizer.encode_ordinary(text[start:])
    return ids


@dataclass
class Conversation:
    """The history of one chat: messages in order, rendered whole before every answer."""
    tokenizer: object
    system: str | None = None
    special_in_content: bool = False

    def __post_init__(self) -> None:
        self.messages: list[dict] = [{"role": "system", "content": self.system}] if self.system else []

    def prompt_ids(self, user: str) -> list[int]:
        """Add the user's turn; the ids of the whole conversation up to the assistant's answer."""
        self.messages.append({"role": "user", "content": user})
        text, spans, _ = render_spans(self.messages, self.tokenizer)
        return encode_chat(text, spans, self.tokenizer, self.messages, special_in_content=self.special_in_content)

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
