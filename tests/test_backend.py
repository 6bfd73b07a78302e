"""The array seam (minillm/backend.py): which module an array belongs to, what the seam supplies
outside the common ground of NumPy and CuPy, the strict test namespace that holds code to that
ground, and `--device cuda` on a machine without a GPU. Tests marked `gpu` run only with CuPy and
an NVIDIA GPU (benchmarks/gpu_check.py runs them there); elsewhere they skip, saying why."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minillm import backend, cuda_graph
from minillm.backend import DeviceError, get_device, namespace
from strict_arrays import StrictArray, strict

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


def host(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# -- namespace ---------------------------------------------------------------------------------------

def test_namespace_is_the_module_of_the_arrays():
    a = host((2, 3))
    assert namespace(a) is np
    assert namespace(a, np.float32(1.0), 2, 0.5, None) is np        # host numbers do not decide
    assert namespace(strict.asarray(a)) is strict
    assert namespace(strict.asarray(a), 1.0, strict.zeros(3)) is strict
    assert namespace() is np


def test_namespace_refuses_mixed_modules_and_non_arrays():
    with pytest.raises(TypeError, match="numpy and strict in one operation"):
        namespace(host((2,)), strict.zeros(2))
    with pytest.raises(TypeError, match="not an array: str"):
        namespace("x")


# -- the strict namespace refuses NumPy --------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda s, a: np.exp(s),
    lambda s, a: np.asarray(s),
    lambda s, a: np.concatenate([s, s]),
    lambda s, a: np.take(s, [0], axis=0),
    lambda s, a: s + a,
    lambda s, a: a + s,
    lambda s, a: s @ a.T,
    lambda s, a: strict.matmul(s, a.T),
    lambda s, a: strict.exp(s, out=a),
    lambda s, a: s.__setitem__(slice(None), a),
    lambda s, a: s[np.array([0, 1])],
], ids=["ufunc", "asarray", "array-function", "take", "add", "radd", "matmul", "ns-arg", "out", "setitem",
        "numpy-index"])
def test_strict_arrays_refuse_every_numpy_mix(call):
    a = host((2, 3))
    with pytest.raises(TypeError):
        call(strict.asarray(a), a)


def test_strict_arrays_compute_like_numpy_views_and_writes_included():
    """What the model does to its arrays, on strict arrays and on NumPy: the same numbers, and in-place
    writes through slices and reshapes reach the array they came from."""
    a = host((2, 4, 6))
    s = strict.asarray(a)
    n = a.copy()
    for x, xp in ((s, strict), (n, np)):
        half = x.shape[-1] // 2
        x[..., :half] -= x[..., half:] * 0.5                     # through a slice
        x.reshape(2, 4, 2, 3)[...] += 1.0                        # through a reshape
        xp.tanh(x, out=x)
        blocks, offsets = xp.asarray([1, 0]), xp.asarray([2, 3])
        x[:, blocks, offsets] = xp.zeros((2, 2))                # a scatter
    assert np.array_equal(s.get(), n)
    table = np.array([[0, 1], [1, 1]])
    assert np.array_equal(strict.take(s, strict.asarray(table), axis=1).get(), np.take(n, table, axis=1))
    assert np.array_equal((s @ s.transpose(0, 2, 1)).get(), n @ n.transpose(0, 2, 1))
    assert np.array_equal(strict.einsum("...i,...i->...", s, s).get(), np.einsum("...i,...i->...", n, n))
    assert isinstance(s.max(axis=-1), StrictArray) and s.nbytes == n.nbytes and s.itemsize == 4


def test_strict_namespace_names_what_it_lacks():
    with pytest.raises(AttributeError, match="no 'fft'"):
        strict.fft


@pytest.mark.parametrize("read", [lambda s: s.get(), lambda s: int(s[0]), lambda s: float(s[0]),
                                  lambda s: bool(s[0]), lambda s: [0, 1, 2][s[0]]],
                         ids=["get", "int", "float", "bool", "index"])
def test_strict_capturing_refuses_host_reads(read):
    """What a CUDA graph capture forbids, on the CPU: inside `capturing()` a value read on the host raises;
    device work does not."""
    s = strict.asarray(np.array([1, 0], dtype=np.intp))
    with strict.capturing():
        s += 1                                                   # device work: fine
        with pytest.raises(RuntimeError, match="inside a graph capture"):
            read(s)
    assert read(s) is not None                                   # outside: fine again


# -- what the seam supplies --------------------------------------------------------------------------

@given(shapes)
def test_row_sums_are_the_same_on_numpy_and_strict(shape):
    a = host(shape, seed=len(shape))
    for f, ref in ((backend.row_sum, a.sum(axis=-1, keepdims=True)),
                   (backend.row_sumsq, (a.astype(np.float64) ** 2).sum(axis=-1, keepdims=True))):
        on_numpy, on_strict = f(a), f(strict.asarray(a))
        assert isinstance(on_numpy, np.ndarray) and isinstance(on_strict, StrictArray)
        assert on_numpy.shape == on_strict.shape == shape[:-1] + (1,)
        np.testing.assert_allclose(on_numpy, ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(on_strict.get(), on_numpy)


def test_row_sums_of_float16_accumulate_in_float32_when_asked():
    a = np.full((2, 4096), 8.0, dtype=np.float16)             # squares 64, a sum of 262,144: past fp16's 65,504
    for x in (a, strict.asarray(a)):
        assert np.isinf(backend.to_host(backend.row_sumsq(x))).all()
        wide = backend.to_host(backend.row_sumsq(x, np.float32))
        assert wide.dtype == np.float32 and (wide == 262144.0).all()
        assert (backend.to_host(backend.row_sum(x * 20.0, np.float32)) == 655360.0).all()


@pytest.mark.parametrize("Tq, Tk", [(1, 1), (3, 3), (2, 5), (4, 9)])
def test_causal_mask_on_each_module(Tq, Tk):
    m = backend.causal_mask(np, Tq, Tk, np.dtype(np.float32))
    for i in range(Tq):                                  # query i sits at position Tk - Tq + i
        assert (m[i, :Tk - Tq + i + 1] == 0).all() and np.isneginf(m[i, Tk - Tq + i + 1:]).all()
    assert not m.flags.writeable and m.dtype == np.float32
    assert backend.causal_mask(np, Tq, Tk, np.dtype(np.float32)) is m          # made once
    s = backend.causal_mask(strict, Tq, Tk, np.dtype(np.float32))
    assert isinstance(s, StrictArray) and np.array_equal(s.get(), m)


def test_to_host():
    a = host((3,))
    assert backend.to_host(a) is a
    h = backend.to_host(strict.asarray(a))
    assert type(h) is np.ndarray and np.array_equal(h, a)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_sampler_takes_logits_from_any_device(temperature):
    """The sampler's last step runs on the host: logits of another module are copied over, the same
    token drawn from the same random stream."""
    from minillm.engine.sampling import sample
    logits = host((50,), seed=3)
    picks = [sample(x, temperature, top_k=10, rng=np.random.default_rng(7)) for x in (logits, strict.asarray(logits))]
    assert picks[0] == picks[1]
    with pytest.raises(backend.MiniLLMError, match="NaN"):
        sample(strict.asarray(np.full(4, np.nan, dtype=np.float32)))


def test_cpu_device_timing_and_launches():
    cpu = get_device("cpu")
    assert cpu.xp is np and not cpu.is_gpu and get_device(" CPU ") is cpu and get_device(cpu) is cpu
    assert "NumPy" in cpu.description
    assert backend.device_of(host((1,))) is cpu
    t0 = cpu.clock()
    assert cpu.clock() >= t0
    assert backend.best_seconds(lambda: host((64, 64)) @ host((64, 64)), np, repeats=2) > 0
    assert cuda_graph.count_launches(lambda: None, cpu) == {}


def test_the_meter_times_a_step_with_the_clock_it_is_given():
    """A GPU step is timed by a clock that waits for the device first: the meter reads the clock it is
    handed at the step's start and end (and perf_counter otherwise); `launches` is shown when counted."""
    from minillm import meter
    ticks = iter([10.0, 10.25])
    with meter.Meter() as m:
        with meter.step("decode", 5, 1, attended=6, clock=lambda: next(ticks)) as rec:
            rec.launches = 42
        with meter.step("decode", 6, 1, attended=7):
            pass
    timed, plain = m.steps
    assert timed.seconds == 0.25 and timed.as_dict()["launches"] == 42
    assert 0 <= plain.seconds < 1 and plain.launches is None and "launches" not in plain.as_dict()


