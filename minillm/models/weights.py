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

Two implementations, both NumPy:
    Dense        a float array kept [in, out] for BLAS (its `matmul` shapes the product, below)
    QuantMatrix  [out, in] rows of GGUF blocks, widened by NumPy a tile at a time (models/quant.py)
and one on a device (`make_weight(..., device=)`, backend.py):
    DeviceDense  a Dense whose array lives on the device (CuPy on a GPU): the plain product `x @ a`
Fused CPU kernels and GPU arrays are further classes answering the same calls; a model's
constructor makes every weight through `make_weight`, so that choice is made in one place.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .. import backend
from ..errors import WeightsError
from .quant import FORMATS, QuantMatrix


class Weight(Protocol):
    n_in: int
    n_out: int
    nbytes: int

    def matmul(self, x: np.ndarray) -> np.ndarray: ...
    def rows(self, ids: np.ndarray, dtype=None) -> np.ndarray: ...
    def counts(self, T: int, itemsize: int = 4) -> dict: ...
    def rows_counts(self, N: int) -> dict: ...


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

    def matmul(self, x: np.ndarray) -> np.ndarray:
        return matmul(x, self.a)                    # [T, out]

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


def to_device(w, device: backend.Device) -> Weight:
    """A weight made on the host, moved once onto `device`. Quantized weights stay on the CPU: NumPy
    widens their blocks there, and no GPU kernel for them is written yet."""
    if not isinstance(w, Dense):
        raise backend.DeviceError(f"{w.fmt.name} weights run on the CPU only; on --device {device.name} use "
                                  "--weights float32 (float16 on a GPU: the default there)")
    return DeviceDense(device.asarray(w.a))


def fused_on_device(parts: list, rows: bool, dtype, xp):
    """Device arrays (random weights drawn on a GPU) fused as make_weight fuses host ones: [in, out]."""
    floats = [p.T if rows else p for p in parts]                                  # [in, out] each
    a = xp.concatenate([f.T for f in floats], axis=0).T if len(floats) > 1 else floats[0]
    return xp.ascontiguousarray(a, dtype=dtype)


def on_device(a, device: backend.Device | None):
    """A model's other arrays (norms, biases, position tables) on its device: a, or a copy there."""
    return a if device is None or device.xp is np else device.asarray(a)


FLOATS = ("float32", "float64")   # weights= values that keep (or widen to) floats in the model's dtype


def check_weights(weights: str) -> str:
    """`weights=` as one of the values a model takes: "float32" or "float64" (floats, in the model's
    dtype: a model's own `weights` label passed back gives the same kind of model), "native" (a
    GGUF's Q8_0 / Q4_0 / Q4_1 blocks kept as the file has them), or a format to quantize to at load
    ("q8_0", "q4_0", "q4_1")."""
    w = str(weights).lower()
    if w not in (*FLOATS, "native", *FORMATS):
        raise WeightsError(f"weights={weights!r}: choose one of float32, native, {', '.join(FORMATS)}")
    return w


def make_weight(w, weights: str = "float32", dtype=np.float32, *, rows: bool = False,
                contiguous: bool = True, device: backend.Device | None = None, kernels: str = "numpy") -> Weight:
    """The one place a model's product weights are made (the fused CPU kernels and the GPU
    arrays are chosen here).

    w: a float array [in, out] (a view is fine; with rows=True its [out, in] rows: a torch Linear's
    weight, or an embedding table [V, d], the tied LM head), a `QuantMatrix` ([out, in] rows of
    blocks, as a GGUF stores them), or a list of them fused (outputs one after another: q|k|v, gate|up).
    weights: "float32" widens quantized parts to floats in `dtype`; "native" keeps a file's blocks
    when every part has the same format (a product that mixes formats is widened); "q8_0" / "q4_0" /
    "q4_1" keeps parts already in that format and quantizes the others' floats to it.
    contiguous: a float weight is copied contiguous (the layout BLAS streams); False keeps a view,
    for an embedding table that is only gathered from.
    device: where the weight lives (backend.Device); None or the CPU: NumPy. Another device gets
    the host weight moved once (`to_device`: floats only).
    kernels: "numpy" (the reference: Dense, QuantMatrix) or "fused" (minillm/kernels/: the same
    weight multiplied by numba kernels that read it once; float32 on the CPU only; see `fused_weight`).
    """
    if kernels == "fused" and np.dtype(dtype) == np.float32 and contiguous and (device is None or device.xp is np):
        return fused_weight(make_weight(w, weights, dtype, rows=rows, contiguous=False))
    parts = w if isinstance(w, list) else [w]
    if device is not None and device.xp is not np:
        if all(not isinstance(p, (np.ndarray, QuantMatrix)) for p in parts):   # on the device already (drawn there)
            return DeviceDense(fused_on_device(parts, rows, dtype, device.xp))
        return to_device(make_weight(w, weights, dtype, rows=rows, contiguous=contiguous), device)
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


KERNELS = ("numpy", "fused")


def fused_weight(w):
    """NumPy's weight -> its fused implementation (minillm/kernels/, numba): a QuantMatrix's planes
    as they are (FusedQuant), a float32 Dense as its [out, in] rows (FusedDense: a torch or GGUF
    checkpoint's rows kept without a copy, GPT-2's [in, out] copied transposed once, at load)."""
    from ..kernels import fuse
    return fuse(w.a.T, transposed=True) if isinstance(w, Dense) else fuse(w)


def check_kernels(kernels: str) -> str:
    """`kernels=` as one of KERNELS (one clear line otherwise)."""
    k = str(kernels).lower()
    if k not in KERNELS:
        raise WeightsError(f"kernels={kernels!r}: choose numpy (the reference) or fused (numba)")
    return k


def stored(w, rows: bool = False):
    """A weight as a checkpoint holds it: a float weight's array ([in, out], or with rows=True its
    [out, in] rows: a view, no copy), a quantized one as it is."""
    if isinstance(w, Dense) or hasattr(w, "wt"):     # Dense (on a device too), the fused kernels' FusedDense
        return w.a.T if rows else w.a
    return w


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
    quantized ones (a GGUF that mixes formats in one fused product)."""
    kinds = [w.fmt.name if isinstance(w, QuantMatrix) else np.dtype(dtype).name for w in mats]
    quantized = [k for k in kinds if k != np.dtype(dtype).name]
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
