"""The kernels' arrays start on 64-byte boundaries (kernels/aligned.py): every weight a kernel set
makes (its planes, held once), the stacked planes of the compiled step, and the float32 product's x;
the same values and the same products as from anywhere else."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import kernels
from minillm.kernels.aligned import ALIGN, aligned, aligned_empty, is_aligned

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"numba kernels: {kernels.status().reason}")


def off_boundary(a: np.ndarray, offset: int) -> np.ndarray:
    """A copy of a starting `offset` bytes past a 64-byte boundary."""
    buf = np.empty(a.nbytes + 2 * ALIGN, np.uint8)
    s = -buf.ctypes.data % ALIGN + offset
    out = buf[s:s + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=3), st.sampled_from([np.int8, np.uint16, np.float32]),
       st.sampled_from([0, 4, 16, 32, 48]))
def test_aligned_gives_the_same_values_from_a_boundary_and_copies_only_when_off_one(shape, dtype, offset):
    a = off_boundary(np.arange(int(np.prod(shape))).astype(dtype).reshape(shape), offset)
    b = aligned(a)
    assert b.shape == a.shape and b.dtype == a.dtype and np.array_equal(a, b) and b.flags.c_contiguous
    assert is_aligned(b) or b.size == 0
    assert (b is a) == (offset == 0 and b.size > 0) or b.size == 0
    assert is_aligned(aligned_empty(shape, dtype)) or not np.prod(shape)
    assert aligned(b) is b or b.size == 0


def _planes_on_boundaries(w) -> None:
    assert all(is_aligned(p) for p in w.planes if p.size), [p.ctypes.data % ALIGN for p in w.planes]
    if w.planes[0].ndim == 2:                                     # GGUF's order: q is the plane
        assert w.q is w.planes[0]
        assert np.shares_memory(w.d, w.planes[1]) and (w.m is None or np.shares_memory(w.m, w.planes[2]))
    else:                                                         # lane order: the planes alone hold them
        assert not any(isinstance(a, np.ndarray) for a in vars(w).values())


@pytest.mark.parametrize("kernels_", ["fused", "int8"])
@pytest.mark.parametrize("weights", ["q8_0", "q4_0", "q4_1"])
def test_every_quantized_weight_a_kernel_set_makes_is_on_a_boundary_and_held_once(kernels_, weights):
    from tests.test_int8_model import build
    model = build("llama", weights, kernels_)
    for w in model.matrices():
        _planes_on_boundaries(w)


def test_float_weights_and_the_stacked_step_are_on_boundaries():
    from tests.test_int8_model import build
    for w in build("gpt2", "float32", "fused").matrices():
        assert is_aligned(w.wt)
    model = build("llama", "q4_1", "int8")
    model.decode_step(3, model.prefill(np.arange(4))[1])          # the compiled step stacks the products
    ((_, n, _, stacked),) = model._compiled_params
    for planes in stacked[2:]:
        for p in planes:
            assert is_aligned(p)
            if p[0].nbytes % ALIGN == 0:                          # then every layer's row starts on one too
                assert all(is_aligned(p[i]) for i in range(n))


@pytest.mark.parametrize("T", [1, 5, 8, 33])
def test_the_float32_product_is_the_same_from_any_start(T):
    rng = np.random.default_rng(T)
    wt = rng.standard_normal((40, 96)).astype(np.float32)
    x = rng.standard_normal((T, 96)).astype(np.float32)
    want = kernels.dense_matmul_t(aligned(wt), aligned(x))
    for offset in (4, 16, 32, 48):
        got = kernels.dense_matmul_t(aligned(wt), off_boundary(x, offset))
        assert np.array_equal(got, want)
    np.testing.assert_allclose(want, x @ wt.T, rtol=1e-4, atol=1e-4)
