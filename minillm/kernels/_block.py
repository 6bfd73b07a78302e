"""A Llama decode step's blocks in one compiled call (the integer set's, models/int8.py
`compiled_blocks`): `decode_layers` runs, for each block, what comes before the attention
(`before_attention`), the attention kernel, and what comes after it (`after_attention`), where the
operations make a dozen calls from Python a block (each, in a step, 3-10 µs of Python, checks and
dispatch; the operations' own work at one row is a few µs).

The same kernels run, called in the same order on the same values: every product is its format's
entry in _int8.py (`KERNELS`, the one `Int8Quant.matmul` calls); the norm, rotation, SwiGLU and the
attention are _exact.py's, compiled without fastmath, so that their copies linked into these
functions compute what the operations' do, bit for bit (a fastmath kernel's bits are those of one
compilation: _exact.py). tests/test_int8_model.py holds the two paths equal, one sequence and a
batch. The callers check the shapes (models/plan.py `decode_pages`): these trust them.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import njit
from numba.extending import overload

from . import _exact as E
from . import _int8, _numba
from ._int8 import KERNELS, Isa

# numba keeps a compiled function on disk until its own file changes; these two link in copies of the
# products (_int8.py) and of the elementwise kernels (_numba.py's source, _exact.py's flags). A hash
# of those files is part of the type of their first argument (`isa`), so that an edit there (a new
# version installed) compiles them again rather than loading halves whose kernels the operations no
# longer run.
SOURCES = hashlib.sha1(b"".join(Path(m.__file__).read_bytes() for m in (_int8, _numba, E))).hexdigest()[:16]


@lru_cache(maxsize=None)
def isa(name: str) -> Isa:
    """The halves' first argument: the instruction set of the products, typed with `SOURCES`."""
    return Isa(name, SOURCES)


def product(isa, planes, x, y):
    """y [N, R] = x [N, C] @ W^T in integers: W's planes in lane order (Q8_0: (q, d); Q4: (q, d, m)),
    the entry `Int8Quant.matmul` calls for this format and instruction set. Compiled code only."""
    raise TypeError("_block.product is called from compiled code (its overload), not from Python")


@overload(product)
def _product(isa, planes, x, y):
    kernel = KERNELS["q8_0" if len(planes) == 2 else "q4", isa.isa]
    if len(planes) == 2:
        return lambda isa, planes, x, y: kernel(planes[0], planes[1], x, y)
    return lambda isa, planes, x, y: kernel(planes[0], planes[1], planes[2], x, y)


@njit(cache=True)
def before_attention(isa, x, norm1, eps, qkv, cos, sin, k, v, blocks, offsets, H, Hkv):
    """The block (models/decoder.py's transformer_block) up to its attention, for N tokens, one a
    sequence: x [N, d] float32, the residual stream; norm1 [d] and eps (a Python float, as the
    operations pass it); qkv the product's planes; cos, sin [N, hd/2] the tokens' rotations; k, v
    [Hkv, blocks, bs, hd] the layer's keys and values as pages (a contiguous cache's rows: one page),
    token n's written at row offsets[n] of page blocks[n]. -> q [H, N, hd], rotated."""
    N, d = x.shape
    hd = k.shape[3]
    h = np.empty((N, d), np.float32)
    E.rms_norm(x, norm1, eps, h)                                      # [N, d]
    y = np.empty((N, (H + 2 * Hkv) * hd), np.float32)
    product(isa, qkv, h, y)                                           # [N, (H + 2·Hkv)·hd]: q | k | v
    qk = np.empty((H + Hkv, N, hd), np.float32)
    E.rope(y.reshape(N, H + 2 * Hkv, hd)[:, :H + Hkv].transpose((1, 0, 2)), cos, sin, qk)   # [H + Hkv, N, hd]
    for n in range(N):                                                # the caches' new rows
        for j in range(Hkv):
            for e in range(hd):
                k[j, blocks[n], offsets[n], e] = qk[H + j, n, e]
                v[j, blocks[n], offsets[n], e] = y[n, (H + Hkv + j) * hd + e]
    return qk[:H]


@njit(cache=True)
def after_attention(isa, x, a, norm2, eps, o, gate_up, down):
    """The block after its attention: a [H, N, hd] the attention's output; o, gate_up, down the
    products' planes. x [N, d] gets both residuals, in place."""
    N, d = x.shape
    H, hd = a.shape[0], a.shape[2]
    m = np.empty((N, H * hd), np.float32)                             # the heads side by side
    for n in range(N):
        for i in range(H):
            for e in range(hd):
                m[n, i * hd + e] = a[i, n, e]
    r = np.empty((N, d), np.float32)
    product(isa, o, m, r)                                             # [N, d]
    x += r
    h = np.empty((N, d), np.float32)
    E.rms_norm(x, norm2, eps, h)
    F2 = 2 * (down[1].shape[0] // ((d + 15) // 16) * 32)            # down's groups: 16 rows' block each
    g = np.empty((N, F2), np.float32)
    product(isa, gate_up, h, g)                                       # [N, 2F]: gate | up
    s = np.empty((N, F2 // 2), np.float32)
    E.swiglu(g, s)                                                    # [N, F]
    product(isa, down, s, r)                                          # [N, d]
    x += r


def at(planes, layer):
    """A stacked weight's planes (each [L, ...], a layer a row) -> layer `layer`'s, as `product` takes
    them. Compiled code only."""
    raise TypeError("_block.at is called from compiled code (its overload), not from Python")


@overload(at)
def _at(planes, layer):
    if len(planes) == 2:
        return lambda planes, layer: (planes[0][layer], planes[1][layer])
    return lambda planes, layer: (planes[0][layer], planes[1][layer], planes[2][layer])


@njit(cache=True)
def decode_layers(isa, x, norm1, norm2, qkv, o, gate_up, down, cos, sin, kp, vp, blocks, offsets, table, lengths,
                  H, Hkv, eps, scale, chunk):
    """Every block of a decode step, one call: for each layer, `before_attention`, the attention
    (_exact.py's `paged_decode`, the kernel the operations call with the set's fixed chunk), then
    `after_attention`. The blocks' weights stacked, a layer a row: norm1, norm2 [L, d]; qkv, o,
    gate_up, down each product's planes, every one [L, ...]; kp, vp [L, Hkv, blocks, bs, hd] every
    layer's pages; the rest as the halves and the kernel take them. x [N, d] gets every block, in
    place."""
    N = x.shape[0]
    hd = kp.shape[4]
    for layer in range(norm1.shape[0]):
        k, v = kp[layer], vp[layer]
        q = before_attention(isa, x, norm1[layer], eps, at(qkv, layer), cos, sin, k, v, blocks, offsets, H, Hkv)
        a = np.empty((H, N, hd), np.float32)
        E.paged_decode(q, k, v, table, lengths, a, scale, chunk)
        after_attention(isa, x, a, norm2[layer], eps, at(o, layer), at(gate_up, layer), at(down, layer))
