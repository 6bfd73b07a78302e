"""The array seam: where a model's arrays live, and the few things NumPy and CuPy spell differently.

The model math takes its array module from its arrays, never from `numpy` by name:

    xp = backend.namespace(x)        # numpy on the CPU, cupy on an NVIDIA GPU
    y = xp.empty_like(x)             # ... and everything else from xp

so one code path runs on the CPU (NumPy) and on a GPU (CuPy, `device="cuda"`). What that code may
call is the ground NumPy and CuPy share: array methods (`.reshape`, `.transpose`, `.astype`,
`.max`, `.sum`), `out=` on element-wise functions and `matmul`, integer-array indexing for reading
and writing, `take` with an index array of any shape, `einsum`, and the attributes the meter reads
(`.nbytes`, `.itemsize`, `.size`, `.shape`). The tests hold the model to exactly that ground with a
strict namespace whose arrays refuse every `numpy.*` call (tests/strict_arrays.py).

Outside that ground, the seam supplies:

    namespace(*arrays)         the module of the arrays (numpy, cupy, or a test namespace); mixing is a bug
    row_sum(x, dtype)          the sum over the last axis, kept [..., 1] (np.add.reduce on NumPy: no wrapper cost)
    row_sumsq(x, dtype)        the sum of squares over the last axis, kept [..., 1] (einsum: no x*x temporary);
                               dtype: accumulate wider (a float16 model's norms in float32)
    accumulator(dtype)         the dtype those sums take for rows of dtype (float32 for float16, else None)
    causal_mask(xp, Tq, Tk, dtype)   the [Tq, Tk] mask, cached per module (read-only on NumPy)
    to_host(x)                 a NumPy array (a device -> host copy on a GPU; x itself on the CPU)
    host_logits(x)             to_host, float16 widened to float32: what the sampler takes
    get_device(name)           "cpu" or "cuda" -> a Device (module, description, synchronize, clock),
                               or ONE clear DeviceError line when no GPU can be used
    device_of(x)               the Device an array lives on
    synchronize(xp), clock(xp) wait for the device's queued work; the time after that wait
    best_seconds(fn, xp)       the best of a few synchronised timings of fn

CUDA graphs (capture, replay, counting a step's kernel launches) are minillm/cuda_graph.py's.

Counts the meter needs come from shapes and host-side arrays, never from a device value (reading
one would wait for the GPU, and is impossible inside a graph capture).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import MiniLLMError

DEVICES = ("cpu", "cuda")
GPU_EXTRA = "minillm[gpu]"


class DeviceError(MiniLLMError):
    """A device that was asked for and cannot be used (no GPU, no CuPy, an unknown name)."""


# -- which module an array belongs to --------------------------------------------------------------

def _cupy_module():
    """cupy, if it has already been imported (an array of it exists only then), else None."""
    return sys.modules.get("cupy")


def _module_of(x):
    if isinstance(x, (np.ndarray, np.generic)):
        return np
    cp = _cupy_module()
    if cp is not None and isinstance(x, cp.ndarray):
        return cp
    get = getattr(x, "__array_namespace__", None)
    if get is not None:
        return get()
    return None


def namespace(*arrays):
    """The array module of `arrays` (Python numbers and None are skipped): numpy, cupy, or the
    namespace a test array names with `__array_namespace__`. Arrays of two modules in one
    operation are a bug in the caller (a weight left on the host, say): TypeError, naming both."""
    if len(arrays) == 1 and type(arrays[0]) is np.ndarray:   # the CPU's path, as cheap as it can be
        return np
    found = None
    for x in arrays:
        if x is None or isinstance(x, (int, float, bool)):
            continue
        xp = _module_of(x)
        if xp is None:
            raise TypeError(f"not an array: {type(x).__name__}")
        if found is None:
            found = xp
        elif xp is not found:
            raise TypeError(f"arrays of {_name(found)} and {_name(xp)} in one operation: move them to one "
                            "device first (a weight or a cache left on the other device?)")
    return np if found is None else found


def _name(xp) -> str:
    return getattr(xp, "__name__", type(xp).__name__)


# -- what NumPy and CuPy spell differently -----------------------------------------------------------

def accumulator(dtype):
    """The dtype a row's statistics (a norm's mean, its sum of squares) are summed in: float32 for
    float16 rows (a float16 sum of 768 squares overflows past 65,504), None (the rows' own) otherwise."""
    return np.float32 if np.dtype(dtype) == np.float16 else None


def host_logits(x) -> np.ndarray:
    """Logits as the sampler takes them: a NumPy array (one device -> host copy on a GPU), float16
    widened to float32 (the CPU's float32 and float64 are returned as they are)."""
    x = to_host(x)
    return x.astype(np.float32) if x.dtype == np.float16 else x


def row_sum(x, dtype=None):
    """x [..., n] -> [..., 1]: the sum over the last axis, accumulated in `dtype` (default x's: a
    float16 model's norms pass float32, as fp16 sums of 4,096 terms lose digits). On NumPy
    `np.add.reduce`, which skips np.sum's dispatch (a few µs a call, ~100 calls a step)."""
    if type(x) is np.ndarray:
        return np.add.reduce(x, axis=-1, keepdims=True, dtype=dtype)
    return namespace(x).sum(x, axis=-1, keepdims=True, dtype=dtype)


def row_sumsq(x, dtype=None):
    """x [..., n] -> [..., 1]: the sum of squares over the last axis, with no x*x temporary where
    the module has einsum (NumPy and CuPy). With `dtype` wider than x's (float16 -> float32), x is
    widened first: a float16 square overflows past 256."""
    xp = np if type(x) is np.ndarray else namespace(x)
    if dtype is not None and np.dtype(dtype) != x.dtype:
        x = x.astype(dtype)
    einsum = getattr(xp, "einsum", None)
    if einsum is not None:
        return einsum("...i,...i->...", x, x)[..., None]
    return xp.sum(x * x, axis=-1, keepdims=True)


@lru_cache(maxsize=32)
def causal_mask(xp, Tq: int, Tk: int, dtype):
    """[Tq, Tk]: 0 where query i (at position Tk - Tq + i) may look, -inf at the keys after it; one
    array per (module, shape, dtype), made on that module's device (read-only on NumPy)."""
    keys = xp.arange(Tk)
    future = keys[None, :] > xp.arange(Tk - Tq, Tk)[:, None]          # True above the diagonal
    mask = xp.where(future, -np.inf, 0.0).astype(dtype)
    if xp is np:
        mask.flags.writeable = False
    return mask


def to_host(x) -> np.ndarray:
    """A NumPy array of x: x itself on the CPU, a device -> host copy of a CuPy array (it waits for
    the GPU). The sampler's last step, and anything a learner prints, goes through here."""
    if isinstance(x, np.ndarray):
        return x
    if _module_of(x) is not None:              # cupy.ndarray.get() and the strict test arrays' get()
        return x.get()
    return np.asarray(x)                       # a Python number or list


# -- devices -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """Where a model's arrays live: the module, what the hardware is, and how to wait for it."""

    name: str          # "cpu" or "cuda"
    xp: object         # numpy or cupy
    description: str   # "CPU (NumPy 2.4.0)", "NVIDIA H200, 139.8 GiB (CuPy 13.4.1, CUDA 12080)"

    def asarray(self, a, dtype=None):
        """a (a NumPy array, a list) as an array on this device."""
        return self.xp.asarray(a, dtype=dtype)

    def synchronize(self) -> None:
        synchronize(self.xp)

    def clock(self) -> float:
        return clock(self.xp)

    @property
    def is_gpu(self) -> bool:
        return self.name == "cuda"


def no_gpu_line(reason: str) -> str:
    return (f"--device cuda: no CUDA GPU found (CuPy: {reason}); install {GPU_EXTRA} on a machine with an "
            "NVIDIA GPU, or use --device cpu")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _import_cupy():
    """cupy, or a DeviceError saying why not (not installed, or installed without a usable CUDA)."""
    try:
        import cupy
    except ImportError:
        raise DeviceError(no_gpu_line("not installed")) from None
    except Exception as e:  # noqa: BLE001  (a broken CUDA install fails the import in many ways)
        raise DeviceError(no_gpu_line(f"does not import: {_first_line(e)}")) from None
    return cupy


_PROBED: dict = {}   # id(cupy module) -> its Device: a GPU is probed once (a failure each time, saying why)


def _cuda_device() -> Device:
    cp = _import_cupy()
    if id(cp) not in _PROBED:
        _PROBED[id(cp)] = _probe(cp)
    return _PROBED[id(cp)]


def _probe(cp) -> Device:
    """The current GPU as a Device, once it has run one kernel; else the DeviceError line saying why."""
    version = getattr(cp, "__version__", "?")
    try:
        n = cp.cuda.runtime.getDeviceCount()
        if n < 1:
            raise DeviceError(no_gpu_line(f"{version}, 0 devices visible"))
        probe = cp.arange(4, dtype=cp.float32)           # one allocation and one kernel (compiled on
        total = float((probe * 2).sum().get())           # first use): the toolkit works, not just the driver
        if total != 12.0:
            raise DeviceError(no_gpu_line(f"{version}, a test kernel computed {total} instead of 12"))
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        gib = props["totalGlobalMem"] / 2**30
        cuda = cp.cuda.runtime.runtimeGetVersion()
    except DeviceError:
        raise
    except Exception as e:  # noqa: BLE001  (no driver, no device, a toolkit that does not match it)
        raise DeviceError(no_gpu_line(f"{version}, {_first_line(e)}")) from None
    return Device("cuda", cp, f"{name}, {gib:.1f} GiB (CuPy {version}, CUDA {cuda})")


CPU = Device("cpu", np, f"CPU (NumPy {np.__version__})")


def get_device(name: str | Device = "cpu") -> Device:
    """"cpu" (NumPy) or "cuda" (CuPy on the current NVIDIA GPU). A GPU that cannot be used is one
    DeviceError line saying why and what to do, never a traceback from inside CuPy."""
    if isinstance(name, Device):
        return name
    key = str(name).strip().lower()
    if key == "cpu":
        return CPU
    if key in ("cuda", "gpu") or key.startswith("cuda:"):
        if key.startswith("cuda:") and key != "cuda:0":
            raise DeviceError(f"--device {name}: minillm runs on the current GPU only; use --device cuda "
                              "(choose the card with CUDA_VISIBLE_DEVICES)")
        return _cuda_device()
    raise DeviceError(f"--device {name!r}: choose one of {', '.join(DEVICES)}")


def device_of(x) -> Device:
    """The Device an array lives on (the CPU for NumPy arrays)."""
    xp = namespace(x)
    if xp is np:
        return CPU
    cp = _cupy_module()
    if cp is not None and xp is cp:
        return _cuda_device()
    return Device(_name(xp), xp, f"test namespace {_name(xp)}")


# -- time and launches -------------------------------------------------------------------------------

def synchronize(xp) -> None:
    """Wait until the device has run everything queued on its current stream (no-op on the CPU,
    whose operations return when they are done)."""
    if xp is np:
        return
    cp = _cupy_module()
    if cp is not None and xp is cp:
        cp.cuda.get_current_stream().synchronize()
        return
    sync = getattr(xp, "synchronize", None)
    if sync is not None:
        sync()


def clock(xp) -> float:
    """time.perf_counter() after the device has finished its queued work: a GPU runs asynchronously,
    so a clock read without the wait times the launches, not the work."""
    synchronize(xp)
    return time.perf_counter()


def best_seconds(fn, xp, repeats: int = 5, warmup: int = 1) -> float:
    """The best wall time of `repeats` calls of fn, each timed from a synchronised clock to a
    synchronised clock, after `warmup` untimed calls (compilation, first touches)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = clock(xp)
        fn()
        best = min(best, clock(xp) - t0)
    return max(best, 1e-9)
