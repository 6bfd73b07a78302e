"""The kernel sets: which implementation of each operation a model computes with, chosen once (by its
target, models/target.py) and then only asked.

    numpy            the reference: NumPy (or CuPy on a GPU) through models/ops.py; every other set is
                     tested equal to it
    fused            numba (minillm/kernels/): products that read each weight once, attention without
                     a score matrix, one-pass norms, rotations and SwiGLU; float32 on the CPU
    batch-invariant  every product and attention in a fixed order (kernels/batch_invariant.py): a
                     request's tokens bit-identical to the same request alone, whatever shares its steps;
                     each sequence attends over its own cache (no batched gather)
    int8             the fused set with quantized products in integers (kernels/int8.py): each product's
                     input rounded per block of 32 to int8, the blocks multiplied with the CPU's integer
                     dot instructions (VNNI, AVX2), W8A8 / W4A8 as llama.cpp multiplies

A set is a row: what it needs (`Spec`: the CPU, float32, numba) and what it offers (`KernelSet`):

    K.weight(w)              a NumPy weight (Dense, QuantMatrix) as this set's (at load, once)
    K.rms_norm(x, w, eps)    K.rope(x, cos, sin)    K.swiglu(gate_up)
    K.attention(q, k, v, Tk) causal attention over a cache's first Tk rows
    K.paged_decode           (q, k_pool, v_pool, table, lengths) -> out: one query per sequence over its
                             blocks in a paged pool, no gather; None: the step gathers (models/plan.py)
    K.gather_decode          may a decode batch of short sequences attend as one gather?

Every one of these is counted once, in models/ops.py, whichever implementation ran: a set passes
its compute kernel to the op (`ops.rms_norm(x, w, eps, kernel=...)`). Adding a set is one builder
and one `Spec` row here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ..errors import MiniLLMError
from ..kernels import runtime
from . import ops

ENV = "MINILLM_KERNELS"     # the default set, when given (the test suite pins "numpy")


class KernelsUnavailable(MiniLLMError):
    """A kernel set that cannot run in this process (numba missing or not working)."""


@dataclass(frozen=True)
class KernelSet:
    name: str
    about: str                                   # for a header: "fused kernels (numba 0.68.1)", ...
    weight: Callable = lambda w: w               # a NumPy weight -> this set's
    lays_out: bool = False                       # its weights copy the values into their own layout
    norm_kernel: Callable | None = None          # the compute kernels it passes to ops (None: ops' own)
    rope_kernel: Callable | None = None
    swiglu_kernel: Callable | None = None
    attention_kernel: Callable | None = None
    paged_kernel: Callable | None = None         # None: no paged kernel, a decode batch is gathered
    gather_decode: bool = True
    batch_invariant: bool = False                # a row's results never depend on the others in its step

    # The operations, counted in ops (looked up there at each call: bench strips their counting code).

    def rms_norm(self, x, w, eps):
        return ops.rms_norm(x, w, eps, kernel=self.norm_kernel)

    def rope(self, x, cos, sin):
        return ops.rope(x, cos, sin, kernel=self.rope_kernel)

    def swiglu(self, gate_up):
        return ops.swiglu(gate_up, kernel=self.swiglu_kernel)

    def attention(self, q, k, v, Tk=None):
        return ops.attention(q, k, v, Tk, kernel=self.attention_kernel)

    @property
    def paged_decode(self) -> Callable | None:
        """(q, k_pool, v_pool, table, lengths) -> out over a paged pool, no gather; None: none here."""
        return None if self.paged_kernel is None else self._paged

    def _paged(self, q, k_pool, v_pool, table, lengths):
        return ops.paged_decode_attention(q, k_pool, v_pool, table, lengths, kernel=self.paged_kernel)


def _numpy() -> KernelSet:
    return KernelSet("numpy", "NumPy kernels")


def _fused() -> KernelSet:
    from ..kernels import elementwise, products
    from .fused import fuse
    return KernelSet("fused", f"fused kernels ({runtime.status().reason})", weight=fuse, lays_out=True,
                     norm_kernel=elementwise.rms_norm, rope_kernel=elementwise.rope, swiglu_kernel=elementwise.swiglu,
                     attention_kernel=products.attention, paged_kernel=products.paged_decode_attention)


def _batch_invariant() -> KernelSet:
    from ..kernels import batch_invariant
    from .weights import fixed_order
    return KernelSet("batch-invariant", f"batch-invariant kernels ({runtime.status().reason})", weight=fixed_order,
                     attention_kernel=batch_invariant.attention, gather_decode=False, batch_invariant=True)


def _int8() -> KernelSet:
    """The fused set with integer products; its paged decode splits every sequence's keys in fixed
    chunks, so that a decode step gives each sequence the bits it gets in a step of its own (its
    products are row by row already: kernels/int8.py)."""
    from functools import partial

    from ..kernels import elementwise, int8, products
    from .int8 import integer
    return KernelSet("int8", f"integer kernels ({int8.describe()}; {runtime.status().reason})", weight=integer,
                     lays_out=True, norm_kernel=elementwise.rms_norm, rope_kernel=elementwise.rope,
                     swiglu_kernel=elementwise.swiglu, attention_kernel=products.attention,
                     paged_kernel=partial(products.paged_decode_attention, chunk=products.DECODE_CHUNK))


@dataclass(frozen=True)
class Spec:
    """What a kernel set needs, and how it is built."""
    name: str
    build: Callable[[], KernelSet]
    needs_numba: bool = False
    cpu_only: bool = False
    float32_only: bool = False
    about: str = ""

    def check(self) -> None:
        """One line if this set cannot run in this process."""
        if self.needs_numba:
            st = runtime.status()
            if not st.usable:
                raise KernelsUnavailable(f"--kernels {self.name} needs numba, which cannot run here: {st.reason}")


SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("numpy", _numpy, about="the reference every other set is tested equal to"),
    Spec("fused", _fused, needs_numba=True, cpu_only=True, float32_only=True,
         about="numba: products that read each weight once, attention without a score matrix"),
    Spec("batch-invariant", _batch_invariant, needs_numba=True, cpu_only=True,
         about="fixed-order products and attention: each request's tokens as it would get alone"),
    Spec("int8", _int8, needs_numba=True, cpu_only=True, float32_only=True,
         about="the fused set, quantized products in integers (x rounded to int8 blocks: W8A8, W4A8)"),
)}
NAMES = tuple(SPECS)


def spec(name) -> Spec:
    """The row of a kernel set's name (one clear line naming the sets otherwise)."""
    s = SPECS.get(str(name).lower())
    if s is None:
        raise MiniLLMError(f"kernels={name!r}: choose one of {', '.join(NAMES)}")
    return s


