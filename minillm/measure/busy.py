"""Is the machine busy? Timings taken while other work runs are slow and noisy, and a learner who is
not told so believes them. `busy_note` says so in one line, with the fix, before the first number.

Three signs, all cheap: a short probe that spins for a moment and compares the CPU time this
process got with the wall time that passed (on a quiet CPU, nearly all of it); the CPUs other
processes kept busy during that probe, where the system counts it (Linux's /proc/stat); and, where
it does not, the load average (runnable work, averaged over a minute) set against the CPUs. The load
average lags a minute behind: it still counts work that has just finished (run back to back on an
idle 2-core machine, every lesson from the third on read load 1.0-1.2, the lessons before it, and
was called busy) and has not yet seen work that has just started.
"""

from __future__ import annotations

import os
import time

from ..threads import blas_threads

PROBE_S = 0.1           # how long the probe spins (CPU time is counted in 10 ms ticks)
FAIR_SHARE = 0.85       # below this share of one core in the probe, something else is running here
                        # (quiet: 0.98-1.0; beside two burners on 2 CPUs a process gets about 2/3)


def _busy_seconds() -> float | None:
    """CPU seconds every process has spent working since boot (Linux's /proc/stat), None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)          # idle and iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")       # user .. steal
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def probe(seconds: float = PROBE_S) -> tuple[float, float | None]:
    """Spin for `seconds` of wall time: (the share of one core this process got, 0 to 1; the CPUs
    other processes kept busy meanwhile, or None where the system does not say)."""
    busy0 = _busy_seconds()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    wall = time.perf_counter() - wall0
    mine = time.process_time() - cpu0
    busy1 = _busy_seconds()
    share = min(1.0, mine / wall) if wall > 0 else 1.0
    others = None if busy0 is None or busy1 is None or wall <= 0 else max(0.0, (busy1 - busy0 - mine) / wall)
    return share, others


def cpu_share(seconds: float = PROBE_S) -> float:
    """The share of one core this process got while spinning for `seconds` of wall time (0 to 1)."""
    return probe(seconds)[0]


def assess(threads: int, cpus: int, load: float | None, share: float, others: float | None = None) -> str | None:
    """The note for these readings, or None when the machine has room for `threads` threads: busy when
    the CPUs other processes used during the probe (where known; else the load average) leave fewer
    than `threads` CPUs free (half a CPU of slack), or when the probe got less than FAIR_SHARE of a core."""
    room = cpus - threads + 0.5
    crowded = others > room if others is not None else load is not None and load > room
    if not crowded and share >= FAIR_SHARE:
        return None
    if others is not None:
        seen = [f"other processes kept {others:.1f} of {cpus} CPU{'s' if cpus != 1 else ''} busy"]
    else:
        seen = [f"load {load:.1f} on {cpus} CPU{'s' if cpus != 1 else ''}"] if load is not None else []
    seen.append(f"this process got {share:.0%} of a core")
    fix = "try --threads 1 or close other work" if threads > 1 else "close other work or run again later"
    return f"busy machine ({'; '.join(seen)}): timings run slow and noisy; {fix}"


def busy_note(threads: int | None = None) -> str | None:
    """One line saying the machine is busy, how busy, and what to do; None when it is quiet.
    `threads`: the BLAS threads the timed work will use (None: as BLAS runs now)."""
    if threads is None:
        threads = blas_threads() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):     # not on every system
        load = None
    return assess(threads, os.cpu_count() or 1, load, *probe())


def conditions(threads: int | None = None, note: str | None = None) -> dict:
    """The conditions a timed command ran under, for its JSON (`--json` notes a busy machine too): the
    busy note (None when quiet), the BLAS threads, the load average and the CPUs. `note`: a note already
    taken (so the machine is not probed twice)."""
    if threads is None:
        threads = blas_threads()
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        load = None
    return {"busy": note if note is not None else busy_note(threads), "blas_threads": threads,
            "load_average": load, "cpus": os.cpu_count()}
