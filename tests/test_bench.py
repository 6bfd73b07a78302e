"""The benchmark's machinery: the counting-code-removed copy of the operations, the no-meter path,
and a tiny end-to-end run (timings themselves are a command, `minillm bench`, not a test)."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


def test_bench_refuses_an_empty_list_of_contexts_in_one_line(capsys, tmp_path, monkeypatch):
    """"" or "," asks for no context: one line, before the machine is probed (no note), never the
    defaults measured silently; with --context-sweep too."""
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    for extra in ([], ["--context-sweep"]):
        for given in ("", ",", " , "):
            assert main(["bench", "--model", "random-tiny", "--contexts", given, "--repeats", "1", *extra]) == 1
            captured = capsys.readouterr()
            lines = captured.err.strip().splitlines()
            assert len(lines) == 1 and "--contexts" in lines[0] and "at least one" in lines[0], captured.err
            assert captured.out == ""


def test_bench_runs_both_kernels_side_by_side_in_one_run(capsys):
    """`bench --kernels numpy,fused` with --weights and with --batch: every row once per kernel, the
    fused rows with no widening pass and the meter's fused counts (no scratch); one clear line for
    a kernel name it does not know, or for two kernels without --weights or --batch."""
    import pytest
    from minillm import kernels
    if not kernels.available():
        pytest.skip(kernels.status().reason)
    assert main(["bench", "--model", "random-tiny", "--weights", "float32,q8_0", "--kernels", "numpy,fused",
                      "--repeats", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    got = {(r["weights"], r["kernels"]): r for r in res["rows"]}
    assert set(got) == {(w, k) for w in ("float32", "q8_0") for k in ("numpy", "fused")}
    assert got["q8_0", "fused"]["scratch_bytes"] == 0 < got["q8_0", "numpy"]["scratch_bytes"]
    assert got["q8_0", "fused"]["widen_ms"] == 0 < got["q8_0", "numpy"]["widen_ms"]
    assert got["q8_0", "fused"]["weight_bytes"] == got["q8_0", "numpy"]["weight_bytes"]
    assert main(["bench", "--model", "random-tiny", "--batch", "1,2", "--kernels", "numpy,fused",
                      "--repeats", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert sorted((r["batch"], m["kernels"]) for m in res["models"] for r in m["rows"]) == [
        (1, "fused"), (1, "numpy"), (2, "fused"), (2, "numpy")]
    assert main(["bench", "--kernels", "gpu"]) == 1
    assert main(["bench", "--kernels", "numpy,fused"]) == 1
    assert "--kernels" in capsys.readouterr().err


def test_bench_says_when_a_row_outran_the_measured_bandwidth(capsys, monkeypatch):
    """A row that read faster than the machine's measured bandwidth (--weights: above its ceiling;
    --batch: its GB/s column): bench says so, with the rate the run reached, and why, from a read of a
    buffer of the weights' size (E22): well above the memory figure, a cache; near it, the figure is low.
    The cache size the operating system lists decides nothing. Nothing of the kind when every row is under."""
    from types import SimpleNamespace
    from minillm.cli import bench as bench_cli
    from minillm.measure import residency
    for gbs, probe, said in ((1e-3, 1e-3, "memory"), (1e-3, 10.0, "cache"), (1e6, 10.0, None)):
        monkeypatch.setattr(bench_cli, "machine", lambda progress=True, gbs=gbs: SimpleNamespace(
            bandwidth_gbs=gbs, peak_gflops=1.0, llc_bytes=1 << 40, method="dot"))
        monkeypatch.setattr(residency, "probe_at", lambda nbytes, repeats=3, probe=probe: probe)
        for args, lead in ((["--weights", "float32,q8_0", "--kernels", "numpy"], "of its ceiling: its steps read"),
                           (["--batch", "1,2"], ": its steps read")):
            assert main(["bench", "--model", "random-tiny", *args, "--repeats", "1"]) == 0
            text = " ".join(capsys.readouterr().out.split())
            assert (lead in text and "more than the 0.0 GB/s measured for memory" in text) == (said is not None)
            assert ("minillm hardware --remeasure" in text) == (said == "memory")
            assert ("the weights came from a cache" in text) == (said == "cache")
            assert "fit the" not in text


def test_bench_ranks_by_the_closeness_rule_and_notes_a_busy_machine_in_json(capsys, monkeypatch):
    """C5/C6: bench's rankings (best batch, fused against NumPy, a speed-up) go through the one closeness
    rule, a bare pass is called no ceiling, and --json carries the busy note and runs on one thread."""
    import contextlib
    from minillm.cli import bench as bench_cli
    seen = []
    monkeypatch.setattr(bench_cli, "comparison_threads", lambda requested, default=None: (1, "busy: one thread"))
    monkeypatch.setattr(bench_cli, "limited", lambda n: seen.append(n) or contextlib.nullcontext())
    assert main(["bench", "--model", "random-tiny", "--batch", "1,2", "--repeats", "2", "--json"]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert seen == [1] and res["conditions"]["busy"] == "busy: one thread" and "busy: one thread" in out.err
    assert main(["bench", "--model", "random-tiny", "--batch", "1,2", "--repeats", "1"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Tokens/s against B = 1's: B = 2 " in text and "(no winner: 1 paired round: a sign test at 5% needs 6" in text
    assert "Tokens/s by batch" not in text and "(a figure, not ranked" in text
    assert "A bare pass is no ceiling" in text and "% of the faster" not in text


def test_the_modes_exclusions_come_from_their_rows():
    """Each mode's row names the flags it does not combine with; the first mode given is the one run,
    and a flag it excludes is one line naming it."""
    import argparse

    from minillm.cli.bench import MODES, chosen_mode
    from minillm.errors import MiniLLMError

    def args(**given):
        return argparse.Namespace(**{"context_sweep": False, "weights": None, "speculate": None, "batch": None,
                                     **given})
    assert chosen_mode(args()).flag is None and chosen_mode(args(batch="2")).flag == "--batch"
    for mode in MODES:
        for flag in mode.excludes:
            asked = {mode.flag[2:].replace("-", "_"): True if mode.flag == "--context-sweep" else "2",
                     flag[2:].replace("-", "_"): "2"}
            with pytest.raises(MiniLLMError, match=f"{mode.flag} .*leave out {flag}"):
                chosen_mode(args(**asked))
    for pair in ({"weights": "q8_0", "speculate": "2"}, {"weights": "q8_0", "batch": "2"},
                 {"speculate": "2", "batch": "2"}, {"context_sweep": True, "speculate": "2"}):
        with pytest.raises(MiniLLMError, match="leave out"):
            chosen_mode(args(**pair))
