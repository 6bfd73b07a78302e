"""When the two phases meet: latency targets and goodput, the budget sweep, prefill/decode
disaggregation (tokens, KV handed over, blocks freed), and the commands for real."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.models.gpt2 import GPT2Config
from minillm.engine.generate import generate
from minillm.errors import MiniLLMError
from minillm.serving.disagg import Disaggregated, disaggregated, parse_split
from minillm.serving.metrics import goodput, latency, parse_slo, request_tpot
from minillm.serving.workloads import WorkItem

from test_cli import TINY_A, cli_env, home, ok, run, user_error  # noqa: F401  (home is a fixture)
from test_properties import random_model

# ------------------------------------------------------------------------------ targets and goodput


def test_slo_parses_either_target_alone_or_both():
    assert parse_slo("ttft=0.5,tpot=0.05") == {"ttft": 0.5, "tpot": 0.05}
    assert parse_slo(" TPOT = 50e-3 ") == {"tpot": 0.05}
    assert parse_slo("ttft=2s") == {"ttft": 2.0}
    assert parse_slo(None) == {}


@pytest.mark.parametrize("text, words", [
    ("", ["NAME=SECONDS"]), ("ttft", ["NAME=SECONDS"]), ("tbt=1", ["unknown target", "ttft and tpot"]),
    ("ttft=fast", ["not a number"]), ("tpot=0", ["above 0"]), ("ttft=-1", ["above 0"]),
    ("ttft=nan", ["above 0"]), ("ttft=1,ttft=2", ["twice"]),
])
def test_bad_slo_is_one_clear_error(text, words):
    with pytest.raises(MiniLLMError) as e:
        parse_slo(text)
    assert all(w in str(e.value) for w in words)


def test_tpot_is_the_mean_gap_of_one_request():
    assert request_tpot(1.0, 1.0, 1) is None
    assert request_tpot(1.0, 1.9, 4) == pytest.approx(0.3)


# Four requests, times by hand: (arrival, token times, finished).
TRACE = [
    (0.0, [0.2, 0.3, 0.4], True),     # TTFT 0.2, TPOT 0.1: meets both
    (0.1, [0.9, 0.95], True),         # TTFT 0.8 misses; TPOT 0.05 meets
    (0.2, [0.4, 0.8, 1.2], True),     # TTFT 0.2 meets; TPOT 0.4 misses
    (0.3, [0.5], True),               # one token: TTFT 0.2 meets, no TPOT to miss
]


def test_goodput_by_hand():
    r = latency(TRACE, 2.0, {"ttft": 0.5, "tpot": 0.1})
    assert r["good_requests"] == 2 and r["goodput_rps"] == pytest.approx(2 / 2.0)
    assert r["slo_met"] == pytest.approx({"ttft": 3 / 4, "tpot": 3 / 4, "all": 2 / 4})
    assert latency(TRACE, 2.0, {"ttft": 0.5})["goodput_rps"] == pytest.approx(3 / 2.0)
    assert latency(TRACE, 2.0, {"tpot": 0.05})["good_requests"] == 2           # requests 2 and 4
    # an unfinished request meets nothing
    assert goodput([(0.1, 0.01, False)], 1.0, {"ttft": 1.0})["good_requests"] == 0


def by_hand(rows: list[dict], duration: float, slo: dict) -> tuple[int, dict]:
    """Goodput from a run's per-request view, the long way round."""
    good, met = 0, {k: 0 for k in slo}
    for q in rows:
        t = q["token_times_s"]
        ttft = t[0] - q["arrival_s"] if t else None
        tpot = (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None
        ok_ = {"ttft": q["finished"] and ttft is not None and ttft <= slo.get("ttft", 0),
               "tpot": q["finished"] and (tpot is None or tpot <= slo.get("tpot", 0))}
        for k in slo:
            met[k] += ok_[k]
        good += all(ok_[k] for k in slo)
    return good, {k: v / len(rows) for k, v in met.items()}


def test_the_commands_goodput_equals_the_hand_computed_one(home, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt_ids": list(range(1, 3 + 5 * i)), "max_tokens": 2 + i % 3,
                                         "arrival": i * 0.005}) + "\n" for i in range(6)))
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", trace, "--slo", "ttft=0.05,tpot=0.01",
               "--json"))
    (res,) = json.loads(r.stdout)
    rows = res["per_request"]
    assert len(rows) == 6 and res["slo"] == {"ttft": 0.05, "tpot": 0.01}
    good, met = by_hand(rows, res["duration_s"], res["slo"])
    assert res["good_requests"] == good
    assert res["goodput_rps"] == pytest.approx(good / res["duration_s"])
    assert {k: res["slo_met"][k] for k in met} == pytest.approx(met)


