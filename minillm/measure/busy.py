"""Is the machine busy? Timings taken while other work runs are slow and noisy, and a learner who is
not told so believes them. `busy_note` says so in one line, with the fix, before the first number.

Two signs, both cheap: the load average (runnable work, ours included, averaged over a minute) set
against the CPUs, and a short probe that spins for a moment and compares the CPU time this process
got with the wall time that passed (on a quiet CPU, nearly all of it).
"""

from __future__ import annotations

import os
import time

from ..threads import blas_threads

PROBE_S = 0.05          # how long the probe spins
FAIR_SHARE = 0.7        # below this share of one core in the probe, something else is running here


def cpu_share(seconds: float = PROBE_S) -> float:
    """The share of one core this process got while spinning for `seconds` of wall time (0 to 1)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    wall = time.perf_counter() - wall0
    return min(1.0, (time.process_time() - cpu0) / wall) if wall > 0 else 1.0


def assess(threads: int, cpus: int, load: float | None, share: float) -> str | None:
    """The note for these readings, or None when the machine has room for `threads` threads: busy when
    the load leaves fewer than `threads` CPUs free (half a CPU of slack), or when the probe got less
    than FAIR_SHARE of a core."""
    crowded = load is not None and load > cpus - threads + 0.5
    if not crowded and share >= FAIR_SHARE:
        return None
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
    return assess(threads, os.cpu_count() or 1, load, cpu_share())
