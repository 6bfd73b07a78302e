"""Were the weights read from a cache or from DRAM? Read from the measurement, never from sysfs.

The cache size the operating system lists can be the whole host chip's (a virtual machine's sysfs shows
the host's 480 MiB L3, shared with other tenants and split across dies), so "the weights fit the
last-level cache" is not a conclusion a size comparison may draw. Weights are called cache-resident
only when a measurement says so:

    - a step read its bytes faster than this machine's measured DRAM bandwidth (by more than OUTRAN),
      or
    - a read of a buffer the size of the weights (`probe_at`) ran well above (RESIDENT ×) the
      large-buffer figure the bandwidth was measured with.

Otherwise the words are only "the operating system reports an L3 of …", with no conclusion.
"""

from __future__ import annotations

import time

import numpy as np

OUTRAN = 1.05        # a step faster than the DRAM figure by more than 5%: not noise in the bandwidth
RESIDENT = 1.5       # a buffer of the weights' size read 1.5× faster than the large buffer: a cache


def os_reports(hw) -> str:
    """'the operating system reports a last-level cache of 32 MiB' (or that it reports none)."""
    n = hw.llc_bytes                          # (Hardware: None where the system lists none)
    if not n:
        return "the operating system reports no last-level cache size"
    unit, scale = next((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1)) if n >= s)
    return f"the operating system reports a last-level cache of {n / scale:.3g} {unit}"


def outran(step_gbs: float, hw) -> bool:
    """Whether a step's measured GB/s passed this machine's measured DRAM bandwidth beyond the noise."""
    return step_gbs > OUTRAN * hw.bandwidth_gbs


def probe_at(nbytes: int, repeats: int = 3) -> float:
    """GB/s reading (summing) a float32 buffer of `nbytes`, best of `repeats` after a warm-up: what this
    machine's memory system gives a working set of that size."""
    x = np.ones(max(1024, int(nbytes) // 4), dtype=np.float32)
    x.sum()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.nbytes / max(best, 1e-9) / 1e9


def verdict(nbytes: int, hw, step_gbs: float | None = None, probe_gbs: float | None = None) -> str:
    """'cache' when a measurement says the weights were read from a cache (a step beat the DRAM figure, or
    the probe at their size ran RESIDENT × above it), 'dram' when the probe at their size ran near the
    DRAM figure, 'unknown' otherwise (then say only what the operating system reports)."""
    if step_gbs is not None and outran(step_gbs, hw):
        return "cache"
    if probe_gbs is not None:
        return "cache" if probe_gbs > RESIDENT * hw.bandwidth_gbs else "dram"
    return "unknown"


# Models to suggest when a run is read from a cache: each at least twice the bytes of the one before.
LARGER = ("large", "random-124m", "random-355m", "random-774m")


def _bundled_large_bytes() -> int | None:
    """The bundled large model's file size (its float32 weights), None where it is not installed."""
    try:
        from ..checkpoints.load import bundled_dir
        f = bundled_dir("large") / "model.safetensors"
        return f.stat().st_size if f.is_file() else None
    except Exception:        # noqa: BLE001  (a missing package or directory: no suggestion of it)
        return None


def larger_model(current_name: str, current_bytes: int) -> str | None:
    """The first model of LARGER with at least 4× the weights of the current one (float32), never the
    current one itself: advice that does not send the learner back to the model they are on."""
    from ..models.gpt2 import GPT2_SIZES
    sizes = {"large": _bundled_large_bytes(), "random-124m": 4 * GPT2_SIZES["124m"].n_params(),
             "random-355m": 4 * GPT2_SIZES["355m"].n_params(), "random-774m": 4 * GPT2_SIZES["774m"].n_params()}
    for name in LARGER:
        size = sizes[name]
        if name != current_name and size is not None and size >= 4 * current_bytes:
            return name
    return None
