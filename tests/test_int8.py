"""The integer kernels (minillm/kernels/int8.py, _int8.py) against their exact NumPy reference: the
rounding of x, and every product on every instruction set this CPU runs, bit for bit, over random
shapes, row counts, stored bytes, extreme and non-finite scales and activations; a row's result
alone equals the same row in a batch, exactly; the reference's error against the float product
stays within the bound its rounding allows; the refusals.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import kernels
from minillm.errors import WeightsError, MiniLLMError
from minillm.kernels import int8
from minillm.models.quant import QK, QuantMatrix

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"numba kernels: {kernels.status().reason}")

FMTS = ("q8_0", "q4_0", "q4_1")
ISAS = int8.supported()


def pl(w: QuantMatrix) -> tuple:
    """A QuantMatrix's planes, as the kernels take them."""
    return int8.planes(w.q, w.d, w.m)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, NaN where the other is NaN (a NaN's payload is the hardware's choice)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    na, nb_ = np.isnan(a), np.isnan(b)
    return bool((na == nb_).all() and np.array_equal(a[~na].view(np.uint32), b[~nb_].view(np.uint32)))


def scales(rng, n: int, kind: str) -> np.ndarray:
    """n float16 scales: ordinary, any bit pattern (subnormal to 65504, inf and NaN), or zero."""
    if kind == "zero":
        return np.zeros(n, np.float16)
    if kind == "any":
        return rng.integers(0, 1 << 16, n).astype(np.uint16).view(np.float16)
    return (rng.standard_normal(n) * 0.01).astype(np.float16)


