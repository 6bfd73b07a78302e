"""The fused kernels (minillm/kernels/) against their NumPy references: every product and both
attentions, on random shapes, block contents, row counts, sequence lengths, GQA groups and page
tables; the meter's counts for fused products; the status when numba cannot run.

Tolerances are float32 rounding, bounded from the sums themselves rather than picked: a float32
sum of n terms is off from the exact sum by at most ~n·2^-24 times the sum of the terms' absolute
values (Higham's γ_n). Each kernel and its NumPy reference are compared with the exact float64
result within twice that (2^-23 per term, plus a few for the scale and offset products), so a
kernel that drops or misplaces one block, one key or one scale is far outside it.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import kernels, meter
from minillm.kernels.aligned import aligned, is_aligned
from minillm.models import kernel_sets, ops
from minillm.models.quant import QK, QuantMatrix

if kernels.available():
    from minillm.kernels import _exact, elementwise, products
    from minillm.models.fused import FUSED_ROWS, FusedDense, FusedQuant, fuse
    from minillm.models.weights import Dense
    FUSED = kernel_sets.get("fused")


def planes(w: QuantMatrix) -> tuple:
    return kernels.planes(w.q, w.d, w.m)

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"fused kernels: {kernels.status().reason}")

U = 2.0 ** -23          # twice float32's unit roundoff
FMTS = ("q8_0", "q4_0", "q4_1")


# -- quantized blocks, as the planes hold them -----------------------------------------------------

def float16_bits(rng, n: int, kind: str) -> np.ndarray:
    """n float16 scales (as float16): ordinary, extreme (subnormal to 65504, both signs), or zero."""
    if kind == "zero":
        return np.zeros(n, np.float16)
    if kind == "extreme":
        bits = rng.integers(0, 1 << 16, n).astype(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0x83FF          # no inf / NaN: exponent 31 -> subnormal
        return bits.view(np.float16)
    return (rng.standard_normal(n) * 0.01).astype(np.float16)


@st.composite
def quant_matrices(draw, max_rows: int = 40, max_blocks: int = 6):
    """A QuantMatrix with random stored bytes: any integers, scales (and minimums) ordinary, extreme
    or zero per block, some whole blocks zero."""
    fmt = draw(st.sampled_from(FMTS))
    R, nb = draw(st.integers(1, max_rows)), draw(st.integers(1, max_blocks))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["plain", "extreme", "mixed"]))
    if kind == "mixed":   # block by block: ordinary, extreme or zero scales
        d = np.choose(rng.integers(0, 3, R * nb), [float16_bits(rng, R * nb, k) for k in ("plain", "extreme", "zero")])
    else:
        d = float16_bits(rng, R * nb, kind)
    d = d.astype(np.float16).reshape(R, nb)
    if fmt == "q8_0":
        q = rng.integers(-127, 128, (R, nb * QK)).astype(np.int8)
    else:
        q = rng.integers(0, 256, (R, nb * QK // 2)).astype(np.uint8)
    zero = rng.random((R, nb)) < 0.2                                    # whole zero blocks
    q.reshape(R, nb, -1)[zero] = 0 if fmt == "q8_0" else 0x88 * (fmt == "q4_0")
    m = float16_bits(rng, R * nb, kind if kind != "mixed" else "plain").reshape(R, nb) if fmt == "q4_1" else None
    return QuantMatrix(fmt, q, d, m)


def terms_bound(w: QuantMatrix, x: np.ndarray) -> np.ndarray:
    """[T, R]: the most float32 rounding may move x @ w^T, from the absolute terms the kernels sum
    (|d·n|, and Q4_0's |8·d| and Q4_1's |m| that they fold in)."""
    R, C = w.shape
    d = np.abs(w.d.astype(np.float64))
    n = np.abs(QuantMatrix(w.fmt, w.q, np.ones_like(w.d), None if w.m is None else np.zeros_like(w.m))
               .dequantize(np.float64))                                  # |q|, or the nibbles n - 8 / n
    a = (n.reshape(R, -1, QK) * d[:, :, None])
    if w.fmt.name == "q4_0":
        a += 16 * d[:, :, None]
    if w.m is not None:
        a += np.abs(w.m.astype(np.float64))[:, :, None]
    ax = np.abs(x.astype(np.float64))
    bound = (C + 8) * U * (ax @ a.reshape(R, C).T)
    if w.fmt.bits == 4 and len(x) % 2:
        # x's last row goes through the one-row form, which sums byte·xlo and hi·(xhi - 16·xlo)
        # for each byte's two values lo·xlo + hi·xhi: a low value's term grows by 32·hi·|d|
        hi = (w.q.reshape(R, -1, 16) >> 4).astype(np.float64)              # [R, nb, 16]
        grow = np.zeros((R, C // QK, 2, 16))
        grow[:, :, 0] = 32 * hi * d[:, :, None]
        bound[-1] += (C + 8) * U * (ax[-1] @ grow.reshape(R, C).T)
    return bound


@settings(max_examples=80, deadline=None)
@given(quant_matrices(), st.one_of(st.integers(1, 10), st.integers(30, 40)), st.integers(0, 2**32 - 1))
def test_fused_quantized_product_equals_numpy(w, T, seed):
    x = (np.random.default_rng(seed).standard_normal((T, w.shape[1])) * 3).astype(np.float32)
    exact = x.astype(np.float64) @ w.dequantize(np.float64).T            # [T, R]
    bound = terms_bound(w, x)
    fused = kernels.quant_matmul_t(planes(w), x)
    numpy_ = w.matmul(x)
    assert fused.dtype == np.float32 and fused.shape == exact.shape
    assert np.all(np.abs(numpy_ - exact) <= bound)                        # the reference, within it
    assert np.all(np.abs(fused - exact) <= bound)
    fq = FusedQuant.of(w)
    assert np.array_equal(fq.matmul(x), fused if T <= FUSED_ROWS else numpy_)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 80), st.integers(1, 12).map(lambda b: 32 * b),
       st.one_of(st.integers(1, 12), st.integers(60, 70), st.integers(255, 260)), st.integers(0, 2**32 - 1))
def test_fused_dense_product_equals_numpy(n_out, n_in, T, seed):
    """The row form up to BLOCKED_FROM rows, then the register-blocked form of this CPU (odd output and
    x row counts: its tails), past 256 BLAS, x @ Wt^T; and both blocked forms (4x4, 6x4) whatever
    this CPU runs, on every shape."""
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((n_in, n_out)).astype(np.float32)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    exact = x.astype(np.float64) @ W
    bound = (n_in + 2) * U * (np.abs(x.astype(np.float64)) @ np.abs(W))
    fd = FusedDense(W)
    assert np.all(np.abs(kernels.dense_matmul_t(fd.wt, x) - exact) <= bound)
    assert np.all(np.abs(fd.matmul(x) - exact) <= bound)
    from minillm.kernels import _numba as K
    for blocked in (K.dense_matmul_t_blocked, K.dense_matmul_t_6x4):
        y = np.full((T, n_out), np.nan, np.float32)
        blocked(fd.wt, x, y)
        assert np.all(np.abs(y - exact) <= bound), blocked.__name__
    assert (fd.n_in, fd.n_out, fd.nbytes) == (n_in, n_out, W.nbytes)
    with meter.Meter() as m:                        # the meter: the weight once, no scratch, whichever ran
        ops.linear(x, fd)
    assert m.steps[-1].bytes["weights"] == W.nbytes and m.steps[-1].scratch == 0
    ids = rng.integers(0, n_out, 5)
    assert np.array_equal(fd.rows(ids), W.T[ids])


# -- the elementwise kernels -----------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.sampled_from([8, 64, 576]), st.sampled_from([1e-6, 1e-5]),
       st.sampled_from([0.01, 1.0, 300.0]), st.integers(0, 2**32 - 1))
def test_fused_rms_norm_equals_numpy(lead, N, n, eps, spread, seed):
    """One pass against ops.rms_norm's four, on [..., n] rows of any scale: both within float32
    rounding of the exact norm (n + 8 roundings of each output's size), and so is the same source
    compiled in IEEE order (the int8 set's, kernels/_exact.py). (Its count is ops.rms_norm's own:
    the fused set passes the kernel to the op, which counts once, whichever ran.)"""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((lead, N, n)) * spread).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    exact = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w
    bound = (n + 8) * U * np.abs(exact) + 1e-30
    fused = FUSED.rms_norm(x, w, eps)
    reference = ops.rms_norm(x, w, eps)
    assert fused.shape == x.shape and fused.dtype == np.float32
    assert np.all(np.abs(reference - exact) <= bound) and np.all(np.abs(fused - exact) <= bound)
    assert np.array_equal(fused, elementwise.rms_norm(x, w, eps))
    assert np.all(np.abs(elementwise.rms_norm(x, w, eps, kernel=_exact.rms_norm) - exact) <= bound)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.sampled_from([1, 16, 1536]), st.sampled_from([0.1, 3.0, 100.0]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_fused_swiglu_equals_numpy(N, F, spread, view, seed):
    """silu(gate)·up in two vectorized passes against ops.swiglu's tanh form, gates from ±0.1 to
    beyond ±88 (exp's cap), on a contiguous [N, 2F] or a strided view: both within a few roundings of
    each output's |gate·up| of the exact value; so is the int8 set's, compiled in IEEE order."""
    rng = np.random.default_rng(seed)
    h = (rng.standard_normal((N, 2 * F + (3 if view else 0))) * spread).astype(np.float32)[:, :2 * F]
    g, u = h[:, :F].astype(np.float64), h[:, F:].astype(np.float64)
    exact = g * u / (1.0 + np.exp(-np.clip(g, -700, 700)))
    bound = 16 * U * np.abs(g * u) + 1e-30
    fused = FUSED.swiglu(h)
    reference = ops.swiglu(h)
    assert fused.shape == (N, F) and fused.dtype == np.float32
    assert np.all(np.abs(reference - exact) <= bound) and np.all(np.abs(fused - exact) <= bound)
    assert np.all(np.abs(elementwise.swiglu(h, kernel=_exact.swiglu) - exact) <= bound)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from([8, 64, 768]), st.sampled_from([1e-5, 1e-6]),
       st.sampled_from([0.01, 1.0, 300.0]), st.sampled_from([0.0, 5.0]), st.integers(0, 2**32 - 1))
def test_fused_layer_norm_equals_numpy(lead, N, n, eps, spread, offset, seed):
    """GPT-2's norm in three passes against ops.layer_norm's eight, rows of any scale, centred or far
    from 0 (offset: a mean of 5 spreads, where centring cancels): both within (n + 8) roundings of the
    exact norm, on the scale of the row's largest |x| over its spread, times |w|, plus |b|."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((lead, N, n)) * spread + offset * spread).astype(np.float32)
    w, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    sd = np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + eps)
    exact = (x64 - mean) / sd * w + b
    bound = (n + 8) * U * (np.abs(x64).max(-1, keepdims=True) / sd * np.abs(w) + np.abs(b)) + 1e-30
    fused = FUSED.layer_norm(x, w, b, eps)
    reference = ops.layer_norm(x, w, b, eps)
    assert fused.shape == x.shape and fused.dtype == np.float32
    assert np.all(np.abs(reference - exact) <= bound) and np.all(np.abs(fused - exact) <= bound)
    assert np.array_equal(fused, elementwise.layer_norm(x, w, b, eps))
    counted = []
    for norm in (FUSED.layer_norm, ops.layer_norm):  # counted once, in ops, whichever ran: the same count
        with meter.Meter() as m:
            norm(x, w, b, eps)
        counted.append([(s.ops, s.bytes) for s in m.steps])
    assert counted[0] == counted[1] and sum(s.ops["layer_norm"]["calls"] for s in m.steps) == 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.sampled_from([1, 16, 3072]), st.sampled_from([0.1, 3.0, 100.0]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_fused_gelu_equals_numpy(N, F, spread, view, seed):
    """GPT-2's tanh GELU as x / (1 + exp(-2u)) in two vectorized passes against ops.gelu's tanh
    chain, inputs from ±0.1 to beyond exp's cap, contiguous or a strided view: both within 16
    roundings of |x| of the exact value."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((N, F + (3 if view else 0))) * spread).astype(np.float32)[:, :F]
    x64 = x.astype(np.float64)
    exact = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    bound = 16 * U * np.abs(x64) + 1e-30
    fused = FUSED.gelu(x)
    reference = ops.gelu(x)
    assert fused.shape == x.shape and fused.dtype == np.float32
    rows = np.ascontiguousarray(x)
    one, shared = np.empty_like(rows), np.empty_like(rows)
    products.K.gelu(rows, one)
    products.K.gelu_rows(rows, shared)                         # the rows among the threads: the same bits
    assert np.array_equal(one, shared) and np.array_equal(fused, one)
    assert np.all(np.abs(reference - exact) <= bound) and np.all(np.abs(fused - exact) <= bound)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 9), st.sampled_from([8, 64, 128]), st.booleans(), st.integers(0, 2**32 - 1))
def test_fused_rope_equals_numpy(G, N, hd, view, seed):
    """The rotation in one pass against ops.rope, on a contiguous array or (as the model passes it)
    a transposed view of a [N, G, hd] product: within 3 roundings of each output's terms, as the
    int8 set's, compiled in IEEE order."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, G + 1, hd)).astype(np.float32)[:, :G].transpose(1, 0, 2) if view else \
        rng.standard_normal((G, N, hd)).astype(np.float32)
    ang = rng.uniform(0, 100, (N, hd // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = x[..., :hd // 2].astype(np.float64), x[..., hd // 2:].astype(np.float64)
    c, s = cos.astype(np.float64), sin.astype(np.float64)
    exact = np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    bound = 3 * U * np.concatenate([np.abs(a * c) + np.abs(b * s), np.abs(b * c) + np.abs(a * s)], axis=-1) + 1e-30
    fused = FUSED.rope(x, cos, sin)
    reference = ops.rope(x, cos, sin)
    assert np.all(np.abs(reference - exact) <= bound) and np.all(np.abs(fused - exact) <= bound)
    assert np.all(np.abs(elementwise.rope(x, cos, sin, kernel=_exact.rope) - exact) <= bound)


# -- attention -------------------------------------------------------------------------------------

def attention_bound(q, k, v, keys: int) -> float:
    """The most float32 rounding may move an attention output: the scores' error (hd terms of
    |q|·|k|, scaled) enters each weight twice (exp, normalisation), then a sum of `keys` values."""
    hd = q.shape[-1]
    g = q.shape[0] // k.shape[0]
    qa = np.abs(q.astype(np.float64)).reshape(k.shape[0], -1, hd)
    s_abs = float((qa @ np.abs(k.astype(np.float64)).transpose(0, 2, 1)).max()) / math.sqrt(hd)
    return 4 * float(np.abs(v).max()) * (2 * (hd + 4) * U * s_abs + (keys + 16) * U) + 1e-30 * g


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 300), st.integers(0, 150),
       st.sampled_from([7, 8, 16, 64]), st.sampled_from([0.3, 1.0, 4.0]), st.integers(0, 2**32 - 1))
def test_fused_attention_equals_numpy(Hkv, g, Tq, past, hd, spread, seed):
    """Causal GQA attention, prefill (Tq > 1: flash tiles across query and key tile edges, four
    rows at a time through the diagonal, an odd last key or lane) and decode (Tq = 1: the one-thread
    kernel, up to SHORT_DECODE keys), peaky scores included (spread)."""
    rng = np.random.default_rng(seed)
    H, Tk = g * Hkv, Tq + past
    q = (rng.standard_normal((H, Tq, hd)) * spread).astype(np.float32)
    k = (rng.standard_normal((Hkv, Tk, hd)) * spread).astype(np.float32)
    v = rng.standard_normal((Hkv, Tk, hd)).astype(np.float32)
    exact = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    bound = attention_bound(q, k, v, Tk)
    assert np.abs(ops.attention(q, k, v) - exact).max() <= bound
    fused, copied = kernels.attention(q, k, v)
    assert fused.shape == q.shape and fused.dtype == np.float32 and copied == 0
    assert np.abs(fused - exact).max() <= bound


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 2), st.integers(2, 200), st.integers(0, 40), st.sampled_from([7, 64]),
       st.data())
