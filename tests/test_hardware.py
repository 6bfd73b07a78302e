"""minillm.measure.hardware and chips: the roofline arithmetic, the seed's 7B example, counts, the cache, the presets."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.cli import hardware as hardware_cli
from minillm.errors import MiniLLMError
from minillm.measure import hardware, probe
from minillm.measure.chips import CHIPS, Hardware, decode_ceiling, get_chip, parse_count, roofline


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh $MINILLM_HOME in fast mode, so nothing touches the user's cache or takes long."""
    monkeypatch.setenv("MINILLM_HOME", str(tmp_path))
    monkeypatch.setenv("MINILLM_FAST", "1")
    return tmp_path


@pytest.fixture
def counted(monkeypatch):
    """Replace both measurements by instant fakes that count their calls."""
    calls = {"bandwidth": 0, "matmul": 0}

    def fake_bandwidth(size_mb=None, repeats=None):
        calls["bandwidth"] += 1
        return {"bandwidth_gbs": 20.0, "method": "matvec", "methods": {"sum": 10.0, "matvec": 20.0},
                "buffer_mb": 64, "llc_mb": 32, "repeats": 1, "fast": True}

    def fake_matmul(size=None, repeats=None):
        calls["matmul"] += 1
        return {"peak_gflops": 100.0, "size": 512, "repeats": 1, "fast": True}

    monkeypatch.setattr(hardware, "measure_bandwidth", fake_bandwidth)
    monkeypatch.setattr(hardware, "measure_matmul_peak", fake_matmul)
    return calls


# ----------------------------------------------------------------------------------------- roofline

finite = st.floats(min_value=1.0, max_value=1e15, allow_nan=False, allow_infinity=False)
rates = st.floats(min_value=1.0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(bytes_moved=finite, flops=finite, bw=rates, peak=rates)
def test_roofline_arithmetic_and_bound(bytes_moved, flops, bw, peak):
    hw = Hardware(name="x", bandwidth_gbs=bw, peak_gflops=peak)
    r = roofline(bytes_moved, flops, hw)
    assert r.t_memory == pytest.approx(bytes_moved / (bw * 1e9))
    assert r.t_compute == pytest.approx(flops / (peak * 1e9))
    assert r.seconds == max(r.t_memory, r.t_compute)
    assert r.intensity == pytest.approx(flops / bytes_moved)
    assert r.ridge == pytest.approx(peak / bw)
    assert r.bound == ("compute" if r.t_compute > r.t_memory else "memory")
    # Away from the ridge itself, the bound is decided by intensity versus ridge.
    if r.intensity > r.ridge * (1 + 1e-9):
        assert r.bound == "compute"
    elif r.intensity < r.ridge * (1 - 1e-9):
        assert r.bound == "memory"
    # The attainable rate is the roof: never above peak, never above intensity × bandwidth.
    assert r.attainable_gflops <= peak * (1 + 1e-9)
    assert r.attainable_gflops <= r.intensity * bw * (1 + 1e-9)


def test_roofline_decode_is_memory_bound_and_prefill_compute_bound():
    a100 = get_chip("a100-80gb")
    n = 7e9
    decode = roofline(bytes_moved=2 * n, flops=2 * n, hw=a100)          # 1 FLOP per byte
    prefill = roofline(bytes_moved=2 * n, flops=2 * n * 2048, hw=a100)  # 2,048 tokens share each weight read
    assert decode.bound == "memory" and decode.intensity == pytest.approx(1.0)
    assert prefill.bound == "compute" and prefill.intensity == pytest.approx(2048)
    assert a100.ridge == pytest.approx(312_000 / 2039)


def test_roofline_rejects_bad_input():
    with pytest.raises(MiniLLMError, match="no published FLOP/s peak"):
        roofline(1, 1, "m2")
    with pytest.raises(MiniLLMError, match="bytes_moved"):
        roofline(-1, 1, "h100-sxm")
    assert roofline(0, 5, "h100-sxm").intensity == math.inf


# ------------------------------------------------------------------------------------ decode ceiling


def test_seed_example_7b_fp16_on_a100_80gb():
    c = decode_ceiling(parse_count("7B"), "fp16", "a100-80gb")
    assert c["bytes_per_token"] == 14e9
    assert c["gb_per_token"] == pytest.approx(14.0)
    assert c["ms_per_token"] == pytest.approx(14e9 / 2039e9 * 1e3)
    assert round(c["ms_per_token"], 1) == 6.9          # "7 ms per token" at ≈ 2 TB/s
    assert round(c["tokens_per_s"]) == 146             # "~140 tokens/s"
    assert c["compute_ms_per_token"] < c["ms_per_token"] / 100  # "whatever the compute"
    at_2tbs = decode_ceiling("7B", "fp16", Hardware(name="2 TB/s", bandwidth_gbs=2000, peak_gflops=None))
    assert at_2tbs["ms_per_token"] == pytest.approx(7.0)
    assert at_2tbs["tokens_per_s"] == pytest.approx(1000 / 7)


@pytest.mark.parametrize("dtype, per", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("int8", 1), ("int4", 0.5),
                                        ("float32", 4), ("BF16", 2)])
