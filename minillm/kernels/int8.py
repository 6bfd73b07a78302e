"""Integer products, the way llama.cpp multiplies: W4A8 (and W8A8) instead of W4A32.

The fused float kernels widen every weight to float32 and multiply floats. Here the activations are
rounded too, once per product, per block of 32 values to int8 with one float32 scale, and each
block's 32 products are summed in integers (one VNNI instruction does 64 such multiply-adds); floats
appear once per block, to scale the block's integer sum. Bytes read are the same as W4A32's (the
weights' blocks); the arithmetic per weight is an 8-bit multiply-add instead of a widen, a scale and
a float multiply-add.

This is a different computation from the float product, so it has its own exact reference, here in
NumPy, and each kernel equals it bit for bit. For x [T, C] and one weight row w [C] (C = 32·nb):

  1. Activations, per row t and block b of 32 values (`quantize_x`):
         d_x = max|x| / 127            (float32)
         q_x = clip(rint(x / d_x), -127, 127)   (rint: halves to even; q_x = 0 where d_x = 0)
         s_x = Σ q_x  (int32),   m_x = d_x · float(s_x)
     A block holding inf or NaN gets d_x = NaN and q_x = 0: its rows' outputs are NaN.
  2. Weights, as stored (models/quant.py's planes): Q8_0 q in -128..127; Q4_0 n - 8 and Q4_1 n,
     n the nibble 0..15; d_w (and Q4_1's m_w) float16, taken to float32 exactly.
  3. Per block, in integers (exact: |I_b| < 2^20):   I_b = Σ_k w_k · q_x,k
  4. Per block, in float32, each operation rounded as written, no fused multiply-add:
         Q8_0, Q4_0:  P_b = (d_w · d_x) · float(I_b)
         Q4_1:        P_b = ((d_w · d_x) · float(I_b)) + (m_w · m_x)
  5. Each row adds its blocks in order, from +0.0:  y = ((0 + P_0) + P_1) + ... + P_{nb-1}.

Integer sums are exact in any order, so every instruction set gives the same I_b and the float
steps are the same operations in the same order: the answer does not depend on the CPU. Nor does a
row's result depend on the other rows in the product (each row of x has its own scales; nothing is
shared across rows), so a batch computes each row bit for bit as it would alone: the integer
products are batch-invariant by construction, without the fixed-order float kernels the
batch-invariant mode uses. (A model's step is more than its products: a prefill cut into other
pieces attends, and a hybrid's linear layers chunk their delta rule, in another order: README.)

Which instructions do step 3 is chosen once from the CPU's features (`isa()`): VNNI's vpdpbusd
(512- or 256-bit), AVX2's vpmaddubsw + vpmaddwd, or LLVM's portable vectors; see _int8.py, which
also has the forms' measured speeds.

The cost in accuracy, measured (benchmarks/int8_error.py, held-out Shakespeare; float activations
against int8 ones on the same weights, the int8 kernel set): the bundled model, all 33,802 held-out
tokens, perplexity Q8_0 130.417 -> 130.436 (+0.01%), Q4_0 130.908 -> 130.916 (+0.006%), float32
130.422; SmolLM2-135M, 4,095 tokens, its native Q4_1 34.903 -> 34.926 (+0.07%; float32, the same
blocks widened, 34.903), requantized Q8_0 34.870 -> 34.918 (+0.14%); the largest logit moved by the
rounding of x 2.2 (SmolLM2 Q4_1) to 3.0 (its Q8_0), the same top-1 at 96-99% of positions, SmolLM2's
256 greedy tokens with its own Q4_1 all float32's. The bound this project holds the integer set to: held-out perplexity
within 0.5% of the same weights' with float activations (`ERROR_BOUND`).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import MiniLLMError
from .aligned import aligned_zeros
from .cpu import cpu_features, target_features  # noqa: F401 (public here too)

ERROR_BOUND = 0.005      # relative perplexity, W·A8 against W·A32 on the same weights (measured above)
QK = 32                  # values per block (models/quant.py's)
GROUP = 16                       # rows per group: the kernels' lanes (a row a lane)
ENV = "MINILLM_INT8_ISA"         # pin the instruction set (one the CPU has): tests, measurements
ISA_WORDS = {
    "avx512-vnni": "AVX512-VNNI vpdpbusd, 512-bit",
    "avx-vnni": "VNNI vpdpbusd, 256-bit",
    "avx2": "AVX2 vpmaddubsw + vpmaddwd",
    "generic": "portable vectors (LLVM)",
}


class Int8Error(MiniLLMError, ValueError):
    """The integer kernels cannot run as asked (an instruction set this CPU lacks, a bad shape): a
    ValueError too, the class the other kernels' checks (kernels/checks.py) raise."""


