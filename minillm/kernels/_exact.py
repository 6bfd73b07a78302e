"""The integer set's elementwise kernels in IEEE order: _numba.py's RMS norm, rotation and SwiGLU,
the same source compiled without fastmath, each under a name of its own (numba keeps its disk cache
by a function's name and line: the fastmath entries and these must not share one).

Why: a fastmath kernel's last bits are those of one compilation. LLVM may reorder a fastmath sum as
it sees fit where it compiles it, and it compiles a kernel again wherever another compiled function
calls it (the callee's code is linked into the caller and optimized there): the int8 set's compiled
block (kernels/_block.py) calling the fastmath norm gave other last bits than the norm called from
Python when numba loaded the block from its disk cache (not when it had just compiled it), and so
did the second of two copies of the block compiled in one process. Without fastmath every
compilation computes each value in the order written, so the block, the operations one by one and a
batch's step give the same bits wherever numba compiled them, which the int8 set promises
(`generate_batch` gives `generate`'s tokens). What it costs: the norm's sum of squares is added in
order, not in vector lanes (1.3 against 0.8 µs a row of 576; SwiGLU 6.5 against 5.3 µs a row of
1,536; one row each, one process, a busy Zen 3). The attention stays the fastmath kernel, called
from Python by both paths (one compiled copy, the same bits): compiled without fastmath, its scores
summed in order, it took 1.8x the time at 33 keys and 3.2x at 1,024 (a SmolLM2 layer: 412 against
128 µs).
"""

from __future__ import annotations

import types

from numba import njit

from . import _numba as K


def _in_order(kernel):
    """kernel's Python source compiled again without fastmath, as `<name>_in_order`."""
    f = kernel.py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_in_order", f.__defaults__, f.__closure__)
    g.__qualname__ = f.__qualname__ + "_in_order"
    g.__doc__ = f.__doc__
    g.__module__ = f.__module__
    return njit(cache=True)(g)


rms_norm = _in_order(K.rms_norm)
rope = _in_order(K.rope)
swiglu = _in_order(K.swiglu)
