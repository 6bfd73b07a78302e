"""Where a step's time goes, as a picture: a Chrome trace-event file (JSON) that Perfetto
(ui.perfetto.dev) and chrome://tracing open, fed by the meter.

Every operation reports itself to the active meter after it has run (`m.count(op, ...)`: the op
modules, models/ops.py and the ones families assemble, whichever kernel ran). A `TraceMeter` is a Meter that also notes the time of each report: the
operation's slice runs from the previous report (or the step's start) to its own, so it holds the
operation and the Python around it, and the slices tile the step with no gap. Each slice carries the
bytes and FLOPs the operation reported, by kind, as its arguments; each step is a slice around its
operations (prefill, decode, ...), with its totals; the time from the last report to the step's end
is a slice of its own ("after the last operation": sampling, the cache's bookkeeping).

    with TraceMeter() as m:
        minillm.generate(model, prompt, 20)
    m.write_trace("steps.json")          # then open it in ui.perfetto.dev

Times are the meter's clock (time.perf_counter; on a GPU read after the device's queued work is
done), in microseconds from the meter's creation; one track per thread (a server's engine thread is
its own).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from .errors import MiniLLMError
from .meter import BYTE_KINDS, FLOP_KINDS, Meter, StepRecord

KINDS = (*BYTE_KINDS, *FLOP_KINDS, "scratch")


class TraceError(MiniLLMError):
    """A trace file cannot be written where asked."""


class TraceMeter(Meter):
    """A Meter that also records one trace slice per reported operation and one per step."""

    def __init__(self, process_name: str = "minillm", pid: int | None = None, max_events: int | None = None,
                 origin: float | None = None) -> None:
        """process_name, pid: the track the slices go on (several traced models: one pid each);
        max_events: keep only the last so many slices (a server runs for days); origin: the clock
        value at time 0 (several meters in one file share one)."""
        super().__init__()
        self.process_name = process_name
        self.pid = os.getpid() if pid is None else pid
        self.events: deque = deque(maxlen=max_events)
        self._origin = time.perf_counter() if origin is None else origin
        self._last = 0.0                 # the clock at the step's start or the last report in it
        self._tids: dict[int, int] = {}

    def _tid(self) -> int:
        return self._tids.setdefault(threading.get_ident(), len(self._tids) + 1)

    def _us(self, t: float) -> float:
        return round((t - self._origin) * 1e6, 3)

    def begin(self, kind: str, position: int, n_tokens: int, clock=None) -> bool:
        opened = super().begin(kind, position, n_tokens, clock)
        if opened:
            self._last = self._t0
        return opened

    def count(self, op: str, **kinds) -> None:
        if self._open is None:           # outside a step: Meter opens and closes one around it
            return super().count(op, **kinds)
        super().count(op, **kinds)
        now = self._clock()
        args = {k: v for k, v in kinds.items() if v}
        args["bytes"] = sum(kinds.get(k, 0) for k in BYTE_KINDS)
        args["flops"] = sum(kinds.get(k, 0) for k in FLOP_KINDS)
        self.events.append({"name": op, "cat": "op", "ph": "X", "ts": self._us(self._last),
                            "dur": round((now - self._last) * 1e6, 3), "pid": self.pid,
                            "tid": self._tid(), "args": args})
        self._last = now

    def end(self, attended: int = 0) -> StepRecord:
        record = super().end(attended)
        t_end = self._t0 + record.seconds
        if t_end > self._last:
            self.events.append({"name": "after the last operation", "cat": "step", "ph": "X",
                                "ts": self._us(self._last), "dur": round((t_end - self._last) * 1e6, 3),
                                "pid": self.pid, "tid": self._tid(), "args": {}})
        self.events.append({"name": record.kind, "cat": "step", "ph": "X", "ts": self._us(self._t0),
                            "dur": round(record.seconds * 1e6, 3), "pid": self.pid, "tid": self._tid(),
                            "args": {"position": record.position, "tokens": record.n_tokens,
                                     "sequences": record.n_seqs, "bytes": record.total_bytes,
                                     "flops": record.total_flops, **record.bytes, **record.flops,
                                     "scratch": record.scratch}})
        return record

    def trace_events(self) -> list[dict]:
        """This meter's events: its track's names, then its slices in time order."""
        meta = [{"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0,
                 "args": {"name": self.process_name}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.pid, "tid": tid,
                  "args": {"name": "main" if ident == threading.main_thread().ident else f"thread {tid}"}}
                 for ident, tid in self._tids.items()]
        return meta + sorted(self.events, key=lambda e: (e["ts"], -e["dur"]))

    def trace(self) -> dict:
        """The trace as Chrome's trace-event JSON object."""
        return as_trace([self])

    def write_trace(self, path: str | Path) -> Path:
        """Write the trace to `path` whole or not at all (a temporary file beside it, renamed)."""
        return write_trace([self], path)