def test_fused_attention_keeps_a_later_nan_out_of_earlier_rows(Hkv, g, Tq, past, hd, data):
    """A NaN in one position's key and value reaches the rows at and after it, never one before it:
    on the diagonal tile four rows score the keys the fourth sees, but each weighs and sums only its
    own (a weight of 0 times NaN would be NaN)."""
    Tk = Tq + past
    p = data.draw(st.integers(past, Tk - 1), label="position of the NaN")
    rng = np.random.default_rng(Tk * 131 + p)
    q = rng.standard_normal((g * Hkv, Tq, hd)).astype(np.float32)
    k, v = rng.standard_normal((2, Hkv, Tk, hd)).astype(np.float32)
    k[:, p], v[:, p] = np.nan, np.nan
    out = kernels.attention(q, k, v)[0]
    i = p - past                                                  # the query at position p
    assert np.isfinite(out[:, :i]).all() and np.isnan(out[:, i:]).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 255, 256, 257, 700]), st.sampled_from([0, 9, -1]),
       st.sampled_from([8, 64]), st.integers(0, 2**32 - 1))
def test_fused_decode_over_a_caches_whole_arrays(Hkv, g, Tk, spare, hd, seed):
    """One query over the first Tk rows of arrays holding `spare` more (a cache's `read_rows`), on
    both sides of SHORT_DECODE (the one-thread kernel, then the split one, over rows seen as pages of
    16 when they divide, -1 here, else as one page): the rows past Tk never count."""
    spare = (-Tk) % 16 + 16 if spare < 0 else spare
    rng = np.random.default_rng(seed)
    H = g * Hkv
    q = rng.standard_normal((H, 1, hd)).astype(np.float32)
    k, v = rng.standard_normal((2, Hkv, Tk + spare, hd)).astype(np.float32)
    k[:, Tk:], v[:, Tk:] = 1e4, np.nan                       # rows past Tk: any of them read shows
    kt, vt = k[:, :Tk].astype(np.float64), v[:, :Tk].astype(np.float64)
    exact = ops.attention(q.astype(np.float64), kt, vt)
    fused = kernels.attention(q, k, v, Tk)[0]
    assert np.abs(fused - exact).max() <= attention_bound(q, k[:, :Tk], v[:, :Tk], Tk)


