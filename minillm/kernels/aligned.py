"""Where the kernels' arrays start. NumPy starts a new array 16 bytes past a 64-byte boundary (or
32, or 48: wherever its allocator puts it), numba's own often at 32: then every 64-byte vector load of
it spans two cache lines, and a product of AVX-512 loads pays for two. The weights are put on a
64-byte boundary once, when a kernel set makes them (the fused set's float32 weights and planes, the
integer set's planes in lane order, the compiled step's stacks); the float32 blocked product's input
at each call (a copy of x, from products.BLOCKED_FROM rows). (The integer kernels read x 4 bytes at a time.)

Measured (Intel Xeon VM, AVX-512, one process, medians of 7 interleaved rounds, 2 threads, the
fused float32 product's register-blocked form; the same values at each start): GPT-2's 2304x768 and
768x3072 weights against 32 rows of x, both on a boundary 795 and 1,271 µs, both 16 bytes past one
1,163 and 1,991; 8 rows 221 and 385 against 268 and 451; one row 153 and 265 against 154 and 304.
"""

from __future__ import annotations

import numpy as np

ALIGN = 64            # bytes: a cache line, and an AVX-512 vector


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose first byte lies on an ALIGN-byte boundary (a view
    into a buffer ALIGN bytes longer)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(n + ALIGN, np.uint8)
    o = -buf.ctypes.data % ALIGN
    return buf[o:o + n].view(dtype).reshape(shape)


def aligned_zeros(shape, dtype) -> np.ndarray:
    a = aligned_empty(shape, dtype)
    a.fill(0)
    return a


def is_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % ALIGN == 0


def aligned(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous array starting on an ALIGN-byte boundary: a itself where it is one, else
    a copy that is (a weight's: made once, when the kernel set makes the weight)."""
    a = np.asarray(a)
    if a.flags.c_contiguous and is_aligned(a):
        return a
    out = aligned_empty(a.shape, a.dtype)
    out[...] = a
    return out
