"""The serving verdicts (ui/report.py: best, favours, budget_verdict, diagnosis, disagg_verdict) say
what their numbers say, and their tests can fail: each helper, broken on purpose, fails its check.

Each check takes the module and calls the helper through it, so a broken helper put in its place
(monkeypatch) is the one checked; the last test runs every check against its broken twin and expects
an AssertionError."""

from __future__ import annotations

import pytest

from minillm.ui import report


def _run(name, rounds=None, **figures):
    """A run's figures; `rounds` ({figure: [value per round]}) as merge_rounds keeps them (none: one run)."""
    return {"policy": name, "label": name, **figures, **({"rounds": rounds} if rounds else {})}


def check_best(m):
    runs = [_run("a", x=3.0), _run("b", x=1.0), _run("c", x=2.0), _run("d", x=None)]
    hi, lo = m.best(runs, "x", True)
    assert (hi["policy"], lo["policy"]) == ("a", "b")
    hi, lo = m.best(runs, "x", False)
    assert (hi["policy"], lo["policy"]) == ("b", "a")


def check_favours(m):
    name = lambda r: r["policy"]  # noqa: E731
    show = lambda v: f"{v:.1f}"  # noqa: E731
    six = lambda *v: list(v) * 3  # noqa: E731      six paired rounds: the fewest the rule ranks
    said = m.favours([_run("a", {"x": six(10.0, 11.0)}, x=10.5), _run("b", {"x": six(20.0, 21.0)}, x=20.5),
                      _run("c", {"x": six(30.0, 31.0)}, x=30.5)], "x", True, "T", show, name)
    assert "favours c (30.5 (30.0-31.0); a: 10.5 (10.0-11.0)), ranked by a sign test on 6 paired rounds" in said
    said = m.favours([_run("a", {"x": six(10.0, 11.0)}, x=10.5), _run("b", {"x": six(10.2, 10.3)}, x=10.25)], "x",
                     True, "T", show, name)
    assert "favours" not in said and "no budget stands out" in said          # within 5%: none favoured
    said = m.favours([_run("a", {"x": six(10.0, 25.0)}, x=17.5), _run("b", {"x": six(20.0, 21.0)}, x=20.5)], "x",
                     True, "T", show, name)
    assert "favours" not in said and "3 of 6 rounds" in said                 # the rounds disagree
    said = m.favours([_run("a", {"x": [10.0, 11.0]}, x=10.5), _run("b", {"x": [20.0, 21.0]}, x=20.5)], "x", True,
                     "T", show, name)
    assert "favours" not in said and "2 paired rounds: a sign test at 5% needs 6" in said   # too few
    said = m.favours([_run("a", x=10.0), _run("b", x=20.0)], "x", True, "T", show, name)
    assert "favours" not in said and "1 paired round:" in said              # one run ranks nothing
    said = m.favours([_run("a", {"x": six(0.1, 0.11)}, x=0.1), _run("b", {"x": six(0.3, 0.31)}, x=0.3)], "x", False,
                     "Gap", show, name)
    assert "favours a" in said


def _twice(**figures):
    """Six rounds of each figure, 2% apart in turn: the rounds of a steady run."""
    return {k: [v, v * 1.02] * 3 for k, v in figures.items()}


def check_budget_verdict(m):
    a = dict(output_tokens_per_s=10.0, tbt_p99_s=0.1, ttft_p95_s=1.0, goodput_rps=0.1)
    b = dict(output_tokens_per_s=20.0, tbt_p99_s=0.3, ttft_p95_s=0.5, goodput_rps=0.3)
    runs = [_run("budget 32", _twice(**a), **a, good_requests=10, slo_met={"tpot": 0.5}),
            _run("no chunking", _twice(**b), **b, good_requests=30, slo_met={"tpot": 0.9})]
    good = {"fixed_s": 0.046, "per_token_s": 0.0013, "r2": 0.77, "steps": 100}
    said = " ".join(m.budget_verdict(runs, good, {"tpot": 0.07}, weight_read_s=0.018))
    assert "46 ms + 1.3 ms per token" in said and "costs as much as 35 tokens" in said
    assert "reading the weights once is 18 ms of it" in said
    assert "up to 18 tokens" in said                                      # (70 − 46) ÷ 1.3
    useless = {**good, "r2": 0.01}
    said = " ".join(m.budget_verdict(runs, useless, {"tpot": 0.07}))
    assert "the fit is not used (r² 0.01" in said and "per token" not in said and "up to" not in said
    assert "Goodput (TPOT≤70 ms) favours no chunking" in said
    runs[0]["good_requests"], runs[1]["good_requests"] = 1, 3                # goodput counts requests: 3
    said = " ".join(m.budget_verdict(runs, useless, {"tpot": 0.07}))          # against 1 ranks nothing
    assert "Goodput (TPOT≤70 ms) favours" not in said and "budget 32 against no chunking: counts too close to rank, 1 against 3" in said


def check_diagnosis(m):
    run = {"policy": "continuous", "mean_batch": 11.2,
           "phases": {"decode": {"seconds": 9.0, "bound": "compute"}, "prefill": {"seconds": 1.0, "bound": "compute"}}}
    said = m.diagnosis(run)
    assert "compute-bound" in said and "memory-bound" not in said and "bigger batches (" not in said
    run["phases"]["decode"]["bound"] = "memory"
    assert "memory-bound" in m.diagnosis(run) and "bigger batches" in m.diagnosis(run)
    run["phases"]["prefill"]["seconds"] = 20.0
    assert "prompt tokens took" in m.diagnosis(run)


