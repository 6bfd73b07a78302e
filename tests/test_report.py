"""What a learner reads: tables that fit 80 columns, words that wrap whole, the traffic command's
rows and messages, positions that agree between table and verdict."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from rich.console import Console

import minillm
from minillm.measure.chips import Hardware
from minillm.ui import report

HW = Hardware(name="this machine", bandwidth_gbs=30.0, peak_gflops=170.0, llc_bytes=32 * 2**20,
              measured_at="2026-12-02T00:00:00+00:00", cpu="x", threads=2, methods={"vecmat": 30.0},
              method="vecmat")


@pytest.fixture(scope="module")
def records():
    model = minillm.load("random-tiny", quiet=True)
    with minillm.Meter() as cached:
        minillm.generate(model, list(range(20)), 6)
    with minillm.Meter() as naive:
        minillm.generate(model, list(range(20)), 6, kv_cache=False)
    return cached.steps, naive.steps


def render(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 160])
def test_steps_tables_fit_the_console_without_cutting_cells(records, width):
    for steps in records:
        text = render(report.steps_table(steps, HW, "a title", width=width), width)
        assert max(len(line) for line in text.splitlines()) <= width
        assert "…" not in text, text                     # no cell was cut short
        assert re.search(r"\d+(\.\d+)? [kMG]?FLOP", text)


def test_narrow_and_wide_tables_show_the_same_totals(records):
    cached, _ = records
    narrow = render(report.steps_table(cached, HW, "t", width=80), 80)
    wide = render(report.steps_table(cached, HW, "t", width=200), 200)
    assert report.fmt_bytes(cached[1].total_bytes) in narrow and "KV read" in wide and "KV read" not in narrow


def test_naive_rows_show_the_position_their_verdict_names(records):
    _, naive = records
    text = render(report.steps_table(naive, HW, "t", width=80), 80)
    last = naive[-1]
    row = [line for line in text.splitlines() if line.strip().startswith(str(len(naive) - 1) + " ")][0]
    assert str(report.last_position(last)) in row.split()
    assert f"position {report.last_position(last)}" in report.verdict(last, HW, "naive")
    assert report.last_position(last) == 20 + len(naive) - 2   # prompt of 20, steps 1..5 recompute from 0


def test_verdicts_and_notes_wrap_at_words(records):
    cached, _ = records
    line = "• " + report.verdict(cached[-1], HW, "cached") + " " + report.cache_note(10, HW, 40.0)
    text = render(line, 80)
    words = set(line.split())
    for got in text.split():
        assert got in words, f"{got!r} is a word cut in two"


def run_cli(*args, columns=80):
    env = {**os.environ, "COLUMNS": str(columns), "MINILLM_FAST": "1"}
    return subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_traffic_steps_means_decode_steps_and_the_table_fits_80_columns(tmp_path):
    r = run_cli("traffic", "--model", "random-tiny", "--prompt-tokens", "10", "--steps", "5")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in r.stdout
    assert sum(1 for line in lines if " decode " in line) == 5
    assert sum(1 for line in lines if " prefill " in line) == 1


def test_traffic_prompt_beyond_the_context_says_so_without_a_negative_count():
    r = run_cli("traffic", "--model", "random-tiny", "--prompt-tokens", "2000", "--steps", "20")
    assert r.returncode != 0
    assert "-" not in re.findall(r"at most (\S+)", r.stderr + r.stdout)[0]
    assert "context of 256" in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_compare_fits_80_columns_and_a_cache_note_comes_first():
    r = run_cli("compare", "ROMEO:", "--max-new-tokens", "4")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if "cache-resident" in out:                               # said only when this run outran DRAM
        assert out.index("cache-resident") < out.index("KV-cached: prefill once")
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80


def test_a_cache_note_comes_from_the_measurement_and_never_suggests_the_model_in_use():
    """E22/C1: the weights are called cache-resident only when this run's steps read faster than the
    DRAM figure; the sysfs size alone concludes nothing; the advice names a bigger model, not this one."""
    big = 480 * 2**20                                        # a VM's sysfs listing the host's 480 MiB L3
    hw = Hardware(name="vm", bandwidth_gbs=30.0, peak_gflops=170.0, llc_bytes=big)
    assert report.cache_note(498e6, hw, 20.0, "random-124m") is None      # streamed from DRAM: no note
    note = report.cache_note(498e6, hw, 45.0, "random-124m")
    assert "45.0 GB/s, more than the 30.0 GB/s" in note and "--model random-774m" in note
    assert "--model random-124m" not in note and "reports a last-level cache of 480 MiB" in note
    assert "--model" not in (report.cache_note(3.2e9, hw, 45.0, "random-774m") or "--model")
