"""The compiled CPU kernels (numba): functions over arrays, nothing of the models. Each is checked
against its NumPy reference (models/ops.py, models/quant.py) by tests/test_kernels.py; the kernel
sets of models/kernel_sets.py choose among them, and models/ops.py counts what they do.

    runtime          status() (can numba run here, and why not), threads, set_threads
    products         the fused float32 products (quant_matmul_t over a quantized matrix's planes,
                     dense_matmul_t over a float weight kept [out, in]), attention without a score
                     matrix (FlashAttention's tiles), paged decode attention (FlashDecoding's split)
    elementwise      one-pass RMS norm, rotation and SwiGLU
    batch_invariant  fixed-order products and attention: a row's result whatever rows come with it
    int8             quantized products in integers: x rounded to int8 blocks, the CPU's dot instructions
    checks           each kernel's argument checks, before it runs (one line for a wrong array)
    cpu              the features the CPU and numba's target both have (what the integer kernels may emit)
    aligned          arrays that start on a 64-byte boundary (the weights, the products' inputs)
    _numba, _batch_invariant, _int8   the numba code itself (loop forms measured and written beside them)

Everything but `status`, `available`, `set_threads` and `threads` needs numba: importing it
without numba raises the status's reason as a MiniLLMError.
"""

from __future__ import annotations

from .runtime import Status, available, set_threads, status, threads

_LAZY = {
    "quant_matmul_t": "products", "dense_matmul_t": "products", "attention": "products", "planes": "products",
    "paged_decode_attention": "products", "decode_chunk": "products",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minillm.kernels' has no attribute {name!r}")
    st = status()
    if not st.usable:
        from ..errors import MiniLLMError
        raise MiniLLMError(f"the fused kernels cannot run here: {st.reason}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value                 # found once: later lookups are plain attributes
    return value


__all__ = ["Status", "available", "set_threads", "status", "threads", *_LAZY]