@st.composite
def paged_batches(draw):
    """A pool of shuffled blocks and B sequences holding random, distinct blocks of it."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    Hkv, g, hd = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.sampled_from([8, 24, 64]))
    bs = draw(st.sampled_from([1, 4, 16]))
    lengths = np.array(draw(st.lists(st.integers(1, 300), min_size=1, max_size=6)), np.intp)
    need = -(-lengths // bs)
    n_blocks = int(need.sum()) + draw(st.integers(0, 5))
    order = rng.permutation(n_blocks)
    nb = int(need.max())
    table = np.zeros((len(lengths), nb), np.intp)
    at = 0
    for i, n in enumerate(need):
        table[i, :n] = order[at:at + n]
        table[i, n:] = order[at]                    # padded as BatchedDecode pads: its own first block
        at += n
    kp = rng.standard_normal((Hkv, n_blocks, bs, hd)).astype(np.float32)
    vp = rng.standard_normal((Hkv, n_blocks, bs, hd)).astype(np.float32)
    q = rng.standard_normal((g * Hkv, len(lengths), hd)).astype(np.float32)
    return q, kp, vp, table, lengths


def batched_decode_reference(q, kp, vp, table, lengths):
    """What plan.BatchedDecode does: gather every sequence's blocks, pad, mask, ops.decode_attention."""
    Hkv, _, bs, hd = kp.shape
    B, nb = table.shape
    T = nb * bs
    k = np.take(kp, table, axis=1).reshape(Hkv, B, T, hd)
    v = np.take(vp, table, axis=1).reshape(Hkv, B, T, hd)
    mask = np.where(np.arange(T)[None, :] < lengths[:, None], 0.0, -np.inf).astype(q.dtype)[:, None, :]
    return ops.decode_attention(q, k, v, mask, lengths)


