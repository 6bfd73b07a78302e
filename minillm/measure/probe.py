"""Measuring this machine: its last-level cache, memory read bandwidth, matmul peak, load and threads.

The bandwidth is the ceiling every decode step is held against, so it is measured to be one that no
step of the engine can beat: several access patterns (the engine's own among them: `v @ W` over
GPT-2-shaped blocks), each repeated, over a buffer many times the last-level cache, and the best of
all of them is kept. `hardware` caches the result; this module only measures.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import MiniLLMError

MB = 2**20
FALLBACK_LLC_BYTES = 32 * MB

# What each bandwidth method does. Each one reads the buffer once and writes almost nothing, so
# bytes read / time is the read bandwidth that method achieves. matvec and vecmat are the two ways
# a decode step can read one weight matrix; vecmat-blocks is a decode step's own pattern.
METHODS = {
    "sum": "x.sum(): NumPy's reduction, one thread",
    "sum-threads": "x.sum() over one slice per hardware thread, all at once",
    "dot": "np.dot(x, x): BLAS sdot, each byte read once",
    "matvec": "W @ v: BLAS sgemv, W stored [out, in]",
    "vecmat": "v @ W: BLAS sgemv, W stored [in, out] (HF Conv1D)",
    "vecmat-blocks": "v @ W over [768, 3072] blocks, one after another, as a decode step reads its weights",
}
BLOCK = (768, 3072)   # GPT-2 small's MLP weight: the engine's largest matrix-vector product


def fast_mode() -> bool:
    """`MINILLM_FAST=1`: smaller buffers and fewer repeats, for tests and quick lessons."""
    return os.environ.get("MINILLM_FAST", "").strip().lower() not in ("", "0", "false", "no")


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, averaged), or None where the OS has none."""
    with contextlib.suppress(OSError, AttributeError):
        return round(os.getloadavg()[0], 2)
    return None