# ------------------------------------------------------------------------------ disaggregation


def test_split_parses():
    assert parse_split("1:1") == (1, 1) and parse_split("3:1") == (3, 1)
    for bad in ("1", "0:1", "a:b", "1:", "1:-2"):
        with pytest.raises(MiniLLMError, match="P:D"):
            parse_split(bad)


CONFIG = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=50)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 5))
    items = []
    for i in range(n):
        prompt = draw(st.lists(st.integers(0, 49), min_size=1, max_size=30))
        new = draw(st.integers(1, 8))
        temp = draw(st.sampled_from([0.0, 0.9]))
        items.append(WorkItem(draw(st.floats(0, 0.02)), prompt, new, temp, seed=i if temp else None))
    return sorted(items, key=lambda w: w.arrival)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=workloads(), budget=st.sampled_from([4, 16, 256]), block=st.sampled_from([1, 4, 16]),
       link=st.sampled_from([0.001, 25.0]), prefill_budget=st.sampled_from([None, 4, 1024]))
def test_disaggregation_keeps_tokens_hands_over_a_fresh_prefill_and_frees_every_block(
        dtype, items, budget, block, link, prefill_budget):
    model = random_model(CONFIG, 3, dtype=dtype)
    d = Disaggregated(model, p_threads=1, d_threads=1, link_gbps=link, num_blocks=64, block_size=block,
                      max_seqs=3, max_batched_tokens=budget, prefill_batched_tokens=prefill_budget, keep_kv=True)
    for w in items:
        d.add(w.prompt, w.max_tokens, w.sampling, arrival=w.arrival)
    d.run()
    # the prefill engine steps within its own budget; the decode engine within the shared one
    assert all(s.n_tokens <= (prefill_budget or budget) for s in d.prefill.steps)
    assert all(s.n_tokens <= budget for s in d.decode.steps)
    if prefill_budget == 1024:      # above every prompt: each prompt whole, from its first position
        assert all(pos == 0 for s in d.prefill.steps for _, pos, _ in s.seqs)
    outs = d.outputs()
    for rid, w in zip(d.order, items):
        assert outs[rid] == generate(model, w.prompt, w.max_tokens, temperature=w.temperature, seed=w.seed)
    tol = 1e-9 if dtype == np.float64 else 2e-5
    for h in d.handed:
        fresh = model.new_cache()
        model.prefill(np.array(h.prompt), fresh)
        T = len(h.prompt)
        for layer in range(CONFIG.n_layer):
            k, v = fresh.read(layer, T)
            np.testing.assert_allclose(h.k[layer], k, atol=tol, rtol=tol)
            np.testing.assert_allclose(h.v[layer], v, atol=tol, rtol=tol)
    assert d.kv_bytes == sum(h.nbytes for h in d.handed)
    assert len(d.handed) == sum(1 for w in items if w.max_tokens > 1)
    for e in (d.prefill, d.decode):
        assert e.blocks.n_free == e.blocks.num_blocks and not e.has_work
    times = [d.token_times(rid) for rid in d.order]
    assert all(len(t) == w.max_tokens and t == sorted(t) for t, w in zip(times, items))
    # the second token comes after the KV has crossed the link
    for h in d.handed:
        assert d.token_times(h.request_id)[1] >= h.ready_at


