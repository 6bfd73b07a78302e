"""The one factory of a model's weights: `make_weight(w, target)` makes NumPy's weight
(models/weights.py: a Dense or a QuantMatrix, kept or quantized as the target's weights say), then
the target's kernel set's implementation of it (models/kernel_sets.py), or the device's copy; and
`on_device(a, target)` puts a model's other arrays (norms, biases, tables) where its weights are."""

from __future__ import annotations

import numpy as np

from . import kernel_sets
from .quant import QuantMatrix
from .target import CPU, Target
from .weights import DeviceDense, Weight, numpy_weight


def to_device(w, target: Target) -> Weight:
    """A weight made on the host, moved once onto the target's device (floats only: the target
    refused quantized weights off the CPU already)."""
    return DeviceDense(target.device.asarray(w.a))


def stacked_on_device(parts: list, rows: bool, dtype, xp):
    """Device arrays (random weights drawn on a GPU) stacked as make_weight stacks host ones: [in, out]."""
    floats = [p.T if rows else p for p in parts]                                  # [in, out] each
    a = xp.concatenate([f.T for f in floats], axis=0).T if len(floats) > 1 else floats[0]
    return xp.ascontiguousarray(a, dtype=dtype)


def on_device(a, target: Target):
    """A model's other arrays (norms, biases, position tables) on its device: a, or a copy there."""
    return a if target.on_cpu else target.device.asarray(a)


def make_weight(w, target: Target = CPU, *, rows: bool = False, contiguous: bool = True) -> Weight:
    """The one place a model's product weights are made: NumPy's, then the target's kernel set's
    implementation of it (models/kernel_sets.py), or the device's.

    w: a float array [in, out] (a view is fine; with rows=True its [out, in] rows: a torch Linear's
    weight, or an embedding table [V, d], the tied LM head), a `QuantMatrix` ([out, in] rows of
    blocks, as a GGUF stores them), or a list of them stacked (outputs one after another: q|k|v, gate|up).
    target.weights: "float32" widens quantized parts to floats in target.dtype; "native" keeps a
    file's blocks when every part has the same format (a product that mixes formats is widened);
    "q8_0" / "q4_0" / "q4_1" keeps parts already in that format and quantizes the others' floats to it.
    contiguous: a float weight is copied contiguous (the layout BLAS streams) and made the kernel
    set's; False keeps a NumPy view, for an embedding table that is only gathered from.
    """
    parts = w if isinstance(w, list) else [w]
    if not target.on_cpu:
        if all(not isinstance(p, (np.ndarray, QuantMatrix)) for p in parts):   # on the device already (drawn there)
            return DeviceDense(stacked_on_device(parts, rows, target.dtype, target.xp))
        return to_device(numpy_weight(parts, target.weights, target.dtype, rows, contiguous), target)
    if not contiguous:
        return numpy_weight(parts, target.weights, target.dtype, rows, contiguous=False)
    K = kernel_sets.get(target.kernels)
    return K.weight(numpy_weight(parts, target.weights, target.dtype, rows, contiguous=not K.lays_out))