# -- the instruction set ------------------------------------------------------------------------------

def supported(features: frozenset | None = None) -> tuple[str, ...]:
    """The instruction sets the integer dot can run on here, fastest first (measured: _int8.py)."""
    f = cpu_features() if features is None else features
    out = []
    if {"avx512vnni", "avx512bw", "avx512vl", "avx512f"} <= f:
        out.append("avx512-vnni")
    if "avxvnni" in f or {"avx512vnni", "avx512vl"} <= f:
        out.append("avx-vnni")
    if "avx2" in f:
        out.append("avx2")
    out.append("generic")
    return tuple(out)


def isa() -> str:
    """The instruction set the integer kernels use here: MINILLM_INT8_ISA if set (refused if this CPU
    lacks it: the instruction would crash the process), else the first of `supported()`."""
    want = os.environ.get(ENV, "").strip().lower()
    have = supported()
    if want:
        if want not in ISA_WORDS:
            raise Int8Error(f"{ENV}={want} is not an instruction set; choose one of {', '.join(ISA_WORDS)}")
        if want not in have:
            raise Int8Error(f"{ENV}={want}: this CPU (or numba's target) lacks it; it has {', '.join(have)}")
        return want
    return have[0]


def describe(name: str | None = None) -> str:
    """One line for the step header and `minillm hardware`: 'int8 dot: AVX512-VNNI vpdpbusd, 512-bit'."""
    name = name or isa()
    return f"int8 dot: {ISA_WORDS[name]}"


_NO_MIN = np.empty((0, 0), np.uint16)   # Q4_0 has no minimums: the kernel's m is empty
_NO_MIN_LANES = np.empty((0, GROUP), np.uint16)   # ... in lane order


# -- the reference (NumPy) ----------------------------------------------------------------------------