def test_the_link_is_charged_by_the_bytes():
    model = random_model(CONFIG, 1, dtype=np.float32)
    items = [WorkItem(0.0, list(range(40)), 3)]
    slow, ds = disaggregated(model, items, p_threads=1, d_threads=1, link_gbps=1e-4, num_blocks=16)
    h = ds.handed[0]
    expect = 2 * CONFIG.n_layer * CONFIG.n_embd * 40 * 4        # K and V, every layer, 40 positions, fp32
    assert h.nbytes == expect == slow["kv_bytes_moved"]
    assert h.ready_at - h.first_at == pytest.approx(expect * 8 / 1e5)
    assert ds.token_times(0)[1] - ds.token_times(0)[0] >= expect * 8 / 1e5


# ------------------------------------------------------------------------------ the commands


def test_serve_sim_budget_sweep_json(home):
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", "mixed", "--requests", "8", "--rate", "50",
               "--compare", "budget", "--slo", "tpot=0.05", "--json", timeout=300))
    res = json.loads(r.stdout)
    assert [x["budget"] for x in res] == [32, 128, 512, 2048, None]
    assert len({x["output_tokens"] for x in res}) == 1
    for x in res:
        assert x["fit"] is None or x["fit"]["steps"] == x["steps"]
        assert 0 <= x["slo_met"]["all"] <= x["slo_met"]["tpot"] <= 1 and "tbt_p99_s" in x


def test_serve_sim_budget_sweep_table_fits_80_columns(home):
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", "mixed", "--requests", "8", "--rate", "50",
               "--compare", "budget", "--slo", "ttft=0.5,tpot=0.05", timeout=300,
               env={**cli_env(home), "COLUMNS": "80"}))
    words = " ".join(r.stdout.split())
    assert ("favours" in words or "no budget stands out" in words) and "no chunking" in words
    assert "Clock: the roofline clock" in words and "; on the roofline clock" in words   # the default, said
    assert "per token" in words or "the fit is not used (" in words      # a fit explains the steps, or is named
    assert all(len(line) <= 80 for line in r.stdout.splitlines())


def test_serve_sim_disaggregation_compare(home):
    env = {**cli_env(home), "COLUMNS": "80"}
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", "mixed", "--requests", "6", "--rate", "50",
               "--compare", "disagg", "--slo", "ttft=0.5,tpot=0.05", "--link-gbps", "100", env=env, timeout=300))
    words = " ".join(r.stdout.split())
    assert "split 1:1" in words and "KV sent" in words and "busy" in words
    assert words.startswith("Clock: the roofline clock (") and "Against one, chunk" in words
    assert "on the roofline clock" in words and "one run of each (priced)" in words
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", "mixed", "--requests", "6", "--rate", "50",
               "--disaggregate", "1:1", "--json", timeout=300))
    (res,) = json.loads(r.stdout)
    assert res["split"] == "1:1" and res["kv_bytes_moved"] > 0
    assert res["handoffs"] == sum(1 for q in res["per_request"] if q["tokens"] > 1) > 0


