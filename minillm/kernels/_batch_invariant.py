"""The batch-invariant kernels (numba): every output computed in one fixed order that no other row
changes. Compiled WITHOUT fastmath, on purpose: no reassociation, no fused multiply-add, so the
order written here is the order run, whatever loop shape LLVM vectorizes the code into.

    fixed_matmul     y[t, r] = (((0 + x[t,0]·a[0,r]) + x[t,1]·a[1,r]) + ...): each output a sum over
                     the input in index order. Vectorized across outputs (lanes are different r), so
                     a row's order does not depend on how many rows come with it, nor on the work
                     item the output falls in (BLAS splits the input dimension into blocks and changes kernels
                     with the row count: its order is not fixed).
    fixed_attention  each query over exactly keys 0 .. its position, in tiles of `kt` keys anchored
                     at key 0 (online softmax): a prefill query and a decode query at the same
                     position run the same arithmetic on the same keys.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

CB = 256         # outputs per work item: a row's [CB] slice of y stays in L1 while the input is summed


@njit(cache=True)
def matmul_item(x, a, y, item):
    """x [T, C], a [C, R] (C-contiguous), y [T, R]: outputs item·CB .. of y = x @ a, each summed over C
    in order, y[t, j] = (((0 + x[t,0]·a[0,j]) + x[t,1]·a[1,j]) + ...), vectorized across the outputs j.
    Rows of x go in fours (each value of a read once for four rows), two inputs k per pass over the
    outputs; the rows left over one at a time, four inputs per pass. Every unrolling keeps each
    output's additions in index order, and nothing is fused or reordered (no fastmath), so which
    rows share a pass changes no bit. Measured on one thread (768x2304): these unrollings 1.3-2x
    faster than one row and one input per pass; tiles with a [4, 64] accumulator array 4-8x slower
    at one row; the [out, in] layout's strided reads 3-8x slower."""
    T, C = x.shape
    R = a.shape[1]
    c0 = item * CB
    c1 = min(R, c0 + CB)
    n = c1 - c0
    t = 0
    while t + 4 <= T:                                   # four rows of x
        y0, y1, y2, y3 = y[t, c0:c1], y[t + 1, c0:c1], y[t + 2, c0:c1], y[t + 3, c0:c1]
        y0[:] = 0
        y1[:] = 0
        y2[:] = 0
        y3[:] = 0
        k = 0
        while k + 2 <= C:                               # inputs k and k+1: a's two rows read once
            u0, u1, u2, u3 = x[t, k], x[t + 1, k], x[t + 2, k], x[t + 3, k]
            v0, v1, v2, v3 = x[t, k + 1], x[t + 1, k + 1], x[t + 2, k + 1], x[t + 3, k + 1]
            ak, bk = a[k, c0:c1], a[k + 1, c0:c1]
            for j in range(n):
                w, z = ak[j], bk[j]
                y0[j] = (y0[j] + u0 * w) + v0 * z
                y1[j] = (y1[j] + u1 * w) + v1 * z
                y2[j] = (y2[j] + u2 * w) + v2 * z
                y3[j] = (y3[j] + u3 * w) + v3 * z
            k += 2
        if k < C:                                       # an odd input left
            u0, u1, u2, u3 = x[t, k], x[t + 1, k], x[t + 2, k], x[t + 3, k]
            ak = a[k, c0:c1]
            for j in range(n):
                w = ak[j]
                y0[j] += u0 * w
                y1[j] += u1 * w
                y2[j] += u2 * w
                y3[j] += u3 * w
        t += 4
    while t < T:                                        # one row at a time
        yt = y[t, c0:c1]
        yt[:] = 0
        k = 0
        while k + 4 <= C:                               # four inputs per pass over the outputs
            x0, x1, x2, x3 = x[t, k], x[t, k + 1], x[t, k + 2], x[t, k + 3]
            a0, a1, a2, a3 = a[k, c0:c1], a[k + 1, c0:c1], a[k + 2, c0:c1], a[k + 3, c0:c1]
            for j in range(n):
                yt[j] = (((yt[j] + x0 * a0[j]) + x1 * a1[j]) + x2 * a2[j]) + x3 * a3[j]
            k += 4
        while k < C:
            xv = x[t, k]
            ak = a[k, c0:c1]
            for j in range(n):
                yt[j] += xv * ak[j]
            k += 1
        t += 1


@njit(cache=True)
def attention_item(q, k, v, out, scale, kt, item):
    """Causal attention for one query of one head (item = h·Tq + i). q [H, Tq, hd], k, v [Hkv, Tk, hd],
    out [H, Tq, hd]; query i sits at position Tk - Tq + i and sees keys 0 .. Tk - Tq + i. Keys go in tiles of kt from
    key 0: per tile, the scores (each a dot product over hd in order), the tile's max, then the
    running max, sum and output rescaled (FlashAttention's online softmax); the output divided by
    the sum at the end."""
    H, Tq, hd = q.shape
    Hkv, Tk = k.shape[0], k.shape[1]
    g = H // Hkv
    off = Tk - Tq
    h = item // Tq
    i = item % Tq
    hk = h // g
    last = off + i + 1
    qs = np.empty(hd, out.dtype)
    for e in range(hd):
        qs[e] = q[h, i, e] * scale
    acc = np.zeros(hd, out.dtype)
    s = np.empty(kt, out.dtype)
    s[0] = -np.inf
    mx = s[0]                                 # -inf and 0 in the output's dtype
    zero = acc[0]
    l = zero
    for j0 in range(0, last, kt):
        nk = min(last, j0 + kt) - j0
        mnew = mx
        for j in range(nk):
            a = zero
            for e in range(hd):
                a += qs[e] * k[hk, j0 + j, e]
            s[j] = a
            mnew = max(mnew, a)
        corr = np.exp(mx - mnew)
        lsum = zero
        for j in range(nk):
            p = np.exp(s[j] - mnew)
            s[j] = p
            lsum += p
        l = l * corr + lsum
        mx = mnew
        for e in range(hd):
            acc[e] *= corr
        for j in range(nk):
            p = s[j]
            for e in range(hd):
                acc[e] += p * v[hk, j0 + j, e]
    for e in range(hd):
        out[h, i, e] = acc[e] / l


# Each kernel twice, the same arithmetic (the item functions above): on numba's threads, and on the
# calling thread for small work (a decode step's product), where waking the threads costs more than
# the work (measured on a busy 2-core machine: 0.2-0.4 ms on one thread against 8-19 ms through the
# pool for one row of a 768x2304 product). Every sum's order is the item's, so the choice changes no bit.
PARALLEL_FROM = 1 << 25     # multiply-adds from which the threaded one runs


@njit(parallel=True, cache=True)
def matmul_threads(x, a, y):
    for item in prange((a.shape[1] + CB - 1) // CB):
        matmul_item(x, a, y, item)


@njit(cache=True)
def matmul_one(x, a, y):
    for item in range((a.shape[1] + CB - 1) // CB):
        matmul_item(x, a, y, item)


@njit(parallel=True, cache=True)
def attention_threads(q, k, v, out, scale, kt):
    for item in prange(q.shape[0] * q.shape[1]):
        attention_item(q, k, v, out, scale, kt, item)


@njit(cache=True)
def attention_one(q, k, v, out, scale, kt):
    for item in range(q.shape[0] * q.shape[1]):
        attention_item(q, k, v, out, scale, kt, item)
