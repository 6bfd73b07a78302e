"""What the CPU and numba's target offer the integer kernels: the features both have.

Its own module, below int8.py (which chooses an instruction set from them) and _int8.py (which emits
a float16 conversion only where the target has F16C), so neither imports the other for it."""

from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=1)
def cpu_features() -> frozenset:
    """The features the integer kernels may use: those of the host CPU (as LLVM sees them: cpuid and
    what the OS enables) that numba's target also has. numba compiles for the host unless told
    otherwise (NUMBA_CPU_NAME=generic, NUMBA_CPU_FEATURES=...): an instruction the host has but the
    target lacks cannot be compiled (LLVM aborts the process), one the target names but the host
    lacks would crash it. Empty where llvmlite is missing."""
    try:
        import llvmlite.binding as llvm
        host = frozenset(k for k, v in llvm.get_host_cpu_features().items() if v)
    except Exception:                         # pragma: no cover - llvmlite missing or odd
        return frozenset()
    return host & target_features(host)


def target_features(host: frozenset) -> frozenset:
    """The features numba compiles for: NUMBA_CPU_FEATURES's "+name" entries where it is set (numba
    sets it to "" for NUMBA_CPU_NAME=generic: none beyond the architecture's baseline), else the
    host's (numba's codegen reads the same two settings)."""
    try:
        from numba.core import config
        given = config.CPU_FEATURES
    except Exception:                         # pragma: no cover - numba missing
        given = os.environ.get("NUMBA_CPU_FEATURES")
        if given is None and os.environ.get("NUMBA_CPU_NAME", "").lower() == "generic":
            given = ""
    if given is None:
        return host
    return frozenset(f.strip()[1:] for f in given.split(",") if f.strip().startswith("+"))
