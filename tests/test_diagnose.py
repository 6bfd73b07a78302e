"""`minillm diagnose`: the workload's counters are the engine's (the answer's decode steps summed
exactly as if every one had run), it fits 80 columns, and bad input is one line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import minillm
from minillm.cli import diagnose
from minillm.ui import report


@pytest.fixture(scope="module")
def tiny():
    return minillm.load("random-tiny", quiet=True)


@pytest.mark.parametrize("P, N", [(5, 2), (12, 9), (30, 3)])
def test_the_answers_counters_equal_running_every_step(tiny, P, N):
    pre, _, dec, first, _, n_decode = diagnose.measure_workload(tiny, P, N)
    ids = np.random.default_rng(0).integers(0, tiny.config.vocab_size, P)
    with minillm.Meter() as m:
        minillm.generate(tiny, ids, N)
    steps = m.of_kind("decode")
    assert n_decode == len(steps) == N - 1
    assert pre.total_flops == m.steps[0].total_flops and pre.total_bytes == m.steps[0].total_bytes
    assert dec.flops == sum(r.total_flops for r in steps)
    assert dec.bytes == sum(r.total_bytes for r in steps)
    assert dec.fused == sum(report.fused_bytes(r, tiny.config, 4) for r in steps)


def run(*args):
    env = {**os.environ, "COLUMNS": "80", "MINILLM_FAST": "1"}
    return subprocess.run([sys.executable, "-m", "minillm", "diagnose", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_diagnose_shows_ttft_the_trade_off_and_a_diagnosis_in_80_columns():
    r = run("--model", "random-tiny", "--prompt-tokens", "60", "--answer-tokens", "20", "--shared-prefix", "30",
            "--chip", "h100")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for text in ("time to first token", "time per output token", "tokens/s in all", "Diagnosis", "prefix caching",
                 "h100-sxm"):
        assert text in out, text
    assert max(len(line) for line in out.splitlines()) <= 80 and "…" not in out


@pytest.mark.parametrize("args, words", [
    (["--prompt-tokens", "250", "--answer-tokens", "20"], "at most 6 answer tokens"),
    (["--prompt-tokens", "0"], "at least 1"),
    (["--shared-prefix", "60", "--prompt-tokens", "50"], "--shared-prefix"),
    (["--chip", "m2"], "no published FLOP/s peak"),
])
def test_bad_input_is_one_line(args, words):
    r = run("--model", "random-tiny", *args)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert words in r.stderr, r.stderr


def _diagnose_in_process(monkeypatch, capsys, chip):
    import argparse

    from minillm.cli import diagnose as d

    monkeypatch.setattr(d, "get_chip", lambda name: chip)
    monkeypatch.setattr(d, "one_thread_when_busy", lambda args, stack: None)
    args = argparse.Namespace(prompt_tokens=40, answer_tokens=10, shared_prefix=0, chip="x", model="random-tiny",
                              weights="float32", device="cpu")
    assert d.run(args) == 0
    return " ".join(capsys.readouterr().out.split())


def test_the_decode_verdict_is_the_rooflines_and_the_capacity_is_the_functions(monkeypatch, capsys, tiny):
    """C13: 'a decode step is memory-bound' was typed beside a computed prefill verdict. On a chip whose
    bandwidth dwarfs its peak a decode step is compute-bound, and diagnose must say so; the memory line is
    measure.shapes.capacity on the model's own shape and the chip's own memory."""
    from minillm.measure.chips import Hardware
    from minillm.measure.shapes import capacity, shape_of

    gpu = Hardware(name="gpu-x", bandwidth_gbs=2000.0, peak_gflops=300_000.0, memory_gb=24)
    said = _diagnose_in_process(monkeypatch, capsys, gpu)
    assert "a decode step is memory-bound (" in said
    n = capacity(shape_of(tiny.config), 50, 24e9)["sequences"]
    assert f"{n:,} requests of 50 tokens fit on one gpu-x" in said
    odd = Hardware(name="odd", bandwidth_gbs=1e9, peak_gflops=1.0, memory_gb=1)
    assert "a decode step is compute-bound (" in _diagnose_in_process(monkeypatch, capsys, odd)
