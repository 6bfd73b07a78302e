"""Workloads, traces, metrics, and `minillm serve-sim` run for real in a subprocess."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.models.gpt2 import GPT2Config
from minillm.engine.engine import Engine
from minillm.errors import MiniLLMError
from minillm.serving.metrics import summarize
from minillm.serving.workloads import WORKLOADS, generate_workload, load_workload, read_trace, write_trace

from test_cli import TINY_A, home, ok, run, user_error  # noqa: F401  (home is a fixture)
from test_properties import random_model

JSON_KEYS = {"policy", "requests", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "tbt_p50_s", "tbt_p95_s",
             "prefix_hit_rate", "prefill_flops", "kv_waste", "preemptions"}


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_seeded_and_fit_the_context(name):
    a = generate_workload(name, rate=2.0, n=20, seed=3, vocab_size=500, n_ctx=128)
    b = generate_workload(name, rate=2.0, n=20, seed=3, vocab_size=500, n_ctx=128)
    assert a == b and a != generate_workload(name, rate=2.0, n=20, seed=4, vocab_size=500, n_ctx=128)
    assert a[0].arrival == 0 and all(x.arrival <= y.arrival for x, y in zip(a, a[1:]))
    assert all(len(w.prompt) + w.max_tokens <= 128 and w.max_tokens >= 1 and max(w.prompt) < 500 for w in a)
    if name == "shared-prefix":
        assert all(w.prompt[:31] == a[0].prompt[:31] for w in a)


def test_poisson_arrivals_come_at_the_rate():
    w = generate_workload("poisson", rate=4.0, n=2000, seed=0)
    assert 3.7 < len(w) / w[-1].arrival < 4.3


def test_a_trace_round_trips(tmp_path):
    items = generate_workload("poisson", n=5, seed=1, vocab_size=300, n_ctx=64)
    write_trace(items, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == items
    (tmp_path / "text.jsonl").write_text('{"prompt": "a b c", "max_tokens": 3, "arrival": 1.5}\n\n'
                                         '{"prompt_ids": [1, 2], "temperature": 0.7, "seed": 4}\n')
    got = load_workload(str(tmp_path / "text.jsonl"))
    assert [w.prompt for w in got] == [[1, 2], [64, 275, 269]] and got[0].max_tokens == 16


@pytest.mark.parametrize("line, words", [
    ("not json", ["line 1", "not JSON"]),
    ('{"prompt": "a", "max_tokens": 0}', ["max_tokens"]),
    ('{"prompt": "a", "promt_ids": [1]}', ["unknown field", "promt_ids"]),
    ('{"max_tokens": 3}', ["prompt"]),
    ('{"prompt_ids": [1, "x"]}', ["prompt_ids"]),
    ('{"prompt": "a", "temperature": -1}', ["temperature"]),
    ('[1, 2]', ["object"]),
])
def test_bad_traces_name_the_line_and_field(tmp_path, line, words):
    (tmp_path / "bad.jsonl").write_text(line + "\n")
    with pytest.raises(MiniLLMError) as e:
        read_trace(tmp_path / "bad.jsonl")
    for w in words:
        assert w in str(e.value)


def test_metrics_of_a_run():
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=256, vocab_size=60)
    model = random_model(config, 0, dtype=np.float32)
    engine = Engine(model, num_blocks=200, block_size=4, prefix_cache=True)
    for w in generate_workload("shared-prefix", rate=50.0, n=6, seed=0, vocab_size=60, n_ctx=256):
        engine.add_request(w.prompt, w.max_tokens, arrival=w.arrival)
    engine.run()
    r = summarize(engine)
    assert JSON_KEYS <= set(r)
    assert r["output_tokens"] == sum(len(q.output) for q in engine.requests.values())
    assert 0 < r["prefix_hit_rate"] < 1 and r["prefill_flops"] > 0
    assert 0 <= r["kv_waste"] < r["kv_waste_contiguous"] <= 1
    assert r["ttft_p50_s"] <= r["ttft_p95_s"] and r["tbt_p50_s"] <= r["tbt_p95_s"]
    assert r["phases"] and abs(sum(p["share"] for p in r["phases"].values()) - 1) < 1e-9


# ------------------------------------------------------------------------ the command, for real


def test_serve_sim_json_compare(home):
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "6", "--rate", "20", "--compare", "--json"))
    results = json.loads(r.stdout)
    assert [x["policy"] for x in results] == ["sequential", "static", "continuous"]
    for x in results:
        assert JSON_KEYS <= set(x) and x["requests"] == 6 and 0 <= x["kv_waste"] <= 1
    assert len({x["output_tokens"] for x in results}) == 1


def test_serve_sim_table_with_a_trace_and_the_prefix_cache(home, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"prompt": "a b c " * 8, "max_tokens": 4, "arrival": i * 0.01}) + "\n"
                             for i in range(4)))
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--workload", trace, "--compare", "prefix-cache",
               "--block-size", "4"))
    assert "prefix hit rate" in r.stdout and "TTFT" in r.stdout and "no prefix cache" in r.stdout


@pytest.mark.parametrize("args, words", [
    (["--workload", "bursty"], ["bursty", "poisson"]),
    (["--workload", "missing.jsonl"], ["missing.jsonl"]),
    (["--rate", "0"], ["--rate"]),
    (["--requests", "0"], ["--requests"]),
    (["--kv-memory", "lots"], ["--kv-memory", "256MB"]),
    (["--kv-memory", "1kB"], ["KV memory", "block"]),
    (["--block-size", "0"], ["--block-size"]),
])
def test_serve_sim_bad_input_is_one_clear_line(home, args, words):
    user_error(run(home, "serve-sim", "--model", TINY_A, "--requests", "2", *args), *words)


def test_serve_sim_a_request_too_big_for_the_pool(home):
    user_error(run(home, "serve-sim", "--model", TINY_A, "--requests", "2", "--kv-memory", "3kB",
                   "--block-size", "1"), "KV blocks", "--kv-memory")


def test_the_live_view_draws_the_queue_and_the_block_map():
    from rich.console import Console

    from minillm.ui.live import render

    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, n_ctx=256, vocab_size=60)
    engine = Engine(random_model(config, 0, dtype=np.float32), num_blocks=64, block_size=4, prefix_cache=True)
    for w in generate_workload("shared-prefix", rate=1000.0, n=5, seed=0, vocab_size=60, n_ctx=256):
        engine.add_request(w.prompt, w.max_tokens, arrival=w.arrival)
    for _ in range(3):
        engine.step()
    console = Console(record=True, width=80, force_terminal=False)
    console.print(render(engine, "continuous"))
    text = console.export_text()
    assert "running" in text and "KV blocks" in text and "█" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    lines = text.splitlines()          # the header in whole lines, none cut or wrapped mid-phrase
    assert lines[0].strip() == "continuous" and lines[1].startswith("t = ") and lines[1].rstrip().endswith("/5")
    assert lines[2].startswith("tokens out ") and "preemptions " in lines[2]


# ------------------------------------------------------------------ --clock: roofline and measured

# The real command with every batched model step slowed by a sleep inside the model's metered step:
# what a busy machine does to the steps it shares, on purpose.
SLOWED = """
import atexit, sys, time
from minillm.models.gpt2 import GPT2
run = GPT2.run
slowed = [0]
def slow(self, plan):
    if len(getattr(plan, "spans", ())) > 1:
        time.sleep(0.004)
        slowed[0] += 1
    return run(self, plan)
