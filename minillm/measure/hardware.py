"""How fast is this machine, and what would another chip do? Bandwidth, matmul peak and the roofline.

Decode reads every weight once per token and does about two FLOPs per weight it reads: it waits on
memory. Prefill reuses each weight for every token of the prompt: it waits on arithmetic. Which of
the two limits a piece of work is decided by two numbers of the machine:

- **memory bandwidth** (GB/s): how fast bytes stream from DRAM (or HBM) into the cores;
- **matmul peak** (GFLOP/s): how fast the cores multiply and add when the data is already close.

Their ratio, the **ridge point** (FLOPs per byte), is the arithmetic intensity at which a piece of
work stops waiting on memory and starts waiting on arithmetic. This module measures both numbers on
this machine (`machine()`, cached under `cache_dir()/hardware.json`), carries the published figures
for well-known chips (`PRESETS`), and applies the roofline model to them (`roofline`,
`decode_ceiling`). `add_arguments` and `run` are the `minillm hardware` command.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import platform
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..errors import MiniLLMError
from ..paths import cache_dir

MB = 2**20
CACHE_VERSION = 1
FALLBACK_LLC_BYTES = 32 * MB

# What each bandwidth method does. Each one reads the buffer once and writes almost nothing, so
# bytes read / time is the read bandwidth that method achieves.
# matvec and vecmat are the two ways a decode step can read a weight matrix.
METHODS = {
    "sum": "x.sum(): NumPy's reduction, one thread",
    "dot": "np.dot(x, x): BLAS sdot, each byte read once",
    "matvec": "W @ v: BLAS sgemv, W stored [out, in]",
    "vecmat": "v @ W: BLAS sgemv, W stored [in, out] (HF Conv1D)",
}

BYTES_PER_ELEMENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def fast_mode() -> bool:
    """`MINILLM_FAST=1`: smaller buffers and fewer repeats, for tests and quick lessons."""
    return os.environ.get("MINILLM_FAST", "").strip().lower() not in ("", "0", "false", "no")


# --------------------------------------------------------------------------------------------------
# The machine: cache size, memory, CPU name
# --------------------------------------------------------------------------------------------------


def _parse_size(text: str) -> int:
    """'32768K' / '1M' / '512' (sysfs cache sizes) → bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    return int(match.group(1)) * scale


def detect_llc_bytes() -> int:
    """Size of the last-level cache (the largest, outermost one) in bytes; 32 MB if it can't be found.

    Tries Linux sysfs, then glibc's `sysconf`, then macOS `sysctl`. The benchmark buffer must be
    many times larger than this, or we would be timing the cache instead of memory.
    """
    best_level, best_size = 0, 0
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and (level, size) > (best_level, best_size):
            best_level, best_size = level, size
    if best_size:
        return best_size
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        with contextlib.suppress(ValueError, OSError, AttributeError):
            size = os.sysconf(name)
            if size and size > 0:
                return int(size)
    if platform.system() == "Darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
                if out.returncode == 0 and int(out.stdout.strip() or 0) > 0:
                    return int(out.stdout.strip())
    return FALLBACK_LLC_BYTES


