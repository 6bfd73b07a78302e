"""Can the fused kernels run here? numba must import and compile; if not, the NumPy kernels run and
the reason is said once."""

from __future__ import annotations

import os

# numba's OpenMP pool spins after each parallel kernel, waiting for the next; on a 2-core machine that
# spin took the cores from the BLAS products and NumPy operations between kernels (a SmolLM2 prefill of
# 128 tokens: 0.58 s with the spin against 0.28 s without). GNU OpenMP's default spin (300,000 turns
# when the cores are not oversubscribed) kept it; no spin (0) or passive waiting halved the fused Q4_1
# decode; 20,000 turns kept the kernels' speed and gave the cores back (quiet 2-core Zen 4, SmolLM2:
# native Q4_1 decode 102 tokens/s against 88 with the default, float32 fused 45 against 33). Read by
# libgomp when numba first loads it; an explicit setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

import time
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Status:
    usable: bool
    reason: str            # "numba 0.68.1" when usable; what went wrong when not
    load_seconds: float    # importing the kernels: loading them from numba's disk cache, or compiling them

    def __bool__(self) -> bool:
        return self.usable


@lru_cache(maxsize=1)
def status() -> Status:
    """Whether numba works in this process, and why not: numba missing, too old for this NumPy, or a
    compile failure. Checked once: imports numba and compiles (or loads from the cache) one kernel."""
    t0 = time.perf_counter()
    try:
        import numba
    except ImportError as e:
        return Status(False, f"numba is not installed ({e}); pip install numba for the fused kernels", 0.0)
    except Exception as e:  # numba refuses some NumPy versions at import
        return Status(False, f"numba does not import here: {type(e).__name__}: {e}", 0.0)
    try:
        import numpy as np
        from . import _numba
        x = np.ones((1, 32), np.float32)
        y = np.empty((1, 1), np.float32)
        _numba.dense_matmul_t(np.ones((1, 32), np.float32), x, y)
        if y[0, 0] != 32:
            return Status(False, f"numba {numba.__version__} compiled a test kernel that gives {y[0, 0]}, not 32", 0.0)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Status(False, f"numba {numba.__version__} failed to compile a test kernel: {type(e).__name__}: {first}",
                      time.perf_counter() - t0)
    _follow_blas()
    return Status(True, f"numba {numba.__version__}", time.perf_counter() - t0)


def _follow_blas() -> None:
    """Start numba's pool on BLAS's thread count (OPENBLAS_NUM_THREADS, --threads), not on every
    core: the two kinds of kernel then compare on equal threads, and on a busy machine a parallel
    loop waiting for a thread the system has descheduled (every kernel call ends in such a wait)
    costs no more than BLAS's own. Measured on a busy 2-core machine, GPT-2-124M decode: numba on 2
    threads with BLAS on 1 ran 6-25x slower than on 1 thread."""
    from ..threads import blas_threads
    n = blas_threads()
    if n:
        import numba
        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def available() -> bool:
    return status().usable


def set_threads(n: int | None) -> None:
    """Run the fused kernels on n threads (None: leave as is). Give the same count as BLAS's
    (`measure.threads.limited` sets BLAS's); numba's pool cannot exceed NUMBA_NUM_THREADS (the cores)."""
    if n is None or not available():
        return
    import numba
    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


def threads() -> int | None:
    """The threads the fused kernels run on now (None without numba)."""
    if not available():
        return None
    import numba
    return numba.get_num_threads()


from .. import threads as _threads  # noqa: E402  (`threads.limited(n)` sets numba's pool too)

if (threads, set_threads) not in _threads.FOLLOWERS:
    _threads.FOLLOWERS.append((threads, set_threads))