GPT2.run = slow
atexit.register(lambda: print(f"slowed steps: {slowed[0]}", file=sys.stderr))
from minillm.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


def _verdicts(stdout: str) -> str:
    """The sentences of `serve-sim --compare` (policies) after its table: the rankings, then each run's
    diagnosis (which kind of step took the time, what bound it)."""
    flat = " ".join(stdout.split())
    return "Throughput" + flat.split(" Throughput", 1)[1]


def test_serve_sim_compare_on_the_roofline_clock_reads_the_same_verdicts_when_the_steps_are_slowed(home, under_load):
    """Two `serve-sim --compare` runs, one with every batched step slowed 4 ms: on the roofline clock
    (the default of a comparison) every verdict and diagnosis, figure for figure, is the same; only the
    measured time said beside it differs."""
    import subprocess
    import sys

    import importlib.util

    from test_cli import REPO, cli_env

    under_load = under_load

    args = ["serve-sim", "--model", str(TINY_A), "--requests", "8", "--rate", "20000", "--compare", "--no-live"]
    plain = ok(run(home, *args))
    slowed = ok(subprocess.run([sys.executable, "-c", SLOWED, *args], capture_output=True, text=True,
                               encoding="utf-8", cwd=REPO, env=cli_env(home), timeout=300))
    for r in (plain, slowed):
        assert r.stdout.lstrip().startswith("Clock: the roofline clock (")      # said before any number
    assert _verdicts(plain.stdout) == _verdicts(slowed.stdout)
    ranked = under_load.rankings(plain.stdout)      # the harness that counts differing verdicts reads them
    assert len(ranked) == 3 and any(v is not None for _, v in ranked), ranked
    assert any("their price" in line for line in plain.stdout.splitlines())   # the measured time is said
    n = int(slowed.stderr.split("slowed steps: ")[1].split()[0])
    assert n > 0, slowed.stderr                             # the slowing ran: batched steps slept (no timing)


