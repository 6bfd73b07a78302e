"""The one closeness rule (minillm/closeness.py): a side is ranked above another only when
each has two rounds or more, their ranges do not overlap and their medians differ by more than 5%;
and every ranking in the lessons and the commands goes through it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import closeness

rounds = st.lists(st.floats(0.01, 100.0), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(rounds, rounds)
def test_apart_ranks_only_rounds_that_agree_beyond_their_spread(a, b):
    side = closeness.apart(a, b)
    assert side == -closeness.apart(b, a)                       # the same verdict from either side
    if side:
        assert len(a) >= 2 and len(b) >= 2
        hi, lo = (a, b) if side > 0 else (b, a)
        assert min(hi) > max(lo)                                # every round beyond the other's
        import statistics
        m1, m2 = statistics.median(hi), statistics.median(lo)
        assert (m1 - m2) / m1 > closeness.CLOSE
    else:
        assert closeness.why_not(a, b)


@pytest.mark.parametrize("a, b, side, why", [
    ([10.0], [20.0], 0, "one run"),                             # one run: no spread, no winner
    ([10.0, 11.0], [20.0, 21.0], -1, ""),
    ([10.0, 25.0], [20.0, 21.0], 0, "overlap"),                 # a busy round crosses the other side
    ([10.0, 10.1], [10.2, 10.3], 0, "within 5%"),               # apart, but within the band
])
def test_apart_on_hand_made_rounds(a, b, side, why):
    assert closeness.apart(a, b) == side
    if why:
        assert why in closeness.why_not(a, b)


def test_a_ranking_names_a_winner_only_beyond_every_other_sides_spread():
    r = closeness.rank({"a": [10, 11], "b": [20, 21], "c": [30, 31]}, higher=True)
    assert r.order == ("c", "b", "a") and r.winner == "c" and r.loser == "a"
    r = closeness.rank({"a": [10, 11], "b": [20, 21], "c": [30, 31]}, higher=False)
    assert r.winner == "a" and r.loser == "c"
    r = closeness.rank({"a": [10, 11], "b": [20, 31], "c": [30, 31]}, higher=True)
    assert r.best == "c" and r.winner is None and "b against c" in r.reason and r.loser == "a"
    said = closeness.best_words(r, "tok/s", lambda v: f"{v:.0f}", threads=1)
    assert "no winner" in said and "this machine, 1 BLAS thread, now" in said
    said = closeness.best_words(closeness.rank({"a": [1, 1.1], "b": [2, 2.1]}), "x", str, threads=2)
    assert said.startswith("x: b best") and "2 BLAS threads" in said


def test_one_run_shares_use_the_band():
    assert closeness.one_run_apart(1.0, 1.04) == 0
    assert closeness.one_run_apart(1.2, 1.0) == 1 and closeness.one_run_apart(1.0, 1.2) == -1


def test_the_lessons_words_go_through_the_rule():
    """lessons/_common.faster_words ranks two timings only as the rule does (lesson 14's 0.91× and
    1.07× of two runs of the same thing: overlapping rounds are no winner)."""
    from minillm.lessons import _common
    T = _common.Timing
    said = _common.faster_words(T((0.91, 1.07)), T((1.0, 1.0)), "fused", "NumPy")
    assert "no winner (medians within 5%)" in said
    said = _common.faster_words(T((0.8, 1.07)), T((1.0, 1.0)), "fused", "NumPy")
    assert "no winner (their rounds overlap)" in said
    said = _common.faster_words(T((0.5, 0.55)), T((1.0, 1.1)), "fused", "NumPy")
    assert "faster, every round beyond the other's spread (this machine" in said
    said = _common.faster_words(T((2.0, 2.1)), T((1.0, 1.1)), "fused", "NumPy")
    assert "slower, every round" in said
    said = _common.faster_words(T((0.5,)), T((1.0,)), "fused", "NumPy")
    assert "no winner (one run" in said


counts = st.lists(st.integers(0, 60), min_size=2, max_size=5)


@settings(max_examples=300, deadline=None)
@given(counts, counts)
def test_counts_rank_only_beyond_twice_their_poisson_spread(a, b):
    """Goodput counts requests: lesson 9's quiet run ranked static (2 of 24 met both) above
    sequential (2), its busy run sequential (2) above static (1). A count is ranked only when every
    round's count clears every round's of the other by more than COUNT_Z·√ of their sum."""
    side = closeness.counts_apart(a, b)
    assert side == -closeness.counts_apart(b, a)
    if side:
        hi, lo = (a, b) if side > 0 else (b, a)
        assert min(hi) - max(lo) > closeness.COUNT_Z * (min(hi) + max(lo)) ** 0.5
    for x, y in zip(a, b):
        if abs(x - y) <= 2:                                     # a request or two apart never ranks
            assert side == 0


def test_a_goodput_ranking_needs_its_counts_apart_too():
    per_s = {"static": [0.11, 0.11, 0.11], "sequential": [0.07, 0.07, 0.07]}  # lesson 9, quiet, 24 requests
    assert closeness.rank(per_s).winner == "static"                             # the rates alone rank
    r = closeness.rank(per_s, counts={"static": [2, 2, 2], "sequential": [2, 2, 2]})
    assert r.winner is None and "counts too close to rank, 2 against 2" in r.reason
    r = closeness.rank(per_s, counts={"static": [20, 21, 22], "sequential": [5, 6, 5]})
    assert r.winner == "static" and r.loser == "sequential"
