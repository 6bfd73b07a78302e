"""One closeness rule for every ranking: the lessons, `bench`, `serve-sim`, `loadgen` and `diagnose`.

A timing taken on a shared machine moves with the load, so two runs of the same comparison can rank
its sides in opposite orders. A side is ranked above another only when **its rounds agree beyond
their spread**:

    - each side was measured in two rounds or more (one run has no spread to judge by);
    - every round of the one lies beyond every round of the other (their ranges do not overlap);
    - and their medians differ by more than CLOSE (5%) of the larger.

Anything else is "no winner", said with the reason and the figures. A winner is said to hold for
this machine, at this thread count, now (`holds_for`): another machine, another load or another
thread count can rank them otherwise.

The rounds are the samples of an interleaved measurement: each side once per round, in turn, so a
busy moment of the machine slows one round of every side, not every round of one (the lessons'
`time_interleaved`, `measure.batching.time_steps`, `serving.disagg.run_interleaved`).

A figure that counts events (goodput: the requests that met their targets, per second) moves by whole
events with the load: two requests against one is not a ranking. Given the counts behind each round
(`rank(..., counts=...)`), a side is ranked above another only when, besides the rule above, every
round's count of the one exceeds every round's count of the other by more than COUNT_Z × √(a + b):
twice the spread two Poisson counts of these sizes would show.

A comparison of shares within one run (loadgen's "which phase took the server's time", the split of
one run's seconds) has no rounds: `one_run_apart` ranks it only beyond the CLOSE band and says that
it is one run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

CLOSE = 0.05        # medians within 5% of the larger: no side is ranked above the other
MIN_ROUNDS = 2      # a side needs this many rounds before it can be ranked
COUNT_Z = 2.0       # counts of events apart by more than COUNT_Z × √(a + b) (two Poisson spreads)


def _rel(a: float, b: float) -> float:
    """How far apart two values are, as a share of the larger magnitude (0 when both are 0)."""
    top = max(abs(a), abs(b))
    return abs(a - b) / top if top > 0 else 0.0


def apart(a: Sequence[float], b: Sequence[float], close: float = CLOSE) -> int:
    """+1 when `a` lies above `b` beyond their spread, -1 when below, 0 when the rule ranks neither:
    fewer than MIN_ROUNDS rounds on a side, ranges that overlap, or medians within `close`."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) < MIN_ROUNDS or len(b) < MIN_ROUNDS:
        return 0
    ma, mb = statistics.median(a), statistics.median(b)
    if _rel(ma, mb) <= close:
        return 0
    if min(a) > max(b):
        return 1
    if max(a) < min(b):
        return -1
    return 0


def one_run_apart(a: float, b: float, close: float = CLOSE) -> int:
    """Two figures of one run (shares of its time, not repeated timings): +1, -1, or 0 within `close`."""
    if _rel(a, b) <= close:
        return 0
    return 1 if a > b else -1


def counts_apart(a: Sequence[int], b: Sequence[int], z: float = COUNT_Z) -> int:
    """+1 when every round's count in `a` exceeds every round's count in `b` by more than z·√(a + b),
    -1 the other way round, else 0 (counts of events too close to rank: one request against two)."""
    lo_a, hi_a, lo_b, hi_b = min(a), max(a), min(b), max(b)
    if lo_a - hi_b > z * math.sqrt(lo_a + hi_b):
        return 1
    if lo_b - hi_a > z * math.sqrt(lo_b + hi_a):
        return -1
    return 0


def why_not(a: Sequence[float], b: Sequence[float], close: float = CLOSE) -> str:
    """Why `apart` ranked neither side, in words."""
    if len(a) < MIN_ROUNDS or len(b) < MIN_ROUNDS:
        return "one run: no spread to judge by"
    if _rel(statistics.median(a), statistics.median(b)) <= close:
        return f"medians within {close:.0%}"
    return "their rounds overlap"


@dataclass(frozen=True)
class Ranking:
    """Sides ordered by their medians (best first), and what the rule lets one say of them."""

    order: tuple[str, ...]              # by median, best first
    medians: dict
    ranges: dict                        # name -> (lo, hi) over the rounds
    rounds: dict                        # name -> number of rounds
    winner: str | None                  # the best, beyond the spread of every other side; else None
    loser: str | None                   # the worst, beyond the spread of every other side; else None
    reason: str                         # why there is no winner ("" when there is one)

    @property
    def best(self) -> str:
        return self.order[0]

    @property
    def worst(self) -> str:
        return self.order[-1]