@st.composite
def quant_matrices(draw, max_rows: int = 40, max_blocks: int = 40, finite: bool = False):
    """A QuantMatrix of random stored bytes (Q8_0's full -128..127), its scales (and minimums)
    ordinary, any float16 bits, or zero, block by block. A non-finite scale or minimum is refused
    in one line where the matrix is made (checked here each time one is drawn); then it is made
    finite, and the matrix built."""
    fmt = draw(st.sampled_from(FMTS))
    R, nb = draw(st.integers(1, max_rows)), draw(st.integers(1, max_blocks))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kinds = ["plain", "zero"] if finite else ["plain", "any", "zero"]
    pick = rng.integers(0, len(kinds), 2 * R * nb) if draw(st.booleans()) else np.zeros(2 * R * nb, int)
    table = [scales(rng, 2 * R * nb, k) for k in kinds]
    sc = np.choose(pick, table).astype(np.float16)
    d, m = sc[:R * nb].reshape(R, nb), sc[R * nb:].reshape(R, nb)
    if fmt == "q8_0":
        q = rng.integers(-128, 128, (R, nb * QK)).astype(np.int8)
    else:
        q = rng.integers(0, 256, (R, nb * QK // 2)).astype(np.uint8)
    if not (np.isfinite(d).all() and (fmt != "q4_1" or np.isfinite(m).all())):
        with pytest.raises(WeightsError, match="NaN or infinite"):
            QuantMatrix(fmt, q, d, m if fmt == "q4_1" else None)
    d, m = np.where(np.isfinite(d), d, 1), np.where(np.isfinite(m), m, 1)
    return QuantMatrix(fmt, q, d, m if fmt == "q4_1" else None)


def activations(rng, T: int, C: int, kind: str) -> np.ndarray:
    """x [T, C]: normal, wide (1e-40 to 1e38, both signs, zeros), or with inf and NaN sprinkled in."""
    x = rng.standard_normal((T, C)).astype(np.float32)
    if kind == "wide":
        x *= (10.0 ** rng.uniform(-40, 37, (T, C))).astype(np.float32)
        x[rng.random((T, C)) < 0.1] = 0
    elif kind == "nonfinite":
        x[rng.random((T, C)) < 0.02] = np.inf
        x[rng.random((T, C)) < 0.02] = -np.inf
        x[rng.random((T, C)) < 0.02] = np.nan
    return x


def unpack(xq, xd, xs, xm, nb):
    """The kernels' rounded x as the reference gives it: (q [T, nb, 32], d, s, m [T, nb])."""
    return xq.reshape(xq.shape[0], nb, QK), xd, xs, xm


rows = st.one_of(st.integers(1, 9), st.integers(30, 70))         # past the tile of 32 and 8 rows


# -- step 1: rounding x ---------------------------------------------------------------------------

@settings(max_examples=60)
@given(st.integers(1, 40), rows, st.sampled_from(["normal", "wide", "nonfinite"]), st.integers(0, 2**32 - 1))
def test_rounding_x_matches_the_reference(nb, T, kind, seed):
    x = activations(np.random.default_rng(seed), T, nb * QK, kind)
    got = int8.quantize_x(x)
    want = int8.quantize_x_ref(x)
    for g, w in zip(unpack(*got, nb), want):
        assert g.shape == w.shape and (same(g, w) if g.dtype.kind == "f" else np.array_equal(g, w))


def test_rounding_halves_to_even_and_clips():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, 1.5, -2.5]                             # d = 1: q = x rounded, halves to even
    q, d, s, m = int8.quantize_x_ref(x)
    assert d[0, 0] == 1 and q[0, 0, :4].tolist() == [127, 0, 2, -2] and s[0, 0] == 127
    got = unpack(*int8.quantize_x(x), 1)
    assert got[0][0, 0, :4].tolist() == [127, 0, 2, -2]
    x[0, 5] = np.nan                                               # a non-finite block: d NaN, q 0
    q, d, s, m = int8.quantize_x_ref(x)
    assert np.isnan(d[0, 0]) and not q.any() and s[0, 0] == 0


# -- steps 2-5: the products ------------------------------------------------------------------------

@settings(max_examples=80)
@given(quant_matrices(), rows, st.sampled_from(["normal", "wide", "nonfinite"]), st.integers(0, 2**32 - 1))
def test_every_instruction_set_equals_the_reference_bit_for_bit(w, T, kind, seed):
    x = activations(np.random.default_rng(seed), T, w.shape[1], kind)
    want = int8.matmul_ref(pl(w), x)
    for name in ISAS:
        assert same(int8.matmul(pl(w), x, name), want), name


@settings(max_examples=40)
@given(quant_matrices(max_rows=24, max_blocks=20), st.integers(2, 40), st.integers(0, 2**32 - 1))
def test_a_row_alone_equals_the_same_row_in_a_batch(w, T, seed):
    """Each row of x has its own scales and nothing is shared across rows: batched == alone exactly."""
    x = activations(np.random.default_rng(seed), T, w.shape[1], "normal")
    batch = int8.matmul(pl(w), x)
    for t in range(T):
        assert same(int8.matmul(pl(w), x[t:t + 1])[0], batch[t])


@settings(max_examples=40)
@given(quant_matrices(max_rows=30, max_blocks=24, finite=True), st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_the_error_against_the_float_product_is_within_the_roundings_bound(w, T, seed):
    """Rounding x to d·q moves each value by at most d/2, so the product moves by at most
    Σ_b (d_b/2)·Σ_k |w_k| per row, plus float32 rounding of the sums (bounded by 2^-22 per term of the
    exact sum of |w·x|, far below it here); a kernel that drops or misplaces a block is outside it."""
    rng = np.random.default_rng(seed)
    x = activations(rng, T, w.shape[1], "normal")
    W = w.dequantize().astype(np.float64)                           # [R, C], exact values
    if not np.isfinite(W).all() or np.abs(W).max() > 1e30:
        return
    exact = x.astype(np.float64) @ W.T                               # [T, R]
    _, dx, _, _ = int8.quantize_x_ref(x)                             # [T, nb]
    nb = w.shape[1] // QK
    wabs = np.abs(W).reshape(-1, nb, QK).sum(axis=2)                 # [R, nb]
    bound = (dx.astype(np.float64) / 2) @ wabs.T                     # [T, R]
    terms = np.abs(x).astype(np.float64) @ np.abs(W).T
    got = int8.matmul(pl(w), x).astype(np.float64)
    assert (np.abs(got - exact) <= bound * (1 + 1e-5) + 2.0 ** -20 * (terms + bound) + 1e-30).all()


@pytest.mark.parametrize("fmt", FMTS)
def test_shapes_of_real_models_equal_the_reference(fmt):
    """The widths of GPT-2 and SmolLM2 (768, 3072; 576, 1536), rows not a multiple of 16, for one
    row of x (a decode step's own path: the accumulator in a register) and for five."""
    rng = np.random.default_rng(0)
    for R, C in ((50, 768), (17, 3072), (40, 576), (33, 1536)):
        w = QuantMatrix.quantize(rng.standard_normal((R, C)).astype(np.float32), fmt)
        for T in (1, 5):
            x = rng.standard_normal((T, C)).astype(np.float32)
            for name in ISAS:
                assert same(int8.matmul(pl(w), x, name), int8.matmul_ref(pl(w), x)), (R, C, T, name)


@settings(max_examples=40)
@given(quant_matrices(), st.integers(0, 2**32 - 1))
def test_an_integer_weight_keeps_its_bytes_in_lane_order_and_gives_ggufs_back(w, seed):
    """Int8Quant holds its planes once, in the kernels' lane order (int8.lane_order): rows padded to
    16, row r's block j in group g = (r // 16)·nb + j, lane r % 16: its byte i at 64·(i // 4) +
    4·lane + i % 4 of the group's 16·bb (bb a block's bytes: Q8_0's 32 values, Q4's 16 bytes of
    nibbles), its scale (and minimum) at [g, lane], the padding zeros; q, d, m, rows, take_rows, the
    float product and nbytes are the QuantMatrix's own."""
    from minillm.models.int8 import Int8Quant
    rng = np.random.default_rng(seed)
    i = Int8Quant.of(w)
    R, C = w.shape
    nb = C // QK
    assert i.nbytes == w.nbytes and np.array_equal(i.q, w.q) and i.q.dtype == w.q.dtype
    assert np.array_equal(i.d, w.d) and (w.m is None) == (i.m is None) and (w.m is None or np.array_equal(i.m, w.m))
    ids = rng.integers(0, R, 5)
    assert same(i.rows(ids), w.rows(ids)) and np.array_equal(i.take_rows(ids[::-1]).q, w.q[ids[::-1]])
    lanes = i.planes[0]
    bb = 32 if w.fmt.bits == 8 else 16
    assert lanes.shape == (int8.groups(R, nb) * 16 * bb,) and lanes.dtype == w.q.dtype
    r, j = np.divmod(np.arange(R * nb)[:, None], nb)                  # every block's row and number
    g, lane, byte = r // 16 * nb + j, r % 16, np.arange(bb)[None, :]
    at = g * 16 * bb + 64 * (byte // 4) + 4 * lane + byte % 4         # its bytes, by the rule
    assert np.array_equal(lanes[at], w.q.reshape(-1, bb))
    pad = np.ones(lanes.size, bool)
    pad[at] = False
    assert not lanes[pad].any()                                         # the rest: the zeros of the padding
    for plane, want in zip(i.planes[1:], (w.d, w.m)):
        if want is None:
            assert plane.shape[0] == 0
            continue
        assert plane.shape == (int8.groups(R, nb), 16)
        assert np.array_equal(plane[g[:, 0], lane[:, 0]], want.view(np.uint16).reshape(-1))
        pad = np.ones(plane.shape, bool)
        pad[g[:, 0], lane[:, 0]] = False
        assert not plane[pad].any()
    mask = rng.random(R) < 0.5
    for rows in (ids, -1 - ids, ids.astype(np.uint64), slice(1, None, 2), mask):   # compiled gather, NumPy's
        assert np.array_equal(int8.lane_rows(lanes, R, nb, rows), w.q[rows])
        assert np.array_equal(int8.gguf_rows(lanes, R, nb, rows), w.q[rows])
        assert np.array_equal(int8.scale_rows(i.planes[1], R, nb, rows), w.d.view(np.uint16)[rows])
    for rows in (ids, -1 - ids, ids.astype(np.uint64), ids[::2], [R - 1, 0], np.zeros(0, np.int64)):
        assert same(i.rows(rows), w.rows(np.arange(R)[rows]))              # one compiled lookup, GGUF's floats
    assert i.rows(ids, np.float64).dtype == np.float64 and same(i.rows(ids, np.float64), w.rows(ids, np.float64))
    for past in ([R], [-R - 1]):
        with pytest.raises(IndexError):
            i.rows(np.array(past))
        with pytest.raises(IndexError):
            int8.lane_rows(lanes, R, nb, past)
        with pytest.raises(IndexError):
            int8.scale_rows(i.planes[1], R, nb, past)
    x = rng.standard_normal((2, C))                                     # float64: QuantMatrix's product
    assert same(i.matmul(x), w.matmul(x))


# -- the instruction set, and refusals ------------------------------------------------------------------

def test_the_instruction_set_follows_the_cpus_features():
    assert int8.supported(frozenset({"avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx2"})) == \
        ("avx512-vnni", "avx-vnni", "avx2", "generic")
    assert int8.supported(frozenset({"avxvnni", "avx2"})) == ("avx-vnni", "avx2", "generic")
    assert int8.supported(frozenset({"avx2", "fma"})) == ("avx2", "generic")
    assert int8.supported(frozenset({"neon"})) == ("generic",)
    assert int8.isa() in ISAS and int8.describe().startswith("int8 dot: ")


def test_an_instruction_set_the_cpu_lacks_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(int8.ENV, "avx-512-typo")
    with pytest.raises(MiniLLMError, match="not an instruction set"):
        int8.isa()
    lacking = [n for n in int8.ISA_WORDS if n not in ISAS]
    if lacking:
        monkeypatch.setenv(int8.ENV, lacking[0])
        with pytest.raises(MiniLLMError, match="lacks it"):
            int8.isa()
        w = QuantMatrix.quantize(np.ones((2, 32), np.float32), "q8_0")
        with pytest.raises(MiniLLMError, match="cannot run"):
            int8.matmul(pl(w), np.ones((1, 32), np.float32), lacking[0])
    monkeypatch.setenv(int8.ENV, "generic")
    assert int8.isa() == "generic"


def test_a_wrong_shape_is_refused_in_one_line():
    w = QuantMatrix.quantize(np.ones((4, 64), np.float32), "q4_0")
    for x in (np.ones((2, 32), np.float32), np.ones(64, np.float32)):
        with pytest.raises(MiniLLMError, match="multiplies x"):
            int8.matmul(pl(w), x)
        with pytest.raises(MiniLLMError, match="multiplies x"):
            int8.matmul_ref(pl(w), x)
    with pytest.raises(MiniLLMError, match="blocks of 32"):
        int8.quantize_x(np.ones((2, 40), np.float32))


def test_float64_and_strided_x_are_taken_as_float32():
    rng = np.random.default_rng(3)
    w = QuantMatrix.quantize(rng.standard_normal((8, 64)).astype(np.float32), "q8_0")
    x = rng.standard_normal((6, 128))
    assert same(int8.matmul(pl(w), x[:, ::2]), int8.matmul_ref(pl(w), x[:, ::2].astype(np.float32)))


# -- reads stay inside the arrays (guard pages), planes checked ------------------------------------

@pytest.mark.parametrize("fmt", FMTS)
def test_no_kernel_reads_past_a_plane_that_ends_at_a_guard_page(fmt):
    """Every plane and x end exactly where an unreadable page begins: a load of one byte past any of
    them kills the process, and so does a store past y. Every instruction set, weights of 1..17 rows
    (a last group of 16 rows partly padding; numba's bounds checks cannot see the kernels'
    hand-written loads and stores; the kernels ask for bytes ahead, a hint that never faults), one
    block a row and several, 1 and 3 rows of x (the one-row path and the tiled one); the embedding's
    lookup (dequant_rows) of the first and last rows as well."""
    from guard_pages import guarded
    rng = np.random.default_rng(11)
    with guarded() as g:
        for R, nb in [(r, 1) for r in range(1, 18)] + [(3, 5), (7, 17), (16, 2), (17, 21)]:
            w = QuantMatrix.quantize(rng.standard_normal((R, nb * QK)).astype(np.float32), fmt)
            p = pl(w)
            lanes = int8.lane_order(p)                    # the planes as the kernels read them
            gp = int8.lane_planes(tuple(g.place(a) if a.size else a for a in lanes), lanes.shape)
            for T in (1, 3):
                x = g.place(rng.standard_normal((T, nb * QK)).astype(np.float32))
                want = int8.matmul_ref(p, x)
                for name in ISAS:
                    assert same(int8.matmul(gp, x, name), want), (name, R, nb, T)
                    y = g.place(np.zeros((T, R), np.float32))   # the last 16 rows' store stops at y's end
                    int8.kernel(fmt == "q8_0", name)(*gp, x, y)
                    assert same(y, want), (name, R, nb, T)
            ids = np.array([R - 1, 0, -1, -R], np.int64)            # the embedding's compiled lookup too
            assert same(int8.dequant_rows(gp, ids), w.rows(ids % R)), (R, nb)


def test_planes_that_disagree_and_a_narrow_x_are_refused_in_one_line():
    """Planes whose shapes, dtypes or layout disagree (each would read past an array or give a wrong
    answer) -> one ValueError line from int8.matmul and int8.planes; x narrower or wider than the
    weight -> one line from Int8Quant.matmul, as from QuantMatrix.matmul."""
    from minillm.models.int8 import Int8Quant
    rng = np.random.default_rng(5)
    q8 = QuantMatrix.quantize(rng.standard_normal((4, 64)).astype(np.float32), "q8_0")
    q41 = QuantMatrix.quantize(rng.standard_normal((4, 64)).astype(np.float32), "q4_1")
    q8p, q41p = pl(q8), pl(q41)
    lo8, lo41 = int8.lane_order(q8p), int8.lane_order(q41p)
    x = np.ones((2, 64), np.float32)
    bad = [
        (q8p[0][:, :32], q8p[1]),                          # q narrower than its scales say
        (q8p[0], q8p[1][:3]),                              # fewer rows of scales
        (q8p[0].view(np.uint8), q8p[1]),                   # Q8_0's q as unsigned
        (q8p[0], q8p[1].view(np.int16)),                   # scales not uint16
        (q8p[0][:, ::2], q8p[1][:, ::2]),                  # strided planes
        (q41p[0], q41p[1], q41p[2][:2]),                   # minimums for fewer rows
        (q41p[0], q41p[1], q41p[2][:, :1]),                # minimums for fewer blocks
        (q41p[0][:, :16], q41p[1], q41p[2]),               # nibbles for one block, scales for two
        (q41p[0].view(np.int8), q41p[1], q41p[2]),         # Q4's nibbles as signed
        (q41p[0],),                                        # one plane
        int8.lane_planes((lo8[0][:-64], lo8[1]), lo8.shape),            # Q8_0 in lane order, a group short
        int8.lane_planes((lo8[0].view(np.uint8), lo8[1]), lo8.shape),   # ... as unsigned
        int8.lane_planes((lo41[0][:-1],) + lo41[1:], lo41.shape),       # Q4 in lane order, a byte short
        int8.lane_planes((lo41[0], lo41[1][:-1], lo41[2]), lo41.shape), # ... scales a group short
        int8.lane_planes((lo41[0], lo41[1], lo41[2].T.copy()), lo41.shape),   # ... minimums turned
        tuple(lo8),                                                     # ... without the weight's shape
        (np.zeros((4, 0), np.int8), np.zeros((4, 0), np.uint16)),   # rows of no values
    ]
    for p in bad:
        with pytest.raises(ValueError) as e:
            int8.matmul(p, x)
        assert "\n" not in str(e.value), p
    with pytest.raises(ValueError, match="do not match"):
        int8.planes(q8.q[:, :32], q8.d)
    w = Int8Quant.of(q41)
    for xx in (np.ones((2, 32), np.float32), np.ones((2, 96), np.float32), np.ones(64, np.float32)):
        with pytest.raises(ValueError, match="x needs 64 columns"):
            w.matmul(xx)


GENERIC_SCRIPT = r"""
import numpy as np, sys
from minillm.kernels import int8
from minillm.models.quant import QK
assert int8.supported() == ("generic",), int8.supported()
h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)      # every float16 bit pattern, as scales
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 16 * QK)).astype(np.float32)
for fmt in ("q8_0", "q4_0", "q4_1"):
    R = (1 << 16) // 16                                           # 16 blocks a row: every pattern once
    d = h.reshape(R, 16)
    if fmt == "q8_0":
        p = int8.planes(rng.integers(-128, 128, (R, 16 * QK)).astype(np.int8), d)
    else:
        m = np.roll(h, 7).reshape(R, 16) if fmt == "q4_1" else None
        p = int8.planes(rng.integers(0, 256, (R, 8 * QK)).astype(np.uint8), d, m)
    got, want = int8.matmul(p, x), int8.matmul_ref(p, x)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all() and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), fmt
print("generic target: every float16 scale exact")
"""


def test_numba_compiling_for_a_generic_cpu_runs_the_portable_integer_kernels(tmp_path):
    """NUMBA_CPU_NAME=generic (numba then compiles for no features beyond the architecture's
    baseline; a CPU without VNNI or F16C is the same case): the integer set follows numba's target
    (the portable form; float16 scales widened in integers, every bit pattern exact) instead of
    emitting an instruction the target lacks (an LLVM abort, exit 134); a quantized model generates,
    and an instruction set the target lacks, asked for, is refused in one line."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, NUMBA_CPU_NAME="generic")
    env.pop("NUMBA_CPU_FEATURES", None)
    r = subprocess.run([sys.executable, "-c", GENERIC_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "every float16 scale exact" in r.stdout, r.stderr[-3000:]
    gen = [sys.executable, "-m", "minillm", "generate", "ROMEO:", "--model", "random-tiny", "--weights", "q8_0",
           "--kernels", "int8", "--max-new-tokens", "3"]
    home = dict(MINILLM_HOME=str(tmp_path), MINILLM_FAST="1")
    r = subprocess.run(gen, capture_output=True, text=True, env=env | home, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    r = subprocess.run(gen, capture_output=True, text=True, env=env | home | {int8.ENV: "avx512-vnni"}, timeout=600)
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "lacks it" in r.stderr


def test_the_instruction_set_follows_numbas_target_features(monkeypatch):
    """NUMBA_CPU_FEATURES naming no VNNI (a CPU without it, or a target chosen so): the integer set
    is what both the host and the target have; "" (what numba sets for NUMBA_CPU_NAME=generic): the
    portable form; unset: the host's."""
    from numba.core import config
    host = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx2", "f16c"})
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+f16c,-avx512vnni,+sse4.2")
    assert int8.supported(host & int8.target_features(host)) == ("avx2", "generic")
    monkeypatch.setattr(config, "CPU_FEATURES", "")
    assert int8.supported(host & int8.target_features(host)) == ("generic",)
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    assert int8.target_features(host) == host


def test_the_int8_bench_runs_its_forms_side_by_side():
    """benchmarks/int8_bench.py runs for real (a tiny model of its kind, one round): the float and
    integer forms in one table per B, each checked against the reference first."""
    import subprocess
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "int8_bench.py"
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('int8_bench', {str(path)!r})\n"
            "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)\n"
            "b.MODELS['tiny'] = dict(layer=[(64, 96), (96, 64)], L=1, head=(128, 64))\n"
            "sys.argv = ['int8_bench.py', '--model', 'tiny', '--format', 'q4_1', '--batch', '1,2', '--rounds', '1',"
            " '--threads', '1', '--no-plain']\n"
            "raise SystemExit(b.main())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for want in ("numpy f32", "fused q4_1", "int8 generic", "B = 1", "B = 2"):
        assert want in r.stdout, (want, r.stdout)
