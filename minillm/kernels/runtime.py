"""Can the fused kernels run here? numba must import and compile; if not, the NumPy kernels run and
the reason is said once."""

from __future__ import annotations

import os
import sys

# numba's OpenMP pool spins after each parallel kernel, waiting for the next; on a 2-core machine that
# spin took the cores from the BLAS products and NumPy operations between kernels (a SmolLM2 prefill of
# 128 tokens: 0.58 s with the spin against 0.28 s without). GNU OpenMP's default spin (300,000 turns
# when the cores are not oversubscribed) kept it; no spin (0) or passive waiting halved the fused Q4_1
# decode; 20,000 turns kept the kernels' speed and gave the cores back (quiet 2-core Zen 4, SmolLM2:
# native Q4_1 decode 102 tokens/s against 88 with the default, float32 fused 45 against 33). Read by
# libgomp when numba first loads it; an explicit setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "20000")


def _wide_vectors() -> None:
    """Let LLVM vectorize the kernels' loops 512 bits wide on a CPU with AVX-512 whose tuning says
    256 (LLVM's "prefer-256-bit", set for every Intel AVX-512 CPU, not for AMD's Zen 4): numba
    compiles for the host's name and features, so on an Intel Xeon the fused float32 products ran
    in ymm registers, half the width Zen 4 gets from the same code. Measured on an Intel Xeon VM
    (Emerald Rapids, 2 vCPUs, 2 threads, quiet; six processes each way, alternated; medians of 11
    interleaved passes each): GPT-2-124M's 48 float32 products, every layer's own weights, 18.5 ms
    (15.3-19.6 over the six) against 22.3 (19.9-26.8) in 256-bit vectors, 64% of `hardware`'s
    28.7 GB/s against 53%; its 154 MB head 8.5 (6.7-9.0) against 10.0 ms (8.7-11.7), faster in each
    of the six pairs. The integer kernels write their 512-bit vectors explicitly: the same speed
    either way (SmolLM2's 120 Q4_1 products 7.8 against 7.7 ms). numba reads
    NUMBA_CPU_FEATURES when it is imported and makes its target at its first compile: both are
    set here (a numba that has compiled already keeps its target); a NUMBA_CPU_NAME or
    NUMBA_CPU_FEATURES of the user's wins (the seam test pins NUMBA_CPU_NAME=znver4: its saved bits
    are untouched)."""
    if os.environ.get("NUMBA_CPU_NAME") or "NUMBA_CPU_FEATURES" in os.environ:
        return
    try:
        import llvmlite.binding as llvm
        features = llvm.get_host_cpu_features()
    except Exception:                         # pragma: no cover - llvmlite missing or odd
        return
    if features.get("avx512f"):
        os.environ["NUMBA_CPU_FEATURES"] = features.flatten() + ",-prefer-256-bit"
        config = sys.modules.get("numba.core.config")    # numba imported first: its setting read already
        if config is not None:
            config.CPU_FEATURES = os.environ["NUMBA_CPU_FEATURES"]


_wide_vectors()

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
