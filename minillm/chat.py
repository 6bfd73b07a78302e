"""Chat: a list of messages -> the prompt text the model was trained on, by its own chat template.

The template is a Jinja program shipped with the model (`tokenizer_config.json`'s `chat_template`,
or a GGUF's `tokenizer.chat_template`). It is rendered as transformers renders it: jinja2's
immutable sandbox (a template cannot reach Python objects or change anything), blocks trimmed,
`raise_exception` and `tojson` available, `add_generation_prompt` set so the text ends where the
assistant's answer begins. Generation stops at the model's end-of-turn ids (`eos_ids`).

A template is a program that came with a file, run on text that came from a client, so it runs
with a budget: in a separate worker process (`python -I`, at most `RENDER_MEMORY` bytes of memory),
for at most `RENDER_SECONDS`, writing at most `RENDER_CHARS` characters, `range` and `tojson`
bounded. A render past its budget is killed and refused with one line; the caller's thread only
waits on a pipe, so a server's event loop, its /health and its shutdown never wait on a template.

Text a user typed is text: `encode_chat` encodes the control tokens the template wrote
(`<|im_start|>`) as their ids, and the same characters inside a message as ordinary text, so a
message cannot open a turn of its own (`special_in_content=True` restores the old reading).

A model without a template gets a plain `role: content` layout, with a note saying so.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import MiniLLMError, PromptError

ROLES = ("system", "user", "assistant", "tool", "developer")
AS_ROLE = {"developer": "system"}     # OpenAI's newer name for the system message, mapped as OpenAI maps it
PLAIN_NOTE = "this model has no chat template; using a plain 'role: text' layout"

RENDER_SECONDS = 2.0                  # one render's wall time
RENDER_CHARS = 1 << 20                # characters one render may write (a 32k-token prompt is ~130k)
RENDER_MEMORY = 1 << 30               # bytes of address space the worker may use
RENDER_WORKERS = 4                    # renders at once (each in its own process)
MAX_RANGE = 10_000                    # items one range() may make
MAX_INDENT = 16                       # tojson's indent


class ChatTemplateError(MiniLLMError):
    """A chat template that refused the messages (status 400), ran past its budget (400), or broke (500)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


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


def render_spans(messages, tokenizer, *, add_generation_prompt: bool = True):
    """-> (text, spans, note): spans are the (start, end) of each message's content in the text, or
    None when the template changes a message's text (then where the user's text lies is unknown)."""
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
    reply = _POOL.render({"template": template, "messages": messages, "add_generation_prompt": add_generation_prompt,
                          **special})
    if "error" in reply:
        raise ChatTemplateError(reply["error"], reply.get("status", 400))
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


# -- the worker: templates rendered in a separate process, with a budget ------------------------------

class _Worker:
    BOOT = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
            "from minillm.chat import _serve_renders; _serve_renders()")

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", "-c", self.BOOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.buf = b""

    def ask(self, request: dict, seconds: float) -> dict | None:
        """The worker's reply, or None if it did not answer within `seconds` (it is then killed)."""
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.kill()
            return {"error": "the chat template's worker process failed (it was restarted); try again",
                    "status": 500}
        deadline, fd = time.monotonic() + seconds, self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.kill()
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:                         # it died: memory past its limit, most likely
                self.kill()
                return {"error": f"the chat template used more than its {RENDER_MEMORY >> 20} MiB of memory "
                                 "on these messages", "status": 400}
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


class _Pool:
    def __init__(self, size: int) -> None:
        self.idle: list[_Worker] = []
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(size)
        atexit.register(self.close)

    def render(self, request: dict) -> dict:
        request = request | {"limit": RENDER_CHARS, "max_range": MAX_RANGE, "max_indent": MAX_INDENT}
        with self.slots:
            with self.lock:
                worker = self.idle.pop() if self.idle else None
            if worker is None or not worker.alive:
                worker = _Worker()
            reply = worker.ask(request, RENDER_SECONDS)
            if worker.alive:
                with self.lock:
                    self.idle.append(worker)
        if reply is None:
            return {"error": f"the chat template ran for over {RENDER_SECONDS:g} s on these messages and was "
                             "stopped", "status": 400}
        return reply

    def close(self) -> None:
        with self.lock:
            workers, self.idle = self.idle, []
        for w in workers:
            w.kill()


