"""Fused kernels for a step's small elementwise operations: ops.rms_norm, ops.layer_norm, ops.gelu,
ops.rope and ops.swiglu,
same arguments, same values (ops counts them, whichever ran). A decode step of SmolLM2 makes 61
norms and 30 rotations: as NumPy's chains of whole-array calls they took 0.89 ms and 0.37 ms of a 10.1 ms fused Q4_1 step,
as these kernels 0.23 and 0.07 of a 7.7 ms one (quiet 2-core Zen 4, timers around each call); a norm
of one row: 7.8 µs against the kernel's 1.6.
The fused kernel set uses them (models/kernel_sets.py); the batch-invariant set keeps ops' own:
each row is computed on its own either way, and ops' results are what that set promises bit for bit.
SwiGLU as two vectorized passes per row (exp(-gate) with the kernels' vectorizable fexp, then
gate·up / (1 + that)): 1.9 µs a row of 1,536 for the kernel, 3.6 with this wrapper, against NumPy's
chain of six whole-array calls, 5.0 (one numba loop with the cap and the division in it was not
vectorized: 4.5; a scalar tanhf per value took 18.7).
"""

from __future__ import annotations

import numpy as np

from . import _numba as K
from . import checks
from .products import _check_float32


# Values from which gelu shares its rows among the threads. Compiled as a parallel loop, the same row's
# code also ran faster on each thread (AMD EPYC Zen 5 VM, 2 threads, rows of 3,072, 41 interleaved
# calls: 1 row 3.7 -> 2.6 µs, 8 rows 26.0 -> 6.9, 512 rows 1,661 -> 455). GPT-2-124M's decode row
# (3,072) stays on one thread: 1 µs a layer is not worth a parallel region on a busy machine.
GELU_PARALLEL_FROM = 4096


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, kernel=K.rms_norm) -> np.ndarray:
    """ops.rms_norm for float32 rows: x [..., n], w [n] -> [..., n]. kernel: _numba's, or the same
    compiled in IEEE order (_exact.py's, the int8 set's)."""
    _check_float32(x, w)
    checks.rms_norm(x, w)
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])            # [N, n]
    y = np.empty_like(rows)
    kernel(rows, w, eps, y)
    return y.reshape(x.shape)


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ops.layer_norm for float32 rows: x [..., n], w, b [n] -> [..., n]."""
    _check_float32(x, w, b)
    checks.layer_norm(x, w, b)
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])            # [N, n]
    y = np.empty_like(rows)
    K.layer_norm(rows, w, b, eps, y)
    return y.reshape(x.shape)


def gelu(x: np.ndarray) -> np.ndarray:
    """ops.gelu for float32 rows: x [..., F] -> [..., F], a new array."""
    _check_float32(x)
    checks.rows(x, "gelu")
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])            # [N, F]
    y = np.empty_like(rows)
    (K.gelu_rows if rows.size >= GELU_PARALLEL_FROM else K.gelu)(rows, y)
    return y.reshape(x.shape)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, kernel=K.rope) -> np.ndarray:
    """ops.rope for float32: x [H, N, hd] (a view of the qkv product is read in place), cos, sin
    [N, hd/2] -> [H, N, hd], a new array."""
    _check_float32(x, cos, sin)
    checks.rope(x, cos, sin)
    y = np.empty(x.shape, np.float32)
    kernel(x, cos, sin, y)
    return y


def swiglu(gate_up: np.ndarray, kernel=K.swiglu) -> np.ndarray:
    """ops.swiglu for float32 rows: gate_up [N, 2F] -> silu(gate)·up [N, F], a new array."""
    _check_float32(gate_up)
    checks.swiglu(gate_up)
    h = np.ascontiguousarray(gate_up)
    y = np.empty((h.shape[0], h.shape[1] // 2), np.float32)
    kernel(h, y)
    return y
