"""What runs where, chosen once: a `Target` is the device, the dtype, the weights' format and the
kernel set of one model, resolved and checked by `Target.resolve` (which `minillm.load` calls) and
then handed, as one value, to the readers, the model and every weight it makes.

    Target.resolve(device="cpu", dtype=None, weights="float32", kernels=None)

    device    "cpu" (NumPy) or "cuda" (CuPy on an NVIDIA GPU): a backend.Device, never None
    dtype     float32 (the CPU's default) or float64 (exactness checks); on a GPU float16 (its
              default) or float32
    weights   "float32" (floats in dtype), "native" (a GGUF's blocks as the file has them), or
              "q8_0" / "q4_0" / "q4_1" (quantized at load); "float64" is float32's spelling for
              dtype float64
    kernels   a kernel set's name (models/kernel_sets.py: numpy, fused, batch-invariant, ...);
              None: the fastest set that runs here for these weights (`kernel_sets.default`)

Every "runs on the CPU only" refusal is worded once, here (`cpu_only`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import backend
from ..errors import MiniLLMError, WeightsError
from .quant import FORMATS

FLOATS = ("float32", "float64")    # weights= values that keep (or widen to) floats in the model's dtype
WEIGHTS = (*FLOATS, "native", *FORMATS)


def cpu_only(what: str, device: backend.Device, fix: str) -> backend.DeviceError:
    """The one wording of a refusal to run `what` on a GPU: what, where it was asked for, what to do."""
    return backend.DeviceError(f"{what} runs on the CPU only; on --device {device.name} {fix}")


def check_weights(weights) -> str:
    """`weights=` as one of WEIGHTS (one clear line otherwise)."""
    w = str(weights).lower()
    if w not in WEIGHTS:
        raise WeightsError(f"weights={weights!r}: choose one of float32, native, {', '.join(FORMATS)}")
    return w


@dataclass(frozen=True)
class Target:
    device: backend.Device
    dtype: np.dtype
    weights: str                  # float32 | native | q8_0 | q4_0 | q4_1 (float64 resolved into dtype)
    kernels: str                  # a kernel set's name (models/kernel_sets.py)

    @property
    def xp(self):
        """The arrays' module: numpy on the CPU, cupy on a GPU."""
        return self.device.xp

    @property
    def on_cpu(self) -> bool:
        """NumPy on the CPU (not a GPU, nor a test namespace standing in for one)."""
        return self.device.name == "cpu"

    @property
    def floats(self) -> bool:
        """Are the products kept in floats (not quantized blocks)?"""
        return self.weights in FLOATS

    def kernel_set(self):
        """The KernelSet this target names (models/kernel_sets.py; built once per process)."""
        from . import kernel_sets
        return kernel_sets.get(self.kernels)

    def with_(self, **changes) -> "Target":
        """This target with some fields changed, resolved again (a draft model in another format)."""
        now = {"device": self.device, "dtype": self.dtype, "weights": self.weights, "kernels": self.kernels}
        return Target.resolve(**{**now, **changes})

    @classmethod
    def resolve(cls, device="cpu", dtype=None, weights="float32", kernels=None) -> "Target":
        """Check and complete a choice of device, dtype, weights and kernels (see the module's docstring)."""
        from . import kernel_sets
        w = check_weights(weights)
        device = backend.get_device(device)
        if w == "float64":
            dtype, w = np.float64, "float32"
        dtype = np.dtype(dtype if dtype is not None else np.float16 if device.is_gpu else np.float32)
        on_cpu = device.name == "cpu"                  # (a test namespace stands in for a GPU's module)
        if not on_cpu and w not in FLOATS:
            raise cpu_only(f"--weights {w} (quantized weights)", device,
                           "use --weights float32 (stored in float16 on a GPU by default)")
        if on_cpu and dtype not in (np.float32, np.float64):
            raise MiniLLMError(f"dtype {dtype}: minillm computes in float32 (default) or float64 (for exactness "
                               "checks)" + ("; float16 is for --device cuda" if dtype == np.float16 else ""))
        if dtype not in (np.float16, np.float32, np.float64):
            raise MiniLLMError(f"dtype {dtype}: on a GPU minillm computes in float16 (default) or float32")
        if kernels is None:
            kernels = kernel_sets.default(on_cpu, dtype, w)
        spec = kernel_sets.spec(kernels)
        if spec.cpu_only and not on_cpu:
            raise cpu_only(f"--kernels {spec.name}", device, "leave --kernels out (the GPU computes with CuPy)")
        if spec.float32_only and dtype != np.float32:
            raise MiniLLMError(f"--kernels {spec.name} computes in float32, not {dtype}: leave --kernels out, "
                               "or load in float32")
        spec.check()                                   # numba, the CPU's instructions: one line if missing
        return cls(device, dtype, w, spec.name)

    @classmethod
    def numpy(cls, dtype=np.float32, weights: str = "float32") -> "Target":
        """The reference on the CPU: NumPy's kernels, in dtype (a constructor's default; tests)."""
        return cls.resolve("cpu", dtype, weights, "numpy")

    def __str__(self) -> str:
        return f"{self.device.name}, {self.dtype.name}, weights {self.weights}, kernels {self.kernels}"


CPU = Target(backend.CPU, np.dtype(np.float32), "float32", "numpy")   # the reference: a bare constructor's default
