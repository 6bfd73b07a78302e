"""The weights a model multiplies by: one small interface, and the one factory that makes them.

Every product weight of a model (a linear layer, the LM head, the token embedding it is tied to)
answers the same calls, so `models/ops.py` never asks what kind of weight it holds:

    w.n_in, w.n_out          the product's widths: y [T, n_out] = x [T, n_in] "times" w
    w.nbytes                 bytes of the weight as stored (what a product reads from memory)
    w.matmul(x)              x [T, n_in] -> y [T, n_out]
    w.rows(ids, dtype=None)  [N, n_in]: the weight vectors of outputs `ids` (a tied head's rows are
                             the token embeddings: the embedding lookup)
    w.counts(T, itemsize)    what a product of T rows costs the meter: {"weights": bytes read,
                             "dequant": widening FLOPs, "scratch": bytes through the cache}
    w.rows_counts(N)         the same for gathering N rows: {"weights": ..., "dequant": ...}
    w.fixed_matmul(x)        matmul's values, each output summed over the input in index order: a
                             row's result whatever rows come with it (the batch-invariant kernels)
    w.stored_as, w.stored()  its format's name, and its array as a checkpoint holds it

Two implementations, both NumPy:
    Dense        a float array kept [in, out] for BLAS (its `matmul` shapes the product, below)
    QuantMatrix  [out, in] rows of GGUF blocks, widened by NumPy a tile at a time (models/quant.py)
and one on a device (backend.py):
    DeviceDense  a Dense whose array lives on the device (CuPy on a GPU): the plain product `x @ a`
The kernel sets add theirs (models/fused.py: numba products; `FixedOrder*` below: the
batch-invariant set's). A model's constructor makes every weight through `make_weight(w, target)`
(models/factory.py): the target (models/target.py) says which, once.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .. import backend
from ..errors import WeightsError
from .quant import FORMATS, QuantMatrix
from .target import FLOATS


class Weight(Protocol):
    n_in: int
    n_out: int
    nbytes: int
    stored_as: str               # "float32", "q8_0", ...: the format its values are kept in

    def matmul(self, x: np.ndarray) -> np.ndarray: ...
    def fixed_matmul(self, x: np.ndarray) -> np.ndarray: ...
    def rows(self, ids: np.ndarray, dtype=None) -> np.ndarray: ...
    def counts(self, T: int, itemsize: int = 4) -> dict: ...
    def rows_counts(self, N: int) -> dict: ...
    def stored(self, rows: bool = False): ...


# -- the product at the heart of every layer --------------------------------------------------------
#
# OpenBLAS multiplies [rows, in] @ [in, out] in panels of 8 rows. Measured on GPT-2 small's weights
# (2-core EPYC, 2 threads, Haswell kernels), one pass over all of them: 1 row runs as a
# matrix-vector product, ~19 ms; 2 rows as one matrix-matrix product take ~42 ms, more than two
# separate matrix-vector products (~31 ms); 3-7 rows take 40-58 ms, but 8 rows take ~39 ms: a row
# count that is not a multiple of 8 falls to slow edge kernels. So `matmul` runs 2 rows as two
# matrix-vector products and pads 3..63 rows with zero rows up to a multiple of 8 (a copy of at
# most 63 rows). Past 64 rows the edge costs a few percent and padding would cost a copy of the
# whole input, so it is not done. Weights under 1 MB stay in the CPU's caches, where packing them is
# cheap and the plain product is the faster one (measured on a 4x128 model), so they are left alone.
# The padding rows are an artefact of the kernel, like its own packing copies: the meter counts the
# model's work (T rows), not them. `minillm bench --batch` measures all of this on your machine.

ROW_PANEL = 8          # the kernel's panel: 3..PAD_BELOW-1 rows are padded up to a multiple of this
PAD_BELOW = 64
SHAPED_FROM = 1 << 20  # bytes of weight from which the product is shaped at all


def padded_rows(T: int) -> int:
    """The rows `matmul` runs the product on for T rows of input (for a weight of SHAPED_FROM bytes or more)."""
    return -(-T // ROW_PANEL) * ROW_PANEL if 2 < T < PAD_BELOW else T


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [T, in] @ w [in, out] -> [T, out] for a float array w, shaped for the BLAS kernel (see above)."""
    T = x.shape[0]
    if w.nbytes < SHAPED_FROM:
        return x @ w
    if T == 2:
        return np.matmul(x[:, None, :], w)[:, 0]        # [2, 1, in] @ [in, out]: two matrix-vector products
    R = padded_rows(T)
    if R != T:
        xp = np.zeros((R, x.shape[1]), dtype=x.dtype)   # [R, in], rows T.. are zeros
        xp[:T] = x
        return (xp @ w)[:T]
    return x @ w