def test_serve_sim_clock_measured_still_serves_rounds(home):
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "4", "--rate", "50", "--compare",
               "prefix-cache", "--clock", "measured", "--repeats", "2", "--json"))
    res = json.loads(r.stdout)
    assert all(list(x)[0] == "clock" and x["clock"] == "measured" and x["n_rounds"] == 2 for x in res)
    assert all("roofline_share" not in x for x in res)
    r = ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "4", "--rate", "50", "--compare",
               "--clock", "measured", "--repeats", "2", "--no-live"))
    words = " ".join(r.stdout.split())
    assert words.startswith("Clock: measured:") and "2 rounds of each, interleaved" in words
    assert "roofline clock" not in words


def test_serve_sim_json_says_the_clock_first(home):
    one = json.loads(ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "3", "--json")).stdout)
    assert [list(x)[0] for x in one] == ["clock"] and one[0]["clock"] == "measured"     # one run: real latency
    priced = json.loads(ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "3", "--clock", "roofline",
                               "--json")).stdout)[0]
    assert list(priced)[0] == "clock" and priced["clock"] == "roofline"
    assert priced["clock_priced_at"]["bandwidth_gbs"] > 0 and priced["measured_model_s"] > 0
    assert priced["roofline_share"] > 0
    rates = json.loads(ok(run(home, "serve-sim", "--model", TINY_A, "--requests", "3", "--rates", "1,1000",
                              "--slo", "ttft=60", "--json")).stdout)
    assert list(rates)[0] == "clock" and rates["clock"] == "roofline"
    assert {x["clock"] for x in rates["runs"]} == {"roofline"}


@pytest.mark.parametrize("args, words", [
    (["--clock", "wall"], ["--clock wall", "roofline", "measured"]),
    (["--compare", "--repeats", "3"], ["--repeats 3", "--clock measured"]),
])
def test_serve_sim_bad_clock_is_one_clear_line(home, args, words):
    r = run(home, "serve-sim", "--model", TINY_A, "--requests", "2", *args)
    assert len(user_error(r, *words).splitlines()) == 1 and r.returncode == 1


@settings(max_examples=200, deadline=None)
@given(st.floats(0.01, 1000), st.lists(st.floats(0.8, 1.25), min_size=2, max_size=5), st.booleans())
def test_a_priced_sweep_favours_a_run_only_apart_from_every_other_by_over_5_percent(base, ratios, high):
    """`favours(..., priced=)`: one value a run (no rounds); a run is favoured exactly when its figure
    beats every other's by more than 5% of the larger, and the sentence names the clock."""
    from minillm.ui.report import favours

    values = [base * r for r in ratios]             # near one another: around the 5% edge
    results = [{"policy": f"run {i}", "x": v} for i, v in enumerate(values)]
    words = "the roofline clock (1 GB/s, 2 GFLOP/s)"
    line = favours(results, "x", high, "X", lambda v: f"{v:.6g}", lambda r: r["policy"], priced=words)
    best = max(range(len(values)), key=lambda i: values[i] if high else -values[i])
    apart = all(abs(values[best] - v) > 0.05 * max(values[best], v) for i, v in enumerate(values) if i != best)
    assert (f"X favours run {best} (" in line) == apart, line
    assert ("no budget stands out" in line) == (not apart) and f"on {words}" in line
