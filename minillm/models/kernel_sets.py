"""The kernel sets: which implementation of each operation a model computes with, chosen once (by its
target, models/target.py) and then only asked.

    numpy            the reference: NumPy (or CuPy on a GPU) through models/ops.py; every other set is
                     tested equal to it
    fused            numba (minillm/kernels/): products that read each weight once, attention without
                     a score matrix, one-pass norms, rotations, GELU and SwiGLU; float32 on the CPU
    batch-invariant  every product and attention in a fixed order (kernels/batch_invariant.py): a
                     request's tokens bit-identical to the same request alone, whatever shares its steps;
                     each sequence attends over its own cache (no batched gather)
    int8             the fused set with quantized products in integers (kernels/int8.py): each product's
                     input rounded per block of 32 to int8, the blocks multiplied with the CPU's integer
                     dot instructions (VNNI, AVX2), W8A8 / W4A8 as llama.cpp multiplies

A set is what it needs (a row of models/target.py's KERNEL_SETS: the CPU, float32, numba: what runs
where, said in one place) and what it offers (`KernelSet`, built here):

    K.weight(w)              a NumPy weight (Dense, QuantMatrix) as this set's (at load, once)
    K.rms_norm(x, w, eps)    K.rope(x, cos, sin)    K.swiglu(gate_up)
    K.layer_norm(x, w, b, eps)    K.gelu(x)              (GPT-2's norm and activation)
    K.attention(q, k, v, Tk, spec)  causal attention over a cache's first Tk rows, with its options
                             (ops.AttentionSpec): the set's kernel where it accepts them all
                             (`attention_accepts`), else ops' NumPy form; counted once in ops either way
    K.head_product(x, w, what)  each head's small product [H, N, a] @ [H, a, b] (latent attention's)
    K.paged_decode           (q, k_pool, v_pool, table, lengths) -> out: one query per sequence over its
                             blocks in a paged pool, no gather; None: the step gathers (models/plan.py)
    K.gather_decode          may a decode batch of short sequences attend as one gather?
    K.compiled_block         (model, plan, cos, sin) -> None, or x -> x: every block of a step in one
                             compiled call of this set's kernels (not a call per operation), the same
                             kernels in the same order (the int8 set's, for a decode step over a
                             contiguous cache or a paged pool: models/int8.py); never with a meter
                             listening: every count below is made as written

Every one of these is counted once, in models/ops.py, whichever implementation ran: a set passes
its compute kernel to the op (`ops.rms_norm(x, w, eps, kernel=...)`). Adding a set is one builder
here and one row in target.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from ..kernels import runtime
from . import ops
from .target import ENV, KERNEL_SETS, NAMES, default, default_described, described, spec, why_default  # noqa: F401  (the table's names)


@dataclass(frozen=True)
class KernelSet:
    name: str
    about: str                                   # for a header: "fused kernels (numba 0.68.1)", ...
    weight: Callable = lambda w: w               # a NumPy weight -> this set's
    lays_out: bool = False                       # its weights copy the values into their own layout
    norm_kernel: Callable | None = None          # the compute kernels it passes to ops (None: ops' own)
    layer_norm_kernel: Callable | None = None
    gelu_kernel: Callable | None = None
    rope_kernel: Callable | None = None
    swiglu_kernel: Callable | None = None
    attention_kernel: Callable | None = None
    attention_accepts: frozenset = frozenset()   # the AttentionSpec options its attention kernel takes
    head_product_kernel: Callable | None = None
    paged_kernel: Callable | None = None         # None: no paged kernel, a decode batch is gathered
    gather_decode: bool = True
    batch_invariant: bool = False                # a row's results never depend on the others in its step
    compiled_block: Callable | None = None       # (model, plan, cos, sin) -> the blocks in one call, or None

    # The operations, counted in ops (looked up there at each call: bench strips their counting code).

    def rms_norm(self, x, w, eps):
        return ops.rms_norm(x, w, eps, kernel=self.norm_kernel)

    def layer_norm(self, x, w, b, eps):
        return ops.layer_norm(x, w, b, eps, kernel=self.layer_norm_kernel)

    def gelu(self, x):
        return ops.gelu(x, kernel=self.gelu_kernel)

    def rope(self, x, cos, sin):
        return ops.rope(x, cos, sin, kernel=self.rope_kernel)

    def swiglu(self, gate_up):
        return ops.swiglu(gate_up, kernel=self.swiglu_kernel)

    def attention(self, q, k, v, Tk=None, spec: ops.AttentionSpec = ops.PLAIN):
        return ops.attention(q, k, v, Tk, kernel=self.attention_kernel if self.takes(spec) else None, spec=spec)

    def takes(self, spec: ops.AttentionSpec) -> bool:
        """Does its attention kernel take these options (else the NumPy form attends)? A value narrower
        than the keys is an option too (`value_width`); `expand` is the plan's, before attention."""
        return spec.asks() - {"expand"} <= self.attention_accepts

    def declines(self, asks) -> list[str]:
        """Of the attention options named in `asks` (ops.AttentionSpec's fields; a model's ATTENTION_ASKS),
        those for which this set attends with NumPy's form instead of its kernel (a header says so)."""
        return [] if self.attention_kernel is None else sorted(set(asks) - {"expand"} - self.attention_accepts)

    def head_product(self, x, w, what: str = "head_product"):
        return ops.head_product(x, w, what, kernel=self.head_product_kernel)

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
                     norm_kernel=elementwise.rms_norm, layer_norm_kernel=elementwise.layer_norm,
                     gelu_kernel=elementwise.gelu, rope_kernel=elementwise.rope, swiglu_kernel=elementwise.swiglu,
                     attention_kernel=products.attention, paged_kernel=products.paged_decode_attention)