# -- a GPU asked for where there is none -------------------------------------------------------------

def one_line_error(name: str) -> str:
    with pytest.raises(DeviceError) as e:
        get_device(name)
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_cuda_without_cupy_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)           # `import cupy` now raises ImportError
    assert one_line_error("cuda") == ("--device cuda: no CUDA GPU found (CuPy: not installed); install "
                                      "minillm[gpu] on a machine with an NVIDIA GPU, or use --device cpu")


def fake_cupy(device_count):
    """A CuPy whose runtime answers getDeviceCount as told (a number, or an exception to raise)."""
    def count():
        if isinstance(device_count, Exception):
            raise device_count
        return device_count
    runtime = types.SimpleNamespace(getDeviceCount=count)
    return types.SimpleNamespace(__version__="13.9.9", cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("answer, says", [
    (RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected\n(a second line)"),
     "CuPy: 13.9.9, RuntimeError: cudaErrorNoDevice: no CUDA-capable device is detected)"),
    (0, "CuPy: 13.9.9, 0 devices visible)"),
])
def test_cuda_with_cupy_but_no_gpu_is_one_clear_line(monkeypatch, answer, says):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(answer))
    text = one_line_error("cuda")
    assert text.startswith("--device cuda: no CUDA GPU found (") and says in text
    assert text.endswith("install minillm[gpu] on a machine with an NVIDIA GPU, or use --device cpu")


