"""The roofline clock (issue 53): an engine on simulated time whose steps are priced from their counted
bytes and FLOPs at a machine's two figures, so a served workload's schedule, latencies and every
verdict drawn from them are the same however busy the machine is."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minillm
from minillm import closeness
from minillm.engine.engine import Engine
from minillm.errors import MiniLLMError
from minillm.measure.chips import Hardware
from minillm.serving import disagg
from minillm.serving.metrics import RooflineClock, serve
from minillm.serving.workloads import generate_workload

HW = Hardware(name="test machine", bandwidth_gbs=20.0, peak_gflops=200.0)


@pytest.fixture(scope="module")
def model():
    return minillm.load("random-tiny", quiet=True)


def items(model, n=8, seed=0, rate=50.0):
    c = model.config
    return generate_workload("poisson", rate=rate, n=n, seed=seed, vocab_size=c.vocab_size, n_ctx=c.n_ctx)


def slowed(monkeypatch, seconds: float) -> None:
    """Every model step takes `seconds` longer, as on a machine shared with other work."""
    from minillm.engine import engine as engine_module
    real = engine_module.run_step

    def slow(*a, **kw):
        time.sleep(seconds)
        return real(*a, **kw)
    monkeypatch.setattr(engine_module, "run_step", slow)


def test_each_step_advances_the_clock_by_its_roofline_price(model):
    clock = RooflineClock(HW)
    _, e = serve(model, items(model), step_time=clock)
    for s in e.steps:
        r = s.record
        want = max(r.total_bytes / (HW.bandwidth_gbs * 1e9), r.total_flops / (HW.peak_gflops * 1e9))
        assert s.seconds == pytest.approx(want, rel=1e-12)
        assert s.model_seconds > 0                       # the measured time is kept beside the price
    # the clock only ever advances by prices, or jumps to an arrival when nothing can run
    steps = list(e.steps)
    assert all(b.start == pytest.approx(a.start + a.seconds) or b.start > a.start + a.seconds
               for a, b in zip(steps, steps[1:]))


def test_a_priced_run_is_the_same_run_on_a_slowed_machine(model, monkeypatch):
    """The whole point: the schedule and every latency are the same when every step really runs
    slower; on the stopwatch they are not."""
    clock = RooflineClock(HW)
    work = items(model, n=10, seed=4)
    quiet, _ = serve(model, work, step_time=clock)
    slowed(monkeypatch, 0.003)
    busy, _ = serve(model, work, step_time=clock)
    for key in ("steps", "output_tokens_per_s", "ttft_p95_s", "tbt_p50_s", "tbt_p99_s", "mean_batch"):
        assert busy[key] == quiet[key], key
    assert [r["token_times_s"] for r in busy["per_request"]] == [r["token_times_s"] for r in quiet["per_request"]]
    assert quiet["clock"] == busy["clock"] == "roofline"
    assert busy["roofline_share"] > 0 and busy["measured_model_s"] > 0      # the measured time is kept beside
    stopwatch, _ = serve(model, work)          # on the stopwatch the stall shows: every gap holds a 3 ms sleep
    assert stopwatch["clock"] == "measured" and stopwatch["tbt_p50_s"] > 0.003 > busy["tbt_p50_s"]


def test_a_split_on_the_roofline_clock_is_the_same_run_when_slowed(model, monkeypatch):
    clock = RooflineClock(HW)
    work = items(model, n=6, seed=2)
    kw = dict(p_threads=1, d_threads=1, link_gbps=clock.copy_gbps(), step_time=clock)
    a, _ = disagg.disaggregated(model, work, **kw)
    slowed(monkeypatch, 0.003)
    b, _ = disagg.disaggregated(model, work, **kw)
    assert a["clock"] == b["clock"] == "roofline"
    for key in ("output_tokens_per_s", "ttft_p95_s", "tpot_p95_s", "tbt_p99_s", "steps"):
        assert a[key] == b[key], key


def test_the_roofline_clock_needs_the_meter_and_simulated_time(model):
    clock = RooflineClock(HW)
    with pytest.raises(MiniLLMError, match="needs meter=True and no clock"):
        Engine(model, step_time=clock, meter=False)
    with pytest.raises(MiniLLMError, match="needs meter=True and no clock"):
        Engine(model, step_time=clock, clock=time.monotonic)
    with pytest.raises(MiniLLMError, match="no peak"):
        RooflineClock(Hardware(name="m1", bandwidth_gbs=68.0, peak_gflops=None))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from("abcd"), st.floats(0.01, 100.0), min_size=1, max_size=4),
       st.booleans())
def test_priced_figures_rank_by_the_minimum_effect_alone(sides, higher):
    r = closeness.rank_priced(sides, higher=higher)
    best = max(sides, key=sides.get) if higher else min(sides, key=sides.get)
    beyond = all(abs(sides[best] - v) > closeness.CLOSE * max(sides[best], v) for k, v in sides.items() if k != best)
    assert (r.winner == best) == (len(sides) > 1 and beyond)
    words = closeness.best_words(r, "Figure", lambda v: f"{v:.4g}")
    if r.winner:
        assert "priced from counts" in words
    elif len(sides) > 1:
        assert "no winner" in words
    assert "round" not in words                      # nothing about rounds: there are none


def test_priced_apart_is_the_band():
    assert closeness.figures_apart(1.06, 1.0) == 1 and closeness.figures_apart(1.0, 1.06) == -1
    assert closeness.figures_apart(1.04, 1.0) == 0
