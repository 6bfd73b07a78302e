"""One verdict rule for every ranking: the lessons, `bench`, `serve-sim`, `loadgen` and `diagnose`.

A timing taken on a shared machine moves with the load, so two runs of the same comparison can rank
its sides in opposite orders. The rule is built so that two identical sides are ranked rarely, at a
rate measured and stated (`tests/test_closeness.py`, the README), and a consistent effect is ranked:

    - **paired rounds**: each round measures every side back to back, the order alternated from one
      round to the next (`round_order`), so a busy moment slows one round of every side, and the
      comparison is made round by round, on the ratio of the two sides within a round;
    - **a minimum effect worth naming**: a round favours a side only when the two differ by more than
      CLOSE (5%) of the larger; a round within the band favours neither;
    - **a stated test**: an exact two-sided sign test, at LEVEL (5%), of the rounds that favour a
      side against a coin. A side is ranked when so many rounds favour it that a coin would do it less
      than one time in twenty: all 6 of 6 rounds (p = 1/32), 8 of 9, 9 of 10 or 11, 10 of 12;
    - **enough rounds to decide**: a sign test at 5% cannot rank fewer than MIN_ROUNDS (6) rounds, so
      fewer are "not ranked" with that reason; an adaptive measurement (`settled`) adds rounds, up to
      CAP (12), until the test ranks or can no longer rank.

Anything else is "no winner" (not ranked), said with the reason and the figures. A winner is said to
hold for this machine, at this thread count, now (`holds_for`).

Sides whose rounds are not paired (two saved runs, rounds of different counts) are compared by the
exact permutation test of their ranges instead: every round of one beyond every round of the other,
medians apart by more than CLOSE, and 2 / C(m + n, m) at or below LEVEL (4 rounds a side or more).

A verdict on what is counted (bytes, FLOPs, tokens) cannot flip with the load and needs no rule: the
lessons say those where they can, and time only where time is the point.

A figure that counts events (goodput: the requests that met their targets, per second) moves by whole
events with the load: two requests against one is not a ranking. Given the counts behind each round
(`rank(..., counts=...)`), a side is ranked above another only when, besides the rule above, every
round's count of the one exceeds every round's count of the other by more than COUNT_Z × √(a + b):
twice the spread two Poisson counts of these sizes would show.

A figure priced from counts (a run on the roofline clock: each step's counted bytes and FLOPs at this
machine's measured bandwidth and peak, `serving.metrics.RooflineClock`) is the same in every run,
busy or not: it has no rounds and needs no test. `rank_priced` ranks such figures by the minimum
effect alone (apart by more than CLOSE), and says so: a verdict that cannot flip with the load.

A comparison of shares within one run (loadgen's "which phase took the server's time", the split of
one run's seconds) has no rounds: `figures_apart` ranks it only beyond the CLOSE band and says that
it is one run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

CLOSE = 0.05        # the minimum effect: a round within 5% of the larger favours neither side
LEVEL = 0.05        # the sign test's level, two-sided: a coin ranks identical sides this often at most
MIN_ROUNDS = 6      # the fewest paired rounds a sign test at LEVEL can rank (2 / 2^6 = 1/32)
CAP = 12            # an adaptive measurement stops here (`settled`)
COUNT_Z = 2.0       # counts of events apart by more than COUNT_Z × √(a + b) (two Poisson spreads)


def _rel(a: float, b: float) -> float:
    """How far apart two values are, as a share of the larger magnitude (0 when both are 0)."""
    top = max(abs(a), abs(b))
    return abs(a - b) / top if top > 0 else 0.0


def round_order(names: Sequence[str], i: int) -> list[str]:
    """The order the sides are measured in round `i`: as given in even rounds, reversed in odd ones,
    so neither side always runs first (a cache warmed, a clock raised, by the side before it)."""
    names = list(names)
    return names if i % 2 == 0 else names[::-1]


def sign_p(k: int, n: int) -> float:
    """The exact two-sided sign test: the chance that a fair coin gives k or more heads of n, or as
    many tails (1.0 for n = 0 or k at most half of n). The rounds that favour neither side count
    as not favouring this one: the test can only be stricter for it."""
    if n <= 0 or 2 * k <= n:
        return 1.0
    tail = sum(math.comb(n, j) for j in range(k, n + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def needed(n: int, level: float = LEVEL) -> int | None:
    """How many of n paired rounds must favour one side for the sign test to rank it (None: n rounds
    cannot rank at this level, whatever they say)."""
    for k in range(n // 2 + 1, n + 1):
        if sign_p(k, n) <= level:
            return k
    return None


@dataclass(frozen=True)
class Test:
    """The verdict on two sides' rounds, with what it rests on."""

    side: int                   # +1: a above b; -1: below; 0: not ranked
    paired: bool                # True: the sign test on paired rounds; False: the unpaired test
    n: int                      # rounds compared (paired), or the smaller side's rounds (unpaired)
    up: int                     # rounds that favour a (paired)
    down: int                   # rounds that favour b (paired)
    p: float                    # the test's p-value
    reason: str                 # why not ranked ("" when ranked)


