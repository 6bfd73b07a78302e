"""The processes that render chat templates (minillm/chat_worker.py), seen from the caller.

A render is one JSON line to a worker and one back; the caller's thread only waits on the pipe, at
most `RENDER_SECONDS`: a worker that has not answered by then is killed (and a new one started for
the next render), and the render is refused as over its budget. `RENDER_WORKERS` renders run at
once, each in its own process; a worker is kept for the next render while it lives. The first
render starts the pool; the pool's workers are killed when the program exits.

The worker is started by its path with `python -I` (no user site, no environment, no current
folder on the path), so it imports only the standard library and jinja2, and sets its limits
(`RENDER_MEMORY` bytes of address space among them) before it reads a request.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

RENDER_SECONDS = 2.0                  # one render's wall time
RENDER_CHARS = 1 << 20                # characters one render may write (a 32k-token prompt is ~130k)
RENDER_MEMORY = 1 << 30               # bytes of address space the worker may use
RENDER_WORKERS = 4                    # renders at once (each in its own process)
MAX_RANGE = 10_000                    # items one range() may make
MAX_INDENT = 16                       # tojson's indent
STOP_POLL = 0.05                      # seconds between two looks at a render's `stop`
WORKER = Path(__file__).with_name("chat_worker.py")


class Worker:
    """One worker process and what it has written that has not been read yet."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-I", str(WORKER), str(RENDER_MEMORY), str(RENDER_SECONDS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.buf = b""

    def ask(self, request: dict, seconds: float, stop=None) -> dict | None:
        """The worker's reply, or None if it did not answer within `seconds` (it is then killed, as it
        is when `stop()` turns true while it works: checked every `STOP_POLL` seconds)."""
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
            if stop is not None and stop():
                self.kill()
                return {"error": "the render was stopped: nobody waits for it", "status": 503, "stopped": True}
            if left <= 0:
                self.kill()
                return None
            if not select.select([fd], [], [], left if stop is None else min(left, STOP_POLL))[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:                         # it died: memory past its limit, most likely
                self.kill()
                return {"error": f"the chat template used more than its {RENDER_MEMORY >> 20} MiB of memory "
                                 "on these messages", "status": 400, "over_budget": True}
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


class Pool:
    """`size` renders at once; idle workers kept for the next. Thread-safe."""

    def __init__(self, size: int) -> None:
        self.idle: list[Worker] = []
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(size)

    def render(self, request: dict, stop=None) -> dict:
        """The reply to a render request: {"text", "spans"}, or {"error", "status"} (and "over_budget"
        when the render ran past its time or memory, "stopped" when `stop()` turned true)."""
        request = request | {"limit": RENDER_CHARS, "max_range": MAX_RANGE, "max_indent": MAX_INDENT}
        with self.slots:
            with self.lock:
                worker = self.idle.pop() if self.idle else None
            if worker is None or not worker.alive:
                worker = Worker()
            reply = worker.ask(request, RENDER_SECONDS, stop)
            if worker.alive:
                with self.lock:
                    self.idle.append(worker)
        if reply is None:
            return {"error": f"the chat template ran for over {RENDER_SECONDS:g} s on these messages and was "
                             "stopped", "status": 400, "over_budget": True}
        return reply

    def close(self) -> None:
        with self.lock:
            workers, self.idle = self.idle, []
        for w in workers:
            w.kill()


_POOL: Pool | None = None
_STARTING = threading.Lock()


def pool() -> Pool:
    """The program's pool, made at its first render (its workers are killed at exit)."""
    global _POOL
    with _STARTING:
        if _POOL is None:
            _POOL = Pool(RENDER_WORKERS)
            atexit.register(_POOL.close)
        return _POOL