@settings(max_examples=60, deadline=None)
@given(paged_batches(), st.sampled_from([None, 1, 3]))
def test_fused_paged_decode_equals_batched_decode(batch, chunk_blocks):
    q, kp, vp, table, lengths = batch
    exact = batched_decode_reference(*(a.astype(np.float64) if a.dtype == np.float32 else a
                                       for a in (q, kp, vp, table, lengths)))
    bound = attention_bound(q, kp.reshape(kp.shape[0], -1, kp.shape[-1]), vp, int(lengths.max()))
    assert np.abs(batched_decode_reference(q, kp, vp, table, lengths) - exact).max() <= bound
    from minillm.kernels import products
    keep = products.DECODE_CHUNK
    try:   # small chunks: FlashDecoding's split and combine on every sequence longer than a chunk
        if chunk_blocks is not None:
            products.DECODE_CHUNK = chunk_blocks * kp.shape[2]
        fused = kernels.paged_decode_attention(q, kp, vp, table, lengths)
    finally:
        products.DECODE_CHUNK = keep
    assert np.abs(fused - exact).max() <= bound


@settings(max_examples=60, deadline=None)
@given(paged_batches(), st.sampled_from([1, 3, 16]))
def test_fixed_chunk_paged_decode_in_ieee_order_equals_batched_decode(batch, chunk_blocks):
    """A fixed chunk (the int8 set's): kernels/_exact.py's kernel, without fastmath, each score summed in
    16 lanes and a fixed tree (a head width of 8: in order; 24: a vector and 8 in order), within the
    same bound of the exact value as the fastmath kernel, split and combined or not."""
    q, kp, vp, table, lengths = batch
    exact = batched_decode_reference(*(a.astype(np.float64) if a.dtype == np.float32 else a
                                       for a in (q, kp, vp, table, lengths)))
    bound = attention_bound(q, kp.reshape(kp.shape[0], -1, kp.shape[-1]), vp, int(lengths.max()))
    got = products.paged_decode_attention(q, kp, vp, table, lengths, chunk=chunk_blocks * kp.shape[2])
    assert np.abs(got - exact).max() <= bound