MARK = '{"otherData": {"source": "minillm"'   # how every trace minillm writes begins: the one kind of
                                             # file a trace may replace
TRACE_EVENTS = 100_000     # slices a traced command keeps (the last ones): about 1 kB each in memory,
                           # measured, so some 100 MB at most, whatever the run's length


def as_trace(meters: list[TraceMeter]) -> dict:
    return {"otherData": {"source": "minillm", "slices": "one per operation reported to the meter"},
            "traceEvents": [e for m in meters for e in m.trace_events()], "displayTimeUnit": "ms"}


def _refuse(path, why: str) -> TraceError:
    return TraceError(f"cannot write the trace to {str(path)[:200]!r}: {why}")


def _ours(path: Path) -> bool:
    """Is the regular file at path a trace minillm wrote (it begins with MARK)? Read without
    following a link, a few bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        return os.read(fd, len(MARK)).decode("utf-8", "replace") == MARK
    finally:
        os.close(fd)


def _check_target(path: Path) -> bool:
    """What is at path now: nothing (False), or a trace minillm wrote (True); else one line. Never a
    link (even to a trace: what it points at would be replaced), a device, a FIFO, a socket, a
    folder, or a file minillm did not write."""
    import stat
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise _refuse(path, e.strerror or str(e)) from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "it is a symbolic link; give the name of a new file such as trace.json")
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is a folder; give a file name such as trace.json")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a file")
        raise _refuse(path, f"it is {kind}, not a file; give the name of a new file such as trace.json")
    if not _ours(path):
        raise _refuse(path, "a file is there that is not a trace minillm wrote; remove it or choose another name")
    return True


def check_path(path: str | Path) -> Path:
    """The trace's path, checked before any work: a name (no NUL byte, each part at most the
    system's 255 bytes), in a folder that exists and takes a new file (tried: a temporary file made
    and removed), where there is nothing yet or a trace minillm wrote (`_check_target`)."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise _refuse(path, "give a file name such as trace.json")
    if "\0" in text:
        raise _refuse(text.replace("\0", "\\0"), "the name holds a NUL byte; give a file name such as trace.json")
    path = Path(text).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    longest = max((len(os.fsencode(p)) for p in path.parts), default=0)
    try:
        limit = os.pathconf(folder if folder.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    if longest > limit:
        raise _refuse(f"{text[:60]}...", f"a part of the name is {longest:,} bytes long, past the system's {limit}")
    if not folder.is_dir():
        raise _refuse(path, f"folder {folder} does not exist")
    if path.name in ("", ".", ".."):
        raise _refuse(path, "it is a folder; give a file name such as trace.json")
    _check_target(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".minillm-trace-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise _refuse(path, f"folder {folder} takes no new file ({e.strerror or e})") from None
    return path


def write_trace(meters: list[TraceMeter], path: str | Path) -> Path:
    """Several meters' traces (each its own track) in one file, whole or not at all: written to a
    temporary file in the same folder, then put in place without replacing anything minillm did not
    write: linked to the name where nothing is there (refused if something appeared since), renamed
    over a trace of minillm's."""
    path = check_path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:200]}.", suffix=".part", dir=folder)
    except OSError as e:
        raise _refuse(path, e.strerror or str(e)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(as_trace(meters), f)
        if _check_target(path):
            os.replace(tmp, path)          # a trace of ours: replaced whole
        else:
            os.link(tmp, path)             # nothing there: a new name, never over what appeared since
    except FileExistsError:
        raise _refuse(path, "a file appeared there while the trace was made; remove it or choose another name") from None
    except OSError as e:
        raise _refuse(path, e.strerror or str(e)) from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


@contextmanager
def traced(path: str | Path | None, process_name: str = "minillm"):
    """`with traced(args.trace) as m:` a TraceMeter active inside, its trace written to `path` at the
    end (also when the block raises: what ran is kept); no path: nothing metered, yields None."""
    if path is None:
        yield None
        return
    path = check_path(path)
    m = TraceMeter(process_name, max_events=TRACE_EVENTS)
    try:
        with m:
            yield m
    finally:
        m.write_trace(path)


def trace_line(path, meters) -> str:
    """What a command says after writing a trace."""
    n = sum(1 for m in meters for e in m.events if e.get("cat") == "op")
    full = any(m.events.maxlen is not None and len(m.events) == m.events.maxlen for m in meters)
    last = f" (the last {sum(len(m.events) for m in meters):,} slices kept)" if full else ""
    return f"trace: {n:,} operation slices in {path}{last} (open it in ui.perfetto.dev or chrome://tracing)"