class Dense:
    """A float weight, kept [in, out] (`a`) so that x @ a streams it as BLAS likes. A tied embedding
    is the LM head's [d, V] array: its rows (the embeddings) are a's columns."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a                                  # [in, out]
        self.n_in, self.n_out = a.shape

    # the array's own description, so a model's parameter list can hold it beside plain arrays
    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    size = property(lambda self: self.a.size)
    nbytes = property(lambda self: self.a.nbytes)
    ndim = 2

    def __array__(self, dtype=None, copy=None):
        return self.a if dtype is None else self.a.astype(dtype)

    def __repr__(self) -> str:
        return f"Dense({self.a.dtype}, {self.n_in}x{self.n_out}, {self.nbytes:,} bytes)"

    stored_as = property(lambda self: self.a.dtype.name)

    def stored(self, rows: bool = False) -> np.ndarray:
        """As a checkpoint holds it: [in, out], or with rows=True its [out, in] rows (a view, no copy)."""
        return self.a.T if rows else self.a

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return matmul(x, self.a)                    # [T, out]

    def fixed_matmul(self, x: np.ndarray) -> np.ndarray:
        """matmul's values summed in index order (kernels/batch_invariant.py), over a contiguous [in, out]."""
        from ..kernels import batch_invariant
        a = self.a if self.a.flags.c_contiguous and self.a.dtype == x.dtype else self.in_out(x.dtype)
        return batch_invariant.matmul(x, a)

    def in_out(self, dtype) -> np.ndarray:
        """A contiguous [in, out] copy in dtype, made once (the fixed-order product's layout)."""
        if getattr(self, "_in_out", None) is None or self._in_out.dtype != dtype:
            self._in_out = np.ascontiguousarray(self.a, dtype=dtype)
        return self._in_out

    def rows(self, ids: np.ndarray, dtype=None) -> np.ndarray:
        return self.a.T[ids]                        # [N, in]  a gather: a copy

    def counts(self, T: int, itemsize: int = 4) -> dict:
        return {"weights": self.nbytes, "dequant": 0, "scratch": 0}

    def rows_counts(self, N: int) -> dict:
        return {"weights": N * self.n_in * self.a.itemsize, "dequant": 0}


class DeviceDense(Dense):
    """A float weight on a device (a CuPy array on a GPU, [in, out]): the same interface, the plain
    product (cuBLAS has no 8-row panels to shape for) and the gather on the device."""

    def __array__(self, dtype=None, copy=None):
        a = backend.to_host(self.a)                 # a device -> host copy
        return a if dtype is None else a.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceDense({self.a.dtype}, {self.n_in}x{self.n_out}, {self.nbytes:,} bytes)"

    def matmul(self, x):
        return x @ self.a                           # [T, out]


class FixedOrderDense(Dense):
    """The batch-invariant kernel set's float weight: a Dense whose product is its fixed-order one."""

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return self.fixed_matmul(x)


class FixedOrderQuant(QuantMatrix):
    """The batch-invariant kernel set's quantized weight: the same planes, the fixed-order product."""

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return self.fixed_matmul(x)


def fixed_order(w):
    """A NumPy weight as the batch-invariant set's (the same arrays, no copy)."""
    if isinstance(w, QuantMatrix):
        return FixedOrderQuant(w.fmt, w.q, w.d, w.m)
    return FixedOrderDense(w.a)


def numpy_weight(parts: list, weights: str, dtype, rows: bool, contiguous: bool) -> Weight:
    """NumPy's weight of `make_weight`'s parts: a QuantMatrix (kept or quantized) or a Dense."""
    fmt = weights if weights in FORMATS else None
    quant = [p for p in parts if isinstance(p, QuantMatrix)]
    if weights not in FLOATS and quant and len(quant) == len(parts) \
            and len({(p.fmt.name, p.n_in) for p in quant}) == 1 and (fmt is None or quant[0].fmt.name == fmt):
        return quant[0] if len(quant) == 1 else QuantMatrix.stack(quant)          # the file's blocks, kept
    floats = [p.dequantize().T if isinstance(p, QuantMatrix) else p.T if rows else p for p in parts]   # [in, out]
    if fmt is not None:                                                      # quantized as [out, in] rows
        return QuantMatrix.quantize(np.concatenate([f.T for f in floats], axis=0) if len(floats) > 1
                                    else np.asarray(floats[0]).T, fmt)
    if len(floats) > 1:
        cat = np.concatenate([f.T for f in floats], axis=0).T                    # [in, out], a view of the rows
        return Dense(np.ascontiguousarray(cat, dtype=dtype) if contiguous else cat.astype(dtype, copy=False))
    a = floats[0]
    return Dense(np.ascontiguousarray(a, dtype=dtype) if contiguous else np.asarray(a, dtype=dtype))


def stored(w, rows: bool = False):
    """A weight as a checkpoint holds it: a float weight's array ([in, out], or with rows=True its
    [out, in] rows: a view, no copy), a quantized one as it is; any other array (a norm) as it is."""
    return w.stored(rows) if isinstance(w, (Dense, QuantMatrix)) else w


def as_weight(w, table: bool = False) -> Weight:
    """A weight as the interface above, for callers that hold a plain array (a lesson calling the ops
    by hand): a float array is [in, out], or with table=True an embedding table [V, d] (then the LM
    head multiplies by its transpose). Anything else is taken to answer the interface already."""
    if isinstance(w, np.ndarray):
        return Dense(w.T if table else w)
    return w


def label(mats: list, dtype) -> tuple[str, int]:
    """The one rule for a model's `weights` label: the most common format among its blocks' products
    (`model.matrices(head=False)`; its dtype's name if none is quantized), and how many products stay in floats beside
    quantized ones (a GGUF that mixes formats in one stacked product)."""
    kinds = [w.stored_as for w in mats]
    quantized = [k for k in kinds if k not in FLOATS and k != np.dtype(dtype).name]
    if not quantized:
        return np.dtype(dtype).name, 0
    return max(set(quantized), key=quantized.count), len(kinds) - len(quantized)


def check_blocks(widths: dict[str, int], weights: str, where: str) -> None:
    """Quantizing at load needs every product's input width to be whole blocks of 32."""
    if weights in FORMATS:
        bad = [f"{k} {v}" for k, v in widths.items() if v % 32]
        if bad:
            raise WeightsError(f"{where}: {', '.join(bad)} not a multiple of 32, the block of {weights}; "
                               "use --weights float32")
