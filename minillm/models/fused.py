"""The fused kernel set's weights (numba products, minillm/kernels/), answering the weight interface
of models/weights.py (n_in, n_out, nbytes, matmul, rows, counts, rows_counts, ...) like the NumPy
`Dense` and `QuantMatrix` they are made from (`fuse`), whose subclasses they are.

FusedQuant is a QuantMatrix (same planes, same bytes, same `rows` and `dequantize`) whose product
runs the fused kernel for up to FUSED_ROWS rows of x in float32: each block's bytes read once,
widened and scaled in registers, no scratch. Past FUSED_ROWS rows (a prefill) it multiplies as
QuantMatrix does, widening a tile at a time for BLAS, and counts as QuantMatrix counts. Measured
(one thread, CPU time, busy machine, a 3072x768 weight): fused over widening + BLAS 2.5x (Q8_0) and
3.3x (Q4_0) at 8 rows, 1.3x and 1.7x at 32, 0.98x and 1.07x at 64, 0.44x and 0.53x at 512.

FusedDense is a float32 weight y = x @ W for W [in, out], kept as its transpose [out, in] (the same
bytes; `rows` are then contiguous, for a tied head's embedding lookup). 1..256 rows of x (DENSE_ROWS)
run the fused kernels, which read the weight once (the row form for the first rows, then a
register-blocked form: kernels/products.py's BLOCKED_FROM, kernels/_numba.py their measurements);
more rows (a long prompt) run BLAS on the same array, x @ Wt.T (at 512 rows 461 ms over GPT-2-124M's
products against the blocked form's 485; quiet 2-core Zen 4, 2 threads).
"""

from __future__ import annotations

import numpy as np

from ..kernels import products
from ..kernels.aligned import aligned
from .quant import QK, QuantMatrix, kept_counts, kept_once
from .weights import Dense

FUSED_ROWS = 32       # quantized: rows of x up to which the fused kernel runs (more: widening + BLAS)
DENSE_ROWS = (1, 256)  # float32: rows of x for which the fused kernels run (a longer prompt: BLAS)


class FusedQuant(QuantMatrix):
    """A QuantMatrix whose product is the fused kernel (see the module's docstring)."""

    def __init__(self, fmt, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> None:
        super().__init__(fmt, q, d, m)
        self.planes = products.planes(q, d, m)  # the kernel's arguments, made once (not per product),
        kept_once(self)                          # on 64-byte boundaries: the weight holds them alone

    def __repr__(self) -> str:
        return "Fused" + super().__repr__()

    def fused(self, T: int, dtype=np.float32) -> bool:
        """Does a product of T rows of `dtype` run the fused kernel?"""
        return T <= FUSED_ROWS and dtype == np.float32      # a dtype or a scalar type: no np.dtype() per call

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [T, C] @ this^T -> [T, R]."""
        if self.fused(x.shape[0], x.dtype):
            return products.quant_matmul_t(self.planes, x)
        return super().matmul(x)

    @kept_counts
    def counts(self, T: int, itemsize: int = 4) -> dict:
        """What a product of T rows tells the meter. Fused: weights = the blocks' bytes, read once
        (rows of x go in fours, the later fours finding the row in the L1 cache); no scratch;
        dequant = per value the widening (Q8_0: cast; Q4: mask or shift, cast) and the scale
        (Q8_0: 1 multiply; Q4: a multiply-add, 2), per scale (and minimum) 4 (float16 to float32),
        Q4_0's offset -8·d 1 per block; once per group of four or two rows of x. A single row (T
        odd) of Q4, per byte (two values): the cast, the high nibble (a multiply and a floor), the
        scale, 4; the offset a multiply-add per block (the kernel's one-row form, which never
        forms the low nibble: byte·xlo + hi·(xhi - 16·xlo)). Otherwise QuantMatrix's counts."""
        if not self.fused(T, np.float32 if itemsize == 4 else np.float64):
            return super().counts(T, itemsize)
        R, C = self.shape
        nb = C // QK
        groups = T // 4 + (T % 4 >= 2)                           # passes over a row: 4, then 2 rows
        per_block = 4 * (2 if self.fmt.has_min else 1) + (1 if self.fmt.name == "q4_0" else 0)
        if self.fmt.bits == 8:
            return {"weights": self.nbytes, "scratch": 0,
                    "dequant": (groups + T % 2) * R * C * 2 + R * nb * per_block}
        one = (T % 2) * (R * C // 2 * 4 + R * nb * 2)            # then 1 row, in the one-row form
        return {"weights": self.nbytes, "scratch": 0, "dequant": groups * R * C * 4 + one + R * nb * per_block}


class FusedDense(Dense):
    """A float32 weight W [in, out] (y = x @ W), kept as Wt [out, in]; see the module's docstring.
    As a Dense, `a` is W [in, out] (here a view of Wt), and it describes itself as that array."""

    def __init__(self, w: np.ndarray, transposed: bool = False) -> None:
        """w: W [in, out], or Wt [out, in] if `transposed` (then no copy is made)."""
        w = np.asarray(w, dtype=np.float32)
        self.wt = aligned(w if transposed else w.T)                  # [out, in], on a 64-byte boundary
        super().__init__(self.wt.T)                                   # a: [in, out], a view

    def __repr__(self) -> str:
        return f"FusedDense({self.n_in}x{self.n_out}, {self.nbytes:,} bytes)"

    def fused(self, T: int, dtype=np.float32) -> bool:
        return DENSE_ROWS[0] <= T <= DENSE_ROWS[1] and np.dtype(dtype) == np.float32

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [T, n_in] -> [T, n_out]."""
        T = x.shape[0]
        if self.fused(T, x.dtype):
            return products.dense_matmul_t(self.wt, x)
        return x @ self.wt.T                                     # [T, in] @ [in, out], BLAS

    def rows(self, ids: np.ndarray, dtype=np.float32) -> np.ndarray:
        """The weight vectors of outputs `ids`, [N, n_in] (a tied head: the token embeddings)."""
        return self.wt[ids].astype(dtype or np.float32, copy=False)

    def counts(self, T: int, itemsize: int = 4) -> dict:
        """The weight read once, whichever ran (BLAS's packing copies are its own, as for Dense)."""
        return {"weights": self.nbytes, "dequant": 0, "scratch": 0}

    def rows_counts(self, N: int) -> dict:
        return {"weights": N * self.n_in * self.wt.itemsize, "dequant": 0}


def fuse(w):
    """The fused implementation of a NumPy weight, where there is one: a QuantMatrix -> FusedQuant
    (same planes, no copy); a float32 Dense -> FusedDense (its [out, in] rows: a torch or GGUF
    checkpoint's rows kept without a copy, GPT-2's [in, out] copied transposed once, at load);
    anything else (float64, already fused) unchanged: the NumPy path computes it."""
    if isinstance(w, (FusedQuant, FusedDense)):
        return w
    if isinstance(w, QuantMatrix):
        return FusedQuant.of(w)
    if isinstance(w, Dense) and w.a.dtype == np.float32:
        return FusedDense(w.a.T, transposed=True)
    return w