@pytest.mark.parametrize("hd", [8, 24, 64])
def test_the_fixed_chunk_kernel_reads_nothing_past_its_pools(hd):
    """kernels/_exact.py's attention loads 16 floats at a time by hand (numba's bounds checks cannot
    see them): the pools, q and the tables end at an unreadable page, the last key read is the pool's
    last row, split in chunks and not; a read past any of them would kill the process. The bits are
    those of the same arrays anywhere else."""
    from guard_pages import guarded
    rng = np.random.default_rng(hd)
    Hkv, g, bs, n_blocks = 2, 3, 4, 9
    kp, vp = rng.standard_normal((2, Hkv, n_blocks, bs, hd)).astype(np.float32)
    q = rng.standard_normal((g * Hkv, 2, hd)).astype(np.float32)
    table = np.array([[8, 0, 1, 2, 3, 4, 5, 6], [7, 8, 0, 0, 0, 0, 0, 0]], np.intp)   # both end in block 8
    lengths = np.array([32, 8], np.intp)
    for chunk in (4, 8, 256):
        want = products.paged_decode_attention(q, kp, vp, table, lengths, chunk=chunk)
        with guarded() as gp:
            got = products.paged_decode_attention(gp.place(q), gp.place(kp), gp.place(vp), gp.place(table),
                                                  gp.place(lengths), chunk=chunk)
        assert np.array_equal(got, want)


