"""The integer kernels themselves (numba, with the vector operations of _simd.py). Imported only
where numba works; compiled on first call for the Isa passed, cached on disk as _numba.py's are.

    quantize_x(x, xq, xd, xs, xm)                   activations to int8 blocks, block-per-lane order
    q8_0_matmul(isa, q, d, xq, xd, xs, y)           y [T, R] = x @ W^T, W Q8_0
    q4_matmul(isa, q, d, m, xq, xd, xs, xm, y)      Q4_0 (m empty) and Q4_1

The arithmetic is int8.py's reference, bit for bit (see its docstring). A kernel walks a weight row
a group of 16 blocks at a time: the group's bytes are loaded once and put in block-per-lane order in
registers (_simd.q8_group / q4_group), then for every row of x eight integer dot instructions leave
the 16 blocks' integer sums in 16 lanes, and the float work is 16 lanes wide: S = d_w·d_x, A += S·I.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._simd import (block_init, dot8, load_f16x16, load_f32x16, q4_group, q8_group, store_f32x16,
                    to_f32, tree_sum, zero_f32x16)
from ._simd import zero_i32x16 as zero_i32

QK = 32          # values per block
GROUP = 16       # blocks per group (one lane each)
ROWS = 16        # weight rows per parallel work item


@njit(parallel=True, cache=True)
def quantize_x(x, xq, xd, xs, xm):
    """x [T, C] float32 -> per block of 32 values: d = max|x| / 127 and q = clip(rint(x / d), ±127)
    (q = 0 where d is 0; d = NaN and q = 0 where the block holds inf or NaN), written as
    xq int8 [T, ng, 8, 64] (group g's vector k, lane L: values 4k..4k+3 of block 16g + L),
    xd float32 [T, 16·ng] (d), xs int32 [T, 16·ng] (Σq), xm float32 [T, 16·ng] (d·Σq);
    blocks past the row's nb read as zeros everywhere."""
    T, C = x.shape
    nb = C // QK
    ng = xd.shape[1] // GROUP
    for t in prange(T):
        for b in range(ng * GROUP):
            g, L = b // GROUP, b % GROUP
            if b >= nb:
                for k in range(8):
                    for j in range(4):
                        xq[t, g, k, 4 * L + j] = 0
                xd[t, b] = np.float32(0.0)
                xs[t, b] = 0
                xm[t, b] = np.float32(0.0)
                continue
            amax = np.float32(0.0)
            bad = False
            for i in range(QK):
                v = x[t, QK * b + i]
                if v - v != np.float32(0.0):          # inf or NaN
                    bad = True
                a = abs(v)
                if a > amax:
                    amax = a
            d = amax / np.float32(127.0)
            s = 0
            if bad or d == np.float32(0.0):
                for k in range(8):
                    for j in range(4):
                        xq[t, g, k, 4 * L + j] = 0
                if bad:
                    d = np.float32(np.nan)
            else:
                for k in range(8):
                    for j in range(4):
                        v = np.rint(x[t, QK * b + 4 * k + j] / d)
                        v = min(max(v, np.float32(-127.0)), np.float32(127.0))
                        qi = np.int32(v)
                        s += qi
                        xq[t, g, k, 4 * L + j] = qi
            xd[t, b] = d
            xs[t, b] = s
            xm[t, b] = d * np.float32(s)


@njit(parallel=True, cache=True)
def q8_0_matmul(isa, q, d, xq, xd, xs, y):
    """Q8_0: q int8 [R, C], d uint16 [R, C/32] (float16 bits); xq, xd, xs from quantize_x;
    y float32 [T, R]."""
    R, C = q.shape
    nb = C // QK
    ng = xd.shape[1] // GROUP
    T = y.shape[0]
    for c in prange((R + ROWS - 1) // ROWS):
        acc = np.empty((T, GROUP), np.float32)
        for r in range(c * ROWS, min(R, c * ROWS + ROWS)):
            for t in range(T):
                store_f32x16(acc, t * GROUP, zero_f32x16())
            for g in range(ng):
                nv = min(GROUP, nb - GROUP * g)
                w = q8_group(isa, q, r * C + g * 512, nv * QK)
                dw = load_f16x16(d, r * nb + g * GROUP, nv)
                for t in range(T):
                    o = (t * ng + g) * GROUP
                    i = dot8(isa, True, block_init(isa, True, xs, o), w, xq, o * QK)
                    a = load_f32x16(acc, t * GROUP) + (dw * load_f32x16(xd, o)) * to_f32(i)
                    store_f32x16(acc, t * GROUP, a)
            for t in range(T):
                y[t, r] = tree_sum(load_f32x16(acc, t * GROUP))


@njit(parallel=True, cache=True)
def q4_matmul(isa, q, d, m, xq, xd, xs, xm, y):
    """Q4_0 and Q4_1: q uint8 [R, C/2] (GGUF's nibble order), d uint16 [R, C/32]; m uint16
    [R, C/32] (Q4_1: value = d·n + m) or an empty [0, 0] array (Q4_0: value = d·(n - 8));
    xq, xd, xs, xm from quantize_x; y float32 [T, R]."""
    R, H = q.shape
    nb = H // 16
    ng = xd.shape[1] // GROUP
    T = y.shape[0]
    has_min = m.shape[0] > 0
    for c in prange((R + ROWS - 1) // ROWS):
        acc = np.empty((T, GROUP), np.float32)
        for r in range(c * ROWS, min(R, c * ROWS + ROWS)):
            for t in range(T):
                store_f32x16(acc, t * GROUP, zero_f32x16())
            for g in range(ng):
                nv = min(GROUP, nb - GROUP * g)
                w = q4_group(q, r * H + g * 256, nv * 16)
                dw = load_f16x16(d, r * nb + g * GROUP, nv)
                if has_min:
                    mw = load_f16x16(m, r * nb + g * GROUP, nv)
                    for t in range(T):
                        o = (t * ng + g) * GROUP
                        i = dot8(isa, False, zero_i32(), w, xq, o * QK)
                        a = load_f32x16(acc, t * GROUP) + ((dw * load_f32x16(xd, o)) * to_f32(i)
                                                           + mw * load_f32x16(xm, o))
                        store_f32x16(acc, t * GROUP, a)
                else:
                    for t in range(T):
                        o = (t * ng + g) * GROUP
                        i = dot8(isa, False, block_init(isa, False, xs, o), w, xq, o * QK)
                        a = load_f32x16(acc, t * GROUP) + (dw * load_f32x16(xd, o)) * to_f32(i)
                        store_f32x16(acc, t * GROUP, a)
            for t in range(T):
                y[t, r] = tree_sum(load_f32x16(acc, t * GROUP))