def test(a: Sequence[float], b: Sequence[float], close: float = CLOSE, level: float = LEVEL) -> Test:
    """The rule on two sides' rounds: paired (same count, round i of each measured back to back) by the
    exact sign test on the rounds beyond `close`; otherwise by the unpaired permutation test."""
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) == len(b):
        n = len(a)
        up = sum(1 for x, y in zip(a, b) if x > y and _rel(x, y) > close)
        down = sum(1 for x, y in zip(a, b) if y > x and _rel(x, y) > close)
        p = sign_p(max(up, down), n)
        if n < MIN_ROUNDS:
            why = (f"{n} paired round{'s' if n != 1 else ''}: a sign test at {level:.0%} needs "
                   f"{MIN_ROUNDS} to rank")
            return Test(0, True, n, up, down, p, why)
        if p <= level and up != down:
            return Test(1 if up > down else -1, True, n, up, down, p, "")
        k = max(up, down)
        why = (f"{k} of {n} rounds favour one side by over {close:.0%}, p = {p:.2f} by an exact sign "
               f"test, not below {level:.0%}")
        return Test(0, True, n, up, down, p, why)
    m, n = len(a), len(b)
    p = 2 / math.comb(m + n, m) if m and n else 1.0
    if min(m, n) < 2 or p > level:
        return Test(0, False, min(m, n), 0, 0, min(1.0, p),
                    f"unpaired rounds ({m} and {n}): too few to rank at {level:.0%}")
    ma, mb = statistics.median(a), statistics.median(b)
    if _rel(ma, mb) <= close:
        return Test(0, False, min(m, n), 0, 0, p, f"medians within {close:.0%}")
    if min(a) > max(b):
        return Test(1, False, min(m, n), 0, 0, p, "")
    if max(a) < min(b):
        return Test(-1, False, min(m, n), 0, 0, p, "")
    return Test(0, False, min(m, n), 0, 0, 1.0, "unpaired rounds that overlap")


def apart(a: Sequence[float], b: Sequence[float], close: float = CLOSE) -> int:
    """+1 when `a` is ranked above `b` by the rule (`test`), -1 when below, 0 when not ranked."""
    return test(a, b, close).side


def settled(a: Sequence[float], b: Sequence[float], cap: int = CAP, close: float = CLOSE) -> bool:
    """Whether an adaptive paired measurement can stop: the test ranks, the cap is reached, or no
    outcome of the rounds left before the cap could rank (at least MIN_ROUNDS rounds first)."""
    n = len(a)
    if n < MIN_ROUNDS:
        return False
    t = test(a, b, close)
    if t.side or n >= cap:
        return True
    k = needed(cap)
    return k is None or max(t.up, t.down) + (cap - n) < k