def test_serve_sim_rates_finds_the_highest_rate_meeting_the_target(home):
    """--rates: the same requests at every rate; with a target every rate meets, the highest swept rate is
    the capacity (and the command says it may be higher); the table names it and what a token costs."""
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "6", "--rates", "1000,1", "--slo", "ttft=60",
               "--json", timeout=300))
    res = json.loads(r.stdout)
    assert [x["rate"] for x in res["runs"]] == [1.0, 1000.0]
    assert len({x["output_tokens"] for x in res["runs"]}) == 1
    assert res["capacity"]["rate"] == 1000.0 and res["capacity"]["all_met"]
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "6", "--rates", "1,1000", "--slo", "ttft=60",
               "--price-per-hour", "2", timeout=300, env={**cli_env(home), "COLUMNS": "80"}))
    words = " ".join(r.stdout.split())
    assert "Capacity: 1000 requests/s is the highest swept rate" in words and "engine-hours" in words
    assert words.startswith("Clock: the roofline clock (") and "their price" in words


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft=soon"], ["--slo", "number"]),
    (["--slo", "p99=1"], ["unknown target"]),
    (["--disaggregate", "2"], ["--disaggregate", "P:D"]),
    (["--disaggregate", "1:1", "--link-gbps", "0"], ["--link-gbps"]),
    (["--disaggregate", "1:1", "--compare", "budget"], ["--disaggregate"]),
    (["--disaggregate", "1:1", "--prefix-cache"], ["--prefix-cache"]),
    (["--rates", "1,2"], ["--rates", "--slo"]),
    (["--rates", "1,x", "--slo", "ttft=1"], ["--rates"]),
    (["--rates", "1,2", "--slo", "ttft=1", "--compare", "budget"], ["--rates", "--compare"]),
    (["--rates", "1,2", "--slo", "ttft=1", "--attainment", "1.5"], ["--attainment"]),
])
def test_serve_sim_bad_targets_and_splits_are_one_clear_line(home, args, words):
    user_error(run(home, "serve-sim", "--model", TINY_A, "--requests", "2", *args), *words)