def test_paged_decode_over_a_real_pool_equals_the_plan():
    """Through cache/paged.py and plan.BatchedDecode: the fused kernel over the pool the engine fills
    gives what the plan's gather and decode_attention give."""
    from minillm.cache.paged import PagedKVPool
    from minillm.models.llama import LlamaConfig
    from minillm.models.plan import BatchedDecode
    cfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, head_dim=16, n_embd=64, n_ctx=256, vocab_size=16, ffn=32)
    pool = PagedKVPool(cfg, num_blocks=40, block_size=4)
    rng = np.random.default_rng(1)
    caches = []
    for n in (5, 17, 1, 30):
        c = pool.sequence()
        c.reserve(n + 1)
        for layer in range(cfg.n_layer):
            c.write(layer, 0, *(rng.standard_normal((2, cfg.n_kv_head, n, cfg.head_dim)).astype(np.float32)))
        c.advance(n)
        caches.append(c)
    plan = BatchedDecode(pool, caches)
    q = rng.standard_normal((cfg.n_head, len(caches), cfg.head_dim)).astype(np.float32)
    knew, vnew = rng.standard_normal((2, cfg.n_kv_head, len(caches), cfg.head_dim)).astype(np.float32)
    want = plan.attend(1, q, knew, vnew)                       # writes the new keys, gathers, attends
    got = kernels.paged_decode_attention(q, pool.k[1], pool.v[1], plan.table, plan.lengths)
    assert np.abs(got - want).max() <= attention_bound(q, pool.k[1].reshape(2, -1, cfg.head_dim), pool.v[1], 31)