def verdict_words(a: Sequence[float], b: Sequence[float], lower_better: bool = True,
                  threads: int | None = None) -> str:
    """'faster, by an exact sign test on 6 paired rounds (…)' or 'no winner (the reason)': a's rounds
    against b's, where `lower_better` says a lower figure wins (seconds)."""
    t = test(a, b)
    if not t.side:
        return f"no winner ({t.reason})"
    good = (t.side < 0) == lower_better
    return f"{'faster' if good else 'slower'}, {_how(t)} ({holds_for(threads)})"


def rule_words(n: int) -> str:
    """How a ranking was decided, in words: 'a sign test on 6 paired rounds (5% level, each over 5%)'."""
    return f"a sign test on {n} paired rounds ({LEVEL:.0%} level, each over {CLOSE:.0%})"


def _how(t: Test) -> str:
    if t.paired:
        return (f"{max(t.up, t.down)} of {t.n} paired rounds over {CLOSE:.0%} apart, "
                f"p = {t.p:.2g} by a sign test")
    return f"every round beyond the other's, p = {t.p:.2g}"


def ratio_span(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """The smallest and largest a ÷ b of the same rounds: a paired measurement's spread, stated beside a
    ratio where no verdict is drawn (lessons 8, 14, 20; `bench`'s kernel sets)."""
    per_round = [x / y for x, y in zip(a, b) if y > 0]
    return min(per_round), max(per_round)


def figures_apart(a: float, b: float, close: float = CLOSE) -> int:
    """Two figures with no rounds to test: one run's shares of its time, or prices from counts (the
    same every run: `rank_priced`). +1, -1, or 0 within `close` of the larger."""
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
    """Why the rule ranked neither side, in words ("" when it ranks one)."""
    return test(a, b, close).reason


@dataclass(frozen=True)
class Ranking:
    """Sides ordered by their medians (best first), and what the rule lets one say of them."""

    order: tuple[str, ...]              # by median, best first
    medians: dict
    ranges: dict                        # name -> (lo, hi) over the rounds
    rounds: dict                        # name -> number of rounds
    winner: str | None                  # the best, ranked above every other side by the rule; else None
    loser: str | None                   # the worst, ranked below every other side by the rule; else None
    reason: str                         # why there is no winner ("" when there is one)
    priced: str = ""                    # rank_priced: what the figures were priced on ("" for timed rounds)

    @property
    def best(self) -> str:
        return self.order[0]

    @property
    def worst(self) -> str:
        return self.order[-1]


def _ends(order: tuple[str, ...], above: Callable[[str, str], bool],
          reason_for: Callable[[str, str], str]) -> tuple[str | None, str | None, str]:
    """The winner (ranked above every other side), the loser (below every other) and, with no winner,
    why not: the closest side against the best, in `reason_for`'s words. `order` is best first."""
    best, worst = order[0], order[-1]
    others = order[1:]
    winner = best if others and all(above(best, k) for k in others) else None
    loser = worst if others and all(above(k, worst) for k in order[:-1]) else None
    reason = ""
    if winner is None and others:
        closest = next(k for k in others if not above(best, k))
        reason = f"{closest} against {best}: {reason_for(best, closest)}"
    return winner, loser, reason


def rank(sides: Mapping[str, Sequence[float]], higher: bool = True, close: float = CLOSE,
         counts: Mapping[str, Sequence[int]] | None = None) -> Ranking:
    """Rank `sides` ({name: its rounds}, round i of every side measured in the same round) by the rule:
    a winner only when the test ranks it above every other side; `higher` says whether a larger figure is better (tokens/s) or worse (seconds). `counts`
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

    winner, loser, reason = _ends(order, above, reason_for)
    return Ranking(order, med, {k: (min(v), max(v)) for k, v in rounds.items()},
                   {k: len(v) for k, v in rounds.items()}, winner, loser, reason)


PRICED_RULE = f"priced from counts, the same every run: apart by over {CLOSE:.0%}"


def rank_priced(sides: Mapping[str, float], higher: bool = True, on: str = "the roofline clock",
                close: float = CLOSE) -> Ranking:
    """Rank figures priced from counts (one value a side, the same in every run: `RooflineClock`) by
    the minimum effect alone: a winner only when it is better than every other side by more than
    `close` of the larger; `on` names what priced them (said in `best_words`)."""
    vals = {k: float(v) for k, v in sides.items()}
    if not vals:
        raise ValueError("rank_priced: no side")
    order = tuple(sorted(vals, key=lambda k: vals[k], reverse=higher))
    sign = 1 if higher else -1

    def above(a: str, b: str) -> bool:
        return sign * figures_apart(vals[a], vals[b], close) > 0

    winner, loser, reason = _ends(order, above, lambda a, b: f"within {close:.0%}")
    return Ranking(order, vals, {k: (v, v) for k, v in vals.items()}, {k: 1 for k in vals}, winner, loser,
                   reason, priced=on)


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
    if r.priced:
        if r.winner is not None:
            rest = ", ".join(f"{k} {fmt(r.medians[k])}" for k in r.order[1:])
            return (f"{what}: {r.winner} best, {fmt(r.medians[r.winner])} ({rest}); on {r.priced}, "
                    f"{PRICED_RULE}.")
        sides = ", ".join(f"{k} {fmt(r.medians[k])}" for k in r.order)
        return f"{what}: no winner ({r.reason}): {sides}; on {r.priced}."
    if r.winner is not None:
        rest = ", ".join(f"{k} {spread_text(r, k, fmt)}" for k in r.order[1:])
        return (f"{what}: {r.winner} best, {spread_text(r, r.winner, fmt)}, ranked by {rule_words(n)} "
                f"({rest}); {where}.")
    sides = ", ".join(f"{k} {spread_text(r, k, fmt)}" for k in r.order)
    return f"{what}: no winner ({r.reason}): {sides}; {where}."


def simulate(effect: float = 1.0, trials: int = 2000, seed: int = 0, adaptive: bool = True,
             rounds: int = MIN_ROUNDS, cap: int = CAP) -> float:
    """How often the rule ranks side b above side a when b's true time is `effect` × a's, under
    simulated noise with heavy tails (seeded, so the figure is the same on every machine):

        - a load shared by both sides of a round, exp(0.3·|t₂|): a busy moment slows the whole round;
        - a drift within the round, exp(0.05·|t₂|) on the side measured second (the load rising);
        - each measurement's own noise, exp(0.1·t₂), t₂ Student's t with 2 degrees of freedom (its
          variance is infinite: one round in a few dozen is far off).

    Rounds alternate which side goes first (`round_order`). `adaptive`: rounds are added from `rounds`
    up to `cap` until `settled`; otherwise exactly `rounds`. Returns the share of trials ranked with b
    slower than a (for effect > 1: a consistent effect found; for 1.0: a false verdict either way)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    ranked = 0
    for _ in range(trials):
        a: list[float] = []
        b: list[float] = []
        while True:
            i = len(a)
            load = math.exp(0.3 * abs(rng.standard_t(2)))
            drift = math.exp(0.05 * abs(rng.standard_t(2)))
            ta = load * math.exp(0.1 * rng.standard_t(2))
            tb = effect * load * math.exp(0.1 * rng.standard_t(2))
            if round_order(("a", "b"), i)[0] == "a":
                tb *= drift
            else:
                ta *= drift
            a.append(ta)
            b.append(tb)
            if adaptive and settled(a, b, cap):
                break
            if not adaptive and len(a) >= rounds:
                break
        side = apart(b, a)
        if (side > 0) if effect > 1 else (side != 0):
            ranked += 1
    return ranked / trials