def test_decode_ceiling_bytes_per_dtype(dtype, per):
    assert decode_ceiling(1_000_000, dtype, "h200")["bytes_per_token"] == 1_000_000 * per


def test_decode_ceiling_rejects_unknown_dtype():
    with pytest.raises(MiniLLMError, match="unknown dtype 'int3'"):
        decode_ceiling(1000, "int3", "h200")


# ---------------------------------------------------------------------------------------- counts


@pytest.mark.parametrize("text, value", [
    ("7B", 7_000_000_000), ("124M", 124_000_000), ("1.5e9", 1_500_000_000), ("350k", 350_000),
    ("1.5b", 1_500_000_000), (" 2T ", 2_000_000_000_000), ("124,439,808", 124_439_808),
    ("124_439_808", 124_439_808), ("42", 42), (7e9, 7_000_000_000),
])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "abc", "7Q", "-3", "0", "1,2", "nan", "inf", "1e999", "B"])
def test_parse_count_rejects(text):
    with pytest.raises(MiniLLMError):
        parse_count(text)


# ------------------------------------------------------------------------------------------- chips


def test_presets_have_sources_and_figures():
    expected = {"a100-40gb": (1555, 312e3), "a100-80gb": (2039, 312e3), "h100-sxm": (3350, 989e3),
                "h200": (4800, 989e3), "rtx-4090": (1008, 165e3), "apple-m1": (68, None), "m1-pro": (200, None),
                "m1-max": (400, None), "m2": (100, None), "m3-max": (400, None), "m4": (120, None),
                "m4-pro": (273, None), "ddr4-3200-dual": (51.2, None), "ddr5-5600-dual": (89.6, None),
                "b200": (8000, 2250e3), "gb200": (8000, 2500e3), "mi300x": (5300, 1307e3)}
    assert set(CHIPS) == set(expected)
    for name, (bw, peak) in expected.items():
        chip = CHIPS[name]
        assert (chip.name, chip.bandwidth_gbs, chip.peak_gflops) == (name, bw, peak)
        assert chip.source and not chip.measured
    assert "300" in CHIPS["m3-max"].note


def test_the_2026_chips_carry_their_lower_precision_peaks():
    """X21: B200/GB200 and MI300X with their datasheets' dense FP8 (and FP4) peaks: halving the math
    precision doubles the peak, so it doubles the ridge."""
    from minillm.measure.chips import peak_for
    for name, fp4 in (("b200", True), ("gb200", True), ("mi300x", False), ("h100-sxm", False)):
        chip = CHIPS[name]
        assert peak_for(chip, "fp8") == pytest.approx(2 * peak_for(chip, "bf16"), rel=0.01)
        assert (peak_for(chip, "fp4") == pytest.approx(4 * chip.peak_gflops, rel=0.01)) if fp4 else \
            peak_for(chip, "fp4") is None
        assert chip.memory_gb and "datasheet" in chip.source
    assert peak_for(CHIPS["a100-80gb"], "fp8") is None


def test_get_chip_is_forgiving_about_spelling():
    assert get_chip("A100_80GB") is CHIPS["a100-80gb"]
    assert get_chip("rtx 4090") is CHIPS["rtx-4090"]


def test_unknown_chip_lists_known_names():
    with pytest.raises(MiniLLMError) as err:
        get_chip("a100-80")
    message = str(err.value)
    assert "'a100-80'" in message and "did you mean 'a100-80gb'" in message.lower()
    assert all(name in message for name in CHIPS)


# -------------------------------------------------------------------------------------- the cache