# -- the meter and the interface -------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_fused_counts_read_the_blocks_once_and_no_scratch(fmt):
    rng = np.random.default_rng(0)
    w = FusedQuant.of(QuantMatrix.quantize(rng.standard_normal((48, 96)).astype(np.float32), fmt))
    R, C = w.shape
    for T in range(1, FUSED_ROWS + 1):
        c = w.counts(T)
        groups = T // 4 + (T % 4 >= 2)                          # four or two rows of x at a time
        one = T % 2                                              # then one row
        per_block = {"q8_0": 4, "q4_0": 5, "q4_1": 8}[fmt]      # the scales (and minimums) widened
        assert c["weights"] == w.nbytes and c["scratch"] == 0
        if fmt == "q8_0":                                        # cast and scale, per value and pass
            assert c["dequant"] == (groups + one) * R * C * 2 + R * C // QK * per_block
        else:                   # many rows: 4 per value; one row: 4 per byte, 2 per block
            assert c["dequant"] == (groups * R * C * 4 + one * (4 * R * C // 2 + 2 * R * C // QK)
                                    + R * C // QK * per_block)
    T = FUSED_ROWS + 1                                        # a prefill: widened as QuantMatrix does
    assert w.counts(T) == QuantMatrix.counts(w, T)
    x = rng.standard_normal((2, C)).astype(np.float32)
    with meter.Meter() as m:
        ops.linear(x, w)                                       # as any weight: its own counts
    rec = m.steps[-1]
    assert rec.scratch == 0 and rec.bytes["weights"] == w.nbytes


def test_status_says_why_not(monkeypatch):
    from minillm.kernels import runtime as st_mod
    monkeypatch.setitem(sys.modules, "numba", None)           # `import numba` raises ImportError
    st = st_mod.status.__wrapped__()
    assert not st.usable and "numba is not installed" in st.reason
    assert kernels.status().usable and kernels.status().reason.startswith("numba ")


@pytest.mark.parametrize("Tq,Tk", [(1, 37), (5, 5), (40, 100)])
def test_fused_attention_counts_no_scores(Tq, Tk):
    """The meter for fused attention (the fused set's, counted in ops): q and the output only (no score
    bytes), 4·hd FLOPs per pair a query may see, counted here from the causal mask itself."""
    rng = np.random.default_rng(0)
    H, Hkv, hd = 6, 2, 16
    q = rng.standard_normal((H, Tq, hd)).astype(np.float32)
    k, v = rng.standard_normal((2, Hkv, Tk, hd)).astype(np.float32)
    with meter.Meter() as m:
        out = FUSED.attention(q, k, v)
    rec = m.steps[-1]
    pairs = int(np.isfinite(ops.causal_mask(Tq, Tk, np.float32)).sum())
    assert rec.bytes["activations"] == q.nbytes + out.nbytes and rec.bytes["kv_read"] == 0
    assert rec.flops["attention"] == 4 * H * pairs * hd and rec.flops["other"] == q.size + 5 * H * pairs


def test_fused_paged_decode_counts_the_real_keys():
    rng = np.random.default_rng(0)
    kp, vp = rng.standard_normal((2, 2, 10, 4, 8)).astype(np.float32)       # [Hkv, blocks, bs, hd]
    q = rng.standard_normal((4, 3, 8)).astype(np.float32)
    table, lengths = np.array([[3, 1, 0], [2, 2, 2], [4, 5, 6]]), np.array([9, 2, 12])
    with meter.Meter() as m:
        FUSED.paged_decode(q, kp, vp, table, lengths)
    rec = m.steps[-1]
    assert rec.bytes["kv_read"] == 2 * 2 * 23 * 8 * 4 and rec.flops["attention"] == 4 * 4 * 23 * 8


def test_fused_kernels_refuse_what_they_cannot_compute():
    """float64 goes to the NumPy path (the classes route it there; the functions say so), and a
    page table that does not hold a sequence's keys is one clear error, not garbage."""
    rng = np.random.default_rng(0)
    w = FusedQuant.of(QuantMatrix.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q8_0"))
    x64 = rng.standard_normal((2, 64))
    assert w.matmul(x64).dtype == np.float64                     # NumPy's product, in float64
    with pytest.raises(TypeError, match="float32"):
        kernels.quant_matmul_t(w.planes, x64)
    q = rng.standard_normal((2, 1, 8)).astype(np.float32)
    kp = np.zeros((1, 3, 4, 8), np.float32)
    with pytest.raises(ValueError, match="paged decode"):
        kernels.paged_decode_attention(q, kp, kp, np.array([[0, 1]]), np.array([9]))
    with pytest.raises(ValueError, match="paged decode"):
        kernels.paged_decode_attention(q, kp, kp, np.array([[0, 1]]), np.array([0]))


def test_fuse_picks_the_fused_implementation_where_there_is_one():
    rng = np.random.default_rng(0)
    qm = QuantMatrix.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q4_1")
    fq = fuse(qm)
    assert isinstance(fq, FusedQuant) and np.array_equal(fq.q, qm.q) and fuse(fq) is fq
    assert fq.q is fq.planes[0]                                                       # held once: the planes
    assert np.shares_memory(fq.d, fq.planes[1]) and np.shares_memory(fq.m, fq.planes[2])
    assert all(is_aligned(p) for p in fq.planes)                                      # on 64-byte boundaries
    W = rng.standard_normal((64, 8)).astype(np.float32)
    fd = fuse(Dense(W))
    assert isinstance(fd, FusedDense) and isinstance(fd, Dense) and (fd.n_in, fd.n_out) == (64, 8)
    assert is_aligned(fd.wt)
    Wt = aligned(np.ascontiguousarray(W.T))
    assert np.shares_memory(fuse(Dense(Wt.T)).wt, Wt)              # [out, in] rows on a boundary kept, no copy
    other = Dense(W.astype(np.float64))
    assert fuse(other) is other


def test_fused_attention_reads_a_cache_slice_in_place_and_counts_a_copy():
    """A KV cache's read (the first t rows of each head of a larger array) goes to the kernel as it is,
    no copy; a view the kernel cannot take in place (rows not contiguous) is copied, and the meter
    counts that copy (written, then read). Both give the contiguous keys' result."""
    rng = np.random.default_rng(3)
    H, Hkv, hd, t = 4, 2, 16, 30
    big = rng.standard_normal((2, Hkv, 50, hd)).astype(np.float32)         # [K|V, Hkv, n_ctx, hd]
    k, v = big[0, :, :t], big[1, :, :t]
    q = rng.standard_normal((H, 5, hd)).astype(np.float32)
    for Tq in (5, 1):
        want = kernels.attention(q[:, :Tq], np.ascontiguousarray(k), np.ascontiguousarray(v))[0]
        with meter.Meter() as m:
            got = FUSED.attention(q[:, :Tq], k, v)
        assert m.steps[-1].bytes["activations"] == q[:, :Tq].nbytes + got.nbytes
        assert np.array_equal(got, want)
    strided = np.ascontiguousarray(big[:, :, :2 * t])[:, :, ::2]         # every other position: no row view
    with meter.Meter() as m:
        FUSED.attention(q, strided[0], strided[1])
    assert m.steps[-1].bytes["activations"] == 2 * q.nbytes + 2 * 2 * strided[0].nbytes


EXTREMES = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 1.0, -1.0, -9.0, -10.0, -10.5, -30.0, -1e19, -1e37, -1e38,
            -3.4028235e38, 1e19, 1e37, 3.4028235e38, float("inf"), float("-inf")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(EXTREMES), st.floats(width=32, allow_nan=False)), min_size=1, max_size=40))
