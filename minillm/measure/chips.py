"""Published chips and the roofline: what another machine would do with the same bytes and FLOPs.

`Hardware` holds a machine's two roofline numbers (bandwidth and matmul peak), measured here by
`hardware.machine()` or published for the chips in `CHIPS`. `roofline` applies the model
(time = max(bytes / bandwidth, FLOPs / peak)); `decode_ceiling` is its batch-1 decode case.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field

from ..errors import MiniLLMError

BYTES_PER_ELEMENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


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
    blas_threads: int | None = None  # threads BLAS ran the measurement with
    numpy_version: str | None = None
    memory_gb: float | None = None  # the chip's own memory (GPUs), for what fits on one
    peaks: dict = field(default_factory=dict)  # dense tensor peaks in other precisions, TFLOP/s: {"fp8": ...}

    @property
    def ridge(self) -> float | None:
        """FLOPs per byte at which work turns from memory-bound to compute-bound (peak / bandwidth)."""
        if self.peak_gflops is None:
            return None
        return self.peak_gflops / self.bandwidth_gbs

    @property
    def measured(self) -> bool:
        return self.measured_at is not None

    def roofline(self, bytes_moved: float, flops: float) -> Roofline:
        """`roofline(bytes_moved, flops, self)`: what this machine would do with that work."""
        return roofline(bytes_moved, flops, self)


def _chip(name: str, bandwidth_gbs: float, peak_tflops: float | None, source: str, note: str = "",
          memory_gb: float | None = None, peaks: dict | None = None) -> Hardware:
    peak = None if peak_tflops is None else peak_tflops * 1000.0
    return Hardware(name=name, bandwidth_gbs=bandwidth_gbs, peak_gflops=peak, source=source, note=note,
                    memory_gb=memory_gb, peaks=dict(peaks or {}))


_DENSE = "peak: dense FP16 tensor math (spec sheets also quote twice that, with sparsity)"

# Published figures: memory bandwidth (GB/s) and dense FP16 tensor peak (TFLOP/s) where one is given.
CHIPS: dict[str, Hardware] = {
    chip.name: chip
    for chip in [
        _chip("a100-40gb", 1555, 312, "NVIDIA A100 datasheet (40 GB PCIe/SXM)", _DENSE, 40),
        _chip("a100-80gb", 2039, 312, "NVIDIA A100 datasheet (80 GB SXM)",
              "2,039 GB/s ≈ 2 TB/s, the bandwidth of the article's 7B example", 80),
        _chip("h100-sxm", 3350, 989, "NVIDIA H100 datasheet (SXM)", _DENSE, 80, {"fp8": 1979}),
        _chip("h200", 4800, 989, "NVIDIA H200 datasheet (SXM)", _DENSE, 141, {"fp8": 1979}),
        _chip("b200", 8000, 2250, "NVIDIA DGX B200 datasheet, per GPU (HGX B200)", _DENSE, 180,
              {"fp8": 4500, "fp4": 9000}),
        _chip("gb200", 8000, 2500, "NVIDIA GB200 NVL72 datasheet, per GPU", _DENSE, 186,
              {"fp8": 5000, "fp4": 10000}),
        _chip("mi300x", 5300, 1307, "AMD Instinct MI300X datasheet", _DENSE, 192, {"fp8": 2615}),
        _chip("rtx-4090", 1008, 165, "NVIDIA Ada GPU architecture whitepaper (RTX 4090)",
              "peak: dense FP16 tensor math with FP32 accumulate", 24),
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


# Names people use for the same chips: the bare family name means the variant most often meant.
ALIASES = {
    "a100": "a100-80gb", "h100": "h100-sxm", "h100-sxm5": "h100-sxm",
    "h200-sxm": "h200", "4090": "rtx-4090", "rtx4090": "rtx-4090", "geforce-rtx-4090": "rtx-4090",
    "m1": "apple-m1", "apple-m2": "m2", "apple-m4": "m4", "m1pro": "m1-pro", "m1max": "m1-max",
    "m3max": "m3-max", "m4pro": "m4-pro", "ddr4": "ddr4-3200-dual", "ddr5": "ddr5-5600-dual",
    "b200-sxm": "b200", "gb200-nvl72": "gb200", "mi300": "mi300x", "amd-mi300x": "mi300x",
}

# Links between GPUs, published figures, GB/s each way: what an all-to-all or a KV transfer crosses.
LINKS: dict[str, tuple[float, str]] = {
    "nvlink4": (450.0, "NVLink 4 (H100, H200): 900 GB/s both ways, 450 each way"),
    "nvlink5": (900.0, "NVLink 5 (B200, GB200): 1.8 TB/s both ways, 900 each way"),
    "ib-ndr": (50.0, "InfiniBand NDR, one 400 Gb/s port: 50 GB/s each way"),
    "pcie5": (64.0, "PCIe 5.0 x16: 64 GB/s each way (host memory to GPU)"),
    "nvme4": (7.0, "one PCIe 4.0 NVMe drive: about 7 GB/s of reads"),
}


def peak_for(hw: Hardware, precision: str = "fp16") -> float | None:
    """A chip's dense tensor peak in GFLOP/s for `precision` (fp16/bf16: the table's peak; fp8, fp4
    where published), None where it has none."""
    key = DTYPE_ALIASES.get(precision, precision)
    if key in ("fp16", "bf16"):
        return hw.peak_gflops
    tf = hw.peaks.get(key)
    return None if tf is None else tf * 1000.0


def get_chip(name: str | Hardware) -> Hardware:
    """A preset by name ('a100-80gb', 'H200', 'rtx_4090', 'h100', 'A100' all work); a Hardware is returned as is."""
    if isinstance(name, Hardware):
        return name
    key = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    key = ALIASES.get(key, key)
    if key in CHIPS:
        return CHIPS[key]
    # Chips of the same family first ('h100-pcie' → 'h100-sxm', not the neighbouring 'h200'), closest first.
    family = [p for p in CHIPS if p.startswith(key) or key.startswith(p.split("-")[0] + "-")]
    close = sorted(family, key=lambda p: -difflib.SequenceMatcher(None, key, p).ratio())
    close = close or difflib.get_close_matches(key, CHIPS, n=1)
    hint = f" Did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""
    raise MiniLLMError(f"unknown chip {name!r}.{hint} Known chips: {', '.join(CHIPS)}")




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

    The article's example: 7B parameters in fp16 are 14 GB; at ~2 TB/s (an A100 80 GB) one token takes
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


