"""Arrays that end exactly at a page the process cannot read (PROT_NONE): a kernel that reads one
byte past such an array's end is killed by the CPU (SIGSEGV) instead of reading its neighbour's
memory silently. numba's bounds checker cannot see loads written by hand in LLVM IR; this can.

    with guarded() as g:
        q = g.place(q)          # a copy of q whose last byte is the last byte before a guard page
        kernel(q, ...)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from contextlib import contextmanager

import numpy as np

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _Guarded:
    def __init__(self) -> None:
        self._maps: list = []

    def place(self, a: np.ndarray) -> np.ndarray:
        """A C-contiguous copy of `a` whose last byte is the last readable byte before a PROT_NONE page."""
        a = np.ascontiguousarray(a)
        pages = (a.nbytes + PAGE - 1) // PAGE + 1
        m = mmap.mmap(-1, pages * PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        if _libc.mprotect(base + (pages - 1) * PAGE, PAGE, 0) != 0:           # PROT_NONE
            raise OSError(ctypes.get_errno(), "mprotect")
        off = (pages - 1) * PAGE - a.nbytes
        out = np.frombuffer(m, dtype=a.dtype, count=a.size, offset=off).reshape(a.shape)
        out[...] = a
        self._maps.append(m)
        return out

    def close(self) -> None:
        self._maps.clear()          # the arrays keep their maps alive while they are referenced


@contextmanager
def guarded():
    g = _Guarded()
    try:
        yield g
    finally:
        g.close()
