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
    kernels   a kernel set's name (KERNEL_SETS below: numpy, fused, batch-invariant, ...); None:
              the fastest set that runs here for these weights (`default`)

What each kernel set needs (the CPU, float32, numba) is a row of KERNEL_SETS, and every "runs on
the CPU only" refusal is worded once, here (`cpu_only`): what runs where is said in this file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import backend
from ..errors import MiniLLMError, WeightsError
from ..kernels import runtime
from .quant import FORMATS

ENV = "MINILLM_KERNELS"     # the default kernel set, when given (the test suite pins "numpy")


class KernelsUnavailable(MiniLLMError):
    """A kernel set that cannot run in this process (numba missing or not working)."""


# -- the kernel sets: what each needs (models/kernel_sets.py builds what each offers) -----------------

@dataclass(frozen=True)
class Spec:
    """What a kernel set needs (models/kernel_sets.py builds what it offers), and when it is the default."""
    name: str
    needs_numba: bool = False
    cpu_only: bool = False
    float32_only: bool = False
    about: str = ""
    cpu_default: bool = False                # the default on the CPU in float32 where numba runs
    formats: tuple[str, ...] = ()            # weight formats it is the default for there, where...
    faster: Callable[[str], bool] | None = None   # ...it measured faster than the CPU default for that format

    def check(self) -> None:
        """One line if this set cannot run in this process."""
        if self.needs_numba:
            st = runtime.status()
            if not st.usable:
                raise KernelsUnavailable(f"--kernels {self.name} needs numba, which cannot run here: {st.reason}")

    def preferred_for(self, weights: str) -> bool:
        """Is it the default for these weights (on the CPU in float32, numba running)?"""
        return weights in self.formats and (self.faster is None or self.faster(weights))


def _int8_faster(weights: str) -> bool:
    """Did the integer kernels measure faster than the fused ones for this format on this CPU's
    instruction set (kernels/int8.py: `faster_than_fused`; native: a GGUF's blocks, taken as Q4_1)?"""
    from ..kernels import int8
    return int8.faster_than_fused("q4_1" if weights == "native" else weights)


KERNEL_SETS: dict[str, Spec] = {s.name: s for s in (
    Spec("numpy", about="the readable reference every other set is tested equal to"),
    Spec("fused", needs_numba=True, cpu_only=True, float32_only=True, cpu_default=True,
         about="numba: products that read each weight once, attention without a score matrix"),
    Spec("batch-invariant", needs_numba=True, cpu_only=True,
         about="fixed-order products and attention: each request's tokens as it would get alone"),
    Spec("int8", needs_numba=True, cpu_only=True, float32_only=True, formats=("q8_0", "q4_0", "q4_1", "native"),
         faster=_int8_faster,
         about="the fused set with quantized products in integers, x rounded to int8 blocks: W8A8, W4A8"),
)}
NAMES = tuple(KERNEL_SETS)


def spec(name) -> Spec:
    """The row of a kernel set's name (one clear line naming the sets otherwise)."""
    s = KERNEL_SETS.get(str(name).lower())
    if s is None:
        raise MiniLLMError(f"kernels={name!r}: choose one of {', '.join(NAMES)}")
    return s


def default(on_cpu: bool, dtype, weights: str) -> str:
    """The set a model computes with unless told: MINILLM_KERNELS when it names one; else on the CPU
    in float32 where numba runs here, the first row preferred for these weights (`Spec.preferred_for`:
    int8 for quantized ones where its integer kernels measured faster on this CPU), else the row that
    is the CPU's default (fused); else numpy (`why_default` says why)."""
    want = os.environ.get(ENV, "").strip().lower()
    if want in KERNEL_SETS:
        return want
    if on_cpu and np.dtype(dtype) == np.float32 and runtime.status().usable:
        rows = KERNEL_SETS.values()
        return next((s.name for s in rows if s.preferred_for(weights)), None) or \
            next(s.name for s in rows if s.cpu_default)
    return "numpy"


def described() -> str:
    """The kernel sets in words, from the rows: 'numpy (the readable reference ...), fused (...), ...'
    (the CLI's help and the docstrings that list them)."""
    return ", ".join(f"{s.name} ({s.about})" for s in KERNEL_SETS.values())


def default_described() -> str:
    """`default`'s rule in words, from the rows."""
    rows = KERNEL_SETS.values()
    cpu = next(s.name for s in rows if s.cpu_default)
    prefer = "".join(f", {s.name} for {'/'.join(s.formats)} weights where it measured faster on this CPU"
                     for s in rows if s.formats)
    return f"{cpu} on the CPU in float32 where numba works{prefer}; numpy otherwise"


def why_default() -> str | None:
    """One line when the default is NumPy on the CPU because numba cannot run here (None otherwise)."""
    if os.environ.get(ENV, "").strip().lower() in KERNEL_SETS:
        return None
    st = runtime.status()
    return None if st.usable else f"computing with the NumPy kernels: the fused ones cannot run here ({st.reason})"


# -- the weights ----------------------------------------------------------------------------------

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

    def with_(self, **changes) -> "Target":
        """This target with some fields changed, resolved again (a draft model in another format)."""
        now = {"device": self.device, "dtype": self.dtype, "weights": self.weights, "kernels": self.kernels}
        return Target.resolve(**{**now, **changes})

    @classmethod
    def resolve(cls, device="cpu", dtype=None, weights="float32", kernels=None) -> "Target":
        """Check and complete a choice of device, dtype, weights and kernels (see the module's docstring)."""
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
            kernels = default(on_cpu, dtype, w)
        row = spec(kernels)
        if row.cpu_only and not on_cpu:
            raise cpu_only(f"--kernels {row.name}", device, "leave --kernels out (the GPU computes with CuPy)")
        if row.float32_only and dtype != np.float32:
            raise MiniLLMError(f"--kernels {row.name} computes in float32, not {dtype}: leave --kernels out, "
                               "or load in float32")
        row.check()                                    # numba, the CPU's instructions: one line if missing
        return cls(device, dtype, w, row.name)

    @classmethod
    def numpy(cls, dtype=np.float32, weights: str = "float32") -> "Target":
        """The reference on the CPU: NumPy's kernels, in dtype (a constructor's default; tests)."""
        return cls.resolve("cpu", dtype, weights, "numpy")

    def __str__(self) -> str:
        return f"{self.device.name}, {self.dtype.name}, weights {self.weights}, kernels {self.kernels}"


CPU = Target(backend.CPU, np.dtype(np.float32), "float32", "numpy")   # the reference: a bare constructor's default
