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
  5. Sixteen float32 lanes per row: the row's block b goes to lane (r·nb + b) mod 16 (r the row's
     number in the weight: the kernels take a weight's blocks 16 at a time in storage order, across
     row ends), and each lane adds its blocks in order from +0.0: A_L = ((0 + P_b) + P_b') + ...
     Then y = the lanes added as a tree: a_i = A_i + A_i+8 (i < 8), b_i = a_i + a_i+4,
     c_i = b_i + b_i+2, y = c_0 + c_1.

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
tokens, perplexity Q8_0 130.417 -> 130.441 (+0.02%), Q4_0 130.908 -> 130.912 (+0.003%), float32
130.422; SmolLM2-135M, 4,095 tokens, its native Q4_1 34.903 -> 34.932 (+0.08%; float32, the same
blocks widened, 34.903), requantized Q8_0 34.870 -> 34.986 (+0.33%); the largest logit moved by the
rounding of x 2.2 (SmolLM2 Q4_1) to 4.4 (its Q8_0), the same top-1 at 95-99% of positions, SmolLM2's
256 greedy tokens all float32's. The bound this project holds the integer set to: held-out perplexity
within 0.5% of the same weights' with float activations (`ERROR_BOUND`).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..errors import MiniLLMError
from .aligned import aligned, aligned_zeros
from .cpu import cpu_features, target_features  # noqa: F401 (public here too)

ERROR_BOUND = 0.005      # relative perplexity, W·A8 against W·A32 on the same weights (measured above)
QK = 32                  # values per block (models/quant.py's)
GROUP = 16                       # blocks per group: the kernels' lanes and the reference's step 5
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
    (`check_planes`)."""
    d = aligned(np.asarray(d).view(np.uint16))
    if q.dtype == np.int8:
        return check_planes((aligned(q), d))
    return check_planes((aligned(q), d, _NO_MIN if m is None else aligned(np.asarray(m).view(np.uint16))))


def check_planes(p: tuple) -> tuple:
    """p as the kernels read it, or a ValueError in one line: kernels/checks.py's agreement of shapes
    and dtypes (q int8 [R, 32·nb] with d uint16 [R, nb]; or q uint8 [R, 16·nb], d and m uint16
    [R, nb], m [0, 0] for Q4_0; or q in lane order, `lane_order`'s 1-D array), at least one block a
    row, and each plane C-contiguous (the kernels read them by flat offsets: a strided plane would be
    read as if it were not)."""
    from . import checks
    if len(p) in (2, 3) and getattr(p[0], "ndim", 0) == 1:    # in lane order: the q it stands for
        R, nb = checks._shape(p[1], 2, "quantized product's d")
        kind, dt, bb = ("Q8_0 values", np.int8, QK) if len(p) == 2 else ("Q4 nibbles", np.uint8, QK // 2)
        if p[0].dtype != dt or p[0].shape != (groups(R, nb) * GROUP * bb,):
            raise Int8Error(f"integer product: {kind} in lane order {p[0].shape} {p[0].dtype} do not match "
                            f"scales [{R}, {nb}] ({dt.__name__} [{groups(R, nb) * GROUP * bb}]: lane_order "
                            "makes them)")
        checks.planes((np.broadcast_to(dt(0), (R, bb * nb)),) + tuple(p[1:]))   # scales, minimums
        p = checks.Planes(p)
        p.n_in = nb * QK
    else:
        p = checks.planes(tuple(p))
    if p[1].shape[1] == 0:
        raise Int8Error(f"integer product: a weight of {p[1].shape[0]} rows of no values; rows need whole "
                        f"blocks of {QK} values")
    if not all(a.flags.c_contiguous for a in p):
        raise Int8Error("integer product: the planes must be C-contiguous (make them with int8.planes)")
    return p


def _shape(p: tuple) -> tuple[int, int]:
    """(R, C) of a weight's planes (in GGUF's order or the kernels' lane order)."""
    R, nb = p[1].shape
    return R, nb * QK


# -- in lane order -------------------------------------------------------------------------------------
#
# The kernels read a group of 16 blocks "block per lane" (_int8.py): vector k holds in its lane L the
# 4 bytes k of the group's block L (Q8_0: 8 vectors, a block's 32 values; Q4: 4, its 16 bytes of
# nibbles). GGUF stores a block's bytes together, so a kernel reading GGUF's order turns each group
# around in registers (rounds of shuffles, every group); a weight laid out in that order once, when it
# is made, is read with plain loads. Lane order: the weight's blocks in storage order (row after row)
# cut in groups of 16, group G's 16·bb bytes (bb a block's bytes: 32 for Q8_0, 16 for Q4) holding
# byte i of its block L at 64·(i // 4) + 4·L + i % 4, the last group padded with zero bytes: a 1-D
# array (int8 for Q8_0, uint8 for Q4) of 16·bb bytes a group. Measured: Q4 (SmolLM2-135M's 120 Q4_1
# products, one row, 2 threads, medians of 11 interleaved rounds, Intel Xeon VM) 1.07x against the
# shuffles in registers (a first look, the shuffles simply left out: 1.18x). Q8_0 (SmolLM2's head,
# 49152x576, three copies in turn so that each comes from memory, 2 threads, AVX2 on an AMD EPYC Zen
# 3, both forms in one process, medians of 15 interleaved rounds): one row of x 1.46x (ranges apart),
# 8 rows 0.94x (each round's ratio 0.89-0.96), 32 rows 0.98x (0.68-1.13); with the group's loads
# moved into the loop over x's rows, 0.98x at 8 rows but 0.92x at 32: kept as it is.

def groups(R: int, nb: int) -> int:
    """Groups of 16 blocks in a weight of R rows of nb blocks (the last one possibly partial)."""
    return -(-R * nb // GROUP)


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


def _lane_index(R: int, nb: int, bb: int, rows=slice(None)) -> np.ndarray:
    """[n, bb·nb] positions in lane order of the GGUF-order bytes of rows `rows` of an R x nb-block
    weight of bb bytes a block (the inverse of laying it out)."""
    r = row_ids(R, rows)                                                     # [n]
    b = r[:, None] * nb + np.arange(nb)[None, :]                             # [n, nb] flat blocks
    i = np.arange(bb)                                                        # byte of a block
    pos = (b // GROUP * GROUP * bb + b % GROUP * 4)[..., None] + (64 * (i // 4) + i % 4)   # [n, nb, bb]
    return pos.reshape(len(r), bb * nb)


def lane_order(p: tuple) -> tuple:
    """Planes with q (Q8_0's values, Q4's nibbles) laid out in lane order (a new array: (lanes [groups·
    16·bb], d[, m])); planes in lane order already, as they are."""
    if p[0].ndim == 1:
        return p
    q, d = p[0], p[1]
    R, nb = d.shape
    bb = q.shape[1] // nb
    lanes = aligned_zeros(groups(R, nb) * GROUP * bb, q.dtype)   # on a 64-byte boundary (aligned.py)
    step = max(1, 65536 // (bb * nb))               # a few rows at a time: the index is 8 bytes a byte
    for r0 in range(0, R, step):
        lanes[_lane_index(R, nb, bb, slice(r0, r0 + step))] = q[r0:r0 + step]
    return check_planes((lanes,) + tuple(p[1:]))


def gguf_rows(lanes: np.ndarray, R: int, nb: int, rows=slice(None)) -> np.ndarray:
    """Rows `rows` of a weight in lane order, back in GGUF's order: [n, bb·nb] of lanes' dtype (int8
    Q8_0 values, uint8 Q4 nibbles; a copy, reading only those rows' bytes). The NumPy form, by the
    rule; `lane_rows` gathers the same bytes in one compiled loop."""
    return lanes[_lane_index(R, nb, lanes.size // (groups(R, nb) * GROUP), rows)]


def lane_rows(lanes: np.ndarray, R: int, nb: int, rows=slice(None)) -> np.ndarray:
    """gguf_rows, gathered by a numba loop: what a weight's q_rows (an embedding's lookup) uses.
    Measured for one row of a 49152x576 Q8_0 weight, interleaved, medians of 15 rounds: gguf_rows'
    index arrays 32.2 µs, this 5.4, GGUF's own order (q[ids]) 1.6."""
    from ._int8 import gather_rows
    ids = np.asarray(rows).reshape(-1) if not isinstance(rows, slice) else None
    if ids is None or ids.dtype.kind not in "iu":               # a slice, a mask: row_ids
        ids = row_ids(R, rows)
    ids = ids.astype(np.int64, copy=False)                     # one compiled form (uint64 + int64 is a float)
    out = np.empty((len(ids), lanes.size // (groups(R, nb) * GROUP) * nb), lanes.dtype)
    if not gather_rows(lanes.view(np.int32), R, nb, ids, out.view(np.int32)):   # ids checked there
        row_ids(R, ids)                                        # the IndexError, in words
    return out


def weight_ints(p: tuple) -> np.ndarray:
    """Step 2's integers of every weight, [R, nb, 32] int8 in value order (Q8_0 q; Q4_0 n - 8; Q4_1 n)."""
    R, C = _shape(p)
    nb = C // QK
    q = gguf_rows(p[0], R, nb) if p[0].ndim == 1 else p[0]
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
            A = np.zeros(P.shape[:2] + (GROUP,), np.float32)                     # step 5
            lane = (np.arange(R)[:, None] * nb + np.arange(nb)[None, :]) % GROUP     # [R, nb]
            rows = np.arange(R)
            for b in range(nb):
                A[:, rows, lane[:, b]] = A[:, rows, lane[:, b]] + P[:, :, b]
            while A.shape[-1] > 1:
                h = A.shape[-1] // 2
                A = A[..., :h] + A[..., h:]
        y[t0:t0 + rows_at_once] = A[..., 0]
    return y


# -- the kernels --------------------------------------------------------------------------------------

def patterns(nb: int) -> int:
    """How many different 16-block x vectors a weight of nb blocks a row needs: its block b of row r
    sits in lane (r·nb + b) mod 16, so the pattern repeats every nb / gcd(nb, 16) groups."""
    return nb // math.gcd(nb, GROUP)


def _check(C: int, x) -> np.ndarray:
    if x.ndim != 2 or x.shape[1] != C:
        raise Int8Error(f"a weight of rows of {C} values multiplies x [T, {C}], not x of shape {x.shape}")
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    return x


def quantize_x(x: np.ndarray) -> tuple:
    """Step 1 by the kernels, in their layout: (xq int8 [T, P, 8, 64], xd, xs, xm [T, 16·P])."""
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
    lane order (`lane_order`) (what a weight class calls per product, without this module's checks)."""
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