def rank(sides: Mapping[str, Sequence[float]], higher: bool = True, close: float = CLOSE,
         counts: Mapping[str, Sequence[int]] | None = None) -> Ranking:
    """Rank `sides` ({name: its rounds}) by the rule: a winner only when it is apart from every other
    side; `higher` says whether a larger figure is better (tokens/s) or worse (seconds). `counts`
    ({name: the events counted in each round}) adds the counting rule (`counts_apart`) for figures
    that count events."""
    rounds = {k: [float(x) for x in v] for k, v in sides.items() if len(v)}
    if not rounds:
        raise ValueError("rank: no side has a round")
    med = {k: statistics.median(v) for k, v in rounds.items()}
    order = tuple(sorted(rounds, key=lambda k: med[k], reverse=higher))
    sign = 1 if higher else -1

    def above(a: str, b: str) -> bool:              # a ranked better than b
        if sign * apart(rounds[a], rounds[b], close) <= 0:
            return False
        return counts is None or sign * counts_apart(counts[a], counts[b]) > 0

    def reason_for(a: str, b: str) -> str:        # why a is not ranked above b, said "b against a"
        if sign * apart(rounds[a], rounds[b], close) <= 0:
            return why_not(rounds[a], rounds[b], close)
        return (f"counts too close to rank, {_span(counts[b])} against {_span(counts[a])} per round, not apart by "
                f"{COUNT_Z:g}·√ of their sum")

    best, worst = order[0], order[-1]
    others = [k for k in order if k != best]
    winner = best if others and all(above(best, k) for k in others) else None
    loser = worst if len(order) > 1 and all(above(k, worst) for k in order if k != worst) else None
    reason = ""
    if winner is None and others:
        closest = next(k for k in others if not above(best, k))
        reason = f"{closest} against {best}: {reason_for(best, closest)}"
    return Ranking(order, med, {k: (min(v), max(v)) for k, v in rounds.items()},
                   {k: len(v) for k, v in rounds.items()}, winner, loser, reason)


def _span(c: Sequence[int]) -> str:
    return str(min(c)) if min(c) == max(c) else f"{min(c)}-{max(c)}"


def holds_for(threads: int | None = None) -> str:
    """The conditions a ranking holds for: 'this machine, 2 BLAS threads, now'."""
    from .threads import blas_threads
    n = threads if threads is not None else blas_threads()
    count = "BLAS threads unknown" if not n else f"{n} BLAS thread{'s' if n != 1 else ''}"
    return f"this machine, {count}, now"


def spread_text(r: Ranking, name: str, fmt: Callable[[float], str]) -> str:
    """'412 tok/s (398-420)': a side's median and the range of its rounds (one run: the figure alone)."""
    lo, hi = r.ranges[name]
    if r.rounds[name] < 2:
        return fmt(r.medians[name])
    a, b = fmt(lo), fmt(hi)
    unit_a, unit_b = a.rpartition(" ")[2], b.rpartition(" ")[2]
    if " " in a and unit_a == unit_b and not unit_a[:1].isdigit():     # '865-884 tok/s', the unit once
        a = a.rpartition(" ")[0]
    return f"{fmt(r.medians[name])} ({a}-{b})"


def best_words(r: Ranking, what: str, fmt: Callable[[float], str], threads: int | None = None) -> str:
    """One sentence: the winner of `what` with its figures and the conditions it holds for, or "no
    winner" with the reason and every side's figures."""
    n = max(r.rounds.values())
    where = holds_for(threads)
    if r.winner is not None:
        rest = ", ".join(f"{k} {spread_text(r, k, fmt)}" for k in r.order[1:])
        return (f"{what}: {r.winner} best, {spread_text(r, r.winner, fmt)}, beyond every other run's "
                f"spread over {n} rounds ({rest}); {where}.")
    sides = ", ".join(f"{k} {spread_text(r, k, fmt)}" for k in r.order)
    return f"{what}: no winner ({r.reason}): {sides}; {where}."
