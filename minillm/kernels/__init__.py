"""Fused CPU kernels (numba): the second half of the lesson, what an inference engine does with the
same arithmetic the NumPy reference does.

    status()                     can the kernels run here (numba imports and compiles), and why not
    default()                    ("fused", numba's version) where they can, else ("numpy", why not)
    FusedQuant, FusedDense       weights answering models/' weight interface with fused products
    fuse(w, transposed=False)    the fused implementation of a weight where there is one, else w
    quant_matmul_t, dense_matmul_t, attention, paged_decode_attention     the kernels as functions

Everything but `status`, `available`, `set_threads` and `threads` needs numba: importing it
without numba raises the status's reason as a MiniLLMError.
"""

from __future__ import annotations

from .runtime import Status, available, default, set_threads, status, threads

_LAZY = {
    "FusedQuant": "weights", "FusedDense": "weights", "fuse": "weights", "FUSED_ROWS": "weights", "DENSE_ROWS": "weights",
    "quant_matmul_t": "products", "dense_matmul_t": "products", "attention": "products",
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


__all__ = ["Status", "available", "default", "set_threads", "status", "threads", *_LAZY]
