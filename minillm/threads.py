"""How many threads BLAS runs with, and a way to set it: timings mean little without that number.

threadpoolctl reads and sets the thread pools of the BLAS libraries NumPy loaded (OpenBLAS, MKL,
BLIS) while the process runs, so `--threads N` works without restarting Python. The limit holds
for the whole process, the server's engine thread included. A utility below every package that
runs work: the commands (`--threads`), the benchmarks, and disaggregation's two engines (each step on
its own share of the machine) all use `limited`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .errors import MiniLLMError


def _blas_pools() -> list[dict]:
    """threadpoolctl's view of the BLAS pools loaded in this process (none if threadpoolctl is missing),
    NumPy's own first: SciPy, when something loads it, brings its own OpenBLAS, and threadpoolctl lists
    the libraries in an order that changes from run to run."""
    import os

    import numpy  # (threadpoolctl sees only the libraries already loaded)
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    home = os.path.dirname(os.path.abspath(numpy.__file__))          # .../site-packages/numpy
    own = (home + os.sep, home + ".libs" + os.sep)                    # and the wheel's numpy.libs beside it
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return sorted(pools, key=lambda p: not os.path.abspath(p.get("filepath") or "").startswith(own))


def blas_threads() -> int | None:
    """The threads NumPy's BLAS uses now (the largest pool if several are loaded), or None if unknown."""
    pools = [p.get("num_threads") for p in _blas_pools()]
    pools = [n for n in pools if isinstance(n, int)]
    return max(pools) if pools else None


def blas_name() -> str | None:
    """'openblas 0.3.31', 'mkl 2024.1', ...: the BLAS NumPy runs on, when threadpoolctl can tell."""
    for p in _blas_pools():
        return f"{p.get('internal_api', '?')} {p.get('version') or ''}".strip()
    return None


def blas_kernel() -> str | None:
    """The kernel family the BLAS chose for this CPU ('Haswell', 'Zen', ...). OPENBLAS_CORETYPE can force
    an older, slower one: benchmark figures should say which ran."""
    for p in _blas_pools():
        return p.get("architecture")
    return None


SPIN_SET_BEFORE_NUMPY = True   # minillm/__init__.py says whether NumPy had loaded OpenBLAS before it


def blas_spin() -> int | None:
    """How long OpenBLAS's idle threads spin, as the exponent n of 2^n cycles that OPENBLAS_THREAD_TIMEOUT
    gives it (minillm sets 10 before it imports NumPy: see minillm/__init__.py), clamped to OpenBLAS's
    4..30; None if it is unset, not a positive whole number (OpenBLAS then keeps its 2^28), set only
    after NumPy had loaded OpenBLAS, or the BLAS is another."""
    import os
    name = blas_name()
    if not SPIN_SET_BEFORE_NUMPY or name is None or not name.startswith("openblas"):
        return None
    try:
        n = int(os.environ.get("OPENBLAS_THREAD_TIMEOUT", ""))
    except ValueError:
        return None
    return min(30, max(4, n)) if n > 0 else None


# Other thread pools that follow BLAS's count: (get, set) pairs registered by the packages that run
# them (the fused kernels' numba pool, minillm/kernels/runtime.py), so this utility imports none of them.
FOLLOWERS: list[tuple] = []


@contextlib.contextmanager
def limited(threads: int | None) -> Iterator[None]:
    """Run the block with BLAS on `threads` threads (None: leave it as it is), and the pools in
    FOLLOWERS (numba's, for the fused kernels) on as many."""
    if threads is None:
        yield
        return
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise MiniLLMError(f"--threads {threads!r}: give a whole number of threads, at least 1")
    _blas_pools()                      # NumPy's BLAS loaded before its pool is limited
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise MiniLLMError("--threads needs threadpoolctl: pip install threadpoolctl") from None
    saved = [(get(), set_) for get, set_ in FOLLOWERS]
    try:
        for _, set_ in saved:
            set_(threads)
        with threadpool_limits(limits=threads, user_api="blas"):
            yield
    finally:
        for n, set_ in saved:
            set_(n)

