"""Chat: a list of messages -> the prompt text the model was trained on, by its own chat template.

The template is a Jinja program shipped with the model (`tokenizer_config.json`'s `chat_template`,
or a GGUF's `tokenizer.chat_template`). It is rendered as transformers renders it: jinja2's
immutable sandbox (a template cannot reach Python objects or change anything), blocks trimmed,
`raise_exception` and `tojson` available, `add_generation_prompt` set so the text ends where the
assistant's answer begins. Generation stops at the model's end-of-turn ids (`eos_ids`).

A model without a template gets a plain `role: content` layout, with a note saying so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

from .errors import MiniLLMError, PromptError

ROLES = ("system", "user", "assistant", "tool")
PLAIN_NOTE = "this model has no chat template; using a plain 'role: text' layout"


@lru_cache(maxsize=8)
def _compile(source: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, **k: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def check_messages(messages) -> list[dict]:
    """[{"role": ..., "content": str}, ...], or PromptError naming the first bad one."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise PromptError(f"messages[{i}]: expected {{\"role\": one of {', '.join(ROLES)}, "
                              "\"content\": a string}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render(messages, tokenizer, *, add_generation_prompt: bool = True) -> tuple[str, str | None]:
    """-> (the prompt text, a note or None). `tokenizer` carries `chat_template` (None: plain layout)."""
    messages = check_messages(messages)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else ""), PLAIN_NOTE
    from jinja2.exceptions import TemplateError
    special = {}
    for key, tid in (("bos_token", getattr(tokenizer, "bos_id", None)),
                     ("eos_token", (getattr(tokenizer, "eos_ids", ()) or (None,))[0])):
        special[key] = tokenizer.decode([tid]) if tid is not None else ""
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **special), None
    except TemplateError as e:
        raise MiniLLMError(f"the model's chat template refused these messages: {e}") from None
    except Exception as e:       # a template bug: a clear line, not a traceback
        raise MiniLLMError(f"the model's chat template failed ({type(e).__name__}: {str(e)[:100]})") from None


@dataclass
class Conversation:
    """The history of one chat: messages in order, rendered whole before every answer."""
    tokenizer: object
    system: str | None = None

    def __post_init__(self) -> None:
        self.messages: list[dict] = [{"role": "system", "content": self.system}] if self.system else []

    def prompt_ids(self, user: str) -> list[int]:
        """Add the user's turn; the ids of the whole conversation up to the assistant's answer."""
        self.messages.append({"role": "user", "content": user})
        text, _ = render(self.messages, self.tokenizer)
        return self.tokenizer.encode(text)

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