def quantize_x_ref(x: np.ndarray) -> tuple:
    """Step 1 in NumPy: x [T, C] float32 -> (q int8 [T, nb, 32], d float32 [T, nb], s int32 [T, nb],
    m float32 [T, nb])."""
    x = np.asarray(x, np.float32)
    T, C = x.shape
    xb = x.reshape(T, C // QK, QK)
    bad = ~np.isfinite(xb).all(axis=2)                                          # [T, nb]
    amax = np.where(bad, np.float32(0), np.abs(np.where(np.isfinite(xb), xb, 0)).max(axis=2, initial=0))
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        qf = np.clip(np.rint(xb / d[..., None]), -127, 127)
    q = np.where((d > 0)[..., None], qf, 0).astype(np.int8)
    d = np.where(bad, np.float32(np.nan), d).astype(np.float32)
    s = q.astype(np.int32).sum(axis=2, dtype=np.int32)
    return q, d, s, (d * s.astype(np.float32)).astype(np.float32)


def planes(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> tuple:
    """A quantized matrix's planes as these kernels take them (kernels/products.py's too): q (int8
    [R, C]: Q8_0; uint8 [R, C/2]: Q4's nibbles in GGUF's order), C-contiguous, then the scales (and
    Q4_1's minimums; for Q4_0 an empty array) as float16 bits, uint16 [R, C/32], checked to agree
    (`check_planes`). The kernels read them in lane order (`lane_order`, a copy on 64-byte boundaries)."""
    d = np.ascontiguousarray(np.asarray(d).view(np.uint16))
    q = np.ascontiguousarray(q)
    if q.dtype == np.int8:
        return check_planes((q, d))
    return check_planes((q, d, _NO_MIN if m is None else np.ascontiguousarray(np.asarray(m).view(np.uint16))))


def check_planes(p: tuple) -> tuple:
    """p as the kernels read it, or a ValueError in one line: kernels/checks.py's agreement of shapes
    and dtypes (q int8 [R, 32·nb] with d uint16 [R, nb]; or q uint8 [R, 16·nb], d and m uint16
    [R, nb], m [0, 0] for Q4_0; or planes in lane order, as `lane_order` makes them, which carry
    their weight's shape), at least one block a row, and each plane C-contiguous (the kernels read
    them by flat offsets: a strided plane would be read as if it were not)."""
    from . import checks
    if len(p) in (2, 3) and getattr(p[0], "ndim", 0) == 1:    # in lane order: the shape they carry
        R, C = _shape(p)
        nb = C // QK
        kind, dt, bb = ("Q8_0 values", np.int8, QK) if len(p) == 2 else ("Q4 nibbles", np.uint8, QK // 2)
        G = groups(R, nb)
        want_m = (G, GROUP) if len(p) == 3 and p[2].shape[0] else (0, GROUP)
        if p[0].dtype != dt or p[0].shape != (G * GROUP * bb,) or p[1].dtype != np.uint16 \
                or p[1].shape != (G, GROUP) or (len(p) == 3 and (p[2].dtype != np.uint16 or p[2].shape != want_m)):
            raise Int8Error(f"integer product: {kind} in lane order {p[0].shape} {p[0].dtype}, scales "
                            f"{p[1].shape} do not match a [{R}, {C}] weight ({dt.__name__} [{G * GROUP * bb}], "
                            f"uint16 [{G}, {GROUP}]: lane_order makes them)")
    else:
        p = checks.planes(tuple(p))
    if _shape(p)[1] == 0:
        raise Int8Error(f"integer product: a weight of {_shape(p)[0]} rows of no values; rows need whole "
                        f"blocks of {QK} values")
    if not all(a.flags.c_contiguous for a in p):
        raise Int8Error("integer product: the planes must be C-contiguous (make them with int8.planes)")
    return p


def _shape(p: tuple) -> tuple[int, int]:
    """(R, C) of a weight's planes (in GGUF's order, or in lane order: the shape they carry)."""
    if p[0].ndim == 1:
        shape = getattr(p, "shape", None)
        if shape is None:
            raise Int8Error("integer product: planes in lane order carry their weight's shape; make them "
                            "with int8.lane_order")
        return shape
    R, nb = p[1].shape
    return R, nb * QK


class LanePlanes(tuple):
    """A weight's planes in lane order, with the shape [R, C] of the weight they hold (lane order pads
    R to whole groups of 16 rows, so the arrays alone do not say it)."""
    shape: tuple


def lane_planes(arrays, shape: tuple) -> LanePlanes:
    """Arrays in lane order (q, d[, m]) as a weight of `shape` [R, C]'s planes (unchecked)."""
    out = LanePlanes(arrays)
    out.shape = tuple(shape)
    return out


# -- in lane order -------------------------------------------------------------------------------------
#
# The kernels read a weight 16 rows at a time, a row a lane (_int8.py): a group is 16 rows' block j,
# and vector k holds in its lane L the 4 bytes k of row L's block (Q8_0: 8 vectors, the block's 32
# values; Q4: 4, its 16 bytes of nibbles), so that eight dot instructions leave each row's block sum
# in its own lane, and a row's blocks add up in its lane, with no sum across lanes at the end. GGUF
# stores a row's blocks one after another; the weight is laid out in the kernels' order once, when it
# is made. Lane order: rows padded with zeros to a multiple of 16, cut in bands of 16 rows; band c's
# block j is group g = c·nb + j, whose 16·bb bytes (bb a block's bytes: 32 for Q8_0, 16 for Q4) hold
# byte i of row 16c + L's block at 64·(i // 4) + 4·L + i % 4 (a 1-D array, int8 for Q8_0, uint8 for
# Q4); the scales (and Q4_1's minimums) likewise, uint16 [groups, 16], row 16c + L's block j at
# [g, L]. The rows' x is then the same for every lane: each 4 bytes of x's block j go to all 16 lanes.
# Measured against the order before (a group was 16 consecutive blocks in storage order, across row
# ends: each row then ended in a sum across lanes, and a group could hold two rows' lanes): below,
# _int8.py.

def groups(R: int, nb: int) -> int:
    """Groups in a weight of R rows of nb blocks: 16 rows' block j each (the rows padded to 16)."""
    return -(-R // GROUP) * nb


def row_ids(R: int, rows) -> np.ndarray:
    """Rows `rows` (a slice, or indices counted from the end where negative) of an R-row weight as
    int64 [n] in 0..R-1; an index past either end is an IndexError. (No arange(R) for a few ids: an
    embedding looks up a step's tokens in a 49,152-row weight.)"""
    if isinstance(rows, slice):
        return np.arange(*rows.indices(R))
    r = np.asarray(rows)
    if r.dtype.kind not in "iu":                                # a mask, say: NumPy's own meaning (or error)
        return np.arange(R)[rows]
    r = r.astype(np.int64).reshape(-1)
    if r.size and (r.max() >= R or r.min() < -R):
        raise IndexError(f"row {r.max() if r.max() >= R else r.min()} of a weight of {R} rows")
    return np.where(r < 0, r + R, r)


def _group_of(R: int, nb: int, rows) -> tuple[np.ndarray, np.ndarray]:
    """([n, nb] group of each block of rows `rows`, [n, 1] its lane)."""
    r = row_ids(R, rows)                                                     # [n]
    g = (r // GROUP * nb)[:, None] + np.arange(nb)[None, :]                   # [n, nb]
    return g, (r % GROUP)[:, None]


def _lane_index(R: int, nb: int, bb: int, rows=slice(None)) -> np.ndarray:
    """[n, bb·nb] positions in lane order of the GGUF-order bytes of rows `rows` of an R x nb-block
    weight of bb bytes a block (the inverse of laying it out)."""
    g, lane = _group_of(R, nb, rows)
    i = np.arange(bb)                                                        # byte of a block
    pos = (g * GROUP * bb + lane * 4)[..., None] + (64 * (i // 4) + i % 4)   # [n, nb, bb]
    return pos.reshape(g.shape[0], bb * nb)


def _scales_in_lanes(a: np.ndarray, R: int, nb: int) -> np.ndarray:
    """Scales (or minimums) uint16 [R, nb] -> [groups, 16] in lane order, on a 64-byte boundary."""
    out = aligned_zeros((groups(R, nb), GROUP), np.uint16)
    g, lane = _group_of(R, nb, slice(None))
    out[g, lane] = a
    return out


def lane_order(p: tuple) -> tuple:
    """Planes in lane order (new arrays, on 64-byte boundaries: (lanes [groups·16·bb], d [groups, 16][,
    m [groups, 16], or [0, 16] for Q4_0]), a LanePlanes carrying the weight's shape); planes in lane
    order already, as they are."""
    if p[0].ndim == 1:
        return p
    q, d = p[0], p[1]
    R, nb = d.shape
    bb = q.shape[1] // nb
    lanes = aligned_zeros(groups(R, nb) * GROUP * bb, q.dtype)
    step = max(1, 65536 // (bb * nb))               # a few rows at a time: the index is 8 bytes a byte
    for r0 in range(0, R, step):
        lanes[_lane_index(R, nb, bb, slice(r0, r0 + step))] = q[r0:r0 + step]
    out = (lanes, _scales_in_lanes(d, R, nb))
    if len(p) == 3:
        out += (_scales_in_lanes(p[2], R, nb) if p[2].shape[0] else _NO_MIN_LANES,)
    return check_planes(lane_planes(out, (R, nb * QK)))


def gguf_rows(lanes: np.ndarray, R: int, nb: int, rows=slice(None)) -> np.ndarray:
    """Rows `rows` of a weight in lane order, back in GGUF's order: [n, bb·nb] of lanes' dtype (int8
    Q8_0 values, uint8 Q4 nibbles; a copy, reading only those rows' bytes). The NumPy form, by the
    rule; `lane_rows` gathers the same bytes in one compiled loop."""
    return lanes[_lane_index(R, nb, lanes.size // (groups(R, nb) * GROUP), rows)]


def scale_rows(scales: np.ndarray, R: int, nb: int, rows=slice(None)) -> np.ndarray:
    """Rows `rows` of scales (or minimums) in lane order [groups, 16], back in GGUF's order: uint16
    [n, nb] (a copy of those rows' alone, gathered as lane_rows gathers q)."""
    from ._int8 import gather_rows
    ids = _ids(R, rows)
    out = np.empty((len(ids), nb), np.uint16)
    if not gather_rows(scales.reshape(-1), R, nb, ids, out):
        row_ids(R, ids)                                        # the IndexError, in words
    return out


def gguf_planes(p: tuple) -> tuple:
    """Planes in lane order back in GGUF's order (copies): (q, d[, m]) as `planes` makes them."""
    if p[0].ndim == 2:
        return p
    R, C = _shape(p)
    nb = C // QK
    out = (gguf_rows(p[0], R, nb), scale_rows(p[1], R, nb))
    if len(p) == 3:
        out += (scale_rows(p[2], R, nb) if p[2].shape[0] else _NO_MIN,)
    return out


def _ids(R: int, rows) -> np.ndarray:
    """rows as int64 ids for gather_rows (which checks them): integer ids as they are, a slice or a
    mask through row_ids."""
    if isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1:
        return rows                                            # a step's ids: no NumPy call at all
    ids = np.asarray(rows).reshape(-1) if not isinstance(rows, slice) else None
    if ids is None or ids.dtype.kind not in "iu":               # a slice, a mask: row_ids
        ids = row_ids(R, rows)
    return ids.astype(np.int64, copy=False)                    # one compiled form (uint64 + int64 is a float)


def lane_rows(lanes: np.ndarray, R: int, nb: int, rows=slice(None)) -> np.ndarray:
    """gguf_rows, gathered by a numba loop: what a weight's q_rows (an embedding's lookup) uses.
    Measured for one row of a 49152x576 Q8_0 weight, interleaved, medians of 15 rounds: gguf_rows'
    index arrays 32.2 µs, this 5.4, GGUF's own order (q[ids]) 1.6."""
    from ._int8 import gather_rows
    ids = _ids(R, rows)
    out = np.empty((len(ids), lanes.size // (groups(R, nb) * GROUP) * nb), lanes.dtype)
    if not gather_rows(lanes.view(np.int32), R, nb, ids, out.view(np.int32)):   # ids checked there
        row_ids(R, ids)                                        # the IndexError, in words
    return out


def dequant_rows(p: tuple, rows) -> np.ndarray:
    """Rows `rows` of planes in lane order dequantized, float32 [n, C]: models/quant.py's
    QuantMatrix.rows (GGUF's dequantization, bit for bit) in one compiled loop (an Int8Quant's
    embedding lookup). One row of SmolLM2's 49152x576 Q8_0 table after a 64 MB read (the head's
    30 MB evict Python's code and data too): the NumPy steps through scale_rows and q_rows 239 µs,
    this 109 (interleaved, medians of 41 rounds)."""
    from ._int8 import dequant_rows as gather
    R, C = _shape(p)
    nb = C // QK
    ids = _ids(R, rows)
    out = np.empty((len(ids), C), np.float32)
    kind = 0 if len(p) == 2 else 1 if p[2].shape[0] == 0 else 2
    if not gather(p[0].reshape(-1), p[1], p[1] if kind < 2 else p[2], kind, R, nb, ids, out):
        row_ids(R, ids)                                        # the IndexError, in words
    return out


def weight_ints(p: tuple) -> np.ndarray:
    """Step 2's integers of every weight, [R, nb, 32] int8 in value order (Q8_0 q; Q4_0 n - 8; Q4_1 n)."""
    p = gguf_planes(p)
    R, C = _shape(p)
    nb = C // QK
    q = p[0]
    if len(p) == 2:
        return q.view(np.int8).reshape(R, nb, QK)
    b = q.reshape(R, nb, 16)
    n = np.concatenate([b & 15, b >> 4], axis=2).astype(np.int8)                 # [R, nb, 32]
    return n if p[2].shape[0] else n - 8


def block_sums_ref(wi: np.ndarray, qx: np.ndarray) -> np.ndarray:
    """Step 3: I [T, R, nb] int32 from the weights' integers [R, nb, 32] and x's [T, nb, 32]. Done as a
    float32 matrix product per block, exact: every partial sum is an integer below 2^24."""
    a = qx.astype(np.float32).transpose(1, 0, 2)                                 # [nb, T, 32]
    b = wi.astype(np.float32).transpose(1, 2, 0)                                 # [nb, 32, R]
    return np.matmul(a, b).transpose(1, 2, 0).astype(np.int32)                   # [T, R, nb]


def matmul_ref(p: tuple, x: np.ndarray, rows_at_once: int = 64) -> np.ndarray:
    """x [T, C] @ w^T -> [T, R] float32 by steps 1-5 (the kernels' exact answer), w given by its
    `planes`, `rows_at_once` rows of x at a time (step 3's [T, R, nb] array is the large one)."""
    p = gguf_planes(p)
    R, C = _shape(p)
    x = _check(C, np.asarray(x))
    T = x.shape[0]
    nb = C // QK
    wi = weight_ints(p)
    dw = p[1].view(np.float16).astype(np.float32)                                # [R, nb], exact
    mw = p[2].view(np.float16).astype(np.float32) if len(p) == 3 and p[2].shape[0] else None
    y = np.empty((T, R), np.float32)
    for t0 in range(0, T, rows_at_once):
        qx, dx, _, mx = quantize_x_ref(x[t0:t0 + rows_at_once])
        I = block_sums_ref(wi, qx)                                               # [t, R, nb]
        with np.errstate(all="ignore"):
            P = (dw[None] * dx[:, None, :]) * I.astype(np.float32)               # step 4
            if mw is not None:
                P = P + mw[None] * mx[:, None, :]
            A = np.zeros(P.shape[:2], np.float32)                                # step 5: in order
            for b in range(nb):
                A = A + P[:, :, b]
        y[t0:t0 + rows_at_once] = A
    return y


# -- the kernels --------------------------------------------------------------------------------------

def _check(C: int, x) -> np.ndarray:
    if x.ndim != 2 or x.shape[1] != C:
        raise Int8Error(f"a weight of rows of {C} values multiplies x [T, {C}], not x of shape {x.shape}")
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    return x


def quantize_x(x: np.ndarray) -> tuple:
    """Step 1 by the kernels: (xq int8 [T, C], xd float32, xs int32, xm float32 [T, nb]), as
    `quantize_x_ref` gives them (xq flat by row)."""
    from . import _int8
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] % QK or x.shape[1] == 0:
        raise Int8Error(f"rows of x cut into blocks of {QK} values: got x of shape {x.shape}")
    return _int8.quantize_x(_check(x.shape[1], x))


_ISA: list = [None, None]     # [MINILLM_INT8_ISA as last read, the instruction set it gave]


def _current_isa() -> str:
    want = os.environ.get(ENV)
    if _ISA[1] is None or want != _ISA[0]:
        _ISA[:] = [want, isa()]
    return _ISA[1]


def kernel(q8: bool, isa_name: str | None = None):
    """The compiled product for Q8_0 (q8) or Q4 planes on an instruction set (default `isa()`):
    kernel(*planes, x, y) with x [T, C] float32 C-contiguous and y [T, R] float32, the planes in
    lane order (`lane_order`; the kernel takes R from y): what a weight class calls per product,
    without this module's checks."""
    from ._int8 import KERNELS
    name = isa_name or _current_isa()
    if name not in supported():
        raise Int8Error(f"this CPU (or numba's target) cannot run the {name!r} integer kernels; it has "
                        f"{', '.join(supported())}")
    return KERNELS["q8_0" if q8 else "q4", name]


def matmul(p: tuple, x: np.ndarray, isa_name: str | None = None) -> np.ndarray:
    """x [T, C] @ w^T -> [T, R] float32 in integers (x rounded to int8 blocks inside, once), w given
    by its `planes` (in GGUF's order they are laid out in lane order first, a copy: a weight class
    keeps them so); equal to `matmul_ref` bit for bit. isa_name: one of `supported()` (default `isa()`)."""
    p = lane_order(check_planes(p))
    R, C = _shape(p)
    x = _check(C, np.asarray(x))
    y = np.empty((x.shape[0], R), np.float32)
    kernel(len(p) == 2, isa_name)(*p, x, y)
    return y


# -- when the integer set is the default ---------------------------------------------------------------
#
# Within ERROR_BOUND for every format measured (see above), so speed decides, per format and
# instruction set, from _int8.py's interleaved measurements against the fused float kernel (one
# thread, whole passes): with VNNI the integer kernels were the faster at every row count measured
# for Q8_0 and Q4_1 (decode of one row 3.18 against 2.95x NumPy float32 on GPT-2's Q8_0, 3.53 against
# 2.79x on SmolLM2's Q4_1; 4 rows 5.94 against 3.49x and 6.76 against 5.10x); with AVX2 alone, faster
# for Q4 (one row 3.38 against 2.79x) but not for Q8_0's one row (2.30 against 2.95x); the portable
# form slower for both (1.80 and 1.83x). Q4_0 takes Q4_1's verdict (the same nibbles, no minimum).

def faster_than_fused(fmt: str, name: str | None = None) -> bool:
    """Is the integer set the faster for weights of `fmt` ("q8_0", "q4_0", "q4_1") on instruction set
    `name` (default this CPU's), by the measurements above?"""
    name = name or isa()
    if name in ("avx512-vnni", "avx-vnni"):
        return True
    return name == "avx2" and fmt in ("q4_0", "q4_1")
