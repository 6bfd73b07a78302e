"""The sampler at its limits: tiny and huge temperatures, +inf, -inf and NaN logits; and unchanged
(same tokens, same random stream) for ordinary logits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minillm.engine.sampling import sample
from minillm.errors import MiniLLMError

finite = hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(-1e4, 1e4, width=32))
tiny = st.floats(5e-324, 1e-30)                  # small enough that logits / temperature overflows
settings_ = settings(max_examples=150, deadline=None)
top_k = st.none() | st.integers(1, 50)
top_p = st.none() | st.floats(0.01, 1.0)


def sample_before(logits, temperature, top_k, top_p, rng):
    """The sampler as it was before the limits were handled: ordinary logits must still give its tokens."""
    if temperature == 0:
        return int(np.argmax(logits))
    order = np.argsort(-logits, kind="stable")
    z = logits[order] / temperature
    if top_k is not None:
        z = z[:top_k]
    p = np.exp(z - z[0])
    p /= p.sum()
    if top_p is not None:
        keep = int(np.searchsorted(np.cumsum(p), top_p)) + 1
        p = p[:keep] / p[:keep].sum()
    i = int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"))
    return int(order[min(i, p.size - 1)])


@settings_
@given(logits=finite, temperature=st.floats(0.05, 20.0), top_k=top_k, top_p=top_p, seed=st.integers(0, 2**32))
def test_ordinary_logits_sample_as_before(logits, temperature, top_k, top_p, seed):
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    assert [sample(logits, temperature, top_k, top_p, a) for _ in range(3)] == \
           [sample_before(logits, temperature, top_k, top_p, b) for _ in range(3)]
    assert a.random() == b.random()                                  # the same draws from the stream


@settings_
@given(logits=finite, temperature=tiny, top_k=top_k, top_p=top_p, seed=st.integers(0, 2**32))
@example(logits=np.array([8.5e-39, 0, 0], dtype=np.float32), temperature=4.3e-31, top_k=None, top_p=None, seed=1)
def test_a_tiny_temperature_is_greedy(logits, temperature, top_k, top_p, seed):
    """A tiny temperature picks the largest logit, unless another is so close that even at this
    temperature it keeps real probability: logits [8.5e-39, 0, 0] at 4.3e-31 differ by 2e-8 of a
    temperature, so the three are all but equally likely (hypothesis found it). What must never
    happen is a token e^-50 times less likely than the best."""
    token = sample(logits, temperature, top_k, top_p, np.random.default_rng(seed))
    gap = (float(logits.max()) - float(logits[token])) / temperature
    assert gap <= 50, (token, gap)


@settings_
@given(logits=finite, temperature=st.floats(1e20, 1e300), seed=st.integers(0, 2**32))
def test_a_huge_temperature_is_uniform_but_valid(logits, temperature, seed):
    assert 0 <= sample(logits, temperature, rng=np.random.default_rng(seed)) < logits.size


@settings_
@given(logits=finite, data=st.data(), temperature=st.floats(0, 1e300) | tiny, top_k=top_k, top_p=top_p)
def test_plus_inf_takes_all_the_probability(logits, data, temperature, top_k, top_p):
    hot = data.draw(st.sets(st.integers(0, logits.size - 1), min_size=1))
    logits = logits.copy()
    logits[list(hot)] = np.inf
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    assert {sample(logits, temperature, top_k, top_p, rng) for _ in range(4)} <= hot


@settings_
@given(logits=finite, data=st.data(), temperature=st.floats(0, 1e300) | tiny, top_k=top_k, top_p=top_p)
def test_minus_inf_is_never_picked(logits, data, temperature, top_k, top_p):
    cold = data.draw(st.sets(st.integers(0, logits.size - 1), max_size=logits.size - 1))
    logits = logits.copy()
    logits[list(cold)] = -np.inf
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    assert not {sample(logits, temperature, top_k, top_p, rng) for _ in range(4)} & cold


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 1.0])
@pytest.mark.parametrize("logits", [[0.0, np.nan, 1.0], [np.nan] * 3, [-np.inf] * 3, [np.inf, np.nan]])
def test_nan_or_all_minus_inf_has_no_token(logits, temperature):
    with pytest.raises(MiniLLMError, match="logits are"):
        sample(np.array(logits, np.float32), temperature, rng=np.random.default_rng(0))


def test_the_limits_by_hand():
    rng = np.random.default_rng(0)
    assert {sample(np.array([1, 3, 2, -1], np.float32), 1e-300, rng=rng) for _ in range(20)} == {1}
    assert {sample(np.array([3, 3, 1], np.float32), 1e-300, rng=rng) for _ in range(40)} == {0, 1}
    assert {sample(np.array([5, np.inf, 9], np.float32), 2.0, rng=rng) for _ in range(20)} == {1}
