"""What an NVIDIA GPU can do, measured with CuPy: the figures `minillm hardware` shows beside the CPU's.

    copy bandwidth    a device-to-device copy of a buffer far larger than the L2 cache: it reads
                      and writes every byte, so (read + written) / time, the figure vendors quote
                      for a copy; and a read-only pass (a sum), what a decode step mostly does
    matmul peak       an n×n by n×n product, 2·n³ FLOPs, in float16 and float32 (tensor cores for
                      float16; float32 as CuPy runs it, without TF32 unless CUPY_TF32=1)
    launch cost       one tiny kernel launched from Python, eager (what each operation of an eager
                      step pays on the host), and the same kernels replayed from one CUDA graph
                      (what each costs on the device when the host is out of the loop)
    ridge             peak FLOP/s ÷ bandwidth: the FLOPs per byte above which a step waits on
                      arithmetic rather than on memory

Every timing synchronises the device before reading the clock (backend.clock), keeps the best of
a few runs, and follows an untimed warm-up. Without CuPy or a GPU, `measure_gpu` raises the
DeviceError line of `backend.get_device("cuda")`; callers print it and carry on with the CPU.
"""

from __future__ import annotations

from ..backend import Captured, Device, DeviceError, best_seconds, get_device
from .chips import Hardware

MB = 2**20


def _cuda(device: Device | None) -> Device:
    return get_device("cuda") if device is None else device


def copy_bandwidth(device: Device | None = None, nbytes: int = 1 << 30, repeats: int = 10) -> dict:
    """Device memory bandwidth in GB/s (10⁹ bytes): a copy (read + write counted) and a sum (read)."""
    device = _cuda(device)
    cp = device.xp
    n = nbytes // 2
    src = cp.ones(n, dtype=cp.float16)
    dst = cp.empty_like(src)
    copy_s = best_seconds(lambda: cp.copyto(dst, src), cp, repeats)
    read_s = best_seconds(lambda: src.sum(dtype=cp.float32), cp, repeats)
    return {"copy_gbs": round(2 * src.nbytes / copy_s / 1e9, 1), "read_gbs": round(src.nbytes / read_s / 1e9, 1),
            "buffer_mb": src.nbytes // MB, "repeats": repeats}


def matmul_peak(device: Device | None = None, dtype: str = "float16", size: int = 8192, repeats: int = 5) -> dict:
    """A size×size matrix product's speed in TFLOP/s (2·size³ FLOPs)."""
    device = _cuda(device)
    cp = device.xp
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=cp.float32).astype(dtype)
    b = rng.standard_normal((size, size), dtype=cp.float32).astype(dtype)
    out = cp.empty((size, size), dtype=dtype)
    seconds = best_seconds(lambda: cp.matmul(a, b, out=out), cp, repeats)
    return {"tflops": round(2 * size**3 / seconds / 1e12, 1), "size": size, "dtype": dtype, "repeats": repeats}


def launch_cost(device: Device | None = None, kernels: int = 1000, repeats: int = 5) -> dict:
    """Microseconds per kernel of `kernels` tiny in-place additions on 16 numbers: launched one by one
    from Python (eager), and replayed as one CUDA graph (the device's own per-kernel cost)."""
    device = _cuda(device)
    cp = device.xp
    x = cp.zeros(16, dtype=cp.float32)

    def chain():
        for _ in range(kernels):
            cp.add(x, 1.0, out=x)                       # one kernel each
        return x

    eager = best_seconds(chain, cp, repeats)
    graph = Captured(chain, device)
    replay = best_seconds(graph.replay, cp, repeats)
    return {"eager_us": round(eager / kernels * 1e6, 2), "graph_us": round(replay / kernels * 1e6, 2),
            "kernels": kernels, "captured_kernels": graph.launches["kernels"], "repeats": repeats}


def ridge(peak_flops: float, bandwidth_bytes: float) -> float:
    """FLOPs per byte at which arithmetic and memory take the same time (the roofline's knee)."""
    return peak_flops / bandwidth_bytes if bandwidth_bytes else 0.0


def measure_gpu(device: Device | None = None, quick: bool = False) -> dict:
    """Every figure above for the current GPU, in one record (quick: smaller buffers, fewer runs,
    for the tests). Ridges use the copy bandwidth: the fastest this card streamed memory here."""
    device = _cuda(device)
    repeats = 2 if quick else 8
    bw = copy_bandwidth(device, nbytes=(64 if quick else 2048) * MB, repeats=repeats)
    size = 1024 if quick else 8192
    peaks = {dt: matmul_peak(device, dt, size, repeats)["tflops"] for dt in ("float16", "float32")}
    launch = launch_cost(device, kernels=100 if quick else 1000, repeats=repeats)
    bandwidth = bw["copy_gbs"] * 1e9
    return {
        "device": device.description,
        "copy_gbs": bw["copy_gbs"], "read_gbs": bw["read_gbs"], "buffer_mb": bw["buffer_mb"],
        "matmul_tflops": peaks, "matmul_size": size,
        "launch_us": launch["eager_us"], "graph_launch_us": launch["graph_us"],
        "ridge_flop_per_byte": {dt: round(ridge(t * 1e12, bandwidth), 1) for dt, t in peaks.items()},
        "quick": quick,
    }


# -- beside the CPU's figures: `minillm hardware`, `bench`, `bench --batch`, `compare` -------------------

_MEASURED: dict = {}   # the figures of this process's GPU, measured once


def find_gpu() -> Device | None:
    """The GPU, or None when there is none to use (no CuPy, no device): then nothing is printed."""
    try:
        return get_device("cuda")
    except DeviceError:
        return None


def gpu_figures(quick: bool = False) -> dict | None:
    """`measure_gpu` of this machine's GPU, measured once per process; None without a GPU."""
    device = find_gpu()
    if device is None:
        return None
    if quick not in _MEASURED:
        _MEASURED[quick] = measure_gpu(device, quick=quick)
    return _MEASURED[quick]


def as_hardware(figures: dict, dtype: str = "float16") -> Hardware:
    """The GPU's measured figures as a roofline machine (chips.Hardware) for weights of `dtype`:
    the copy bandwidth, and the matmul peak of that dtype."""
    dt = "float32" if str(dtype) in ("float32", "float64") else "float16"
    return Hardware(name=f"GPU: {figures['device'].split(',')[0]}", bandwidth_gbs=figures["copy_gbs"],
                    peak_gflops=figures["matmul_tflops"][dt] * 1000, method="device copy",
                    source=f"measured here with CuPy ({dt} matmul {figures['matmul_size']}²)",
                    buffer_mb=figures["buffer_mb"], matmul_size=figures["matmul_size"])


def summary(figures: dict) -> str:
    """One line of the GPU's figures, to print beside the CPU's."""
    t, r = figures["matmul_tflops"], figures["ridge_flop_per_byte"]
    return (f"GPU {figures['device']}: copy {figures['copy_gbs']:,.0f} GB/s, read {figures['read_gbs']:,.0f} GB/s; "
            f"matmul {t['float16']:,.0f} TFLOP/s float16, {t['float32']:,.0f} float32; launch "
            f"{figures['launch_us']:.1f} µs eager, {figures['graph_launch_us']:.2f} µs in a graph; ridge "
            f"{r['float16']:,.0f} FLOP/byte float16, {r['float32']:,.0f} float32"
            + (" (quick measurement)" if figures.get("quick") else ""))