def available_memory_bytes() -> int | None:
    """Memory we could use without pushing others into swap (Linux MemAvailable), or None if unknown."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def cpu_model() -> str:
    """The CPU's marketing name, e.g. 'AMD EPYC 7763 64-Core Processor' or 'Apple M2'."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")) and ":" in line:
                return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_threads() -> int:
    """Hardware threads this process may run on (its affinity mask where the OS has one)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def default_buffer_mb(llc_bytes: int, fast: bool = False) -> int:
    """The bandwidth buffer: at least 8× the last-level cache and 256 MB, at most 4 GB or a quarter of free memory.

    Fast mode uses 64 MB: quick, but on a chip with a big cache partly a cache measurement.
    """
    if fast:
        return 64
    want = max(256 * MB, 8 * llc_bytes)
    cap = 4096 * MB
    free = available_memory_bytes()
    if free:
        cap = min(cap, free // 4)
    return max(16, min(want, cap) // MB)


# --------------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------------


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Best (shortest) wall time of `repeats` calls, after one untimed warm-up call.

    The best run is the one least disturbed by everything else on the machine, so it is the
    closest to what the hardware can do.
    """
    fn()
    best = math.inf
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def measure_bandwidth(size_mb: int | None = None, repeats: int | None = None) -> dict:
    """This machine's memory *read* bandwidth in GB/s (1 GB = 10⁹ bytes), best over several methods.

    A float32 buffer far larger than the last-level cache is read end to end by each method in
    `METHODS`; bytes / best time is that method's bandwidth. The methods differ in how many threads
    they use and how well they keep the memory system busy; the fastest one is the closest we get to
    the hardware's limit, and `matvec` is exactly the access pattern of a decode step.

    Returns `{"bandwidth_gbs", "method", "methods": {name: GB/s}, "buffer_mb", "llc_mb", "repeats", "fast"}`.
    """
    fast = fast_mode()
    llc = detect_llc_bytes()
    if size_mb is None:
        size_mb = default_buffer_mb(llc, fast)
    if repeats is None:
        repeats = 3 if fast else 5
    if size_mb <= 0 or repeats <= 0:
        raise MiniLLMError(f"measure_bandwidth: size_mb={size_mb} and repeats={repeats} must be positive")

    # A square matrix whose side is a multiple of 64 floats, so rows start on cache-line boundaries.
    side = max(64, int(math.isqrt(size_mb * MB // 4)) // 64 * 64)
    x = np.ones(side * side, dtype=np.float32)  # np.ones touches every page: no page faults while timing
    W = x.reshape(side, side)                   # the same memory seen as a matrix: no second buffer
    v = np.ones(side, dtype=np.float32)
    runs = {
        "sum": lambda: x.sum(),
        "dot": lambda: np.dot(x, x),
        "matvec": lambda: W @ v,
        "vecmat": lambda: v @ W,
    }
    methods = {name: round(x.nbytes / _best_seconds(fn, repeats) / 1e9, 2) for name, fn in runs.items()}
    best = max(methods, key=methods.__getitem__)
    return {
        "bandwidth_gbs": methods[best],
        "method": best,
        "methods": methods,
        "buffer_mb": round(x.nbytes / MB),
        "llc_mb": round(llc / MB, 2),
        "repeats": repeats,
        "fast": fast,
    }


def measure_matmul_peak(size: int | None = None, repeats: int | None = None) -> dict:
    """float32 matrix-multiply (sgemm) speed in GFLOP/s: the best this machine's BLAS can do.

    An n×n by n×n product does 2·n³ FLOPs (one multiply and one add per term) on 3·n² numbers,
    so at n = 2048 it does ~680 FLOPs per float it touches: it waits on arithmetic, not memory.
    Returns `{"peak_gflops", "size", "repeats", "fast"}`.
    """
    fast = fast_mode()
    if size is None:
        size = 512 if fast else 2048
    if repeats is None:
        repeats = 2 if fast else 5
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    out = np.empty((size, size), dtype=np.float32)
    seconds = _best_seconds(lambda: np.matmul(a, b, out=out), repeats)
    return {"peak_gflops": round(2 * size**3 / seconds / 1e9, 1), "size": size, "repeats": repeats, "fast": fast}


# --------------------------------------------------------------------------------------------------
# Hardware: this machine (measured) and known chips (published)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    """A machine's two roofline numbers and where they came from.

    `bandwidth_gbs` is in GB/s (10⁹ bytes/s); `peak_gflops` in GFLOP/s (None where no peak is
    published). Measured records also carry the CPU, the per-method bandwidths and the load
    average at the time, so a low figure can be explained.
    """

    name: str
    bandwidth_gbs: float
    peak_gflops: float | None
    llc_bytes: int | None = None
    method: str = "spec sheet"
    measured_at: str | None = None  # ISO time for a measurement; None for a published figure
    source: str = ""
    note: str = ""  # a caveat worth printing beside the figures
    cpu: str | None = None
    threads: int | None = None
    fast: bool = False
    methods: dict = field(default_factory=dict)  # GB/s by bandwidth method
    buffer_mb: int | None = None
    matmul_size: int | None = None
    load_avg: float | None = None  # 1-minute load average when measured: others' work lowers the figures

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte at which work turns from memory-bound to compute-bound (peak / bandwidth)."""
        if self.peak_gflops is None:
            return None
        return self.peak_gflops / self.bandwidth_gbs

    @property
    def measured(self) -> bool:
        return self.measured_at is not None


def _chip(name: str, bandwidth_gbs: float, peak_tflops: float | None, source: str, note: str = "") -> Hardware:
    peak = None if peak_tflops is None else peak_tflops * 1000.0
    return Hardware(name=name, bandwidth_gbs=bandwidth_gbs, peak_gflops=peak, source=source, note=note)


_DENSE = "peak: dense FP16 tensor math (spec sheets also quote twice that, with sparsity)"

# Published figures: memory bandwidth (GB/s) and dense FP16 tensor peak (TFLOP/s) where one is given.
PRESETS: dict[str, Hardware] = {
    chip.name: chip
    for chip in [
        _chip("a100-40gb", 1555, 312, "NVIDIA A100 datasheet (40 GB PCIe/SXM)", _DENSE),
        _chip("a100-80gb", 2039, 312, "NVIDIA A100 datasheet (80 GB SXM)",
              "2,039 GB/s ≈ 2 TB/s, the bandwidth in the seed's 7B example"),
        _chip("h100-sxm", 3350, 989, "NVIDIA H100 datasheet (SXM)", _DENSE),
        _chip("h200", 4800, 989, "NVIDIA H200 datasheet (SXM)", _DENSE),
        _chip("rtx-4090", 1008, 165, "NVIDIA Ada GPU architecture whitepaper (RTX 4090)",
              "peak: dense FP16 tensor math with FP32 accumulate"),
        _chip("apple-m1", 68, None, "Apple M1 tech specs"),
        _chip("m1-pro", 200, None, "Apple M1 Pro tech specs"),
        _chip("m1-max", 400, None, "Apple M1 Max tech specs"),
        _chip("m2", 100, None, "Apple M2 tech specs"),
        _chip("m3-max", 400, None, "Apple M3 Max tech specs",
              "300 or 400 GB/s depending on the bin: 14-core CPU 300, 16-core 400"),
        _chip("m4", 120, None, "Apple M4 tech specs"),
        _chip("m4-pro", 273, None, "Apple M4 Pro tech specs"),
        _chip("ddr4-3200-dual", 51.2, None, "JEDEC DDR4-3200, dual channel",
              "theoretical: 3,200 MT/s × 8 bytes × 2 channels"),
        _chip("ddr5-5600-dual", 89.6, None, "JEDEC DDR5-5600, dual channel",
              "theoretical: 5,600 MT/s × 8 bytes × 2 channels"),
    ]
}


def get_chip(name: str | Hardware) -> Hardware:
    """A preset by name ('a100-80gb', 'H200', 'rtx_4090' all work); a Hardware is returned as is."""
    if isinstance(name, Hardware):
        return name
    key = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    if key in PRESETS:
        return PRESETS[key]
    close = difflib.get_close_matches(key, PRESETS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise MiniLLMError(f"unknown chip {name!r}.{hint} Known chips: {', '.join(PRESETS)}")


# --------------------------------------------------------------------------------------------------
# This machine: measure once, cache as JSON
# --------------------------------------------------------------------------------------------------


def cache_path() -> Path:
    """`cache_dir()/hardware.json` (honours $MINILLM_HOME)."""
    return cache_dir() / "hardware.json"


def _load_cached(path: Path, want_full: bool) -> Hardware | None:
    """The cached record, or None if it is missing, unreadable, from another machine, or not good enough.

    A fast-mode record is not reused for a full measurement; a corrupt file is simply measured again.
    """
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or record.get("version") != CACHE_VERSION:
            return None
        known = {f.name for f in fields(Hardware)}
        hw = Hardware(**{k: v for k, v in record.items() if k in known})
        if not (isinstance(hw.bandwidth_gbs, (int, float)) and math.isfinite(hw.bandwidth_gbs) and hw.bandwidth_gbs > 0):
            return None
        if hw.peak_gflops is not None and not (math.isfinite(hw.peak_gflops) and hw.peak_gflops > 0):
            return None
    except (OSError, ValueError, TypeError):
        return None
    if hw.cpu != cpu_model() or hw.threads != cpu_threads():
        return None  # a shared $MINILLM_HOME seen from another machine
    if want_full and hw.fast:
        return None
    return hw


def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename over it: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _status(message: str, progress: bool) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr while measuring (nothing when progress=False). Yields an `update(msg)`."""
    if not progress:
        yield lambda _msg: None
        return
    from rich.console import Console

    with Console(stderr=True).status(message) as status:
        yield lambda msg: status.update(msg)


def measure_machine(progress: bool = True) -> Hardware:
    """Measure this machine now (bandwidth, then matmul peak) without touching the cache."""
    fast = fast_mode()
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = round(os.getloadavg()[0], 2)
    with _status("Measuring memory bandwidth…", progress) as update:
        bw = measure_bandwidth()
        update("Measuring matmul peak…")
        mm = measure_matmul_peak()
    cpu = cpu_model()
    return Hardware(
        name="this machine",
        bandwidth_gbs=bw["bandwidth_gbs"],
        peak_gflops=mm["peak_gflops"],
        llc_bytes=detect_llc_bytes(),
        method=bw["method"],
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=f"measured: {bw['method']}, {bw['buffer_mb']} MB; sgemm {mm['size']}²",
        note="fast mode (MINILLM_FAST): small buffers, rough figures" if fast else "",
        cpu=cpu,
        threads=cpu_threads(),
        fast=fast,
        methods=bw["methods"],
        buffer_mb=bw["buffer_mb"],
        matmul_size=mm["size"],
        load_avg=load,
    )


def machine(remeasure: bool = False, progress: bool = True) -> Hardware:
    """This machine's figures: read from `cache_dir()/hardware.json`, or measured (a few seconds) and cached.

    `remeasure=True` measures again and replaces the cache. With `progress`, a spinner on stderr
    says what is being measured. If the cache cannot be written the figures are still returned.
    """
    path = cache_path()
    if not remeasure:
        cached = _load_cached(path, want_full=not fast_mode())
        if cached is not None:
            return cached
    hw = measure_machine(progress=progress)
    record = {"version": CACHE_VERSION, **asdict(hw)}
    try:
        _write_atomically(path, json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        if progress:
            from rich.console import Console

            Console(stderr=True).print(f"[yellow]note:[/] could not cache hardware figures at {path}: {exc}")
    return hw


# --------------------------------------------------------------------------------------------------
# The roofline
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    """How long some work takes on a machine if it is limited only by memory traffic or by arithmetic.

    The work needs `t_memory` to move its bytes and `t_compute` to do its FLOPs; with the two
    overlapped, it takes the longer of the two, and that one is what it is *bound* by.
    """

    bytes_moved: float
    flops: float
    t_memory: float   # seconds to move the bytes at full bandwidth
    t_compute: float  # seconds to do the FLOPs at full peak
    seconds: float    # max(t_memory, t_compute): the roofline's best case
    bound: str        # "memory" or "compute"
    intensity: float  # FLOPs per byte of the work
    ridge: float      # FLOPs per byte of the machine: above it, compute-bound

    @property
    def attainable_gflops(self) -> float:
        """The roofline itself: min(peak, intensity × bandwidth), in GFLOP/s."""
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0


def roofline(bytes_moved: float, flops: float, hw: Hardware | str) -> Roofline:
    """Apply the roofline model: time = max(bytes / bandwidth, FLOPs / peak)."""
    hw = get_chip(hw)
    if hw.peak_gflops is None:
        raise MiniLLMError(f"chip {hw.name!r} has no published FLOP/s peak, so the roofline needs one; "
                           "use decode_ceiling for a bandwidth-only estimate")
    for label, value in (("bytes_moved", bytes_moved), ("flops", flops)):
        if not (math.isfinite(value) and value >= 0):
            raise MiniLLMError(f"roofline: {label}={value!r} must be a finite number ≥ 0")
    t_memory = bytes_moved / (hw.bandwidth_gbs * 1e9)
    t_compute = flops / (hw.peak_gflops * 1e9)
    if bytes_moved > 0:
        intensity = flops / bytes_moved
    else:
        intensity = math.inf if flops > 0 else 0.0
    return Roofline(
        bytes_moved=bytes_moved,
        flops=flops,
        t_memory=t_memory,
        t_compute=t_compute,
        seconds=max(t_memory, t_compute),
        bound="compute" if t_compute > t_memory else "memory",
        intensity=intensity,
        ridge=hw.ridge,
    )


def _dtype_key(dtype: str) -> str:
    key = str(dtype).strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in BYTES_PER_ELEMENT:
        raise MiniLLMError(f"unknown dtype {dtype!r}; choose one of {', '.join(BYTES_PER_ELEMENT)}")
    return key


def decode_ceiling(n_params: int | float | str, dtype: str, hw: Hardware | str) -> dict:
    """The fastest batch-1 decode can go: every weight is read once per token, so tokens/s ≤ bandwidth / model bytes.

    The seed's example: 7B parameters in fp16 are 14 GB; at ~2 TB/s (an A100 80 GB) one token takes
    ~7 ms, ~146 tokens/s, however many FLOP/s the chip has. Where the chip has a peak we also give
    the compute time (2 FLOPs per parameter per token), to show how small it is beside the memory time.
    """
    hw = get_chip(hw)
    n = parse_count(n_params) if isinstance(n_params, str) else n_params
    if not (isinstance(n, (int, float)) and math.isfinite(n) and n > 0):
        raise MiniLLMError(f"decode_ceiling: n_params={n_params!r} must be a positive number")
    key = _dtype_key(dtype)
    bytes_per_token = n * BYTES_PER_ELEMENT[key]
    seconds = bytes_per_token / (hw.bandwidth_gbs * 1e9)
    result = {
        "chip": hw.name,
        "n_params": int(n),
        "dtype": key,
        "bytes_per_param": BYTES_PER_ELEMENT[key],
        "bytes_per_token": bytes_per_token,
        "gb_per_token": bytes_per_token / 1e9,
        "bandwidth_gbs": hw.bandwidth_gbs,
        "seconds_per_token": seconds,
        "ms_per_token": seconds * 1e3,
        "tokens_per_s": 1.0 / seconds,
        "compute_ms_per_token": None,
    }
    if hw.peak_gflops is not None:
        result["compute_ms_per_token"] = 2 * n / (hw.peak_gflops * 1e9) * 1e3
    return result


_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(
    r"""\s*
    (                                        # the number:
      (?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9][0-9_]*)(?:\.[0-9]*)?   # 124,439,808 or 124_439_808 or 1.5
      (?:e[+-]?[0-9]+)?                      # optional exponent: 1.5e9
    | \.[0-9]+(?:e[+-]?[0-9]+)?              # or a leading dot: .5
    )
    \s*([kmbgt]?)\s*                          # optional suffix: k, M, B (or G), T
    """,
    re.IGNORECASE | re.VERBOSE,
)


def parse_count(text: str | int | float) -> int:
    """'7B' → 7_000_000_000; '124M', '1.5e9', '350k', '124,439,808' also work. Must be positive."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        match = _COUNT.fullmatch(str(text))
        if not match:
            raise MiniLLMError(f"cannot read {text!r} as a count; write e.g. 7B, 124M, 350k or 1.5e9")
        value = float(match.group(1).replace(",", "").replace("_", "")) * _SUFFIXES[match.group(2).lower()]
    if not (math.isfinite(value) and value >= 1):
        raise MiniLLMError(f"count {text!r} must be a finite number ≥ 1")
    return int(round(value))


# --------------------------------------------------------------------------------------------------
# `minillm hardware`
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `minillm hardware`."""
    parser.add_argument("--chip", metavar="NAME", help=f"a known chip: {', '.join(PRESETS)}")
    parser.add_argument("--params", metavar="N", help="model size for the decode ceiling: 7B, 124M, 1.5e9, ...")
    parser.add_argument("--dtype", default="fp16", choices=list(BYTES_PER_ELEMENT),
                        help="bytes per weight for the decode ceiling (default fp16)")
    parser.add_argument("--remeasure", action="store_true", help="measure this machine again, replacing the cache")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of tables")


def _sig(x: float, digits: int = 3) -> str:
    """A number to `digits` significant figures, never in scientific notation: 14.0, 0.497, 2,039."""
    if x == 0 or not math.isfinite(x):
        return str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 1 else _sig(x, 2)


def _peak(hw: Hardware) -> str:
    if hw.peak_gflops is None:
        return "—"
    return f"{hw.peak_gflops / 1000:,.0f} TFLOP/s" if hw.peak_gflops >= 10_000 else f"{hw.peak_gflops:,.1f} GFLOP/s"


def run(args: argparse.Namespace) -> int:
    """`minillm hardware`: this machine beside the presets, and the decode ceiling if --params is given."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Check the user's input before spending seconds on measuring.
    chip = get_chip(args.chip) if args.chip else None
    n_params = parse_count(args.params) if args.params else None
    dtype = _dtype_key(args.dtype)

    here = machine(remeasure=args.remeasure, progress=not args.json)
    targets = [chip] if chip else [here, *PRESETS.values()]
    ceilings = [decode_ceiling(n_params, dtype, hw) for hw in targets] if n_params else []

    if args.json:
        print(json.dumps({
            "machine": {**asdict(here), "ridge": here.ridge},
            "presets": {name: {**asdict(hw), "ridge": hw.ridge} for name, hw in PRESETS.items()},
            "decode_ceiling": ceilings,
        }, indent=2))
        return 0

    console = Console()
    mine = Table(title="This machine (measured)", show_header=False, title_justify="left", box=box.SIMPLE)
    mine.add_column(style="bold", no_wrap=True)
    mine.add_column()
    mine.add_row("CPU", f"{escape(str(here.cpu))}, {here.threads} threads")
    mine.add_row("memory read bandwidth", f"{here.bandwidth_gbs:,.1f} GB/s (best method: {here.method})")
    for name, gbs in here.methods.items():
        mine.add_row(f"  {name}", f"{gbs:,.1f} GB/s  [dim]{escape(METHODS.get(name, ''))}[/]")
    mine.add_row("float32 matmul peak", f"{here.peak_gflops:,.1f} GFLOP/s ({here.matmul_size}² sgemm)")
    mine.add_row("ridge point", f"{here.ridge:,.1f} FLOP/byte (peak ÷ bandwidth)")
    if here.llc_bytes:
        mine.add_row("last-level cache", f"{here.llc_bytes / MB:g} MB (buffer {here.buffer_mb} MB)")
    mine.add_row("measured at", f"{here.measured_at}  [dim]{escape(str(cache_path()))}[/]")
    if here.fast:
        mine.add_row("[yellow]note[/]", escape(here.note))
    if here.load_avg is not None and here.threads and here.load_avg > 0.5 * here.threads:
        mine.add_row("[yellow]note[/]", f"load average was {here.load_avg} while measuring: other work may have "
                     "lowered these figures; rerun with --remeasure when the machine is idle")
    console.print(mine)

    chips = Table(title="Known chips (published figures) beside this machine", title_justify="left",
                  box=box.SIMPLE_HEAD)
    chips.add_column("chip", style="bold", no_wrap=True)
    chips.add_column("bandwidth", justify="right", no_wrap=True)
    chips.add_column("peak", justify="right", no_wrap=True)
    chips.add_column("ridge", justify="right", no_wrap=True)
    chips.add_column("source", overflow="fold")
    notes: list[str] = []
    for hw in [here, *PRESETS.values()]:
        ridge = "—" if hw.ridge is None else f"{hw.ridge:,.0f}" if hw.ridge >= 10 else f"{hw.ridge:.1f}"
        style = "reverse" if chip is not None and hw is chip else None
        mark = ""
        if hw.note and hw.measured_at is None:
            if hw.note not in notes:
                notes.append(hw.note)
            mark = f" [{notes.index(hw.note) + 1}]"
        chips.add_row(hw.name, f"{_sig(hw.bandwidth_gbs)} GB/s", _peak(hw), ridge, escape(hw.source + mark), style=style)
    console.print(chips)
    console.print("  [dim]ridge: FLOPs per byte above which work is compute-bound. "
                  "peak: FP16 for the GPUs, float32 as measured for this machine.[/]")
    for i, text in enumerate(notes, 1):
        console.print(f"  [dim]\\[{i}] {escape(text)}[/]")

    if ceilings:
        table = Table(title=f"Decode ceiling, batch 1: {n_params:,} parameters in {dtype}", title_justify="left",
                      box=box.SIMPLE_HEAD)
        for heading in ("chip", "GB per token", "ms per token", "tokens/s", "compute ms/token"):
            table.add_column(heading, justify="left" if heading == "chip" else "right", no_wrap=True)
        for c in ceilings:
            compute = "—" if c["compute_ms_per_token"] is None else _ms(c["compute_ms_per_token"])
            table.add_row(c["chip"], _sig(c["gb_per_token"]), _ms(c["ms_per_token"]), f"{c['tokens_per_s']:,.0f}", compute)
        console.print(table)
        c = ceilings[0]
        console.print(
            f"{c['n_params']:,} parameters × {c['bytes_per_param']:g} bytes ({dtype}) = {_sig(c['gb_per_token'])} GB "
            f"per token; at {_sig(c['bandwidth_gbs'])} GB/s ({c['chip']}) that is {_ms(c['ms_per_token'])} ms per token, "
            f"about {c['tokens_per_s']:,.0f} tokens/s, whatever the compute.",
            soft_wrap=True,
        )
    return 0
