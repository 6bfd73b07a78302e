"""A Llama block's decode step of one sequence in three calls (the integer set's, models/int8.py
`compiled_blocks`): what comes before the attention in one compiled call, the attention kernel,
what comes after it in another, where the operations make a dozen calls from Python (each, in a
step, 3-10 µs of Python, checks and dispatch; the operations' own work at one row is a few µs).

The same kernels run, called in the same order with arrays of the same types (a C-contiguous array
is typed apart from a strided one, and numba compiles each type anew): every product is its
format's entry in _int8.py (`KERNELS`, the one `Int8Quant.matmul` calls), the norm, rotation and
SwiGLU _exact.py's, compiled without fastmath, so that their copies linked into these functions
compute what the operations' do, bit for bit (a fastmath kernel's bits are those of one
compilation: _exact.py); the attention is the fastmath kernel itself, called from Python between
the two halves as the operations call it. tests/test_int8_model.py holds the two paths equal.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from . import _exact as E
from ._int8 import KERNELS


def product(isa, planes, x, y):
    """y [1, R] = x [1, C] @ W^T in integers: W's planes in lane order (Q8_0: (q, d); Q4: (q, d, m)),
    the entry `Int8Quant.matmul` calls for this format and instruction set."""


@overload(product)
def _product(isa, planes, x, y):
    kernel = KERNELS["q8_0" if len(planes) == 2 else "q4", isa.isa]
    if len(planes) == 2:
        return lambda isa, planes, x, y: kernel(planes[0], planes[1], x, y)
    return lambda isa, planes, x, y: kernel(planes[0], planes[1], planes[2], x, y)


@njit(cache=True)
def before_attention(isa, x, norm1, eps, qkv, cos, sin, k, v, pos, H, Hkv):
    """The block (models/decoder.py's transformer_block) up to its attention, for one token: x [1, d]
    float32, the residual stream; norm1 [d] and eps (a Python float, as the operations pass it); qkv
    the product's planes; cos, sin [1, hd/2] the token's rotation; k, v [Hkv, S, hd] the layer's
    cache, the token's key and value written at row `pos`. -> q [H, 1, hd], rotated."""
    d = x.shape[1]
    hd = k.shape[2]
    h = np.empty((1, d), np.float32)
    E.rms_norm(x, norm1, eps, h)                                      # [1, d]
    y = np.empty((1, (H + 2 * Hkv) * hd), np.float32)
    product(isa, qkv, h, y)                                           # [1, (H + 2·Hkv)·hd]: q | k | v
    qk = np.empty((H + Hkv, 1, hd), np.float32)
    E.rope(y.reshape(H + 2 * Hkv, 1, hd)[:H + Hkv], cos, sin, qk)     # q and k turned: [H + Hkv, 1, hd]
    for j in range(Hkv):                                              # the cache's new row
        for e in range(hd):
            k[j, pos, e] = qk[H + j, 0, e]
            v[j, pos, e] = y[0, (H + Hkv + j) * hd + e]
    return qk[:H]


@njit(cache=True)
def after_attention(isa, x, a, norm2, eps, o, gate_up, down):
    """The block after its attention: a [H, 1, hd] the attention's output; o, gate_up, down the
    products' planes. x [1, d] gets both residuals, in place."""
    d = x.shape[1]
    r = np.empty((1, d), np.float32)
    product(isa, o, a.reshape(1, a.shape[0] * a.shape[2]), r)         # [1, d]
    x += r
    h = np.empty((1, d), np.float32)
    E.rms_norm(x, norm2, eps, h)
    F2 = gate_up[1].shape[0]
    g = np.empty((1, F2), np.float32)
    product(isa, gate_up, h, g)                                       # [1, 2F]: gate | up
    s = np.empty((1, F2 // 2), np.float32)
    E.swiglu(g, s)                                                    # [1, F]
    product(isa, down, s, r)                                          # [1, d]
    x += r
