"""The benchmark's machinery: the counting-code-removed copy of the operations, the no-meter path,
and a tiny end-to-end run (timings themselves are a command, `minillm bench`, not a test)."""

from __future__ import annotations

import json

import numpy as np

import minillm
from minillm import meter
from minillm.measure import bench
from minillm.cli import main


def test_with_no_meter_active_no_operation_counts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Meter.count was called with no meter active")

    monkeypatch.setattr(meter.Meter, "count", refuse)
    model = minillm.load("random-tiny")
    assert meter.active() is None
    assert len(minillm.generate(model, [1, 2, 3], 4)) == 4


def test_counting_code_removed_strips_the_reports_and_computes_the_same():
    """bench's "counting code removed" figure: with the reports cut out, a metered forward, prefill and
    decode step count nothing and compute the same; afterwards they count again."""
    model = minillm.load("random-tiny")
    ids = [5, 6, 7, 8]

    def work():
        logits = model.forward(ids)
        _, cache = model.prefill(ids[:2])
        return logits, model.decode_step(ids[2], cache)

    with minillm.Meter() as before:
        expected = work()
    assert before.total("total_bytes") > 0
    with bench.counting_code_removed():
        with minillm.Meter() as m:
            stripped = work()
    assert all(s.total_bytes == 0 and s.total_flops == 0 for s in m.steps)
    for a, b in zip(stripped, expected):
        np.testing.assert_array_equal(a, b)
    with minillm.Meter() as after:                     # restored afterwards
        work()
    assert after.total("total_bytes") == before.total("total_bytes")


def test_bench_json_on_a_tiny_model(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    monkeypatch.setenv("MINILLM_FAST", "1")
    assert main(["bench", "--model", "random-tiny", "--contexts", "4,32", "--repeats", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["context"] for r in result["rows"]] == [4, 32]
    for r in result["rows"]:
        assert r["cached_tok_s"] > 0 and r["naive_tok_s"] > 0 and r["prefill_s"] > 0
        assert r["step_bytes"] > 0 and r["achieved_gbs"] > 0
    assert result["rows"][1]["step_bytes"] > result["rows"][0]["step_bytes"]   # a longer context reads more KV
    assert result["ceiling_ms"] > 0 and result["layout_out_in_ms"] > 0
    assert min(result["meter_idle_ms"], result["meter_removed_ms"], result["meter_on_ms"]) > 0


def test_bench_rejects_contexts_beyond_the_model(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    assert main(["bench", "--model", "random-tiny", "--contexts", "4,5000", "--repeats", "1", "--json"]) == 1
    assert "context 5000" in capsys.readouterr().err
