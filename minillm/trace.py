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


def as_trace(meters: list[TraceMeter]) -> dict:
    return {"traceEvents": [e for m in meters for e in m.trace_events()], "displayTimeUnit": "ms",
            "otherData": {"source": "minillm", "slices": "one per operation reported to the meter"}}


def check_path(path: str | Path) -> Path:
    """The trace's path, checked before any work: its folder must exist and not be the path itself."""
    path = Path(path).expanduser()
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TraceError(f"cannot write the trace to {path}: folder {folder} does not exist")
    if path.is_dir():
        raise TraceError(f"cannot write the trace to {path}: it is a folder; give a file name such as trace.json")
    return path


def write_trace(meters: list[TraceMeter], path: str | Path) -> Path:
    """Several meters' traces (each its own track) in one file, whole or not at all."""
    path = check_path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=folder)
    except OSError as e:
        raise TraceError(f"cannot write the trace to {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(as_trace(meters), f)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise TraceError(f"cannot write the trace to {path}: {e.strerror or e}") from None
    return path


@contextmanager
def traced(path: str | Path | None, process_name: str = "minillm"):
    """`with traced(args.trace) as m:` a TraceMeter active inside, its trace written to `path` at the
    end (also when the block raises: what ran is kept); no path: nothing metered, yields None."""
    if path is None:
        yield None
        return
    path = check_path(path)
    m = TraceMeter(process_name)
    try:
        with m:
            yield m
    finally:
        m.write_trace(path)


def trace_line(path, meters) -> str:
    """What a command says after writing a trace."""
    n = sum(1 for m in meters for e in m.events if e.get("cat") == "op")
    return f"trace: {n:,} operation slices in {path} (open it in ui.perfetto.dev or chrome://tracing)"