def test_machine_measures_once_then_reads_the_cache(home, counted):
    first = hardware.machine(progress=False)
    assert counted == {"bandwidth": 1, "matmul": 1}
    assert (home / "hardware.json").is_file()
    assert not list(home.glob("*.tmp"))  # the atomic write left no temporary file behind
    [record] = json.loads((home / "hardware.json").read_text())["records"]
    assert record["fast"] is True and record["cpu"] and record["threads"] >= 1

    second = hardware.machine(progress=False)
    assert counted == {"bandwidth": 1, "matmul": 1}
    assert second == first
    assert second.ridge == pytest.approx(100.0 / 20.0)

    hardware.machine(remeasure=True, progress=False)
    assert counted == {"bandwidth": 2, "matmul": 2}


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"version": 1}', "",
                                     '{"version": 1, "name": "x", "bandwidth_gbs": -3, "peak_gflops": 1}'])
def test_corrupt_cache_is_remeasured(home, counted, garbage):
    (home / "hardware.json").write_text(garbage)
    hw = hardware.machine(progress=False)
    assert counted["bandwidth"] == 1 and hw.bandwidth_gbs == 20.0
    assert json.loads((home / "hardware.json").read_text())["records"][0]["bandwidth_gbs"] == 20.0


def test_fast_record_is_not_reused_for_a_full_measurement(home, counted, monkeypatch):
    hardware.machine(progress=False)
    monkeypatch.delenv("MINILLM_FAST")
    hardware.machine(progress=False)
    assert counted["bandwidth"] == 2


def test_progress_spinner_goes_to_stderr(home, counted, capsys, monkeypatch):
    # rich draws a spinner only on a terminal: make every console one, or a spinner on stdout would
    # pass unseen (it did).
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    hardware.machine(progress=True)
    got = capsys.readouterr()
    assert got.out == "" and "Measuring" in got.err, got


# ------------------------------------------------------------------------------------ measurements


def test_measured_bandwidth_and_peak_are_positive_and_finite(home):
    bw = hardware.measure_bandwidth(size_mb=32, repeats=1)
    assert bw["method"] in probe.METHODS and set(bw["methods"]) == set(probe.METHODS)
    assert all(math.isfinite(v) and v > 0 for v in bw["methods"].values())
    assert bw["bandwidth_gbs"] == max(bw["methods"].values())
    assert bw["fast"] is True
    mm = hardware.measure_matmul_peak(size=256, repeats=1)
    assert math.isfinite(mm["peak_gflops"]) and mm["peak_gflops"] > 0


def test_machine_in_fast_mode_end_to_end(home):
    hw = hardware.machine(progress=False)
    assert hw.fast and hw.measured and hw.buffer_mb == 64
    assert math.isfinite(hw.bandwidth_gbs) and hw.bandwidth_gbs > 0
    assert hw.ridge > 0 and hw.llc_bytes > 0


def test_buffer_is_far_larger_than_the_cache(monkeypatch):
    monkeypatch.setattr(probe, "available_memory_bytes", lambda: 64 * 2**30)
    assert probe.default_buffer_mb(64 * 2**20) == 512          # 8 × a 64 MiB cache, past the floor
    assert probe.default_buffer_mb(2**20) == 256               # the 256 MB floor for a small cache
    assert probe.default_buffer_mb(1024 * 2**20) == 4096       # capped at 4 GB
    monkeypatch.setattr(probe, "available_memory_bytes", lambda: 1024 * 2**20)
    assert probe.default_buffer_mb(64 * 2**20) == 256          # at most a quarter of free memory
    assert probe.default_buffer_mb(32 * 2**20, fast=True) == 64


# -------------------------------------------------------------------------------------------- CLI


def _args(*argv):
    parser = argparse.ArgumentParser()
    hardware_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_cli_prints_the_seed_example(home, counted, capsys):
    assert hardware_cli.run(_args("--chip", "a100-80gb", "--params", "7B", "--dtype", "fp16")) == 0
    out = capsys.readouterr().out
    assert "14.0 GB per token" in out and "6.9 ms per token" in out and "146 tokens/s" in out
    assert "a100-40gb" in out and "NVIDIA A100 datasheet" in out  # the presets beside this machine