def test_loadgen_slo_against_minillm_serve(tmp_path):
    import http.client
    import os
    import subprocess
    import sys

    from minillm.serving.prom import parse
    from test_cli import REPO

    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1"}
    env.pop("PYTHONPATH", None)
    p = subprocess.Popen([sys.executable, "-m", "minillm", "serve", "--model", "random-tiny", "--port", "0",
                          "--kv-memory", "8MB"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=REPO, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("listening on http://127.0.0.1:"), (line, p.stderr.read() if p.poll() else "")
        url = line.split()[-1]
        r = subprocess.run([sys.executable, "-m", "minillm", "loadgen", "--url", url, "--requests", "5",
                            "--rate", "20", "--slo", "ttft=30,tpot=10", "--json"], capture_output=True, text=True,
                           cwd=REPO, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert res["ok"] == 5 and res["slo"] == {"ttft": 30.0, "tpot": 10.0}
        assert res["good_requests"] == 5 and res["slo_met"]["all"] == 1.0        # targets no run misses
        assert res["goodput_rps"] == pytest.approx(5 / res["wall_s"])
        assert res["tpot_p50_s"] <= res["tpot_p95_s"]
        r = subprocess.run([sys.executable, "-m", "minillm", "loadgen", "--url", url, "--requests", "3",
                            "--rate", "20", "--slo", "ttft=1e-6"], capture_output=True, text=True,
                           cwd=REPO, env=env, timeout=120)
        words = " ".join(r.stdout.split())
        assert r.returncode == 0 and "goodput: 0 of 3 requests met every target" in words, r.stdout + r.stderr
        bad = subprocess.run([sys.executable, "-m", "minillm", "loadgen", "--url", url, "--slo", "tpot"],
                             capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
        assert bad.returncode != 0 and "--slo" in bad.stderr and "Traceback" not in bad.stderr
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", "/metrics")
        m = parse(conn.getresponse().read().decode())
        assert m["minillm_time_per_output_token_seconds_count"] >= 5
        assert m["minillm_time_to_first_token_seconds_count"] >= 8
        assert 'minillm_time_per_output_token_seconds_bucket{le="0.05"}' in m
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_the_live_view_marks_the_step_a_long_prefill_stalled_everyone():
    from rich.console import Console

    from minillm.engine.engine import Engine
    from minillm.ui.live import LiveView

    model = random_model(CONFIG, 2, dtype=np.float32)
    import io

    from minillm.ui.live import render

    engine = Engine(model, num_blocks=64, block_size=4, max_batched_tokens=64)
    for i in range(3):
        engine.add_request([1 + i, 2, 3], 12, arrival=0.0)
    engine.add_request(list(range(1, 41)), 2, arrival=1e-9)      # a long prompt among running decodes
    with LiveView(Console(file=io.StringIO(), width=80, force_terminal=True), title="mixed", fps=1e9) as view:
        engine.on_step = view
        engine.run()
    stalls = [(i, s) for i, s in enumerate(engine.steps, 1) if s.prefill_tokens >= 40 and s.decode_tokens]
    assert view.stall is not None and view.stall["step"] == stalls[0][0]
    console = Console(record=True, width=80, force_terminal=False)
    console.print(render(engine, "mixed", view.stall))
    text = console.export_text()
    assert "◆ stall: step" in text and "40 prompt tokens held 3 decodes" in text
    assert all(len(line) <= 80 for line in text.splitlines())


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_handed_off_request_preempted_on_the_decode_engine_is_recomputed_there(temperature):
    model = random_model(CONFIG, 5, dtype=np.float64)
    items = [WorkItem(0.0, list(range(1 + i, 9 + i)), 24, temperature, seed=i if temperature else None)
             for i in range(4)]
    d = Disaggregated(model, p_threads=1, d_threads=1, link_gbps=100, num_blocks=16, block_size=4,
                      max_seqs=4, max_batched_tokens=64)
    for w in items:
        d.add(w.prompt, w.max_tokens, w.sampling, arrival=w.arrival)
    d.run()
    assert d.decode.scheduler.preemptions > 0
    outs = d.outputs()
    for rid, w in zip(d.order, items):
        assert outs[rid] == generate(model, w.prompt, w.max_tokens, temperature=w.temperature, seed=w.seed)
    assert all(e.blocks.n_free == e.blocks.num_blocks for e in (d.prefill, d.decode))


# ------------------------------------------------------------------------------ verdicts from numbers

def _runs(**figures):
    """Budget runs with the given figures: name=[value per run] over budgets 32, 128, none, each served in
    six rounds 1% apart in turn (as merge_rounds keeps them; six: the fewest the verdict rule ranks)."""
    budgets = [32, 128, None]
    timed = ("output_tokens_per_s", "tbt_p99_s", "ttft_p95_s", "goodput_rps")
    return [{"budget": b, "policy": "no chunking" if b is None else f"budget {b}",
             **{k: v[i] for k, v in figures.items()},
             "rounds": {k: [v[i], v[i] * 1.01] * 3 for k, v in figures.items() if k in timed}}
            for i, b in enumerate(budgets)]


def test_a_budget_verdict_names_a_run_only_beyond_the_others_spread_and_none_when_all_are_close():
    from minillm.ui.report import budget_verdict
    runs = _runs(output_tokens_per_s=[10.0, 20.0, 20.0], tbt_p99_s=[0.1, 0.3, 0.2],
                 ttft_p95_s=[1.0, 1.02, 1.01], goodput_rps=[0.1, 0.6, 0.2], good_requests=[10, 60, 20],
                 slo_met=[{"all": x, "tpot": x} for x in (0.2, 0.6, 0.4)])
    lines = budget_verdict(runs, None, {"tpot": 0.05})
    tput, gap, ttft, good = lines[0], lines[1], lines[2], lines[-1]
    assert "favours" not in tput and "no budget stands out" in tput          # two tied at the top: no winner
    assert "favours budget 32 (100 ms (100-101 ms); budget 128: 302 ms (300-303 ms))" in gap
    assert "favours" not in ttft and "0 of 6 rounds favour one side by over 5%" in ttft and "no budget stands out" in ttft
    assert "favours budget 128 (0.60 req/s (0.60-0.61 req/s); budget 32: 0.10 req/s" in good
