"""Quantized weights: GGUF's Q8_0, Q4_0 and Q4_1, kept quantized in memory and multiplied there.

A quantized matrix holds R rows of C values (GGUF's layout, as torch's Linear: a linear layer's
weight is [out, in], blocks run along `in`, the dimension the product sums over). Each row is cut
into blocks of 32 values; a block stores one float16 scale d (Q4_1 also a float16 minimum m) and
32 small integers q:

    Q8_0   x = d·q           q int8 in -127..127          34 bytes per 32 values  (8.5 bits each)
    Q4_0   x = d·(q - 8)     q 4 bits in 0..15            18 bytes per 32 values  (4.5 bits)
    Q4_1   x = d·q + m       q 4 bits in 0..15            20 bytes per 32 values  (5 bits)

Q4's 32 values sit in 16 bytes, GGUF's nibble order: byte j holds value j in its low 4 bits and
value j + 16 in its high 4 bits. Quantizing follows ggml's reference (`ggml-quants.c`) as the
`gguf` package implements it in NumPy; the tests check ours against it bit for bit.

In memory the blocks are kept as planes: all the q of a matrix in one array, all the scales in
another (and the minimums in a third). The bytes are exactly GGUF's (`nbytes` counts q, scales and
minimums), only their order differs; `to_gguf_blocks` / `from_gguf_blocks` convert. NumPy can then
widen a run of rows with one call instead of one per block.

The product. NumPy's integer matrix products do not use BLAS, so the integers are widened to
floats first, a tile of rows at a time, into one float32 scratch buffer reused for every tile,
small enough to stay in the CPU's L2 cache (TILE_BYTES): DRAM sees only the quantized bytes, the
widened floats live and die in the cache. Then BLAS multiplies in the cache:

  decode (few rows of x): the scale is applied after the product, per block:
      y[r] = Σ_b d[r,b] · (Σ_j q[r,b,j] · x[b,j])            (Q4_0: q - 8 -> the sum minus 8·Σ_j x[b,j];
                                                                 Q4_1: + m[r,b] · Σ_j x[b,j])
      so widening is one cast per value, and the block sums are one batched product per tile.
  prefill (many rows): the tile is widened to the dequantized values (scale, offset, minimum
      applied: the same float32 values as `dequantize`), then one matrix product for all rows.

The meter is told both: `weights` = the quantized bytes read from memory; `scratch` = the float
traffic in the cache (each widened value written once and read once, the scales likewise); FLOPs
of kind `dequant` = the widening's element operations (see `counts`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..errors import WeightsError

QK = 32                    # values per block, every format here
TILE_BYTES = 1 << 20       # float32 scratch per tile: this machine's L2 (1 MiB per core)
# Measured on GPT-2 small's shapes, Q8_0, one thread, whole decode pass (2-core EPYC, L2 1 MiB,
# L3 32 MiB, under other load): 256 KiB 0.89 ns a weight, 512 KiB 0.73, 1 MiB 0.59, 2 MiB 0.47-0.79,
# 4 MiB 1.11. Small tiles pay NumPy's per-call cost (~10 calls a tile), big ones leave L2.
OUT_TILE = 256            # the fixed-order product (`fixed_matmul`): output rows widened at a time
DECODE_ROWS = 8            # up to this many rows of x: the scale after the product (see above)


COUNTS_KEPT = 64           # rows of x up to which a weight keeps what it told the meter (`kept_counts`)


def kept_counts(counts):
    """A weight's `counts(T, itemsize)`, kept per (T, itemsize) for T up to COUNTS_KEPT rows: a decode
    step asks each weight the same question every step (some 120 products a SmolLM2 step, a few µs
    of arithmetic each); the answer depends on nothing else (a weight's planes never change). The
    same dict is given again: its readers (ops.linear, ops.lm_head) only read it."""
    def kept(self, T: int, itemsize: int = 4) -> dict:
        memo = self.__dict__.get("_counts_kept")
        if memo is None:
            memo = self.__dict__["_counts_kept"] = {}
        key = (counts.__qualname__, T, itemsize)       # a subclass's and its base's apart
        c = memo.get(key)
        if c is None:
            c = counts(self, T, itemsize)
            if T <= COUNTS_KEPT:
                memo[key] = c
        return c
    kept.__doc__, kept.__name__, kept.__qualname__ = counts.__doc__, counts.__name__, counts.__qualname__
    return kept


@dataclass(frozen=True)
class Format:
    name: str              # "q8_0", "q4_0", "q4_1"
    ggml_type: int         # GGMLQuantizationType value
    block_bytes: int       # bytes per block of QK values, scales included
    bits: int              # bits per stored integer
    has_min: bool          # Q4_1's per-block minimum


FORMATS = {
    "q8_0": Format("q8_0", 8, 34, 8, False),
    "q4_0": Format("q4_0", 2, 18, 4, False),
    "q4_1": Format("q4_1", 3, 20, 4, True),
}


def get_format(name: str) -> Format:
    try:
        return FORMATS[name.lower()]
    except KeyError:
        raise WeightsError(f"unknown quantized format {name!r}; choose one of: {', '.join(FORMATS)}") from None


# -- float16 scales to float32, fast ------------------------------------------------------------------
#
# NumPy converts float16 in software here (~3 ns a value: no F16C path on this CPU), slower than all
# the rest of the widening. A float16's bits shifted left by 13 are a float32 with the same
# mantissa and an exponent 112 too small: multiplying by 2^112 fixes it exactly, zeros and
# subnormals included (scales are finite, never inf or NaN). The sign is put back last.

_F16_FIX = np.float32(2.0 ** 112)


def f16_to_f32(h: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float16 array h -> float32, bit-exact for finite values (`out`: a float32 array of h's shape)."""
    if out is None:
        out = np.empty(h.shape, np.float32)
    u = out.view(np.uint32)
    np.copyto(u, h.view(np.uint16), casting="unsafe")
    sign = np.bitwise_and(u, 0x8000, out=_scratch(u.size, np.uint32, "sign").reshape(u.shape))
    np.bitwise_and(u, 0x7FFF, out=u)
    np.left_shift(u, 13, out=u)
    np.multiply(out, _F16_FIX, out=out)
    np.left_shift(sign, 16, out=sign)
    np.bitwise_or(u, sign, out=u)
    return out


# -- quantizing (ggml's reference, in NumPy) --------------------------------------------------------

def _round_away(a: np.ndarray) -> np.ndarray:
    """C's roundf: halves away from zero (np.round rounds halves to even)."""
    return np.sign(a) * np.floor(np.abs(a) + np.float32(0.5))


def _safe_inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def quantize_blocks(blocks: np.ndarray, fmt: Format):
    """blocks [n, 32] float32 -> (q, d, m): q int8 [n, 32] (Q8_0) or uint8 [n, 16] packed nibbles
    (Q4), d float16 [n], m float16 [n] or None."""
    if fmt.name == "q8_0":
        d = np.abs(blocks).max(axis=1) / np.float32(127)                       # [n]
        q = _round_away(blocks * _safe_inverse(d)[:, None]).astype(np.int8)     # [n, 32]
        return q, d.astype(np.float16), None
    if fmt.name == "q4_0":
        imax = np.abs(blocks).argmax(axis=1)[:, None]
        d = np.take_along_axis(blocks, imax, axis=1)[:, 0] / np.float32(-8)    # [n] signed
        q = np.trunc(blocks * _safe_inverse(d)[:, None] + np.float32(8.5))
        m = None
    else:
        lo, hi = blocks.min(axis=1), blocks.max(axis=1)
        d = (hi - lo) / np.float32(15)
        q = np.trunc((blocks - lo[:, None]) * _safe_inverse(d)[:, None] + np.float32(0.5))
        m = lo.astype(np.float16)
    q = q.astype(np.uint8).clip(0, 15)                                          # [n, 32]
    packed = q[:, :16] | (q[:, 16:] << np.uint8(4))                             # [n, 16]
    return packed, d.astype(np.float16), m


def check_planes(fmt: Format, q: np.ndarray, d: np.ndarray, m: np.ndarray | None) -> None:
    """A quantized matrix's planes agree (q [R, C] int8 for Q8_0 or [R, C/2] uint8 for Q4, float16
    scales [R, C/32], Q4_1's minimums beside them) and every scale and minimum is finite: a NaN or
    infinite float16 reads as 98304 or 65536 to the fused kernel's bit conversion (and to
    `f16_to_f32`), a wrong value rather than NaN. One WeightsError line otherwise, once, when the
    matrix is made (the loaders refuse such files before; this catches a matrix made by hand)."""
    per_block, want_q = (QK, np.int8) if fmt.bits == 8 else (QK // 2, np.uint8)
    ok = getattr(d, "ndim", 0) == 2 and d.dtype == np.float16 and getattr(q, "dtype", None) == want_q
    if ok:
        R, nb = d.shape
        ok = q.shape == (R, nb * per_block) and ((m is None) != fmt.has_min) and \
            (m is None or (m.shape == d.shape and m.dtype == np.float16))
    if not ok:
        raise WeightsError(f"a {fmt.name} matrix needs q {want_q.__name__} [R, C/{QK // per_block}], float16 scales "
                           f"[R, C/{QK}]{' and minimums of their shape' if fmt.has_min else ''}; got q "
                           f"{getattr(q, 'shape', q)} {getattr(q, 'dtype', '')}, d {getattr(d, 'shape', d)} "
                           f"{getattr(d, 'dtype', '')}, m {None if m is None else m.shape}")
    for plane, name in ((d, "scales"), (m, "minimums")):
        if plane is not None and not np.isfinite(plane).all():
            bad = int(np.count_nonzero(~np.isfinite(plane)))
            raise WeightsError(f"a {fmt.name} matrix's {name} hold {bad:,} NaN or infinite value"
                               f"{'s' if bad > 1 else ''}; the weights are damaged")


def kept_once(w) -> None:
    """A kernel set's quantized weight w, whose `planes` (q, d[, m] in GGUF's order) may be copies of
    its q, d and m (put on 64-byte boundaries: kernels/aligned.py): q, d and m become views of the
    planes, so that the weight holds its bytes once."""
    p = w.planes
    w.q = p[0]
    w.d = p[1].view(w.d.dtype)
    if w.m is not None:
        w.m = p[2].view(w.m.dtype)


class QuantMatrix:
    """R rows of C values, quantized in blocks of 32 along each row, kept quantized in memory.

    q: int8 [R, C] (Q8_0) or uint8 [R, C/2] (Q4, packed as GGUF); d: float16 [R, C/32] scales;
    m: float16 [R, C/32] minimums (Q4_1) or None. A linear layer's weight is its [out, in] matrix.
    """

    def __init__(self, fmt: Format | str, q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None):
        self.fmt = get_format(fmt) if isinstance(fmt, str) else fmt
        check_planes(self.fmt, q, d, m)
        self.q, self.d, self.m = q, d, m
        R, nb = d.shape
        self.shape = (R, nb * QK)
        self._x_order = None

    # -- what it is ---------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes in memory: the integers, the scales and the minimums (GGUF's bytes exactly; float16
        scales and minimums, one a block)."""
        return self.size * self.fmt.bits // 8 + self.size // QK * 2 * (2 if self.fmt.has_min else 1)

    ndim = 2
    dtype = np.dtype(np.float32)      # what it computes in by default
    @classmethod
    def of(cls, w: "QuantMatrix") -> "QuantMatrix":
        """w's planes (no copy where they are contiguous already) as this class: a kernel set's own
        quantized weight (models/fused.py's FusedQuant, models/int8.py's Int8Quant)."""
        return cls(w.fmt, np.ascontiguousarray(w.q), np.ascontiguousarray(w.d),
                   None if w.m is None else np.ascontiguousarray(w.m))

    n_in = property(lambda self: self.shape[1])     # the weight interface (models/weights.py):
    n_out = property(lambda self: self.shape[0])    # y [T, R] = x [T, C] times these rows

    def __repr__(self) -> str:
        return f"QuantMatrix({self.fmt.name}, {self.shape[0]}x{self.shape[1]}, {self.nbytes:,} bytes)"

    @property
    def stored_as(self) -> str:
        """Its format's name (the weight interface: what a model's `weights` label counts)."""
        return self.fmt.name

    def stored(self, rows: bool = False) -> "QuantMatrix":
        """As a checkpoint holds it: itself ([out, in] rows of blocks, as GGUF keeps them)."""
        return self

    # -- building ----------------------------------------------------------------------------------

    @classmethod
    def quantize(cls, w: np.ndarray, fmt: Format | str) -> "QuantMatrix":
        """w [R, C] float (C a multiple of 32) -> its quantized rows."""
        fmt = get_format(fmt) if isinstance(fmt, str) else fmt
        w = np.asarray(w)
        if w.ndim != 2 or w.shape[1] % QK:
            raise WeightsError(f"cannot quantize a {w.shape} tensor to {fmt.name}: rows must be a multiple of {QK} long")
        R, C = w.shape
        q, d, m = quantize_blocks(w.astype(np.float32).reshape(-1, QK), fmt)
        nb = C // QK
        return cls(fmt, q.reshape(R, -1), d.reshape(R, nb), None if m is None else m.reshape(R, nb))

    @classmethod
    def from_gguf_blocks(cls, raw: np.ndarray, fmt: Format | str, shape: tuple[int, int]) -> "QuantMatrix":
        """GGUF's bytes (uint8, R·C/32 blocks of fmt.block_bytes) -> planes. Copies once."""
        fmt = get_format(fmt) if isinstance(fmt, str) else fmt
        R, C = shape
        blocks = np.asarray(raw, dtype=np.uint8).reshape(R, C // QK, fmt.block_bytes)
        d = np.ascontiguousarray(blocks[..., 0:2]).view(np.float16)[..., 0]
        if fmt.has_min:
            m = np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0]
            q = blocks[..., 4:]
        else:
            m, q = None, blocks[..., 2:]
        q = np.ascontiguousarray(q).reshape(R, -1)
        if fmt.name == "q8_0":
            q = q.view(np.int8)
        return cls(fmt, q, d, m)

    @classmethod
    def stack(cls, mats: list["QuantMatrix"]) -> "QuantMatrix":
        """Several matrices of one format and width, their rows one after another (q|k|v fused)."""
        fmt = mats[0].fmt
        if any(w.fmt != fmt or w.shape[1] != mats[0].shape[1] for w in mats):
            raise WeightsError("cannot fuse quantized matrices of different formats or widths: "
                               + ", ".join(f"{w.fmt.name} {w.shape[0]}x{w.shape[1]}" for w in mats))
        cat = lambda planes: np.concatenate(planes, axis=0)
        return cls(fmt, cat([w.q for w in mats]), cat([w.d for w in mats]),
                   None if mats[0].m is None else cat([w.m for w in mats]))

    def take_rows(self, order: np.ndarray) -> "QuantMatrix":
        """The rows in another order (a row keeps its blocks whole: reordering costs no rounding)."""
        return QuantMatrix(self.fmt, self.q_rows(order), *self.scale_rows(order))

    def q_rows(self, rows) -> np.ndarray:
        """Rows `rows` (indices or a slice) of q, in GGUF's order (a subclass that lays q out its own
        way, models/int8.py's, gathers them)."""
        return self.q[rows]

    def scale_rows(self, rows) -> tuple:
        """(d, m) of rows `rows` (m None where the format has none), as q_rows gives q."""
        return self.d[rows], None if self.m is None else self.m[rows]

    def to_gguf_blocks(self) -> np.ndarray:
        """The planes back as GGUF's bytes: uint8 [R, C/32 · block_bytes]."""
        R, C = self.shape
        nb = C // QK
        parts = [self.d.reshape(R, nb, 1).view(np.uint8)]
        if self.m is not None:
            parts.append(self.m.reshape(R, nb, 1).view(np.uint8))
        parts.append(self.q_rows(slice(None)).view(np.uint8).reshape(R, nb, -1))
        return np.concatenate(parts, axis=2).reshape(R, -1)

    # -- values ------------------------------------------------------------------------------------

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """All rows as floats [R, C], the values GGUF's dequantization gives."""
        return self.rows(np.arange(self.shape[0]), dtype)

    def rows(self, ids: np.ndarray, dtype=None) -> np.ndarray:
        """Rows `ids` dequantized [N, C], in dtype (default float32): an embedding lookup, reading
        only those rows' blocks."""
        n = len(ids)
        out = np.empty((n, self.shape[1]), dtype or np.float32)
        d, m = self.scale_rows(ids)
        self._widen(self.q_rows(ids), f16_to_f32(d), None if m is None else f16_to_f32(m), out, scaled=True)
        return out

    def _widen(self, q: np.ndarray, d: np.ndarray | None, m: np.ndarray | None, out: np.ndarray,
               scaled: bool) -> np.ndarray:
        """q of n rows -> out [n, C] floats: the integers as they are (scaled=False: Q8_0's q, Q4's
        nibbles 0..15, in GGUF's order) or dequantized (d·q, d·(q-8), d·q + m)."""
        n, C = out.shape
        nb = C // QK
        if self.fmt.bits == 8:
            np.copyto(out, q, casting="unsafe")
        else:                                                     # 16 bytes -> 32 values per block
            o = out.reshape(n, nb, 2, 16)
            qb = q.reshape(n, nb, 16)
            np.bitwise_and(qb, 15, out=o[:, :, 0], casting="unsafe")
            np.right_shift(qb, 4, out=o[:, :, 1], casting="unsafe")
        if scaled:
            o = out.reshape(n, nb, QK)
            if self.fmt.name == "q4_0":
                o -= 8
            o *= d[:, :, None]
            if m is not None:
                o += m[:, :, None]
        return out

    # -- the product -------------------------------------------------------------------------------
    #
    # The scratch holds a tile's integers as floats in "product order": Q8_0's in GGUF's order; Q4's
    # as two planes, every low nibble of the row, then every high nibble (each plane one contiguous
    # cast: writing 16 values here, 16 there, per block, measured 5x slower). The columns of x are
    # put in the same order once per call: the product is the same sum.

    def _order(self) -> np.ndarray | None:
        """Scratch column k holds the row's value number order[k] (None: the identity)."""
        if self.fmt.bits == 8:
            return None
        if self._x_order is None:
            C = self.shape[1]
            j = np.arange(16)
            self._x_order = np.concatenate([b * QK + h * 16 + j for h in (0, 1) for b in range(C // QK)])
        return self._x_order

    def _widen_raw(self, q: np.ndarray, out: np.ndarray) -> np.ndarray:
        """q of n rows -> out [n, C]: the stored integers as floats, in product order."""
        if self.fmt.bits == 8:
            np.copyto(out, q, casting="unsafe")
            return out
        half = out.shape[1] // 2
        nib = _scratch(q.size, np.uint8, "nibbles").reshape(q.shape)     # [n, C/2] bytes
        np.bitwise_and(q, 15, out=nib)
        np.copyto(out[:, :half], nib, casting="unsafe")                    # low nibbles
        np.right_shift(q, 4, out=nib)
        np.copyto(out[:, half:], nib, casting="unsafe")                    # high nibbles
        return out

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x [T, C] @ this^T -> [T, R]: the quantized bytes read once, widened a tile at a time."""
        R, C = self.shape
        if x.ndim != 2 or x.shape[1] != C:
            raise ValueError(f"quantized product: x {x.shape} against a [{R}, {C}] matrix: x needs {C} columns")
        T = x.shape[0]
        nb = C // QK
        dt = x.dtype
        rows = max(1, min(R, TILE_BYTES // (C * dt.itemsize)))
        scratch = _scratch(rows * C, dt).reshape(rows, C)          # [rows, C], reused for every tile
        y = np.empty((T, R), dt)
        d = f16_to_f32(self.d, _scratch(self.d.size, np.float32, "scales").reshape(self.d.shape))  # [R, nb]
        m = None if self.m is None else f16_to_f32(self.m, _scratch(self.m.size, np.float32, "mins").reshape(self.m.shape))
        if dt != np.float32:
            d = d.astype(dt)
            m = None if m is None else m.astype(dt)
        order = self._order()
        xo = x if order is None else x[:, order]                   # [T, C] in product order
        h = 1 if order is None else 2                              # groups per block: Q4's two planes
        gs = QK // h                                               # values per group
        if T <= DECODE_ROWS:
            xg = np.ascontiguousarray(xo.T).reshape(h * nb, gs, T)             # [groups, gs, T]
            xsum = xg.reshape(h, nb, gs, T).sum(axis=(0, 2)) if self.fmt.bits == 4 else None   # [nb, T]
            for r0 in range(0, R, rows):
                r1 = min(R, r0 + rows)
                n = r1 - r0
                w = self._widen_raw(self.q_rows(slice(r0, r1)), scratch[:n])                      # [n, C]
                p = np.matmul(w.reshape(n, h * nb, gs).transpose(1, 0, 2), xg)       # [groups, n, T]
                if h == 2:
                    p = np.add(p[:nb], p[nb:], out=p[:nb])                           # [nb, n, T] block sums
                if self.fmt.name == "q4_0":
                    p -= 8 * xsum[:, None, :]
                y[:, r0:r1] = np.einsum("bnt,nb->tn", p, d[r0:r1])                   # [T, n]
                if m is not None:
                    y[:, r0:r1] += (m[r0:r1] @ xsum).T
            return y
        for r0 in range(0, R, rows):
            r1 = min(R, r0 + rows)
            n = r1 - r0
            w = self._widen_raw(self.q_rows(slice(r0, r1)), scratch[:n])                          # [n, C]
            w4 = w.reshape(n, h, nb, gs)
            if self.fmt.name == "q4_0":
                w4 -= 8
            w4 *= d[r0:r1, None, :, None]
            if m is not None:
                w4 += m[r0:r1, None, :, None]
            np.matmul(xo, w.T, out=y[:, r0:r1])
        return y

    @kept_counts
    def counts(self, T: int, itemsize: int = 4) -> dict:
        """What `matmul` on T rows tells the meter (besides the product's 2·T·R·C FLOPs):
        weights = nbytes; scratch = each widened value and each widened scale (and minimum) written
        once and read once; dequant = element operations: per value 1 cast (Q4: + 1 mask or
        shift), per scale or minimum 7 (f16_to_f32), and then decode: per block and row of x 2
        (the scale's multiply-add; Q4_0: + 2 for the -8·Σx, Q4_1: + 2 for m·Σx), or prefill: per
        value 1 for the scale (Q4_0: + 1 for the -8, Q4_1: + 1 for the minimum)."""
        R, C = self.shape
        nb = C // QK
        n_s = 2 if self.fmt.has_min else 1
        per_value = 1 if self.fmt.bits == 8 else 2
        ops = R * C * per_value + 7 * n_s * R * nb
        if T <= DECODE_ROWS:
            ops += 2 * T * R * nb * (1 if self.fmt.name == "q8_0" else 2)
        else:
            ops += R * C * (1 if self.fmt.name == "q8_0" else 2)
        return {"weights": self.nbytes, "scratch": 2 * itemsize * (R * C + n_s * R * nb), "dequant": ops}

    def fixed_matmul(self, x: np.ndarray) -> np.ndarray:
        """`matmul`'s values, each output summed over the input in index order (the batch-invariant
        kernels): OUT_TILE rows at a time widened as `rows` does, laid out [in, n]."""
        from ..kernels import batch_invariant
        x = np.ascontiguousarray(x)
        y = np.empty((x.shape[0], self.n_out), x.dtype)
        for r0 in range(0, self.n_out, OUT_TILE):
            r1 = min(self.n_out, r0 + OUT_TILE)
            tile = np.ascontiguousarray(self.rows(np.arange(r0, r1), x.dtype).T)      # [in, n]
            y[:, r0:r1] = batch_invariant.matmul(x, tile)
        return y

    def rows_counts(self, N: int) -> dict:
        """What `rows` on N rows reads and does: their blocks' bytes; per value the cast (Q4: + mask
        or shift) and the scale (Q4: + offset or minimum), per scale or minimum 7."""
        R, C = self.shape
        nb = C // QK
        n_s = 2 if self.fmt.has_min else 1
        per_value = 2 if self.fmt.bits == 8 else 4
        return {"weights": N * nb * self.fmt.block_bytes, "dequant": N * (C * per_value + 7 * n_s * nb)}


_SCRATCH: dict = {}


def _scratch(n: int, dtype, what: str = "tile") -> np.ndarray:
    """One reused buffer per purpose, dtype and thread: a tile never costs an allocation."""
    key = (what, np.dtype(dtype).str, threading.get_ident())
    buf = _SCRATCH.get(key)
    if buf is None or buf.size < n:
        buf = _SCRATCH[key] = np.empty(n, dtype)
    return buf[:n]

