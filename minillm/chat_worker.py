"""The chat-template worker: a process that renders chat templates, one JSON request a line on stdin,
one JSON reply a line on stdout. Started by path (`python -I chat_worker.py MEMORY SECONDS`, by
minillm/chat_pool.py), it needs the standard library and jinja2 only, and imports nothing of
minillm: the sandbox holds exactly what it runs.

Its limits come first, before jinja2 is imported or any request read: address space `MEMORY`
bytes (a template that builds a huge string dies here, not in the server), no file written
(RLIMIT_FSIZE 0), no core file, a handful of descriptors; Ctrl-C is the parent's to handle. A
watchdog thread ends the process when its parent goes, or when one render runs past four times
its budget of `SECONDS` (the parent kills it sooner; this is the backstop).

A request: {"template", "messages", "add_generation_prompt", "bos_token", "eos_token", "limit",
"max_range", "max_indent"}. The reply: {"text", "spans"} (spans: where each message's content lies
in the text, or None when the template rewrites it), or {"error", "status"}. The template runs in
jinja2's immutable sandbox as transformers runs it (trim_blocks, lstrip_blocks, loopcontrols,
`raise_exception`, `tojson`), with `range`, `tojson` and `*` bounded by the request's limits, and
its output cut off past `limit` characters.
"""

import json
import os
import re
import sys
import threading
import time

MAX_FILES = 32              # descriptors: stdin, stdout, stderr and the module files jinja2 reads at import


def set_limits(memory: int) -> None:
    """The process's limits, before anything else runs (each as far as this system allows)."""
    import resource
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # the parent handles Ctrl-C; it kills us if need be
    for name, value in (("RLIMIT_AS", memory), ("RLIMIT_FSIZE", 0), ("RLIMIT_CORE", 0),
                        ("RLIMIT_NOFILE", MAX_FILES)):
        limit = getattr(resource, name, None)
        if limit is None:
            continue
        try:
            hard = resource.getrlimit(limit)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass


def serve(memory: int, seconds: float) -> None:
    """Answer requests until stdin closes."""
    busy = [None]                                       # when the render under way began

    def watchdog(parent: int = os.getppid()) -> None:   # an orphan, or a render its parent failed to stop, ends
        while os.getppid() == parent and (busy[0] is None or time.monotonic() - busy[0] < 4 * seconds):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    too_big = {"error": f"the chat template used more than its {memory >> 20} MiB of memory on these messages",
               "status": 400, "over_budget": True}
    for line in sys.stdin:
        busy[0] = time.monotonic()
        try:
            reply = render(json.loads(line))
        except MemoryError:
            reply = too_big
        try:
            out = json.dumps(reply)
        except MemoryError:
            out = json.dumps({"error": "the chat template's output is too big", "status": 400})
        busy[0] = None
        sys.stdout.write(out + "\n")
        sys.stdout.flush()


_MARK = re.compile("\ue000(\\d+)\ue001")


def render(req: dict) -> dict:
    """One request's reply: the text and the messages' spans, or an error and its status."""
    from jinja2.exceptions import TemplateError, TemplateSyntaxError
    limit = req["limit"]

    class Budget(Exception):
        pass

    try:
        template = compile_template(req["template"], req["max_range"], req["max_indent"], limit)
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


def compile_template(source: str, max_range: int, max_indent: int, limit: int):
    """The template compiled in the sandbox, its `range`, `tojson` and `*` bounded (the last 8 kept)."""
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


if __name__ == "__main__":
    set_limits(int(sys.argv[1]))
    serve(int(sys.argv[1]), float(sys.argv[2]))