def test_cli_json_has_every_chip_when_no_chip_is_given(home, counted, capsys):
    assert hardware_cli.run(_args("--params", "124M", "--dtype", "fp32", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert [c["chip"] for c in data["decode_ceiling"]] == ["this machine", *CHIPS]
    assert data["machine"]["bandwidth_gbs"] == 20.0


def test_cli_errors_before_measuring(home, counted):
    with pytest.raises(MiniLLMError, match="unknown chip"):
        hardware_cli.run(_args("--chip", "tpu-v9"))
    with pytest.raises(MiniLLMError, match="cannot read '7Q'"):
        hardware_cli.run(_args("--params", "7Q"))
    assert counted["bandwidth"] == 0


# ------------------------------------------------------------------ aliases, field types, the ceiling


@pytest.mark.parametrize("alias, chip", [("h100", "h100-sxm"), ("H100", "h100-sxm"), ("a100", "a100-80gb"),
                                         ("4090", "rtx-4090"), ("M1", "apple-m1")])
def test_common_chip_aliases(alias, chip):
    assert get_chip(alias) is CHIPS[chip]


def test_a_near_miss_suggests_the_family_not_a_neighbour():
    with pytest.raises(MiniLLMError) as err:
        get_chip("h100-pcie")
    assert "'h100-sxm'" in str(err.value).split("Known chips")[0]
    assert "'h200'" not in str(err.value).split("Known chips")[0]


@pytest.mark.parametrize("field, bad", [("methods", "fast"), ("methods", {"sum": "x"}), ("threads", "2"),
                                        ("llc_bytes", "32M"), ("load_avg", "busy"), ("bandwidth_gbs", True),
                                        ("peak_gflops", "1e3"), ("measured_at", "yesterday"), ("buffer_mb", 1.5),
                                        ("cpu", 7), ("fast", "no"), ("method", None)])
def test_a_cache_with_the_right_machine_but_wrong_types_is_measured_again(home, counted, field, bad, capsys):
    hardware.machine(progress=False)
    path = home / "hardware.json"
    data = json.loads(path.read_text())
    data["records"][0][field] = bad
    path.write_text(json.dumps(data))
    hw = hardware.machine(progress=False)          # no traceback: measured again
    assert counted == {"bandwidth": 2, "matmul": 2}
    assert isinstance(hw.methods, dict) and isinstance(hw.threads, int)
    assert hardware_cli.run(argparse.Namespace(chip=None, params="7B", dtype="fp16", remeasure=False, json=False,
                                           threads=None)) == 0
    assert "GB/s" in capsys.readouterr().out


def test_a_cache_from_another_thread_count_or_numpy_is_measured_again(home, counted, monkeypatch):
    hardware.machine(progress=False)
    monkeypatch.setattr(hardware, "blas_threads", lambda: 97)
    hardware.machine(progress=False)
    assert counted["bandwidth"] == 2
    path = home / "hardware.json"
    data = json.loads(path.read_text())
    assert sorted(r["blas_threads"] for r in data["records"])[-1] == 97 and len(data["records"]) == 2
    for r in data["records"]:
        r["numpy_version"] = "0.0.1"
    path.write_text(json.dumps(data))
    hardware.machine(progress=False)
    assert counted["bandwidth"] == 3


def test_each_thread_count_keeps_its_own_figures(home, counted, monkeypatch):
    """Measured at 2 threads and at 1, each is kept: going back and forth measures nothing more, and
    a run never gets the other thread count's figures."""
    rates = {2: 20.0, 1: 9.0}
    threads = {"now": 2}
    monkeypatch.setattr(hardware, "blas_threads", lambda: threads["now"])
    monkeypatch.setattr(hardware, "measure_bandwidth", lambda: {
        "bandwidth_gbs": rates[threads["now"]], "method": "matvec", "methods": {"matvec": rates[threads["now"]]},
        "buffer_mb": 64})
    two = hardware.machine(progress=False)
    threads["now"] = 1
    one = hardware.machine(progress=False)
    threads["now"] = 2
    assert hardware.machine(progress=False) == two and two.bandwidth_gbs == 20.0 and two.blas_threads == 2
    threads["now"] = 1
    assert hardware.machine(progress=False) == one and one.bandwidth_gbs == 9.0 and one.blas_threads == 1
    assert counted["matmul"] == 2                               # one measurement per thread count
    hardware.machine(remeasure=True, progress=False)            # replaces this thread count's record only
    assert len(json.loads((home / "hardware.json").read_text())["records"]) == 2


def test_a_stale_record_is_measured_again(home, counted):
    hardware.machine(progress=False)
    path = home / "hardware.json"
    data = json.loads(path.read_text())
    data["records"][0]["measured_at"] = "2001-01-01T00:00:00+00:00"
    path.write_text(json.dumps(data))
    hw = hardware.machine(progress=False)
    assert counted["bandwidth"] == 2 and not hardware.is_stale(hw)


def test_provenance_shows_age_load_and_staleness(home, counted):
    hw = hardware.machine(progress=False)
    line = hardware.provenance(hw)
    assert "measured" in line and "ago" in line and "BLAS thread" in line and "read methods" in line
    import dataclasses
    old = dataclasses.replace(hw, measured_at="2001-01-01T00:00:00+00:00")
    assert hardware.is_stale(old) and "--remeasure" in hardware.provenance(old)
    busy = dataclasses.replace(hw, load_avg=50.0, threads=2)
    assert "busy" in hardware.provenance(busy)


def test_the_measured_bandwidth_bounds_the_engines_achieved_bandwidth(tmp_path, monkeypatch):
    """No cached decode step of a DRAM-sized model may read faster than the measured bandwidth.

    The bandwidth is measured before and after the engine runs (the best of both, as `machine()`
    keeps the best of its rounds), so a busy moment lowers the engine and the ceiling alike."""
    import minillm

    from minillm.models.gpt2 import GPT2_SIZES

    monkeypatch.delenv("MINILLM_FAST", raising=False)
    llc = probe.detect_llc_bytes() or 0
    # the smallest GPT-2 size whose weights are 4× this machine's last-level cache (some servers have 0.5 GB)
    size = next((k for k in ("124m", "355m", "774m", "1558m") if 4 * GPT2_SIZES[k].n_params() > 4 * llc), None)
    if size is None:
        pytest.skip(f"no GPT-2 size is 4× this machine's {llc / 2**20:.0f} MiB last-level cache")
    model = minillm.load(f"random-{size}", quiet=True)
    before = hardware.measure_bandwidth(repeats=3)["bandwidth_gbs"]
    with minillm.Meter() as meter:
        minillm.generate(model, list(range(8)), 6)
    after = hardware.measure_bandwidth(repeats=3)["bandwidth_gbs"]
    ceiling = max(before, after)
    steps = [s for s in meter.steps if s.kind == "decode"]
    assert steps and all(s.bytes["weights"] > 4 * llc for s in steps)
    # The median step, not the luckiest one: on a shared 2-core machine a single 20 ms step can land in
    # a quiet moment that neither bandwidth measurement saw (that flaked once in a full-suite run).
    typical = sorted(s.gbps for s in steps)[len(steps) // 2]
    assert typical <= ceiling, f"decode steps read {typical:.1f} GB/s (median), above the measured {ceiling:.1f} GB/s"


def test_cli_says_when_the_weights_do_not_fit_the_chip(home, counted, capsys):
    """70B in fp16 (140 GB) on an 80 GB H100: the ceiling is arithmetic only, and the command says so and
    names tensor parallelism with the GPU count; 7B fits and gets no such line."""
    assert hardware_cli.run(_args("--chip", "h100", "--params", "70B", "--dtype", "fp16")) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "do not fit 0.9 of its 80 GB" in out and "over 2 or more" in out   # the one capacity rule
    assert hardware_cli.run(_args("--chip", "h100", "--params", "7B", "--dtype", "fp16")) == 0
    assert "do not fit" not in capsys.readouterr().out


FAKE_GPU = {   # the shape of measure.gpu.measure_gpu's record (figures made up: the printing is tested)
    "device": "NVIDIA Test GPU, 80.0 GiB (CuPy 13.0, CUDA 12080)", "copy_gbs": 2000.0, "read_gbs": 1800.0,
    "buffer_mb": 2048, "matmul_tflops": {"float16": 400.0, "float32": 40.0}, "matmul_size": 8192,
    "launch_us": 6.5, "graph_launch_us": 1.25, "ridge_flop_per_byte": {"float16": 200.0, "float32": 20.0},
    "quick": False}


def test_cli_prints_a_gpu_beside_the_cpu_only_when_there_is_one(home, counted, capsys, monkeypatch):
    """`minillm hardware` with a GPU: its measured table, and a row in the chips' table and the ceilings;
    without one (the measure returns None) nothing of it appears."""
    assert hardware_cli.run(_args("--params", "124M")) == 0
    assert "GPU" not in capsys.readouterr().out.split("Known chips")[0]
    monkeypatch.setattr(hardware_cli, "gpu_figures", lambda: FAKE_GPU)
    assert hardware_cli.run(_args("--params", "124M")) == 0
    out = capsys.readouterr().out
    assert "This machine's GPU (measured with CuPy)" in out and "NVIDIA Test GPU" in out
    assert "2,000 GB/s device copy" in out and "6.50 µs a kernel" in out and "200.0 FLOP/byte" in out
    assert "GPU: NVIDIA Test GPU" in out.split("Known chips")[1]          # a row beside the presets
    assert hardware_cli.run(_args("--params", "124M", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == FAKE_GPU and data["decode_ceiling"][1]["chip"] == "GPU: NVIDIA Test GPU"
