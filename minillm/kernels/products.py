"""The fused products and attention as plain functions over NumPy arrays (float32), each checked
against its NumPy reference by tests/test_kernels.py. The fused kernel set's weights
(models/fused.py) and attention (models/kernel_sets.py) call these; models/ops.py counts them.

Shapes follow models/ops.py: a quantized weight is the planes of [out, in] rows of blocks that
models/quant.py's QuantMatrix holds (q, then the scales d and Q4_1's minimums m as float16); a
float weight for the fused product is kept transposed, [out, in], so that both walk a weight row
by row; attention takes ops.attention's q [H, Tq, hd], k, v [Hkv, Tk, hd] and the paged pool's
[Hkv, blocks, block_size, hd] layout (cache/paged.py).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds          # NumPy 2
except ImportError:                                        # pragma: no cover - NumPy 1.x
    from numpy import byte_bounds

from . import _exact, checks
from . import _numba as K
from .aligned import aligned
from .cpu import cpu_features

_NO_MIN = np.empty((0, 0), np.uint16)    # Q4_0 has no minimums: the kernel's m is empty
_ONE_BLOCK = np.zeros((1, 1), np.intp)   # a contiguous cache's rows as block 0 of a one-block pool
_ONE_BLOCK.flags.writeable = False        # read-only, as the engine's tables: see _paged_decode
QUERY_TILE = 64       # flash attention: queries per tile (of each of a group's g heads)
KEY_TILE = 128        # flash attention: keys per tile. Against 32 x 64, one process, 15 interleaved calls
                      # (AMD EPYC Zen 5 VM, 2 threads): GPT-2's 12 heads at 512 tokens 1.19x, at 128 1.10x;
                      # SmolLM2's 9 / 3 heads at 128 / 512 / 1,024 tokens 1.09 / 1.13 / 1.14x
DECODE_CHUNK = 256    # paged decode: keys per work item at least (FlashDecoding's split)
PAGE = 16             # a contiguous cache's rows seen as pages of this many, for the split kernel
SHORT_DECODE = 256    # one query over at most this many keys: the one-thread kernel; past it the split
                      # kernel over the rows seen as pages of PAGE. Measured (quiet 2-core Zen 4, the
                      # split on 2 threads, a cache's whole arrays of 8,192 rows), µs at 64 / 128 / 256 /
                      # 512 / 2,048 keys: SmolLM2's 9/3 heads one thread 6.3 / 11.5 / 22.1 / 43.7 / 177,
                      # split 11.8 / 15.5 / 23.2 / 31.8 / 114; GPT-2's 12 heads 9.8 / 18.6 / 35.0 /
                      # 65.8 / 256 against 18.9 / 24.1 / 35.3 / 56.1 / 164


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def _check_float32(*arrays: np.ndarray) -> None:
    for a in arrays:
        if a.dtype != np.float32:
            raise TypeError(f"the fused kernels compute in float32, got {a.dtype}: use the NumPy path for it")


def planes(q: np.ndarray, d: np.ndarray, m: np.ndarray | None = None) -> tuple:
    """A quantized matrix's planes as the kernels take them: q (int8 [R, C]: Q8_0; uint8 [R, C/2]:
    Q4's nibbles), then the scales (and Q4_1's minimums; for Q4_0 an empty array) as float16 bits,
    uint16, checked to agree (`checks.Planes`: a product then checks only x). Made once per weight
    (models/fused.py keeps them)."""
    d = aligned(d.view(np.uint16))
    if q.dtype == np.int8:
        return checks.planes((aligned(q), d))
    return checks.planes((aligned(q), d, _NO_MIN if m is None else aligned(m.view(np.uint16))))


def quant_matmul_t(p: tuple, x: np.ndarray) -> np.ndarray:
    """x [T, C] @ w^T -> [T, R] in float32, w (its `planes`) read once per four rows of x (any T)."""
    _check_float32(x)
    checks.quant_product(p, x)
    x = _f32(x)
    y = np.empty((x.shape[0], p[0].shape[0]), np.float32)   # [T, R]
    if len(p) == 2:
        K.q8_0_matmul_t(*p, x, y)
    else:
        K.q4_matmul_t(*p, x, y)
    return y


WIDE = "avx512f" in cpu_features()   # 32 vector registers: the blocked form six output rows by four
BLOCKED = K.dense_matmul_t_6x4 if WIDE else K.dense_matmul_t_blocked
BLOCKED_FROM = 4 if WIDE else 8      # rows of x from which the float32 product runs the blocked form
                                     # (AMD Zen 5, GPT-2's products, 4 / 6 rows: the 6x4 form 1.14x
                                     # [0.91-1.21] / 1.23x [1.16-1.27] the row form; the 4x4 form was
                                     # slower than the row form at 4 rows on a Zen 4: from 8 there)


def dense_matmul_t(wt: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x [T, C] @ wt^T -> [T, R], wt float32 [R, C] (a weight [in, out] kept as its transpose): the
    weight read once, for four rows of x at a time (the row form up to BLOCKED_FROM - 1 rows, then
    the blocked form: six output rows against four rows of x where the CPU has AVX-512's 32 vector
    registers, four against four elsewhere; _numba.py says why)."""
    _check_float32(x, wt)
    checks.dense_product(wt, x)
    # x on a 64-byte boundary for the blocked form (aligned.py); the row form reads the weight, not x,
    # and its copy cost more than it gave: GPT-2-124M's decode 0.94x [0.88-1.00] with it, 1.01x
    # [0.99-1.05] without (against the weights' alignment alone; one process, 11 interleaved rounds)
    x = _f32(x) if x.shape[0] < BLOCKED_FROM else aligned(_f32(x))
    y = np.empty((x.shape[0], wt.shape[0]), np.float32)
    (BLOCKED if x.shape[0] >= BLOCKED_FROM else K.dense_matmul_t)(wt, x, y)
    return y


