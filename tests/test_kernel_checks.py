"""Issue 43, item 2: the kernels check what they are handed. Every public kernel function and fused
weight is called with each kind of inconsistent argument (x narrower or wider than the weight,
planes that disagree, H not a multiple of Hkv, H < Hkv, no KV head, a k or v head size unlike q's,
too few key rows, a short norm weight, short or narrow rotation tables, an odd head size or SwiGLU
width, block ids past the pool or negative, lengths past a table row, a batch of 0): each is one
ValueError, the class NumPy's path (models/ops.py) raises for the same arrays where it raises; and
a matrix with NaN or infinite scales is refused when it is made.

The same cases, and valid edge shapes checked against NumPy, run again in a subprocess with
NUMBA_BOUNDSCHECK=1 (a fresh cache, so every kernel compiles with the checks): a kernel that read
past an array would raise IndexError there instead of passing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minillm import kernels
from minillm.errors import WeightsError
from minillm.models import ops
from minillm.models.quant import QuantMatrix

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"fused kernels: {kernels.status().reason}")
if kernels.available():
    from minillm.kernels import batch_invariant, elementwise, products
    from minillm.models.fused import FusedDense, FusedQuant, fuse

REPO = Path(__file__).resolve().parents[1]
rng = np.random.default_rng(43)


def f32(*shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def quant(fmt: str, R: int = 8, C: int = 64) -> QuantMatrix:
    return QuantMatrix.quantize(f32(R, C), fmt)


def planes(fmt: str) -> tuple:
    w = quant(fmt)
    return kernels.planes(w.q, w.d, w.m)


# -- each case: (the kernel's call, NumPy's call of the same arrays or None) ---------------------------

def attention_cases() -> dict:
    q, k = f32(4, 3, 8), f32(2, 5, 8)
    return {
        "H not a multiple of Hkv": ((f32(3, 3, 8), k, k, None), True),
        "H < Hkv": ((f32(1, 3, 8), k, k, None), True),
        "no KV head": ((q, f32(0, 5, 8), f32(0, 5, 8), None), False),
        "k head size narrower": ((q, f32(2, 5, 4), k, None), True),
        "v head size narrower": ((q, k, f32(2, 5, 4), None), False),   # NumPy: latent attention's narrower values
        "v fewer heads": ((q, k, f32(1, 5, 8), None), False),          # NumPy broadcasts it
        "v fewer rows than Tk": ((q, k, f32(2, 4, 8), 5), True),
        "Tk past the rows": ((q, k, k, 6), True),
        "Tk under Tq": ((q, k, k, 2), False),
        "q of 2 dimensions": ((f32(4, 8), k, k, None), True),
    }


ATTN = attention_cases()


def paged_args(**change):
    a = {"q": f32(4, 2, 8), "kp": f32(2, 6, 4, 8), "vp": None, "table": np.array([[0, 1], [2, 3]]),
         "lengths": np.array([5, 8])}
    a.update(change)
    a["vp"] = a["kp"] if a["vp"] is None else a["vp"]
    return a["q"], a["kp"], a["vp"], a["table"], a["lengths"]


PAGED = {
    "a block id of 10^9": paged_args(table=np.array([[0, 10 ** 9], [2, 3]])),
    "a negative block id": paged_args(table=np.array([[0, 1], [-1, 3]])),
    "a block id one past the pool": paged_args(table=np.array([[0, 6], [2, 3]])),
    "a length of 0": paged_args(lengths=np.array([0, 8])),
    "a length past its table row": paged_args(lengths=np.array([5, 9])),
    "lengths of another batch": paged_args(lengths=np.array([5, 8, 1])),
    "a table of another batch": paged_args(table=np.array([[0, 1]])),
    "a table of 1 dimension": paged_args(table=np.array([0, 1])),
    "pools of two shapes": paged_args(vp=f32(2, 6, 4, 4)),
    "a head size unlike q's": paged_args(kp=f32(2, 6, 4, 4)),
    "H not a multiple of Hkv": paged_args(q=f32(3, 2, 8)),
    "H < Hkv": paged_args(q=f32(1, 2, 8)),
    "a batch of 0": paged_args(q=f32(4, 0, 8), table=np.zeros((0, 2), int), lengths=np.zeros(0, int)),
}


def test_attention_refuses_each_inconsistent_shape():
    for name, (args, numpy_raises) in ATTN.items():
        for kernel in (products.attention, batch_invariant.attention):
            with pytest.raises(ValueError) as e:
                kernel(*args)
            assert "\n" not in str(e.value), name
        if numpy_raises:
            with pytest.raises(ValueError):
                ops.attention(*args)


@pytest.mark.parametrize("name", list(PAGED))
def test_paged_decode_refuses_each_inconsistent_argument(name):
    with pytest.raises(ValueError, match="paged decode"):
        products.paged_decode_attention(*PAGED[name])


def test_decode_chunk_refuses_a_count_of_zero():
    for args in ((100, 0, 2, 16), (100, 2, 0, 16), (100, 2, 2, 0), (0, 2, 2, 16)):
        with pytest.raises(ValueError, match="at least 1"):
            products.decode_chunk(*args)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_quantized_product_refuses_each_inconsistent_argument(fmt):
    p = planes(fmt)
    q, d = p[0], p[1]
    bad = {"x narrower": (p, f32(2, 32)), "x wider": (p, f32(2, 96)), "x of 1 dimension": (p, f32(64)),
           "q a column short": ((q[:, :-1], *p[1:]), f32(2, 64)), "d a row short": ((q, d[:-1], *p[2:]), f32(2, 64)),
           "q of another type": ((q.view(np.uint8) if q.dtype == np.int8 else q.view(np.int8), *p[1:]), f32(2, 64)),
           "four planes": ((*p, d, d)[:4], f32(2, 64))}
    if len(p) == 3:
        bad["minimums of another shape"] = ((q, d, d[:, :1]), f32(2, 64))
    for name, (pl, x) in bad.items():
        with pytest.raises(ValueError):
            products.quant_matmul_t(pl, x)
    w = FusedQuant.of(quant(fmt))
    for x in (f32(2, 32), f32(2, 96), f32(40, 32), f32(40, 96)):          # the fused rows, and the NumPy path's
        with pytest.raises(ValueError):
            w.matmul(x)
        with pytest.raises(ValueError):
            quant(fmt).matmul(x)


def test_dense_product_refuses_each_inconsistent_argument():
    wt = f32(8, 64)
    for x in (f32(2, 63), f32(2, 65), f32(64)):
        with pytest.raises(ValueError):
            products.dense_matmul_t(wt, x)
    with pytest.raises(ValueError):
        products.dense_matmul_t(f32(64), f32(2, 64))
    w = FusedDense(f32(64, 8))
    for x in (f32(1, 63), f32(4, 65), f32(20, 63), f32(100, 65)):           # fused rows, and BLAS's
        with pytest.raises(ValueError):
            w.matmul(x)
    for x in (f32(2, 63), f32(2, 65)):
        with pytest.raises(ValueError):
            batch_invariant.matmul(x, np.ascontiguousarray(f32(64, 8)))


def test_elementwise_kernels_refuse_each_inconsistent_shape():
    x = f32(3, 4, 8)
    cases = [(elementwise.rms_norm, ops.rms_norm, (x, f32(7), 1e-5)),
             (elementwise.rms_norm, ops.rms_norm, (x, f32(9), 1e-5)),
             (elementwise.rms_norm, ops.rms_norm, (x, f32(2, 8), 1e-5)),
             (elementwise.rope, ops.rope, (x, f32(3, 4), f32(3, 4))),                 # a row short
             (elementwise.rope, ops.rope, (x, f32(4, 3), f32(4, 3))),                 # narrow
             (elementwise.rope, ops.rope, (x, f32(4, 4), f32(4, 3))),
             (elementwise.rope, ops.rope, (f32(3, 4, 7), f32(4, 3), f32(4, 3))),      # odd head size
             (elementwise.rope, None, (f32(4, 8), f32(4, 4), f32(4, 4))),
             (elementwise.swiglu, ops.swiglu, (f32(3, 7),)),
             (elementwise.swiglu, None, (f32(8),)),
             (elementwise.layer_norm, ops.layer_norm, (x, f32(7), f32(8), 1e-5)),     # a short weight
             (elementwise.layer_norm, ops.layer_norm, (x, f32(8), f32(9), 1e-5)),     # a long bias
             (elementwise.layer_norm, None, (x, f32(2, 8), f32(8), 1e-5)),
             (elementwise.gelu, None, (f32(3, 0),)),
             (elementwise.gelu, None, (np.float32(1.0),))]
    for kernel, reference, args in cases:
        with pytest.raises(ValueError):
            kernel(*args)
        if reference is not None:
            with pytest.raises(ValueError):
                reference(*args)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_a_matrix_with_nan_or_infinite_scales_is_refused_when_made(fmt):
    w = quant(fmt)
    for plane in ("d", "m") if w.m is not None else ("d",):
        for value in (np.nan, np.inf, -np.inf):
            d, m = w.d.copy(), None if w.m is None else w.m.copy()
            (d if plane == "d" else m)[3, 1] = value
            with pytest.raises(WeightsError, match="NaN or infinite"):
                QuantMatrix(w.fmt, w.q, d, m)
            with pytest.raises(WeightsError, match="NaN or infinite"):
                FusedQuant(w.fmt, w.q, d, m)
    with pytest.raises(WeightsError, match="needs q"):
        QuantMatrix(w.fmt, w.q[:, :-1], w.d, w.m)
    with pytest.raises(WeightsError, match="needs q"):
        QuantMatrix(w.fmt, w.q, w.d.astype(np.float32), w.m)
    assert isinstance(fuse(w), FusedQuant)


# -- valid edge shapes equal NumPy (under NUMBA_BOUNDSCHECK=1: no read past an array) ----------------

def test_valid_edge_shapes_equal_numpy():
    for T in (1, 2, 3, 5, 7):
        for fmt in ("q8_0", "q4_0", "q4_1"):
            w = quant(fmt, R=17, C=96)
            x = f32(T, 96)
            np.testing.assert_allclose(products.quant_matmul_t(kernels.planes(w.q, w.d, w.m), x), w.matmul(x),
                                       rtol=1e-4, atol=1e-4)
        wt, x = f32(17, 40), f32(T, 40)
        np.testing.assert_allclose(products.dense_matmul_t(wt, x), x @ wt.T, rtol=1e-4, atol=1e-4)
    for H, Hkv, Tq, Tk, rows in ((4, 2, 1, 7, 9), (4, 4, 3, 3, 3), (6, 2, 5, 70, 80), (2, 1, 1, 300, 320),
                                 (3, 1, 33, 40, 40)):
        q, k, v = f32(H, Tq, 16), f32(Hkv, rows, 16), f32(Hkv, rows, 16)
        want = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), Tk)
        for kernel in (products.attention, batch_invariant.attention):
            np.testing.assert_allclose(kernel(q, k, v, Tk)[0], want, rtol=1e-4, atol=1e-4)
    q, kp = f32(4, 3, 8), f32(2, 7, 4, 8)
    table, lengths = np.array([[6, 0, 1], [2, 2, 2], [5, 4, 3]]), np.array([9, 1, 12])
    out = products.paged_decode_attention(q, kp, kp, table, lengths)
    for b in range(3):
        keys = np.concatenate([kp[:, blk] for blk in table[b]], axis=1)[:, :lengths[b]]    # [Hkv, len, hd]
        np.testing.assert_allclose(out[:, b:b + 1], ops.attention(q[:, b:b + 1], keys, keys), rtol=1e-4, atol=1e-5)
    x, w = f32(2, 3, 10), f32(10)
    np.testing.assert_allclose(elementwise.rms_norm(x, w, 1e-5), ops.rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    xr, c, s = f32(2, 5, 6), f32(5, 3), f32(5, 3)
    np.testing.assert_allclose(elementwise.rope(xr, c, s), ops.rope(xr, c, s), rtol=1e-5, atol=1e-6)
    h = f32(3, 10)
    np.testing.assert_allclose(elementwise.swiglu(h), ops.swiglu(h), rtol=1e-4, atol=1e-6)
    b = f32(10)
    np.testing.assert_allclose(elementwise.layer_norm(x, w, b, 1e-5), ops.layer_norm(x, w, b, 1e-5), rtol=1e-5,
                               atol=1e-5)
    for g in (f32(1, 1), f32(3, 10), f32(2, 3, 7)):
        np.testing.assert_allclose(elementwise.gelu(g), ops.gelu(g), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_every_case_again_with_numba_checking_every_index(tmp_path):
    """The whole file but this test, with numba's bounds checking on and its own compile cache."""
    env = dict(os.environ) | {"NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(__file__)),
                        "-k", "not numba_checking"], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "IndexError" not in r.stdout


