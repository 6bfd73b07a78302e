"""The integer set's kernels in IEEE order: _numba.py's RMS norm, rotation and SwiGLU, the same
source compiled without fastmath, each under a name of its own (numba keeps its disk cache by a
function's name and line: the fastmath entries and these must not share one); and its decode
attention (`paged_decode`), _numba.py's paged kernel without fastmath, its sums written in vector
lanes.

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
1,536; one row each, one process, a busy Zen 3). The attention, compiled without fastmath with its
scores summed in order, took 1.8x the time at 33 keys and 3.2x at 1,024 (a SmolLM2 layer: 412
against 128 µs); with each score summed in 16 lanes of explicit vectors (_int8.py's, which carry no
fastmath flags: the order written) and the weighted sum of values too, 1.14x at 33 keys, 1.26x at
1,024 and 1.17x for 8 sequences of 100 (SmolLM2's 9 and 3 heads of 64, medians of 9 interleaved
rounds, a Zen 3, 2 threads). So the compiled step (kernels/_block.py) calls it inside, one call
for every block, where it called the fastmath kernel from Python between two halves a block. It
links in _int8.py's vector operations and _numba.py's exp: numba checks only this file for its disk
cache, so an edit there wants an edit here (kernels/_block.py's halves carry a hash of all three).
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit, prange

from . import _numba as K
from ._int8 import GROUP, load_f32x16, splat_f32x16, store_f32x16, tree_sum


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


# -- the fixed-chunk decode attention, in IEEE order ------------------------------------------------------

fexp = njit(inline="always")(K.exp_polynomial)   # _numba.py's exp, without fastmath
combine = njit(inline="always")(K.combine_chunks)   # and its combining of chunks


@njit(inline="always")
def _dot(a, ao, b, bo, n):
    """Σ_i a[ao + i]·b[bo + i], i < n, over flat float32 arrays: in 16 lanes (lane l adds the products
    i ≡ l mod 16 in order), the lanes in a fixed tree, then the last n mod 16 in order. Vectors
    without fastmath: the order written, in any compilation, at vector speed (summed in order the
    scores took 1.8-3.2x the time)."""
    n16 = n - n % GROUP
    s = np.float32(0.0)
    if n16:
        acc = load_f32x16(a, ao) * load_f32x16(b, bo)
        for i in range(GROUP, n16, GROUP):
            acc = acc + load_f32x16(a, ao + i) * load_f32x16(b, bo + i)
        s = tree_sum(acc)
    for i in range(n16, n):
        s += a[ao + i] * b[bo + i]
    return s


@njit(inline="always")
def _sum(a, n):
    """Σ a[i], i < n, a flat float32 array, in _dot's order (16 lanes, a fixed tree, the rest)."""
    n16 = n - n % GROUP
    s = np.float32(0.0)
    if n16:
        acc = load_f32x16(a, 0)
        for i in range(GROUP, n16, GROUP):
            acc = acc + load_f32x16(a, i)
        s = tree_sum(acc)
    for i in range(n16, n):
        s += a[i]
    return s


@njit(parallel=True, cache=True)
def paged_decode(q, kp, vp, table, lengths, out, scale, chunk):
    """_numba.py's paged_decode_attention (its arguments, its chunks and work items, its two passes,
    its combining of chunks) without fastmath, each score a `_dot`: the int8 set's decode attention,
    whose bits are the same wherever numba compiles it (from Python, and inside kernels/_block.py's
    step: one order, no copy of the kernel that sums its own way)."""
    H, B, hd = q.shape
    Hkv, nblk, bs = kp.shape[0], kp.shape[1], kp.shape[2]
    g = H // Hkv
    longest, nch, pm, pl, pacc = K.chunk_partials(lengths, chunk, B, Hkv, g, hd)
    kf, vf = kp.reshape(-1), vp.reshape(-1)
    for item in prange(B * Hkv * nch):
        b = item // (Hkv * nch)
        hk = (item // nch) % Hkv
        c = item % nch
        p0 = c * chunk
        nk = max(0, min(lengths[b], p0 + chunk) - p0)
        qs = np.empty(g * hd, np.float32)
        for h in range(g):
            for e in range(hd):
                qs[h * hd + e] = q[hk * g + h, b, e] * scale
        acc = np.zeros(g * hd, np.float32)
        s = np.empty((g, nk), np.float32)
        rows = np.empty(nk, np.intp)                      # each key's first value in the flat pool
        for j in range(nk):                               # scores: each key read once for g heads
            rows[j] = ((hk * nblk + table[b, (p0 + j) // bs]) * bs + (p0 + j) % bs) * hd
            for h in range(g):
                s[h, j] = _dot(qs, h * hd, kf, rows[j], hd)
        for h in range(g):
            mx = np.float32(-np.inf)
            for j in range(nk):
                mx = max(mx, s[h, j])
            for j in range(nk):                           # the weights, each on its own (vectorized)
                s[h, j] = fexp(s[h, j] - mx)
            pm[b, hk, c, h] = mx
            pl[b, hk, c, h] = _sum(s[h], nk)
        hd16 = hd - hd % GROUP
        for j in range(nk):                               # the weighted sum: each value read once
            o = rows[j]
            for h in range(g):
                p = s[h, j]
                pv = splat_f32x16(p)
                for e in range(0, hd16, GROUP):
                    store_f32x16(acc, h * hd + e, load_f32x16(acc, h * hd + e) + pv * load_f32x16(vf, o + e))
                for e in range(hd16, hd):
                    acc[h * hd + e] += p * vf[o + e]
        if lengths[b] <= chunk:                           # its one chunk: the output itself
            if c == 0:
                for h in range(g):
                    inv = np.float32(1.0) / pl[b, hk, c, h]
                    for e in range(hd):
                        out[hk * g + h, b, e] = acc[h * hd + e] * inv
        else:
            for h in range(g):
                for e in range(hd):
                    pacc[b, hk, c, h, e] = acc[h * hd + e]
    if longest <= chunk:
        return
    for item in prange(B * H):                            # combine the chunks by their max and sum
        combine(lengths, out, chunk, pm, pl, pacc, item)