def _rows(k: np.ndarray) -> tuple[np.ndarray, int]:
    """k [Hkv, Tk, hd] as a C-contiguous array the kernels can vectorize over, with as many rows per
    head as its memory spaces heads apart (>= Tk) and no copy, when k is the first Tk rows of each
    head of a larger C-contiguous array (a KV cache's `read`: k[layer, :, :t]); else a contiguous
    copy (counted as activations: written, then read). numba compiles a strided ('A') array's loops
    without vector instructions: on a 1,024-token prefill of GPT-2-124M's shapes that ran 5.5x slower.
    -> (array, bytes copied)."""
    if k.flags.c_contiguous:
        return k, 0
    Hkv, Tk, hd = k.shape
    b = k.itemsize
    if k.strides[2] == b and k.strides[1] == hd * b and k.strides[0] % (hd * b) == 0 and Tk > 0:
        S = k.strides[0] // (hd * b)
        base = k
        while isinstance(base.base, np.ndarray):
            base = base.base
        lo, hi = byte_bounds(base) if base.flags.c_contiguous else (1, 0)
        start = k.__array_interface__["data"][0]
        if lo <= start and start + Hkv * S * hd * b <= hi:
            return np.lib.stride_tricks.as_strided(k, (Hkv, S, hd), (S * hd * b, hd * b, b)), 0
    c = np.ascontiguousarray(k)
    return c, 2 * c.nbytes


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, Tk: int | None = None,
              chunk: int | None = None) -> tuple[np.ndarray, int]:
    """ops.attention's semantics (causal, query i at position Tk - Tq + i, GQA H = g·Hkv), without a
    score matrix: FlashAttention's tiles and running max/sum for Tq > 1; for Tq == 1 a one-thread
    kernel up to SHORT_DECODE keys, else the paged decode kernel (one page holding all Tk keys,
    split in chunks). q [H, Tq, hd], k, v [Hkv, Tk, hd]
    -> (out [H, Tq, hd] float32, bytes of k and v copied to rows first: 0 unless they came strided).
    With Tk, k and v may hold more rows per head than the Tk keys (a cache's whole arrays,
    `read_rows`): the first Tk are attended. No pair past the diagonal is computed
    (ops.attention counts what it does). chunk (keys): for Tq == 1 the paged decode kernel with
    this fixed chunk in IEEE order (kernels/_exact.py), the rows seen as one block, at any Tk: the
    bits `paged_decode_attention(..., chunk)` gives the same keys in a paged pool of any block size,
    in any batch, and the int8 set's compiled step gives them (the int8 set passes DECODE_CHUNK: a
    token's bits alone == batched)."""
    _check_float32(q, k, v)
    Tk = checks.attention(q, k, v, Tk)
    H, Tq, hd = q.shape
    Hkv = k.shape[0]
    scale = np.float32(1.0 / math.sqrt(hd))
    if k.flags.c_contiguous and v.flags.c_contiguous:
        copied_k = copied_v = 0
    else:
        (k, copied_k), (v, copied_v) = _rows(k), _rows(v)            # [Hkv, S >= Tk, hd], C-contiguous
    if Tq == 1 and chunk is not None:                    # fixed chunks: a paged pool's bits
        _check_chunk(chunk)
        out = np.empty((H, 1, hd), np.float32)
        if k.shape[1] != v.shape[1]:                     # rows of two lengths: the Tk keys copied
            k, v = np.ascontiguousarray(k[:, :Tk]), np.ascontiguousarray(v[:, :Tk])
            copied_k, copied_v = copied_k + 2 * k.nbytes, copied_v + 2 * v.nbytes
        S = k.shape[1]
        _fixed_chunks(_f32(q), k.reshape(Hkv, 1, S, hd), v.reshape(Hkv, 1, S, hd), _ONE_BLOCK,
                      _length(Tk), out, scale, chunk)
    elif Tq == 1 and Tk <= SHORT_DECODE:                  # one thread, the scores kept whole
        out = np.empty((H, 1, hd), np.float32)
        K.decode_attention_short(_f32(q), k, v, Tk, out, scale)
    elif Tq == 1:                                        # the rows as pages: FlashDecoding's split
        out = np.empty((H, 1, hd), np.float32)
        S = k.shape[1]
        bs = PAGE if S % PAGE == 0 and v.shape[1] == S else S   # else one page: no split
        kp, vp = k.reshape(Hkv, S // bs, bs, hd), v.reshape(Hkv, S // bs, bs, hd)     # views, no copy
        table = np.arange(-(-Tk // bs), dtype=np.intp)[None]                        # [1, pages] in order
        _paged_decode(_f32(q), kp, vp, table, _length(Tk), out, scale, decode_chunk(Tk, 1, Hkv, bs))
    else:
        out = np.empty((H, Tq, hd), np.float32)
        K.flash_attention(_f32(q), k, v, Tk, out, scale, QUERY_TILE, KEY_TILE)
    return out, copied_k + copied_v


@lru_cache(maxsize=1 << 16)
def _length(Tk: int) -> np.ndarray:
    """[Tk] as the paged kernel's lengths for one sequence: a read-only intp array, made once per
    length (a decode step of one sequence asks for the same one in every layer; read-only, so shared
    safely, and the type `_paged_decode` passes anyway: no view made per call)."""
    a = np.array([Tk], np.intp)
    a.flags.writeable = False
    return a


def _check_chunk(chunk) -> None:
    if not isinstance(chunk, (int, np.integer)) or chunk <= 0:
        raise ValueError(f"chunk={chunk!r}: a positive number of keys")


def decode_chunk(longest: int, B: int, Hkv: int, block_size: int) -> int:
    """Keys per work item of the paged decode kernel: enough items for the threads (FlashDecoding
    splits a long sequence when B·Hkv items alone would leave threads idle), never under
    DECODE_CHUNK keys, a whole number of blocks."""
    from .runtime import threads
    checks.positive(longest=longest, B=B, Hkv=Hkv, block_size=block_size)
    want = max(1, -(-4 * (threads() or 1) // (B * Hkv)))          # chunks per sequence wanted
    chunk = max(DECODE_CHUNK, -(-longest // want))
    return -(-chunk // block_size) * block_size


def paged_decode_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, table: np.ndarray,
                           lengths: np.ndarray, chunk: int | None = None) -> np.ndarray:
    """B sequences' one new query each, over their keys in a paged pool, no gather and no padding.
    q [H, B, hd]; k_pool, v_pool [Hkv, blocks, block_size, hd] (one layer of PagedKVPool.k/.v);
    table [B, nb] each sequence's blocks in order (rows may be padded past their length); lengths
    [B] each sequence's keys. -> [H, B, hd] float32, what ops.decode_attention gives over the
    gathered, padded and masked keys (ops.paged_decode_attention counts it: each sequence's own
    keys read from the pool, no copy, no padding). chunk: keys per work item; None: `decode_chunk`'s,
    which depends on the batch (its size, its longest sequence). A fixed chunk splits every sequence
    the same way in any batch and over any blocks, in IEEE order (kernels/_exact.py), so its result
    is bit for bit the same as alone, and as `attention(..., chunk)` over a contiguous cache's rows
    (the int8 kernel set passes DECODE_CHUNK)."""
    _check_float32(q, k_pool, v_pool)
    table, lengths = checks.paged(q, k_pool, v_pool, table, lengths)
    if chunk is not None:
        _check_chunk(chunk)
    H, B, hd = q.shape
    Hkv, bs = k_pool.shape[0], k_pool.shape[2]
    out = np.empty((H, B, hd), np.float32)
    scale = np.float32(1.0 / math.sqrt(hd))
    if chunk is None:
        _paged_decode(_f32(q), k_pool, v_pool, table, lengths, out, scale, decode_chunk(int(lengths.max()), B, Hkv, bs))
    else:
        _fixed_chunks(_f32(q), k_pool, v_pool, table, lengths, out, scale, chunk)
    return out


def _readonly(a: np.ndarray) -> np.ndarray:
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _paged_decode(q, kp, vp, table, lengths, out, scale, chunk) -> None:
    """Every call of the paged decode kernel (a contiguous cache's rows, a pool, alone or in a
    batch) with the same argument types, so one compiled specialization runs them all. numba
    compiles (and caches on disk) one machine code per type signature, and a read-only array is
    another type: the engine's step passes read-only tables (models/plan.py), a contiguous cache's
    decode passed writable ones, and the two copies of the kernel, each with fastmath's reassociated
    sums, agreed only as long as LLVM compiled them alike. Compiled under other CPU features (the
    256- and 512-bit vectors of kernels/runtime.py: the same keys gave other last bits in 46,591 of
    54,208 outputs), as a disk cache written by processes with other settings can hand one
    process, they did not: the int8 set's batched step then left `generate`'s bits, which the
    fixed chunk is there to keep. q, kp, vp, out: C-contiguous float32 (the callers make them so);
    table, lengths: intp, passed read-only."""
    K.paged_decode_attention(q, kp, vp, _readonly(table), _readonly(lengths), out, scale, chunk)


def _fixed_chunks(q, kp, vp, table, lengths, out, scale, chunk) -> None:
    """Every call with a fixed chunk (the int8 set's): the kernel in IEEE order (kernels/_exact.py
    `paged_decode`), whose bits are the same wherever numba compiles it, from Python here and inside
    the int8 set's compiled step (kernels/_block.py); arguments as `_paged_decode`'s."""
    _exact.paged_decode(q, kp, vp, _readonly(table), _readonly(lengths), out, scale, chunk)
