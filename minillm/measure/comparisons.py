"""Comparisons that hold on a busy machine, and fits that are allowed to say something.

Two configurations timed on different thread counts on a contended machine can rank upside down: a
2-thread run loses more to other programs than a 1-thread one (it waits for both cores). So a command
or lesson that ranks configurations asks `comparison_threads` for ONE thread count for every side: the
one asked for on a quiet machine, one thread on a busy one, with the line that says so.

A least-squares fit of step time against tokens (serving.metrics.step_fit) is only a model when the
token count explains the times: `fit_problem` names what makes a fit meaningless (too few points, r²
too low, a fixed part below zero, no growth with tokens), and whoever prints a conclusion from the fit
prints that instead.
"""

from __future__ import annotations

from .busy import busy_note

MIN_R2 = 0.5        # below this the token count explains less than half of the steps' variance


def comparison_threads(requested: int | None, default: int | None = None) -> tuple[int | None, str | None]:
    """(threads for every side, a line saying why) : `requested` (or `default`) on a quiet machine; 1 when
    the machine is busy, with a line that says every side ran on one thread and why."""
    threads = requested if requested is not None else default
    note = busy_note(threads or None)
    if note is None:
        return threads, None
    return 1, (f"{note}. So every side of this comparison runs on 1 BLAS thread: runs on different thread "
               "counts rank upside down on a contended machine.")


def fit_problem(fit: dict | None, min_r2: float = MIN_R2, priced: bool = False) -> str | None:
    """Why a fit of step time against tokens supports no conclusion, or None when it may be used.
    priced: the steps' times were priced from counts (the roofline clock), so no noise is in them and
    a poor fit is the cost's own shape (a roofline is flat until the arithmetic passes the read)."""
    if fit is None:
        return "too few steps of different sizes to fit"
    if fit["r2"] < min_r2:
        why = ("priced from counts, so no noise: per-step costs the token count does not capture, as a "
               "weight read that every step pays whatever its size" if priced else
               "a busy machine's noise, or per-step costs the token count does not capture")
        return f"r² {fit['r2']:.2f}: the tokens in a step explain little of its time here ({why})"
    if fit["per_token_s"] <= 0:
        return "the fitted time per token is not above zero: step time did not grow with tokens on this run"
    if fit["fixed_s"] <= 0:
        return "the fitted fixed part is below zero: a step cannot cost less than nothing"
    return None