def _batch_invariant() -> KernelSet:
    from ..kernels import batch_invariant
    from .weights import fixed_order
    return KernelSet("batch-invariant", f"batch-invariant kernels ({runtime.status().reason})", weight=fixed_order,
                     attention_kernel=batch_invariant.attention, head_product_kernel=batch_invariant.head_products,
                     gather_decode=False, batch_invariant=True)


def _int8() -> KernelSet:
    """The fused set with integer products; its decode attention splits every sequence's keys in fixed
    chunks and tiles, over a paged pool and over a contiguous cache alike, so that a decode step gives
    each sequence the bits it gets in a step of its own and alone in a contiguous cache (its products
    are row by row already: kernels/int8.py): `generate_batch` gives `generate`'s tokens. Its RMS norm,
    rotation and SwiGLU are the fused set's compiled in IEEE order, and so is its attention's fixed-chunk
    kernel (kernels/_exact.py), so that a decode step, its blocks in one compiled call
    (`compiled_block`), computes the bits of the operations."""
    from functools import partial

    from ..kernels import _exact, elementwise, int8, products
    from .int8 import compiled_blocks, integer
    return KernelSet("int8", f"integer kernels ({int8.describe()}; {runtime.status().reason})", weight=integer,
                     lays_out=True, norm_kernel=partial(elementwise.rms_norm, kernel=_exact.rms_norm),
                     layer_norm_kernel=elementwise.layer_norm, gelu_kernel=elementwise.gelu,
                     rope_kernel=partial(elementwise.rope, kernel=_exact.rope),
                     swiglu_kernel=partial(elementwise.swiglu, kernel=_exact.swiglu),
                     attention_kernel=partial(products.attention, chunk=products.DECODE_CHUNK),
                     paged_kernel=partial(products.paged_decode_attention, chunk=products.DECODE_CHUNK),
                     compiled_block=compiled_blocks)


BUILDERS: dict[str, Callable[[], KernelSet]] = {
    "numpy": _numpy, "fused": _fused, "batch-invariant": _batch_invariant, "int8": _int8,
}


@lru_cache(maxsize=None)
def get(name: str) -> KernelSet:
    """The kernel set of a name (a row of models/target.py's KERNEL_SETS), built once per process;
    one line if it cannot run here."""
    spec(name).check()
    return BUILDERS[spec(name).name]()
