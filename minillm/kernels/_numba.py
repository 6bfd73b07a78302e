"""The numba kernels themselves. Imported only once `status()` has found numba working; compiled on
first call and cached on disk (`cache=True`: numba's __pycache__ next to this file, or
NUMBA_CACHE_DIR), so a later process loads the machine code instead of compiling it again.

Every product kernel is written in one loop form, chosen by measurement: for each output row, one
flat loop over the row's values, each value widened and scaled in registers and multiplied into a
scalar accumulator per row of x. LLVM vectorizes that loop into wide accumulators and adds them up
once at the row's end (and, as the loop starts at 0 in steps of 32, sees that a vector of values
shares one block's scale: no gather). The row's block scales are converted from float16 once per
row into a small array first. Rows of x go in fours (then two, then one), so a row of weights is
read from memory once for up to four rows of x and from the L1 cache for the others.

Measured alternatives (Q8_0 over SmolLM2's matrices, one row of x, interleaved rounds on a busy
2-core machine, as multiples of float32 BLAS's speed in the same run; such a machine moves these
ratios between runs, so only ratios within one run are compared): run A: a [T, 32] accumulator
array with each block widened into a [32] array 0.12x (a runtime T keeps the accumulators in
memory), a horizontal sum per block 0.31x, a [32] accumulator for one row of x 1.49x, the flat
loop converting each value's scale from float16 3.17x; run B: that flat loop 0.84x, this form
(scales converted once per row) 5.11x. Then as multiples of this form's speed (one thread, CPU
time): the scales expanded to one per value before the loop 0.21-0.39x, the row widened into an
L1 float array and then dotted 0.16-0.31x, one group of eight rows of x instead of four and four
1.05x (not worth a second copy of the loop).
For one row of x, the Q4 kernel multiplies the block's scale once into the nibbles' products,
s·(lo·xlo + hi·xhi), and adds the offsets (Q4_1's minimums, Q4_0's -8·d) as one dot product with
the blocks' sums of x: one multiply fewer per byte than widening each value (4.14 against 4.32 ms
over SmolLM2's Q4_1 layers, interleaved rounds, quiet 2-core Zen 4); for 2 and 4 rows widening each
value once for all of them takes fewer. Nor does it form the low nibble: with byte = lo + 16·hi,
lo·xlo + hi·xhi = byte·xlo + hi·(xhi - 16·xlo), and xhi - 16·xlo is made once per call, so a byte
costs a multiply-add less (SmolLM2's 120 Q4_1 layers, one row, 2 threads, both forms in one
process: 4.96 against 5.39 ms, medians of 21 interleaved passes). Its terms are larger than the
values' own (byte·xlo up to 255·|xlo| where lo·xlo is at most 15·|xlo|), so its rounding is too: on
the first 8 of SmolLM2's Q4_1 matrices the largest error was 2.9e-7 of the sum of |w·x| against
1.1e-7 (tests/test_kernels.py bounds it from the terms it sums).
A Q4 byte is split in floats: hi = floor(byte / 16), lo = byte - 16·hi (exact below 256). numba
types `byte & 15` and `byte >> 4` as int64; LLVM then widens 8 lanes at a time and converts int64
to float (vcvtqq2ps): 1.7x the CPU time of the float split (measured again over SmolLM2's Q4_1
layers with uint8, int32 and uint32 operands: 6.9-7.3 ms against 4.1-4.3).
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

QK = 32          # values per block
ROWS = 16        # output rows per parallel work item (one float32 scale array per item)
F16_FIX = np.float32(2.0 ** 112)
# fastmath without "nnan" and "ninf": the online softmax starts from a max of -inf, and extreme
# inputs must give what NumPy gives. "reassoc" lets LLVM split a row's sum into vector lanes.
FAST = {"nsz", "arcp", "contract", "afn", "reassoc"}
AHEAD_BYTES = 4096   # how far ahead of the row form's weight row the next bytes are asked for, where
                     # ROWS_AHEAD (Intel Xeon VM: GPT-2's products and head, 1 / 2 / 4 rows of x, 2 threads,
                     # 1.05-1.14 / 1.14 / 1.14x with it; 8,192 and 16,384 bytes no better). The blocked
                     # form (8 rows and more) asks for nothing: the next four rows asked for gave
                     # 0.94-1.13x, no steady gain


def _rows_ahead() -> bool:
    """Does the float32 row form ask for the bytes ahead of its weight row? Measured, each in one
    process interleaved: on an Intel Xeon VM (Emerald Rapids) yes (above); on an AMD EPYC Zen 3 VM
    the same products ran slower with it, 0.81 / 0.74 / 0.69x at 1 / 2 / 4 rows (14.4 against 17.7 ms
    at one row, medians of 9 rounds), so not on AMD's Zen. Decided by the CPU numba compiles for (its
    name is part of numba's disk-cache key, so a cached kernel was compiled with the same answer);
    the integer kernels' prefetch (_int8.py) gains on both (Zen 3: SmolLM2's products 1.10x, its
    head 1.17x)."""
    name = os.environ.get("NUMBA_CPU_NAME", "").strip().lower()
    if not name or name == "host":
        try:
            import llvmlite.binding as llvm
            name = llvm.get_host_cpu_name().lower()
        except Exception:                     # pragma: no cover - llvmlite missing or odd
            return True
    return not name.startswith(("znver", "bdver", "btver", "amdfam"))


ROWS_AHEAD = _rows_ahead()


@intrinsic
def prefetch(typingctx, arr, off):
    """A hint, no load: the cache line holding flat byte `off` of a C-contiguous arr is fetched toward
    L1 (past the array's end it is dropped, never a fault). _int8.py's kernels use it too (an edit
    here reaches their disk cache only with an edit there: numba checks the compiled function's file)."""
    def cg(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        p = builder.gep(builder.bitcast(a.data, ir.IntType(8).as_pointer()), [args[1]])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])   # read, keep, data
        return context.get_dummy_value()
    return types.none(arr, off), cg


@njit(inline="always", cache=True)
def f16(h):
    """A float16's bits (uint16) -> its float32 value, exact for finite values (models/quant.py's
    f16_to_f32, for one value: shift the bits into float32's place, fix the exponent by 2^112)."""
    b = np.uint32(h)
    mag = np.uint32((b & np.uint32(0x7FFF)) << np.uint32(13)).view(np.float32) * F16_FIX
    return -mag if b & np.uint32(0x8000) else mag


# -- quantized products: y [T, R] = x [T, C] @ W^T, W [R, C] in blocks of 32 -----------------------

@njit(parallel=True, cache=True, fastmath=FAST)
def q8_0_matmul_t(q, d, x, y):
    """Q8_0: q int8 [R, C], d uint16 [R, C/32] (float16 bits); value = d·q."""
    R, C = q.shape
    nb = C // QK
    T = x.shape[0]
    for c in prange((R + ROWS - 1) // ROWS):
        s = np.empty(nb, np.float32)
        for r in range(c * ROWS, min(R, c * ROWS + ROWS)):
            for b in range(nb):
                s[b] = f16(d[r, b])
            t = 0
            while t + 4 <= T:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                for k in range(C):
                    w = s[k >> 5] * np.float32(q[r, k])
                    a0 += w * x[t, k]
                    a1 += w * x[t + 1, k]
                    a2 += w * x[t + 2, k]
                    a3 += w * x[t + 3, k]
                y[t, r] = a0
                y[t + 1, r] = a1
                y[t + 2, r] = a2
                y[t + 3, r] = a3
                t += 4
            if t + 2 <= T:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                for k in range(C):
                    w = s[k >> 5] * np.float32(q[r, k])
                    a0 += w * x[t, k]
                    a1 += w * x[t + 1, k]
                y[t, r] = a0
                y[t + 1, r] = a1
                t += 2
            if t < T:
                a0 = np.float32(0.0)
                for k in range(C):
                    a0 += s[k >> 5] * np.float32(q[r, k]) * x[t, k]
                y[t, r] = a0


@njit(parallel=True, cache=True, fastmath=FAST)
def q4_matmul_t(q, d, m, x, y):
    """Q4_0 and Q4_1: q uint8 [R, C/2], byte j of a block holding value j (low nibble) and j + 16
    (high nibble); d uint16 [R, C/32]; m uint16 [R, C/32] (Q4_1: value = d·n + m) or an empty
    [0, 0] array (Q4_0: value = d·n - 8·d). x [T, C] is first split in the bytes' order, xlo and
    xhi [T, C/2] (xlo[:, 16b + j] = x[:, 32b + j], xhi[:, 16b + j] = x[:, 32b + 16 + j]), so that
    one flat loop over a row's bytes meets each value's x."""
    R, H = q.shape
    nb = H // 16
    T = x.shape[0]
    xlo = np.empty((T, H), np.float32)
    xhi = np.empty((T, H), np.float32)
    xs = np.empty((T, nb), np.float32)             # each block's sum of x (the one-row form's offsets;
    for t in range(T):                             # not np.zeros: in a parallel kernel that is a parallel
        for b in range(nb):                        # region of its own, 1.8 µs more a call)
            xs[t, b] = np.float32(0.0)
            for j in range(16):
                xlo[t, 16 * b + j] = x[t, 32 * b + j]
                xhi[t, 16 * b + j] = x[t, 32 * b + 16 + j]
                xs[t, b] += x[t, 32 * b + j] + x[t, 32 * b + 16 + j]
    xd = np.empty(H, np.float32)                   # the one-row form's xhi - 16·xlo (x's last row,
    if T % 2:                                      # which it multiplies when T is odd)
        for i in range(H):
            xd[i] = xhi[T - 1, i] - np.float32(16.0) * xlo[T - 1, i]
    has_min = m.shape[0] > 0
    for c in prange((R + ROWS - 1) // ROWS):
        s = np.empty(nb, np.float32)
        o = np.empty(nb, np.float32)
        for r in range(c * ROWS, min(R, c * ROWS + ROWS)):
            for b in range(nb):
                s[b] = f16(d[r, b])
                o[b] = f16(m[r, b]) if has_min else np.float32(-8.0) * s[b]
            t = 0
            while t + 4 <= T:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                for i in range(H):
                    fb = np.float32(q[r, i])
                    hi = np.floor(fb * np.float32(0.0625))
                    sb = s[i >> 4]
                    ob = o[i >> 4]
                    wl = sb * (fb - np.float32(16.0) * hi) + ob
                    wh = sb * hi + ob
                    a0 += wl * xlo[t, i] + wh * xhi[t, i]
                    a1 += wl * xlo[t + 1, i] + wh * xhi[t + 1, i]
                    a2 += wl * xlo[t + 2, i] + wh * xhi[t + 2, i]
                    a3 += wl * xlo[t + 3, i] + wh * xhi[t + 3, i]
                y[t, r] = a0
                y[t + 1, r] = a1
                y[t + 2, r] = a2
                y[t + 3, r] = a3
                t += 4
            if t + 2 <= T:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                for i in range(H):
                    fb = np.float32(q[r, i])
                    hi = np.floor(fb * np.float32(0.0625))
                    sb = s[i >> 4]
                    ob = o[i >> 4]
                    wl = sb * (fb - np.float32(16.0) * hi) + ob
                    wh = sb * hi + ob
                    a0 += wl * xlo[t, i] + wh * xhi[t, i]
                    a1 += wl * xlo[t + 1, i] + wh * xhi[t + 1, i]
                y[t, r] = a0
                y[t + 1, r] = a1
                t += 2
            if t < T:                      # one row: the scale outside the nibbles' sum, the
                a0 = np.float32(0.0)           # offsets as one dot with the blocks' sums of x, and
                for i in range(H):             # lo·xlo + hi·xhi as byte·xlo + hi·(xhi - 16·xlo)
                    fb = np.float32(q[r, i])
                    a0 += s[i >> 4] * (fb * xlo[t, i] + np.floor(fb * np.float32(0.0625)) * xd[i])
                z = np.float32(0.0)
                for b in range(nb):
                    z += o[b] * xs[t, b]
                y[t, r] = a0 + z


# -- float32 products: y [T, R] = x [T, C] @ Wt^T, Wt [R, C] (an [in, out] weight kept transposed) --
#
# The same row form as the quantized kernels for the first rows of x; register-blocked forms past them
# (`dense_matmul_t_blocked`, `dense_matmul_t_6x4`: products.py's BLOCKED_FROM and BLOCKED choose).
# Measured against two kernels over the [in, out] layout (column tiles of 64 with the accumulators in
# an L1-resident [T, 64] array, or four such rows with the x values broadcast): those ran at
# 0.4-1.0x BLAS, the row form faster than BLAS at 1..8 rows.

@njit(parallel=True, cache=True, fastmath=FAST)
def dense_matmul_t(wt, x, y):
    R, C = wt.shape
    T = x.shape[0]
    for r in prange(R):
        if ROWS_AHEAD:
            for j in range(0, 4 * C, 64):              # the bytes AHEAD_BYTES past this row's, asked for
                prefetch(wt, 4 * r * C + AHEAD_BYTES + j)
        t = 0
        while t + 4 <= T:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for k in range(C):
                w = wt[r, k]
                a0 += w * x[t, k]
                a1 += w * x[t + 1, k]
                a2 += w * x[t + 2, k]
                a3 += w * x[t + 3, k]
            y[t, r] = a0
            y[t + 1, r] = a1
            y[t + 2, r] = a2
            y[t + 3, r] = a3
            t += 4
        if t + 2 <= T:
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            for k in range(C):
                w = wt[r, k]
                a0 += w * x[t, k]
                a1 += w * x[t + 1, k]
            y[t, r] = a0
            y[t + 1, r] = a1
            t += 2
        if t < T:
            a0 = np.float32(0.0)
            for k in range(C):
                a0 += wt[r, k] * x[t, k]
            y[t, r] = a0


@njit(inline="always", fastmath=FAST)
def _one_by_one(wt, x, y, r0, r1, t0):
    """The blocked forms' tails: y[t, r] for output rows r0..r1-1 and rows of x t0..T-1, each its
    own sum."""
    for r in range(r0, r1):
        for t in range(t0, x.shape[0]):
            a0 = np.float32(0.0)
            for k in range(x.shape[1]):
                a0 += wt[r, k] * x[t, k]
            y[t, r] = a0


@njit(parallel=True, cache=True, fastmath=FAST)
def dense_matmul_t_blocked(wt, x, y):
    """The same product for 8 rows of x and more: four output rows at a time against four rows of x,
    sixteen accumulators, so each pass over the four weight rows' values loads 4 weight and 4 x
    vectors for 16 multiply-adds (the row form above loads 5 for 4, and runs out of loads before
    multiply-adds). The four weight rows (4·C floats) stay in L1 while x's rows go by in fours: the
    weight is read from memory once. GPT-2-124M's products and head, quiet 2-core Zen 4, 2 threads,
    one pass, ms: 8 / 16 / 32 / 64 / 128 / 256 rows 24.0 / 34.6 / 54.0 / 93.0 / 177 / 254 against
    the row form's 35.4 / 61.7 / 103 / 182 / 388 and BLAS's best (Wt @ x^T or x @ Wt.T) 44.2 / 52.6 /
    75.5 / 120 / 209 / 263; at 512 rows BLAS is the faster (461 against 485), at 1..7 the row form
    (4 rows 17.8 against 20.1). A 2x4 form: 30.2 / 45.6 / 68.8 ms at 8 / 16 / 32 rows."""
    R, C = wt.shape
    T = x.shape[0]
    for rr in prange((R + 3) // 4):
        r = 4 * rr
        if r + 3 < R:
            t = 0
            while t + 4 <= T:
                a0 = np.float32(0.0)
                a1 = np.float32(0.0)
                a2 = np.float32(0.0)
                a3 = np.float32(0.0)
                b0 = np.float32(0.0)
                b1 = np.float32(0.0)
                b2 = np.float32(0.0)
                b3 = np.float32(0.0)
                c0 = np.float32(0.0)
                c1 = np.float32(0.0)
                c2 = np.float32(0.0)
                c3 = np.float32(0.0)
                d0 = np.float32(0.0)
                d1 = np.float32(0.0)
                d2 = np.float32(0.0)
                d3 = np.float32(0.0)
                for k in range(C):
                    w0 = wt[r, k]
                    w1 = wt[r + 1, k]
                    w2 = wt[r + 2, k]
                    w3 = wt[r + 3, k]
                    x0 = x[t, k]
                    x1 = x[t + 1, k]
                    x2 = x[t + 2, k]
                    x3 = x[t + 3, k]
                    a0 += w0 * x0
                    a1 += w0 * x1
                    a2 += w0 * x2
                    a3 += w0 * x3
                    b0 += w1 * x0
                    b1 += w1 * x1
                    b2 += w1 * x2
                    b3 += w1 * x3
                    c0 += w2 * x0
                    c1 += w2 * x1
                    c2 += w2 * x2
                    c3 += w2 * x3
                    d0 += w3 * x0
                    d1 += w3 * x1
                    d2 += w3 * x2
                    d3 += w3 * x3
                y[t, r], y[t + 1, r], y[t + 2, r], y[t + 3, r] = a0, a1, a2, a3
                y[t, r + 1], y[t + 1, r + 1], y[t + 2, r + 1], y[t + 3, r + 1] = b0, b1, b2, b3
                y[t, r + 2], y[t + 1, r + 2], y[t + 2, r + 2], y[t + 3, r + 2] = c0, c1, c2, c3
                y[t, r + 3], y[t + 1, r + 3], y[t + 2, r + 3], y[t + 3, r + 3] = d0, d1, d2, d3
                t += 4
            _one_by_one(wt, x, y, r, r + 4, t)         # the last rows of x
        else:
            _one_by_one(wt, x, y, r, R, 0)             # the last output rows


@njit(parallel=True, cache=True, fastmath=FAST)
def dense_matmul_t_6x4(wt, x, y):
    """The blocked form with six output rows against four rows of x: 24 accumulators, and each pass
    over the six weight rows' values loads 6 weight and 4 x vectors for 24 multiply-adds (the 4x4
    form: 8 for 16). For CPUs with 32 vector registers (AVX-512): the 24 sums, four x vectors and a
    weight vector fit them (AVX2's 16 would spill). GPT-2-124M's products and head from memory, AMD
    EPYC Zen 5 VM, 2 threads, one process, medians of 7 rounds, ms: 4 / 8 / 16 rows of x 16.4 / 21.1
    / 27.4 against the 4x4 form's 18.7 / 23.0 / 31.0 and the row form's 21.2 / 32.5 / 60.6 (one row:
    10.5 in the row form); 8x2, 10x2 and 12x2 tiles within 5% of it, 16x1 and 8x3 behind."""
    R, C = wt.shape
    T = x.shape[0]
    for rr in prange((R + 5) // 6):
        r = 6 * rr
        if r + 5 < R:
            t = 0
            while t + 4 <= T:
                a0, a1, a2, a3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                b0, b1, b2, b3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                c0, c1, c2, c3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                d0, d1, d2, d3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                e0, e1, e2, e3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                f0, f1, f2, f3 = np.float32(0.0), np.float32(0.0), np.float32(0.0), np.float32(0.0)
                for k in range(C):
                    x0, x1, x2, x3 = x[t, k], x[t + 1, k], x[t + 2, k], x[t + 3, k]
                    w = wt[r, k]
                    a0 += w * x0
                    a1 += w * x1
                    a2 += w * x2
                    a3 += w * x3
                    w = wt[r + 1, k]
                    b0 += w * x0
                    b1 += w * x1
                    b2 += w * x2
                    b3 += w * x3
                    w = wt[r + 2, k]
                    c0 += w * x0
                    c1 += w * x1
                    c2 += w * x2
                    c3 += w * x3
                    w = wt[r + 3, k]
                    d0 += w * x0
                    d1 += w * x1
                    d2 += w * x2
                    d3 += w * x3
                    w = wt[r + 4, k]
                    e0 += w * x0
                    e1 += w * x1
                    e2 += w * x2
                    e3 += w * x3
                    w = wt[r + 5, k]
                    f0 += w * x0
                    f1 += w * x1
                    f2 += w * x2
                    f3 += w * x3
                y[t, r], y[t + 1, r], y[t + 2, r], y[t + 3, r] = a0, a1, a2, a3
                y[t, r + 1], y[t + 1, r + 1], y[t + 2, r + 1], y[t + 3, r + 1] = b0, b1, b2, b3
                y[t, r + 2], y[t + 1, r + 2], y[t + 2, r + 2], y[t + 3, r + 2] = c0, c1, c2, c3
                y[t, r + 3], y[t + 1, r + 3], y[t + 2, r + 3], y[t + 3, r + 3] = d0, d1, d2, d3
                y[t, r + 4], y[t + 1, r + 4], y[t + 2, r + 4], y[t + 3, r + 4] = e0, e1, e2, e3
                y[t, r + 5], y[t + 1, r + 5], y[t + 2, r + 5], y[t + 3, r + 5] = f0, f1, f2, f3
                t += 4
            _one_by_one(wt, x, y, r, r + 6, t)         # the last rows of x
        else:
            _one_by_one(wt, x, y, r, R, 0)             # the last output rows


# -- attention without the score matrix ------------------------------------------------------------

def exp_polynomial(x):
    """exp(x) in float32 arithmetic that LLVM can vectorize (libm's expf is one call per value):
    x = n·ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf polynomial (about 1 ulp), 2^n built in
    the exponent's bits. Below -87 it gives exp(-87) ~ 1.6e-38 instead of a smaller number or 0: a
    weight of that size is lost in any sum it enters (the first tile's correction exp(-inf) so
    multiplies a running sum and output that are still 0). The source, compiled twice: `fexp` below
    with fastmath, kernels/_exact.py's without."""
    x = max(x, np.float32(-87.0))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)


fexp = njit(inline="always", cache=True, fastmath=FAST)(exp_polynomial)


@njit(inline="always", fastmath=FAST)
def _dot_4x2(a, r, b, c, n):
    """The dot products of rows r..r+3 of a with rows c and c+1 of b over their first n columns,
    eight sums (a load of a's lanes serves two rows of b, one of b's four rows of a): the attention
    tiles' inner product, for the scores and for the values alike."""
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    b0 = np.float32(0.0)
    b1 = np.float32(0.0)
    b2 = np.float32(0.0)
    b3 = np.float32(0.0)
    for i in range(n):
        u = b[c, i]
        w = b[c + 1, i]
        x0 = a[r, i]
        x1 = a[r + 1, i]
        x2 = a[r + 2, i]
        x3 = a[r + 3, i]
        a0 += x0 * u
        a1 += x1 * u
        a2 += x2 * u
        a3 += x3 * u
        b0 += x0 * w
        b1 += x1 * w
        b2 += x2 * w
        b3 += x3 * w
    return a0, a1, a2, a3, b0, b1, b2, b3


@njit(inline="always", fastmath=FAST)
def _dot_4x1(a, r, b, c, n):
    """_dot_4x2 for one row of b (an odd last one)."""
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    for i in range(n):
        u = b[c, i]
        a0 += a[r, i] * u
        a1 += a[r + 1, i] * u
        a2 += a[r + 2, i] * u
        a3 += a[r + 3, i] * u
    return a0, a1, a2, a3


@njit(inline="always", fastmath=FAST)
def _scores_4(qs, row, kh, j0, top, s4):
    """s4[t, j] = q·k for rows row..row+3 of qs and keys j0 .. j0+top-1 of one head's keys kh
    [keys, hd], two keys at a time."""
    hd = qs.shape[1]
    j = 0
    while j + 2 <= top:
        s4[0, j], s4[1, j], s4[2, j], s4[3, j], s4[0, j + 1], s4[1, j + 1], s4[2, j + 1], s4[3, j + 1] = \
            _dot_4x2(qs, row, kh, j0 + j, hd)
        j += 2
    if j < top:                                             # an odd last key
        s4[0, j], s4[1, j], s4[2, j], s4[3, j] = _dot_4x1(qs, row, kh, j0 + j, hd)


@njit(inline="always", fastmath=FAST)
def _online_softmax(s, lim, r, mx, l, acc):
    """One row's step of the online softmax over a tile's first `lim` scores s[:lim] (the keys it may
    see): the running max and sum of row r updated, its output so far rescaled, s[:lim] made the
    weights exp(s - max)."""
    mnew = mx[r]
    for j in range(lim):
        mnew = max(mnew, s[j])
    corr = fexp(mx[r] - mnew)
    lsum = np.float32(0.0)
    for j in range(lim):                                    # weights, vectorized
        p = fexp(s[j] - mnew)
        s[j] = p
        lsum += p
    l[r] = l[r] * corr + lsum
    mx[r] = mnew
    for e in range(acc.shape[1]):
        acc[r, e] *= corr


@njit(inline="always", fastmath=FAST)
def _values_4(s4, vt, lim, nk, acc, row):
    """acc[row + t, e] += sum over the keys j row + t sees of s4[t, j]·vt[e, j], for four rows whose
    first sees the tile's keys j < lim and each next one key more (up to nk): the values transposed
    (vt [hd, keys]), so each sum runs along a row of both, two lanes at a time over the keys all four
    see, then each row's own last keys. No row reads a value past its position (a NaN there stays out
    of the rows before it, as a weight of 0 times it would not)."""
    hd = acc.shape[1]
    e = 0
    while e + 2 <= hd:
        a0, a1, a2, a3, b0, b1, b2, b3 = _dot_4x2(s4, 0, vt, e, lim)
        acc[row, e] += a0
        acc[row + 1, e] += a1
        acc[row + 2, e] += a2
        acc[row + 3, e] += a3
        acc[row, e + 1] += b0
        acc[row + 1, e + 1] += b1
        acc[row + 2, e + 1] += b2
        acc[row + 3, e + 1] += b3
        e += 2
    if e < hd:                                              # an odd head size's last lane
        a0, a1, a2, a3 = _dot_4x1(s4, 0, vt, e, lim)
        acc[row, e] += a0
        acc[row + 1, e] += a1
        acc[row + 2, e] += a2
        acc[row + 3, e] += a3
    for t in range(1, 4):                                   # on the diagonal: the keys row + t alone sees
        for j in range(lim, min(nk, lim + t)):
            p = s4[t, j]
            for e in range(hd):
                acc[row + t, e] += p * vt[e, j]


@njit(parallel=True, cache=True, fastmath=FAST)
def flash_attention(q, k, v, Tk, out, scale, bq, bk):
    """Causal attention, FlashAttention's online softmax. q [H, Tq, hd], k, v [Hkv, >= Tk, hd] (the
    first Tk rows of each head are the keys: a cache's whole C-contiguous array may be passed),
    out [H, Tq, hd]; query i sits at position Tk - Tq + i. One work item: a KV head and a tile of
    bq queries of each of its g query heads; keys go in tiles of bk, each tile's values copied once
    transposed (vt [hd, keys]) and its keys and values read for all g·bq rows, four rows at a time:
    the scores of four rows against the tile's keys (`_scores_4`), each row's online-softmax step
    (`_online_softmax`), then the four rows' weighted sums of values (`_values_4`). Per row a running
    max `mx`, a running sum `l` and the unnormalised output `acc`: a new tile's scores s give
    mx' = max(mx, max s), and l, acc are rescaled by exp(mx - mx') before the tile's exp(s - mx')
    are added. A row sees only keys <= its position: on the diagonal tile the four rows score the
    keys the fourth sees, and each weighs and sums only its own; rows that see none of a tile skip
    it, and the last rows of a tile (fewer than four) go one at a time. No mask."""
    H, Tq, hd = q.shape
    Hkv = k.shape[0]
    g = H // Hkv
    off = Tk - Tq
    nqt = (Tq + bq - 1) // bq
    for item in prange(Hkv * nqt):
        hk = item // nqt
        i0 = (item % nqt) * bq
        n = min(Tq, i0 + bq) - i0
        rows = g * n
        qs = np.empty((rows, hd), np.float32)
        acc = np.zeros((rows, hd), np.float32)
        mx = np.full(rows, -np.inf, np.float32)
        l = np.zeros(rows, np.float32)
        s4 = np.empty((4, bk), np.float32)              # [4, bk] four rows' scores, then weights
        vt = np.empty((hd, bk), np.float32)             # [hd, bk] the tile's values, transposed
        for h in range(g):
            for ii in range(n):
                for e in range(hd):
                    qs[h * n + ii, e] = q[hk * g + h, i0 + ii, e] * scale
        last = off + i0 + n                       # the tile's last query sees keys 0 .. last-1
        for j0 in range(0, last, bk):
            nk = min(last, j0 + bk) - j0
            for j in range(nk):
                for e in range(hd):
                    vt[e, j] = v[hk, j0 + j, e]
            first = max(0, j0 - off - i0)          # the tile's first row that sees key j0
            for h in range(g):
                ii = first
                while ii + 4 <= n:
                    row = h * n + ii
                    lim = min(nk, off + i0 + ii + 1 - j0)   # keys of this tile the first of the four sees
                    _scores_4(qs, row, k[hk], j0, min(nk, lim + 3), s4)   # ... the fourth's, for all four
                    for t in range(4):
                        _online_softmax(s4[t], min(nk, lim + t), row + t, mx, l, acc)
                    _values_4(s4, vt, lim, nk, acc, row)
                    ii += 4
                for ii in range(ii, n):                 # the last rows, one at a time
                    lim = min(nk, off + i0 + ii + 1 - j0)
                    row = h * n + ii
                    s = s4[0]                           # the four rows' buffer, free here
                    for j in range(lim):
                        a = np.float32(0.0)
                        for e in range(hd):
                            a += qs[row, e] * k[hk, j0 + j, e]
                        s[j] = a
                    _online_softmax(s, lim, row, mx, l, acc)
                    for e in range(hd):
                        a = np.float32(0.0)
                        for j in range(lim):
                            a += s[j] * vt[e, j]
                        acc[row, e] += a
        for h in range(g):
            for ii in range(n):
                row = h * n + ii
                inv = np.float32(1.0) / l[row]
                for e in range(hd):
                    out[hk * g + h, i0 + ii, e] = acc[row, e] * inv


@njit(parallel=True, cache=True, fastmath=FAST)
def paged_decode_attention(q, kp, vp, table, lengths, out, scale, chunk):
    """One query per sequence over its paged keys, FlashDecoding's split. q [H, B, hd]; kp, vp
    [Hkv, blocks, bs, hd] (one layer's pool); table [B, nb] block numbers; lengths [B] keys per
    sequence; out [H, B, hd]. A sequence's keys go in chunks of `chunk`: one work item is a
    sequence, a KV head and a chunk, each key's row read once for the g query heads that share it,
    its scores kept whole (two passes: the scores and their max, then the weights and the weighted
    sum of values); the chunks' partial results (max, sum, unnormalised output) are combined at the
    end. Key j is row j % bs of block table[b, j // bs], and nothing else depends on the blocks: the
    same keys in the same chunks give the same bits over any block size, a contiguous cache's rows
    seen as one block included."""
    H, B, hd = q.shape
    Hkv, bs = kp.shape[0], kp.shape[2]
    g = H // Hkv
    # A sequence whose keys fit in one chunk (its own length, whatever the batch's longest) is
    # finished by its work items, out = acc / l: its other chunks hold no key (l = 0), so combining
    # them adds nothing. The combining loop, a second parallel region, runs only for the others,
    # and only when there are some (a decode step of short sequences: one region, not two).
    longest, nch, pm, pl, pacc = chunk_partials(lengths, chunk, B, Hkv, g, hd)
    for item in prange(B * Hkv * nch):
        b = item // (Hkv * nch)
        hk = (item // nch) % Hkv
        c = item % nch
        p0 = c * chunk
        nk = max(0, min(lengths[b], p0 + chunk) - p0)
        qs = np.empty((g, hd), np.float32)
        for h in range(g):
            for e in range(hd):
                qs[h, e] = q[hk * g + h, b, e] * scale
        acc = np.zeros((g, hd), np.float32)
        s = np.empty((g, nk), np.float32)
        blks = np.empty(nk, np.intp)
        rws = np.empty(nk, np.intp)
        for j in range(nk):                              # scores: each key read once for g heads
            blks[j] = table[b, (p0 + j) // bs]
            rws[j] = (p0 + j) % bs
            blk = blks[j]
            rw = rws[j]
            for h in range(g):
                a = np.float32(0.0)
                for e in range(hd):
                    a += qs[h, e] * kp[hk, blk, rw, e]
                s[h, j] = a
        for h in range(g):
            mx = np.float32(-np.inf)
            for j in range(nk):
                mx = max(mx, s[h, j])
            lsum = np.float32(0.0)
            for j in range(nk):                          # weights, vectorized
                p = fexp(s[h, j] - mx)
                s[h, j] = p
                lsum += p
            pm[b, hk, c, h] = mx
            pl[b, hk, c, h] = lsum
        for j in range(nk):                              # the weighted sum: each value read once
            blk = blks[j]
            rw = rws[j]
            for h in range(g):
                p = s[h, j]
                for e in range(hd):
                    acc[h, e] += p * vp[hk, blk, rw, e]
        if lengths[b] <= chunk:                          # its one chunk: the output itself
            if c == 0:
                for h in range(g):
                    inv = np.float32(1.0) / pl[b, hk, c, h]
                    for e in range(hd):
                        out[hk * g + h, b, e] = acc[h, e] * inv
        else:
            for h in range(g):
                for e in range(hd):
                    pacc[b, hk, c, h, e] = acc[h, e]
    if longest <= chunk:
        return
    for item in prange(B * H):                           # combine the chunks by their max and sum
        combine(lengths, out, chunk, pm, pl, pacc, item)


@njit(inline="always", cache=True)
def chunk_partials(lengths, chunk, B, Hkv, g, hd):
    """paged_decode_attention's chunks and their partial results: the longest sequence's keys, the
    chunks nch it takes, and arrays for each work item's max pm and sum pl [B, Hkv, nch, g] and
    unnormalised output pacc [B, Hkv, nch, g, hd] (kernels/_exact.py's copy calls it too: no float
    arithmetic, the same in both)."""
    longest = 0
    for b in range(B):
        longest = max(longest, lengths[b])
    nch = max(1, (longest + chunk - 1) // chunk)
    pm = np.empty((B, Hkv, nch, g), np.float32)
    pl = np.empty((B, Hkv, nch, g), np.float32)
    pacc = np.empty((B, Hkv, nch, g, hd), np.float32)
    return longest, nch, pm, pl, pacc


def combine_chunks(lengths, out, chunk, pm, pl, pacc, item):
    """paged_decode_attention's last step for query head `item` of B·H (a sequence, a head): its
    chunks' unnormalised outputs pacc [B, Hkv, nch, g, hd] combined by their maxima pm and sums pl
    [B, Hkv, nch, g] into out [H, B, hd]; nothing for a sequence of one chunk (its work items wrote
    its output). The source, compiled twice: `combine` below with fastmath, kernels/_exact.py's
    without."""
    H, B, hd = out.shape
    nch, g = pm.shape[2], pm.shape[3]
    b = item // H
    if lengths[b] <= chunk:
        return
    hq = item % H
    hk = hq // g
    h = hq % g
    M = -np.inf
    for c in range(nch):
        if pl[b, hk, c, h] > 0:
            M = max(M, pm[b, hk, c, h])
    L = np.float32(0.0)
    for e in range(hd):
        out[hq, b, e] = 0.0
    for c in range(nch):
        if pl[b, hk, c, h] > 0:
            f = np.exp(pm[b, hk, c, h] - M)
            L += pl[b, hk, c, h] * f
            for e in range(hd):
                out[hq, b, e] += pacc[b, hk, c, h, e] * f
    inv = np.float32(1.0) / L
    for e in range(hd):
        out[hq, b, e] *= inv


combine = njit(inline="always", cache=True, fastmath=FAST)(combine_chunks)


# -- a step's small elementwise chains, each one pass (the NumPy reference: models/ops.py) ----------

@njit(cache=True, fastmath=FAST)
def rms_norm(x, w, eps, y):
    """x, y [N, n] float32, w [n]: y = x / sqrt(mean(x²) + eps) · w, row by row, one pass to sum and
    one to write (ops.rms_norm makes four passes and two arrays)."""
    N, n = x.shape
    for r in range(N):
        s = np.float32(0.0)
        for i in range(n):
            s += x[r, i] * x[r, i]
        inv = np.float32(1.0) / np.sqrt(s / np.float32(n) + np.float32(eps))
        for i in range(n):
            y[r, i] = x[r, i] * inv * w[i]


@njit(cache=True, fastmath=FAST)
def layer_norm(x, w, b, eps, y):
    """x, y [N, n] float32, w, b [n]: y = (x - mean) / sqrt(var + eps) · w + b, row by row (GPT-2's
    norm), as ops.layer_norm computes it: the mean, then the variance of the centred row, then one
    pass to write (ops.layer_norm makes eight passes and two arrays)."""
    N, n = x.shape
    for r in range(N):
        s = np.float32(0.0)
        for i in range(n):
            s += x[r, i]
        mean = s / np.float32(n)
        q = np.float32(0.0)
        for i in range(n):
            c = x[r, i] - mean
            q += c * c
        inv = np.float32(1.0) / np.sqrt(q / np.float32(n) + np.float32(eps))
        for i in range(n):
            y[r, i] = (x[r, i] - mean) * inv * w[i] + b[i]


@njit(inline="always", fastmath=FAST)
def _gelu_row(x, y, r):
    """Row r of gelu (its docstring says how): exp(-2u) in one vectorized pass, the division in another."""
    for i in range(x.shape[1]):
        v = x[r, i]
        minus_2u = np.float32(-1.5957691216057308) * (v + np.float32(0.044715) * v * v * v)
        e = fexp(min(minus_2u, np.float32(88.0)))
        y[r, i] = e if minus_2u <= np.float32(88.0) else np.float32(np.inf)
    for i in range(x.shape[1]):
        y[r, i] = x[r, i] / (np.float32(1.0) + y[r, i])


@njit(cache=True, fastmath=FAST)
def gelu(x, y):
    """x, y [N, F] float32: GPT-2's tanh GELU, 0.5·x·(1 + tanh(u)) with u = √(2/π)·(x + 0.044715·x³),
    written x / (1 + exp(-2u)). Two vectorized passes per row, as swiglu: exp(-2u) (the vectorizable
    fexp), then the division (libm's tanhf is a call per value, not vectorized). Past -2u = 88 (x below
    about -10, down to -inf, where x³ overflows) exp(-2u) is taken as inf: x / inf is -0, NumPy's tanh
    chain's answer there (the exact value is below 1e-36); capping it at exp(88) instead gave
    x / 1.65e38, -0.06 to -2.06 for x <= -1e37. x = -inf gives NaN, as NumPy's does."""
    for r in range(x.shape[0]):
        _gelu_row(x, y, r)


@njit(parallel=True, cache=True, fastmath=FAST)
def gelu_rows(x, y):
    """gelu's values, bit for bit, the rows shared among the threads (elementwise.GELU_PARALLEL_FROM
    says from how many values)."""
    for r in prange(x.shape[0]):
        _gelu_row(x, y, r)


@njit(cache=True, fastmath=FAST)
def rope(x, cos, sin, y):
    """x [G, N, hd] (any strides: q and k are views of the qkv product), cos, sin [N, hd/2], y
    [G, N, hd]: coordinate i and i + hd/2 turned by their position's angle, as ops.rope does."""
    G, N, hd = x.shape
    half = hd // 2
    for g in range(G):
        for n in range(N):
            for i in range(half):
                a = x[g, n, i]
                b = x[g, n, half + i]
                y[g, n, i] = a * cos[n, i] - b * sin[n, i]
                y[g, n, half + i] = b * cos[n, i] + a * sin[n, i]


@njit(cache=True, fastmath=FAST)
def swiglu(h, y):
    """h [N, 2F] (gate | up), y [N, F]: y = silu(gate)·up = gate·up / (1 + exp(-gate)), as ops.swiglu
    computes it in its tanh form. Two vectorized passes per row: exp(-gate) (the vectorizable fexp;
    -gate capped at 88, where exp is 1.7e38 and the result 0 to float32's precision), then the rest."""
    N, F = y.shape
    for r in range(N):
        for i in range(F):
            y[r, i] = fexp(min(-h[r, i], np.float32(88.0)))
        for i in range(F):
            y[r, i] = h[r, i] * h[r, F + i] / (np.float32(1.0) + y[r, i])


@njit(cache=True, fastmath=FAST)
def decode_attention_short(q, k, v, Tk, out, scale):
    """One query per head over a short context, on one thread: q [H, 1, hd]; k, v [Hkv, >= Tk, hd]
    (the first Tk rows of each head are the keys: a cache's whole arrays may be passed); out
    [H, 1, hd]. Two passes over the keys per head, the scores kept whole (Tk floats): no split, no
    running max to combine, no parallel launch, which on a short context cost more than they save
    (products.SHORT_DECODE)."""
    H, hd = q.shape[0], q.shape[2]
    g = H // k.shape[0]
    s = np.empty(Tk, np.float32)
    acc = np.empty(hd, np.float32)
    for h in range(H):
        hk = h // g
        mx = np.float32(-np.inf)
        for j in range(Tk):
            a = np.float32(0.0)
            for e in range(hd):
                a += q[h, 0, e] * k[hk, j, e]
            a *= scale
            s[j] = a
            mx = max(mx, a)
        tot = np.float32(0.0)
        for j in range(Tk):                          # weights, vectorized
            p = fexp(s[j] - mx)
            s[j] = p
            tot += p
        for e in range(hd):
            acc[e] = np.float32(0.0)
        for j in range(Tk):                          # the weighted sum of values
            p = s[j]
            for e in range(hd):
                acc[e] += p * v[hk, j, e]
        inv = np.float32(1.0) / tot
        for e in range(hd):
            out[h, 0, e] = acc[e] * inv