def _parse_size(text: str) -> int:
    """'32768K' / '1M' / '512' (sysfs cache sizes) → bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    return int(match.group(1)) * scale


def detect_llc_bytes() -> int:
    """Size of the last-level cache (the largest, outermost one) in bytes; 32 MB if it can't be found.

    Tries Linux sysfs, then glibc's `sysconf`, then macOS `sysctl`. The benchmark buffer must be
    many times larger than this, or we would be timing the cache instead of memory.
    """
    best_level, best_size = 0, 0
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and (level, size) > (best_level, best_size):
            best_level, best_size = level, size
    if best_size:
        return best_size
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            size = os.sysconf(name)
            if size and size > 0:
                return int(size)
    if platform.system() == "Darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
                if out.returncode == 0 and int(out.stdout.strip() or 0) > 0:
                    return int(out.stdout.strip())
    return FALLBACK_LLC_BYTES


def available_memory_bytes() -> int | None:
    """Memory we could use without pushing others into swap (Linux MemAvailable), or None if unknown."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'AMD EPYC 7763 64-Core Processor' or 'Apple M2'."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")) and ":" in line:
                return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_threads() -> int:
    """Hardware threads this process may run on (its affinity mask where the OS has one)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_buffer_mb(llc_bytes: int, fast: bool = False) -> int:
    """The bandwidth buffer: at least 8× the last-level cache and 256 MB, at most 4 GB or a quarter of free memory.

    Fast mode uses 64 MB: quick, but on a chip with a big cache partly a cache measurement.
    """
    if fast:
        return 64
    want = max(256 * MB, 8 * llc_bytes)
    cap = 4096 * MB
    free = available_memory_bytes()
    if free:
        cap = min(cap, free // 4)
    return max(16, min(want, cap) // MB)


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Best (shortest) wall time of `repeats` calls, after one untimed warm-up call.

    The best run is the one least disturbed by everything else on the machine, so it is the
    closest to what the hardware can do.
    """
    fn()
    best = math.inf
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def measure_bandwidth(size_mb: int | None = None, repeats: int | None = None) -> dict:
    """This machine's memory *read* bandwidth in GB/s (1 GB = 10⁹ bytes), best over several methods.

    A float32 buffer far larger than the last-level cache is read end to end by each method in
    `METHODS`; bytes / best time is that method's bandwidth. The methods run in interleaved rounds
    (each method once per round), so a busy moment of the machine lowers one round of each, not all
    of one method; each keeps its best round. The methods differ in how many threads they use and
    how well they keep the memory system busy: the fastest one is the figure, the closest we get to
    the hardware's limit, so that no decode step of the engine reads faster than it.

    Returns `{"bandwidth_gbs", "method", "methods": {name: GB/s}, "buffer_mb", "llc_mb", "repeats", "fast"}`.
    """
    fast = fast_mode()
    llc = detect_llc_bytes()
    if size_mb is None:
        size_mb = default_buffer_mb(llc, fast)
    if repeats is None:
        repeats = 3 if fast else 7
    if size_mb <= 0 or repeats <= 0:
        raise MiniLLMError(f"measure_bandwidth: size_mb={size_mb} and repeats={repeats} must be positive")

    # A square matrix whose side is a multiple of 64 floats, so rows start on cache-line boundaries.
    side = max(64, int(math.isqrt(size_mb * MB // 4)) // 64 * 64)
    x = np.ones(side * side, dtype=np.float32)  # np.ones touches every page: no page faults while timing
    W = x.reshape(side, side)                   # the same memory seen as a matrix: no second buffer
    v = np.ones(side, dtype=np.float32)
    rows, cols = BLOCK
    n_blocks = x.size // (rows * cols)
    blocks = [x[i * rows * cols:(i + 1) * rows * cols].reshape(rows, cols) for i in range(n_blocks)]
    v_block = np.ones(rows, dtype=np.float32)
    workers = max(1, cpu_threads())
    slices = np.array_split(x, workers)
    pool = ThreadPoolExecutor(max_workers=workers)
    runs = {
        "sum": (x.nbytes, lambda: x.sum()),
        "sum-threads": (x.nbytes, lambda: list(pool.map(np.sum, slices))),
        "dot": (x.nbytes, lambda: np.dot(x, x)),
        "matvec": (x.nbytes, lambda: W @ v),
        "vecmat": (x.nbytes, lambda: v @ W),
    }
    if n_blocks >= 2:
        runs["vecmat-blocks"] = (n_blocks * rows * cols * 4, lambda: [v_block @ b for b in blocks])
    best = {name: math.inf for name in runs}
    try:
        for _, fn in runs.values():
            fn()                                    # warm-up: first touches, thread start-up
        for _ in range(repeats):
            for name, (_, fn) in runs.items():
                start = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - start)
    finally:
        pool.shutdown()
    methods = {name: round(runs[name][0] / max(best[name], 1e-9) / 1e9, 2) for name in runs}
    top = max(methods, key=methods.__getitem__)
    return {
        "bandwidth_gbs": methods[top],
        "method": top,
        "methods": methods,
        "buffer_mb": round(x.nbytes / MB),
        "llc_mb": round(llc / MB, 2),
        "repeats": repeats,
        "fast": fast,
    }


def measure_matmul_peak(size: int | None = None, repeats: int | None = None) -> dict:
    """float32 matrix-multiply (sgemm) speed in GFLOP/s: the best this machine's BLAS can do.

    An n×n by n×n product does 2·n³ FLOPs (one multiply and one add per term) on 3·n² numbers,
    so at n = 2048 it does ~680 FLOPs per float it touches: it waits on arithmetic, not memory.
    Returns `{"peak_gflops", "size", "repeats", "fast"}`.
    """
    fast = fast_mode()
    if size is None:
        size = 512 if fast else 2048
    if repeats is None:
        repeats = 2 if fast else 5
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)
    seconds = _best_seconds(lambda: np.matmul(a, b, out=out), repeats)
    return {"peak_gflops": round(2 * size**3 / seconds / 1e9, 1), "size": size, "repeats": repeats, "fast": fast}