@lru_cache(maxsize=None)
def get(name: str) -> KernelSet:
    """The kernel set of a name, built once per process."""
    s = spec(name)
    s.check()
    return s.build()


def default(on_cpu: bool, dtype, weights: str) -> str:
    """The set a model computes with unless told: MINILLM_KERNELS when it names one; else on the CPU
    in float32 where numba runs here, int8 for quantized weights (q8_0, q4_0, q4_1, and native, a
    GGUF's blocks) where the integer kernels measured faster than the fused ones for that format on
    this CPU's instruction set (kernels/int8.py: `faster_than_fused`; all within their error bound),
    else fused; else numpy (`why_default` says why)."""
    want = os.environ.get(ENV, "").strip().lower()
    if want in SPECS:
        return want
    if on_cpu and np.dtype(dtype) == np.float32 and runtime.status().usable:
        if weights in ("q8_0", "q4_0", "q4_1", "native"):
            from ..kernels import int8
            if int8.faster_than_fused("q4_1" if weights == "native" else weights):
                return "int8"
        return "fused"
    return "numpy"


def why_default() -> str | None:
    """One line when the default is NumPy on the CPU because numba cannot run here (None otherwise)."""
    if os.environ.get(ENV, "").strip().lower() in SPECS:
        return None
    st = runtime.status()
    return None if st.usable else f"computing with the NumPy kernels: the fused ones cannot run here ({st.reason})"
