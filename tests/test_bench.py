"""The benchmark's machinery: the counting-code-removed copy of the operations, the no-meter path,
and a tiny end-to-end run (timings themselves are a command, `minillm bench`, not a test)."""

from __future__ import annotations

import json

import numpy as np

import minillm
from minillm import meter
from minillm.measure import bench
from minillm.cache import contiguous as kvcache
from minillm.models import ops
from minillm.cli import main


def test_with_no_meter_active_no_operation_counts(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("Meter.count was called with no meter active")

    monkeypatch.setattr(meter.Meter, "count", refuse)
    model = minillm.load("random-tiny")
    assert meter.active() is None
    assert len(minillm.generate(model, [1, 2, 3], 4)) == 4


def test_counting_code_removed_strips_the_reports_and_computes_the_same():
    model = minillm.load("random-tiny")
    ids = [5, 6, 7, 8]
    expected = model.forward(ids)
    _, cache = model.prefill(ids[:2])
    expected_step = model.decode_step(ids[2], cache)
    with bench.counting_code_removed():
        for name in ("embedding", "layer_norm", "linear", "gelu", "add", "attention", "lm_head"):
            assert "active" not in getattr(ops, name).__code__.co_names, f"{name} still reads meter.active()"
        assert "active" not in kvcache.KVCache.write.__code__.co_names
        with minillm.Meter() as m:                     # nothing reports, so no records
            stripped = model.forward(ids)
        assert m.steps == [] or all(s.total_bytes == 0 for s in m.steps)
        _, cache = model.prefill(ids[:2])
        stripped_step = model.decode_step(ids[2], cache)
    np.testing.assert_array_equal(stripped, expected)
    np.testing.assert_array_equal(stripped_step, expected_step)
    assert "active" in ops.linear.__code__.co_names     # restored afterwards


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