def test_unknown_devices_are_one_clear_line():
    assert "choose one of cpu, cuda" in one_line_error("tpu")
    assert "current GPU only" in one_line_error("cuda:1")


# -- on a GPU (skipped without one) --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda():
    try:
        return get_device("cuda")
    except DeviceError as e:
        pytest.skip(str(e))


@pytest.mark.gpu
def test_gpu_namespace_and_seam_equal_numpy(cuda):
    cp = cuda.xp
    a = host((3, 5, 7))
    d = cuda.asarray(a)
    assert namespace(d) is cp and backend.device_of(d).is_gpu
    with pytest.raises(TypeError):
        namespace(d, a)
    np.testing.assert_allclose(backend.to_host(backend.row_sum(d)), backend.row_sum(a), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(backend.to_host(backend.row_sumsq(d)), backend.row_sumsq(a), rtol=1e-6)
    np.testing.assert_array_equal(backend.to_host(backend.causal_mask(cp, 3, 5, np.dtype(np.float32))),
                                  backend.causal_mask(np, 3, 5, np.dtype(np.float32)))


@pytest.mark.gpu
def test_gpu_launch_count_and_graph_replay(cuda):
    cp = cuda.xp
    x = cp.zeros(16, dtype=cp.float32)

    def three():                                  # one kernel each (x[...] += 1 would add a copy kernel)
        cp.add(x, 1.0, out=x)
        cp.multiply(x, 2.0, out=x)
        cp.add(x, 1.0, out=x)
        return x

    assert cuda_graph.count_launches(three, cuda)["kernels"] == 3
    g = cuda_graph.Captured(three, cuda)             # one eager call, then the capture (which runs nothing)
    assert g.launches["kernels"] == 3
    assert float(x[0].get()) == 3.0
    g.replay()
    cuda.synchronize()
    assert float(x[0].get()) == 7.0              # (3 + 1) * 2 + 1: the replay ran all three kernels


@pytest.mark.gpu
def test_gpu_hardware_measures_are_positive(cuda):
    from minillm.measure import gpu
    r = gpu.measure_gpu(cuda, quick=True)
    assert r["copy_gbs"] > 0 and r["read_gbs"] > 0 and r["launch_us"] > 0
    assert r["matmul_tflops"]["float16"] > 0 and r["ridge_flop_per_byte"]["float16"] > 0


def test_gpu_check_skips_cleanly_without_a_gpu(tmp_path):
    try:
        backend.get_device("cuda")
        pytest.skip("this machine has a usable GPU: gpu_check runs for real there")
    except DeviceError as e:
        why = str(e)
    out = tmp_path / "check.json"
    r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(out)], capture_output=True,
                       text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["skipped"] == why and report["parts"] == {}
    assert "H200" in report["developers_h200"]["source"]
