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

from ..backend import Device, DeviceError, best_seconds, get_device
from ..cuda_graph import Captured
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


# -- a model's decode step on the GPU: eager against one CUDA-graph replay (lesson 17, gpu_check) ---------

H200_SOURCE = ("measured on an NVIDIA H200 with torch 2.11 and CUDA 13, random weights, a minimal decode step "
               "with a static KV cache over 256 positions, one run, by minillm's developers")
H200_RUN = {   # minillm's developers' figures: data to measure against, not a claim about any machine running this
    "source": H200_SOURCE,
    "gpt2_124m_fp16_b1": {"eager_ms": 2.31, "graph_ms": 0.74, "bytes": 257e6, "transformers_eager_ms": 4.97,
                          "kernels": 180},
    "smollm2_135m_bf16_transformers_eager_ms": 18.2,
    "llama2_7b_fp16_b1": {"eager_ms": 17.7, "graph_ms": 5.59, "bytes": 13.3e9, "copy_tbs": 4.27},
    "llama2_7b_fp16_graph_ms": {"64": 8.4, "256": 16.1},
    "llama3_8b_gqa_fp16": {"graph_ms": {"256": 11.3, "384": 16.1}, "tflops": (364, 382)},
    "context": 256,
}
ARTICLE_7B = {"bytes": 14e9, "ms": 7.0, "chip": "A100"}   # the article's wall: 14 GB a step, ~7 ms a token

SHAPES = {   # LlamaConfig fields of the Llama-family shapes the GPU figures use
    "smollm2-135m": dict(n_layer=30, n_head=9, n_kv_head=3, head_dim=64, n_embd=576, n_ctx=2048,
                         vocab_size=49152, ffn=1536, eps=1e-5, theta=100000.0),
    "llama2-7b": dict(n_layer=32, n_head=32, n_kv_head=32, head_dim=128, n_embd=4096, n_ctx=4096,
                      vocab_size=32000, ffn=11008, eps=1e-5, theta=10000.0, tied=False),
    "llama3-8b": dict(n_layer=32, n_head=32, n_kv_head=8, head_dim=128, n_embd=4096, n_ctx=8192,
                      vocab_size=128256, ffn=14336, eps=1e-5, theta=500000.0, tied=False),
}


def batched_step(shape_name: str, batch: int, context: int, bytes_per_value: float = 2.0) -> dict:
    """A batched decode step of a named shape (measure/shapes.py) by its arithmetic: the weights read
    once for all B rows (an untied embedding by its rows), each sequence's KV of `context` positions, and
    2 FLOPs per weight per row plus attention's 4·L·t·H·hd per row. -> bytes by kind, FLOPs, FLOP/byte,
    and `cap`: the FLOP/byte the step tends to as B grows (one row's FLOPs ÷ its own KV bytes)."""
    from .experts import params_read
    from .shapes import kv_bytes_per_sequence, shape
    s = shape(shape_name)
    weights = params_read(s, batch) * bytes_per_value
    kv_one = kv_bytes_per_sequence(s, context, bytes_per_value)
    per_row = 2 * params_read(s, 1) + 4 * s["n_layer"] * context * s["n_head"] * s["head_dim"]
    flops = batch * per_row
    return {"weights": weights, "kv": batch * kv_one, "bytes": weights + batch * kv_one, "flops": flops,
            "intensity": flops / (weights + batch * kv_one), "cap": per_row / kv_one, "kv_per_row": kv_one}


def roof_shares(step: dict, ms: float, bandwidth_gbs: float, peak_tflops: float) -> dict:
    """A measured step against both roofs: its bytes' time at the bandwidth, its FLOPs' time at the
    peak, the roofline's bound, and the shares of the bandwidth and of the peak it reached."""
    t_mem = step["bytes"] / (bandwidth_gbs * 1e9) * 1e3
    t_cmp = step["flops"] / (peak_tflops * 1e12) * 1e3
    return {"t_mem_ms": t_mem, "t_cmp_ms": t_cmp, "bound": "compute" if t_cmp > t_mem else "memory",
            "of_bandwidth": t_mem / ms, "of_peak": t_cmp / ms, "of_roofline": max(t_mem, t_cmp) / ms}


def crossing_batch(step_at_1: dict, ridge: float) -> float | None:
    """The B at which a batched step's FLOP/byte reaches `ridge` (None when its cap stays below it):
    B·F ÷ (W + B·K) = ridge, so B = ridge·W ÷ (F − ridge·K) for one row's FLOPs F and KV bytes K."""
    F, K, W = step_at_1["flops"], step_at_1["kv_per_row"], step_at_1["weights"]
    return None if F <= ridge * K else ridge * W / (F - ridge * K)


def free_bytes(device: Device) -> int:
    """Device memory free now (CuPy's pool's cached blocks count as used: freed first)."""
    cp = device.xp
    cp.get_default_memory_pool().free_all_blocks()
    return int(cp.cuda.runtime.memGetInfo()[0])


def decode_figures(model, batch: int = 1, context: int = 256, steps: int = 20, prompt: int = 16,
                   eager: bool = True) -> dict:
    """`batch` sequences decoding over a static KV of `context` positions (engine/static.py): the
    median step eager and as one CUDA-graph replay, the kernels one step launches (the capture's
    nodes), and the meter's bytes and FLOPs of one step."""
    import statistics

    import numpy as np

    from ..backend import clock
    from ..engine.static import StaticDecode
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(0, model.config.vocab_size, prompt))) for _ in range(batch)]
    sd = StaticDecode(model, batch=batch, context=context)
    sd.start(prompts)
    xp = sd.xp

    def timed(graph: bool) -> float:
        times = []
        for _ in range(steps):
            t0 = clock(xp)
            sd.step(graph=graph)                                   # -> host token ids [B]
            times.append(clock(xp) - t0)
        return statistics.median(times[1:] if len(times) > 2 else times)

    r = {"batch": batch, "context": context, "weights_bytes": int(model.nbytes())}
    if eager:
        r["eager_ms"] = timed(False) * 1e3
    sd.host_positions[:] = prompt                                  # the same positions again for the graph
    sd.positions[...] = xp.asarray(sd.host_positions)
    sd.capture()
    r["graph_ms"] = timed(True) * 1e3
    r["kernels"] = sd.launches.get("kernels")
    r["bytes"], r["flops"] = int(sd.step_bytes), int(sd.step_flops)
    r["graph_gbs"] = r["bytes"] / r["graph_ms"] * 1e-6
    r["graph_tflops"] = r["flops"] / r["graph_ms"] * 1e-9
    r["intensity"] = r["flops"] / r["bytes"]
    sd.close()
    return r