def test_fused_gelu_equals_numpy_at_extreme_values(values):
    """Every float32 (subnormals, ±3.4e38, ±inf): the fused GELU within 16 roundings of NumPy's
    result or of 1 (whichever is larger), NaN where NumPy's is NaN (-inf), and negative or -0 where
    NumPy's is -0 (x below about -5: the exact value is below 1e-10): for x <= -1e37 the fused kernel
    gave -0.06 to -2.06."""
    x = np.array(values + EXTREMES, np.float32)[None, :]
    with np.errstate(all="ignore"):
        ref = ops.gelu(x.copy())
    fused = FUSED.gelu(x)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(fused), nan), (x[np.isnan(fused) != nan], fused[np.isnan(fused) != nan])
    r, f = ref[~nan].astype(np.float64), fused[~nan].astype(np.float64)
    with np.errstate(all="ignore"):
        bad = ~((r == f) | (np.abs(f - r) <= 16 * U * np.maximum(np.abs(r), 1.0)))
    assert not bad.any(), (x[~nan][bad], f[bad], r[bad])
    neg_zero = (r == 0) & np.signbit(r) & (x[~nan] < -1)
    assert (f[neg_zero] <= 0).all() and np.signbit(f[neg_zero]).all(), (x[~nan][neg_zero], f[neg_zero])
    shared = np.empty_like(x)
    products.K.gelu_rows(x, shared)                            # the rows among the threads: the same bits
    assert np.array_equal(shared, fused, equal_nan=True)


WIDTH_SCRIPT = r"""
import os, re
before = os.environ.get("NUMBA_CPU_FEATURES")
import numpy as np
FIRST
from numba import njit
from minillm.kernels import _numba as K
f = njit(parallel=True, fastmath=K.FAST)(K.dense_matmul_t.py_func)    # compiled here, not from the cache
f(np.ones((64, 768), np.float32), np.ones((1, 768), np.float32), np.empty((1, 64), np.float32))
asm = f.inspect_asm(f.signatures[0])
print(len(re.findall(r"vfmadd\w+\s+[^\n]*zmm", asm)), before == os.environ.get("NUMBA_CPU_FEATURES"))
"""


def test_the_fused_products_run_512_bits_wide_where_the_cpu_has_avx512():
    """LLVM tunes Intel's AVX-512 CPUs to 256-bit vectors ("prefer-256-bit"); kernels/runtime.py lifts
    that before numba compiles, so the float32 product multiplies in zmm registers here as on Zen 4;
    a NUMBA_CPU_FEATURES of the user's is left as given."""
    import os
    import subprocess
    llvm = pytest.importorskip("llvmlite.binding")
    features = llvm.get_host_cpu_features()
    if not features.get("avx512f"):
        pytest.skip("this CPU has no AVX-512")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")}
    for first in ("import minillm.kernels.runtime", "import numba"):        # numba imported before minillm too
        r = subprocess.run([sys.executable, "-c", WIDTH_SCRIPT.replace("FIRST", first)], capture_output=True,
                           text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        zmm, _ = r.stdout.split()
        assert int(zmm) > 0, (first, r.stdout)
    own = features.flatten()
    r = subprocess.run([sys.executable, "-c", WIDTH_SCRIPT.replace("FIRST", "")], capture_output=True, text=True,
                       env=env | {"NUMBA_CPU_FEATURES": own}, timeout=600)
    assert r.returncode == 0 and r.stdout.split()[1] == "True", (r.stdout, r.stderr[-3000:])


@pytest.mark.parametrize("name,ahead", [("znver3", False), ("znver4", False), ("emeraldrapids", True),
                                        ("skylake-avx512", True), ("generic", True)])
def test_the_float_row_form_asks_for_bytes_ahead_on_the_cpus_where_it_measured_faster(monkeypatch, name, ahead):
    """kernels/_numba.py's row form prefetches the weight bytes ahead on Intel's CPUs (faster on a Xeon)
    and not on AMD's Zen (slower on a Zen 3), decided by the CPU numba compiles for."""
    pytest.importorskip("numba")
    from minillm.kernels import _numba as K
    monkeypatch.setenv("NUMBA_CPU_NAME", name)
    assert K._rows_ahead() is ahead


def test_the_float_tiles_bench_explains_itself_and_refuses_bad_input():
    """benchmarks/float_tiles.py (the float32 product's forms side by side, 498 MB of weights: a command,
    not a test) says what it times, and a bad batch list is one line, not a traceback."""
    import subprocess
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "float_tiles.py"
    r = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "6x4" in r.stdout and "BLOCKED_FROM" in r.stdout
    for bad in ("0", "4,x", "2305843009213693952"):           # 2**61 rows: refused before any array
        r = subprocess.run([sys.executable, str(path), "--batch", bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "--batch" in r.stderr and "Traceback" not in r.stderr, r.stderr
