"""One attention with its options (ops.AttentionSpec): a window and sinks in the NumPy form, checked
against the definition, and the kernel sets' fallback to that form for options their kernels decline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import meter
from minillm.models import kernel_sets, ops
from minillm.models.ops import AttentionSpec


@st.composite
def shapes(draw):
    Hkv, g = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    Tq = draw(st.integers(1, 12))
    Tk = Tq + draw(st.integers(0, 12))
    hd = draw(st.sampled_from([2, 4, 8]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    q = rng.standard_normal((Hkv * g, Tq, hd))
    k, v = rng.standard_normal((Hkv, Tk, hd)), rng.standard_normal((Hkv, Tk, hd))
    return q, k, v, draw(st.sampled_from([1, 3, 128]))          # the query block: several blocks too


def definition(q, k, v, window=None, sinks=None):
    """Each query on its own: scores over the keys it may see, softmax with the sink's logit, values."""
    H, Tq, hd = q.shape
    Hkv, Tk = k.shape[:2]
    g = H // Hkv
    out = np.zeros((H, Tq, v.shape[-1]))
    for h in range(H):
        for i in range(Tq):
            p = Tk - Tq + i
            lo = 0 if window is None else max(0, p - window + 1)
            s = k[h // g, lo:p + 1] @ q[h, i] / math.sqrt(hd)
            logits = s if sinks is None else np.append(s, sinks[h])
            w = np.exp(logits - logits.max())
            w = w[:len(s)] / w.sum()
            out[h, i] = w @ v[h // g, lo:p + 1]
    return out


def attend(q, k, v, block, spec):
    old, ops.QUERY_BLOCK = ops.QUERY_BLOCK, block
    try:
        return ops.attention(q, k, v, spec=spec)
    finally:
        ops.QUERY_BLOCK = old


@settings(max_examples=60, deadline=None)
@given(shapes(), st.integers(1, 30))
def test_a_window_attends_the_keys_inside_it(case, window):
    q, k, v, block = case
    got = attend(q, k, v, block, AttentionSpec(window=window))
    np.testing.assert_allclose(got, definition(q, k, v, window=window), rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(shapes(), st.integers(0, 10))
def test_a_window_as_long_as_the_sequence_is_full_attention(case, more):
    q, k, v, block = case
    full = attend(q, k, v, block, ops.PLAIN)
    assert np.array_equal(attend(q, k, v, block, AttentionSpec(window=k.shape[1] + more)), full)


@settings(max_examples=60, deadline=None)
@given(shapes(), st.data())
def test_sinks_take_their_share_of_the_softmax(case, data):
    q, k, v, block = case
    sinks = np.array(data.draw(st.lists(st.floats(-4, 4), min_size=q.shape[0], max_size=q.shape[0])))
    got = attend(q, k, v, block, AttentionSpec(sinks=sinks))
    np.testing.assert_allclose(got, definition(q, k, v, sinks=sinks), rtol=1e-10, atol=1e-12)
    window = data.draw(st.integers(1, 8))
    both = attend(q, k, v, block, AttentionSpec(window=window, sinks=sinks))
    np.testing.assert_allclose(both, definition(q, k, v, window, sinks), rtol=1e-10, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(shapes())
def test_a_sink_of_minus_infinity_is_no_sink(case):
    q, k, v, block = case
    none = attend(q, k, v, block, ops.PLAIN)
    assert np.array_equal(attend(q, k, v, block, AttentionSpec(sinks=np.full(q.shape[0], -np.inf))), none)


def test_a_window_reads_and_counts_only_its_keys():
    """A decode query with a window of w multiplies w keys, not the whole context: counted so."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 1, 4)), rng.standard_normal((1, 50, 4)), rng.standard_normal((1, 50, 4))
    with meter.Meter() as m, meter.step("decode", 49, 1, 50):
        ops.attention(q, k, v, spec=AttentionSpec(window=8))
    assert m.steps[0].flops["attention"] == 2 * 2 * 8 * (4 + 4)


def test_a_kernel_set_falls_back_to_numpys_form_for_what_it_declines():
    """The fused set's attention kernel takes plain attention only: with a window, a sink, a scale or
    narrower values it attends with NumPy's form (the same bits), counted once, and says which."""
    import minillm
    if not minillm.kernels.available():
        pytest.skip(f"the fused kernels: {minillm.kernels.status().reason}")
    K, N = kernel_sets.get("fused"), kernel_sets.get("numpy")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3, 8), (2, 9, 8), (2, 9, 8)))
    for spec in (AttentionSpec(window=4), AttentionSpec(sinks=np.zeros(4, np.float32)), AttentionSpec(scale=0.3)):
        assert not K.takes(spec) and K.declines(spec.asks()) == sorted(spec.asks())
        with meter.Meter() as m, meter.step("prefill", 6, 3, 9):
            got = K.attention(q, k, v, None, spec)
        assert np.array_equal(got, N.attention(q, k, v, None, spec))
        assert m.steps[0].ops["attention"]["calls"] == 1
    assert K.takes(ops.PLAIN) and N.declines({"window"}) == []
    with pytest.raises(ValueError, match="window or sink"):
        ops.attention(q, k, v, kernel=lambda *a: None, spec=AttentionSpec(window=4))