_POOL = _Pool(RENDER_WORKERS)


def _serve_renders() -> None:
    """The worker process: one JSON request a line on stdin, one JSON reply a line on stdout."""
    import resource
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # the parent handles Ctrl-C; it kills us if need be
    try:
        resource.setrlimit(resource.RLIMIT_AS, (RENDER_MEMORY, RENDER_MEMORY))
    except (ValueError, OSError):
        pass
    busy = [None]                                       # when the render under way began

    def watchdog(parent: int = os.getppid()) -> None:  # an orphan, or a render its parent failed to stop, ends
        while os.getppid() == parent and (busy[0] is None or time.monotonic() - busy[0] < 4 * RENDER_SECONDS):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    for line in sys.stdin:
        busy[0] = time.monotonic()
        try:
            reply = _render_here(json.loads(line))
        except MemoryError:
            reply = {"error": f"the chat template used more than its {RENDER_MEMORY >> 20} MiB of memory on "
                              "these messages", "status": 400}
        try:
            out = json.dumps(reply)
        except MemoryError:
            out = json.dumps({"error": "the chat template's output is too big", "status": 400})
        busy[0] = None
        sys.stdout.write(out + "\n")
        sys.stdout.flush()


_MARK = re.compile("\ue000(\\d+)\ue001")


def _render_here(req: dict) -> dict:
    from jinja2.exceptions import TemplateError, TemplateSyntaxError
    limit = req["limit"]

    class Budget(Exception):
        pass

    try:
        template = _compile(req["template"], req["max_range"], req["max_indent"], limit)
        args = {"add_generation_prompt": req["add_generation_prompt"], "bos_token": req["bos_token"],
                "eos_token": req["eos_token"]}

        def run(messages) -> str:
            out, n = [], 0
            for piece in template.generate(messages=messages, **args):
                n += len(piece)
                if n > limit:
                    raise Budget(f"the chat template wrote over {limit:,} characters on these messages")
                out.append(piece)
            return "".join(out)

        messages = req["messages"]
        text = run(messages)
        marked = run([{**m, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)])
    except Budget as e:
        return {"error": str(e), "status": 400}
    except TemplateSyntaxError as e:
        return {"error": f"the model's chat template cannot be read ({str(e)[:100]})", "status": 500}
    except TemplateError as e:
        return {"error": f"the model's chat template refused these messages: {str(e)[:200]}", "status": 400}
    except MemoryError:
        raise
    except Exception as e:       # a template bug: a clear line, not a traceback
        return {"error": f"the model's chat template failed ({type(e).__name__}: {str(e)[:100]})", "status": 500}
    rebuilt, spans, at = [], [], 0
    for part in _MARK.split(marked):
        if len(rebuilt) % 2:                  # a message's index: its content goes here
            i = int(part)
            content = messages[i]["content"] if i < len(messages) else ""
            spans.append((at, at + len(content)))
            part = content
        rebuilt.append(part)
        at += len(part)
    return {"text": text, "spans": spans if "".join(rebuilt) == text else None}


_COMPILED: dict = {}


def _compile(source: str, max_range: int, max_indent: int, limit: int):
    if source in _COMPILED:
        return _COMPILED[source]
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def bounded_range(*args):
        r = range(*args)
        if len(r) > max_range:
            raise TemplateError(f"range() of {len(r):,} items; at most {max_range:,}")
        return r

    def tojson(x, indent=None, **_):
        if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= max_indent):
            raise TemplateError(f"tojson(indent={str(indent)[:20]}): at most {max_indent}")
        text = json.dumps(x, ensure_ascii=False, indent=indent)
        if len(text) > limit:
            raise TemplateError(f"tojson wrote over {limit:,} characters")
        return text

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*"})

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > limit:
                        raise TemplateError(f"a repetition of over {limit:,} items")
            return super().call_binop(context, operator, left, right)

    env = Env(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["range"] = bounded_range
    if len(_COMPILED) >= 8:
        _COMPILED.clear()
    _COMPILED[source] = env.from_string(source)
    return _COMPILED[source]


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