def _disagg_runs(one_threads, split):
    fit = {"fixed_s": 0.01, "per_token_s": 0.001, "r2": 0.9, "steps": 50}
    common = dict(ttft_p95_s=0.1, tpot_p95_s=0.02, busy=[0.5], fit=[fit], kv_bytes_moved=0, handoffs=0,
                  link_seconds=0.0)
    one = {**common, "label": "one", "split": "colocated", "threads": one_threads, "output_tokens_per_s": 100.0}
    two = {**common, "label": "split", "split": split, "threads": 2, "output_tokens_per_s": 150.0,
           "ttft_p95_s": 0.05, "busy": [0.3, 0.9], "fit": [fit, fit], "kv_bytes_moved": 1000, "handoffs": 4,
           "link_seconds": 1e-4, "link_gbps": 25.0}
    for r in (one, two):
        r["rounds"] = _twice(output_tokens_per_s=r["output_tokens_per_s"], ttft_p95_s=r["ttft_p95_s"],
                             tpot_p95_s=r["tpot_p95_s"])
    return [one, two]


def check_disagg_verdict(m):
    said = " ".join(m.disagg_verdict(_disagg_runs(2, "1:1")))      # the run: 2 threads against 1:1
    assert "Not ranked" in said and "wins" not in said and "loses" not in said
    said = " ".join(m.disagg_verdict(_disagg_runs(1, "1:1")))
    assert "Against one the split" in said and "this machine, 1 BLAS thread, now" in said
    assert "loses on tok/s per engine" in said and "TTFT p95" in said.split("wins on")[1]   # 75 < 100 per engine
    assert "favours the split" in said and "disfavours it" in said      # the simulation's two biases


CHECKS = {"best": check_best, "favours": check_favours, "budget_verdict": check_budget_verdict,
          "diagnosis": check_diagnosis, "disagg_verdict": check_disagg_verdict}


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_verdict_says_what_its_numbers_say(name):
    CHECKS[name](report)


def _broken():
    real = {k: getattr(report, k) for k in CHECKS}

    def best(results, key, high):                      # ranks the wrong way round
        return real["best"](results, key, not high)

    def favours(results, key, high, what, show, name):  # names a winner however close the runs
        hi, lo = report.best(results, key, high)
        return (f"{what} favours {name(hi)} ({show(hi[key])} ({show(hi[key])}-{show(hi[key])}); {name(lo)}: "
                f"{show(lo[key])} ({show(lo[key])}-{show(lo[key])})), beyond every other run's spread.")

    def budget_verdict(results, fit, slo, weight_read_s=None):   # uses a fit that explains nothing
        return real["budget_verdict"](results, fit and {**fit, "r2": max(fit["r2"], 0.9)}, slo, weight_read_s)

    def diagnosis(r):                                   # the typed verdict of old: decode is memory-bound
        r = {**r, "phases": {**r["phases"], "decode": {**r["phases"].get("decode", {}), "bound": "memory"}}}
        return real["diagnosis"](r)

    def disagg_verdict(results):                        # ranks sides that ran on different thread counts
        return real["disagg_verdict"]([{**r, "threads": 1} if r["split"] == "colocated" else r for r in results])

    return {"best": best, "favours": favours, "budget_verdict": budget_verdict, "diagnosis": diagnosis,
            "disagg_verdict": disagg_verdict}


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_verdict_broken_on_purpose_fails_its_check(name, monkeypatch):
    monkeypatch.setattr(report, name, _broken()[name])
    with pytest.raises(AssertionError):
        CHECKS[name](report)


# -- the lessons' own word helpers: each chooses its words from the numbers it is given -------------

def _lesson(number: int):
    import importlib

    from minillm.cli import learn
    return importlib.import_module(next(i.module for i in learn.LESSONS if i.number == number))


def test_lesson_7_names_the_phase_that_takes_longer_and_calls_a_near_tie_one():
    dominates = _lesson(7).dominates
    assert dominates(1.2) == "prefill dominates" and dominates(5.0) == "prefill dominates"
    assert dominates(0.8) == "decode dominates" and dominates(0.01) == "decode dominates"
    assert dominates(1.05) == dominates(0.95) == "prefill about equals decode"


def test_lesson_20_measures_a_speedup_against_the_byte_ratio_that_bounds_it():
    """A share of the byte ratio, a figure: no words chosen from bands of a timed share (issue 53)."""
    reach = _lesson(20).reach_words
    assert reach(3.5, 3.7) == "95% of the byte ratio"
    assert reach(2.0, 4.0) == "50% of the byte ratio"
    assert reach(4.33, 3.7) == "117% of the byte ratio"
    assert reach(0.5, 3.7) == "14% of the byte ratio"


def test_the_gpu_ridges_the_lessons_quote_are_the_chips_published_figures():
    """153-295 FLOPs per byte, from the chip table's published peaks and bandwidths (the A100's 312
    fp16 TFLOP/s over 2.04 TB/s up to the H100 SXM's 989 over 3.35), not typed in the lessons."""
    from lessons import _common
    from minillm.measure.chips import get_chip
    chips = [get_chip(g) for g in _common.GPUS]
    ridges = [c.peak_gflops / c.bandwidth_gbs for c in chips]
    assert _common.gpu_ridge_range() == f"{min(ridges):.0f}-{max(ridges):.0f}" == "153-295"