def test_a_read_only_table_is_checked_once_and_still_refused_when_bad():
    """A step's read-only table and lengths (models/plan.py's BatchedDecode) have their maxima kept
    after the first check: a bad one is refused at the first call and at every later one, and a
    writeable pair is checked whole each time."""
    from minillm.kernels import checks
    q = np.zeros((4, 2, 8), np.float32)
    pool = np.zeros((2, 3, 4, 8), np.float32)
    bad = np.array([[0, 1], [2, 3]], np.intp)          # block 3 of a pool of 3
    lengths = np.array([5, 6], np.intp)
    bad.flags.writeable = lengths.flags.writeable = False
    for _ in range(2):
        with pytest.raises(ValueError, match="block ids"):
            checks.paged(q, pool, pool, bad, lengths)
    good = np.array([[0, 1], [2, 0]], np.intp)
    good.flags.writeable = False
    for _ in range(2):
        assert checks.paged(q, pool, pool, good, lengths)[0] is good
    with pytest.raises(ValueError, match="lengths"):                    # the same table, a pool of 1 row a block
        checks.paged(q, pool[:, :, :1], pool[:, :, :1], good, lengths)
    mutable, n = np.array([[0, 1], [2, 0]], np.intp), np.array([5, 6], np.intp)
    checks.paged(q, pool, pool, mutable, n)
    mutable[1, 1] = 7                                                  # writeable: checked again, whole
    with pytest.raises(ValueError, match="block ids"):
        checks.paged(q, pool, pool, mutable, n)
