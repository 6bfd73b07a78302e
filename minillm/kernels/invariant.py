"""Batch-invariant mode: a request's tokens bit-identical to the same request alone, whatever else
shares its steps (issue 33; the idea of Thinking Machines' "Defeating nondeterminism in LLM
inference" and of SGLang's and vLLM's batch-invariant modes).

Why the default path is not: BLAS sums a [B, d] @ [d, out] product in an order that depends on B
(other kernels, other blocking: a row's sum is split and added up differently), and attention runs
a prompt's queries in blocks whose key range depends on how the prompt was split into chunks. So in
float32 a sequence's logits in a batch differ from its logits alone in the last bits, and now and
then a token does.

What this mode changes, and only while it is on (`with invariant.mode():`, which the engine enters
around each step for `Engine(..., deterministic=True)`, and `generate(..., deterministic=True)`
around its loop; models/ops.py and models/plan.py ask `on()`):
    products   `matmul(w, x)`: each output a sum over the input in index order (kernels/_invariant.py),
               the same for 1 row or 500
    attention  `attention(q, k, v)`: each query over exactly its keys, in tiles anchored at key 0
               (and no batched decode gather: every sequence attends over its own cache)
The rest of a step already computes each row on its own: NumPy's reductions over a contiguous last
axis (the norms, the softmax of sampling) sum each row in an order fixed by its length, and the
element-wise functions (GELU's tanh, SwiGLU, RoPE) give each element the same result wherever it
sits (tests/test_deterministic.py checks all of it end to end).

It needs numba; without it `check()` raises one line saying so.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from ..errors import MiniLLMError
from .runtime import count_attention, status

KEY_TILE = 64        # attention: keys per tile, from key 0
OUT_TILE = 256       # quantized weights: output rows widened per product call

_ON: ContextVar[bool] = ContextVar("minillm_batch_invariant", default=False)


class DeterministicUnavailable(MiniLLMError):
    """The batch-invariant mode cannot run here (numba missing or not working)."""


def check() -> None:
    """Raise one clear line if the batch-invariant kernels cannot run in this process."""
    st = status()
    if not st.usable:
        raise DeterministicUnavailable(f"--deterministic needs the numba kernels, which cannot run here: {st.reason}")


def on() -> bool:
    """Is the batch-invariant mode on in this context?"""
    return _ON.get()


@contextmanager
def mode(enabled: bool = True):
    """Run the model's steps batch-invariant inside this block (enabled=False: leave as is)."""
    if not enabled:
        yield
        return
    check()
    token = _ON.set(True)
    try:
        yield
    finally:
        _ON.reset(token)


def _k():
    from . import _invariant
    return _invariant


def matmul(w, x: np.ndarray) -> np.ndarray:
    """x [T, n_in] times the weight w (models/weights.py's interface) -> [T, n_out], each output summed
    over the input in index order: a row's result never depends on the other rows. A float weight is
    used as it is stored (Dense's contiguous [in, out] array, no copy); any other (quantized, or kept
    [out, in] for a fused kernel) is taken OUT_TILE output rows at a time (`w.rows`, widened as its
    NumPy product widens tiles) and laid out [in, OUT_TILE], so every weight gives the same order."""
    K = _k()
    x = np.ascontiguousarray(x)
    T = x.shape[0]
    y = np.empty((T, w.n_out), x.dtype)
    run = K.matmul_threads if T * w.n_in * w.n_out >= K.PARALLEL_FROM else K.matmul_one
    a = getattr(w, "a", None)                                   # Dense: [in, out]
    if getattr(w, "wt", None) is not None:                      # a fused float weight, kept [out, in]:
        a = getattr(w, "in_out", None)                          # its [in, out] copy, made once (this
        if a is None:                                           # mode's only extra memory)
            a = w.in_out = np.ascontiguousarray(w.wt.T)
    if a is not None and a.flags.c_contiguous and a.dtype == x.dtype:
        run(x, a, y)
        return y
    for r0 in range(0, w.n_out, OUT_TILE):                      # any other weight: a tile of rows,
        r1 = min(w.n_out, r0 + OUT_TILE)                        # widened, laid out [in, n]
        tile = np.ascontiguousarray(np.asarray(w.rows(np.arange(r0, r1), x.dtype), dtype=x.dtype).T)
        out = np.empty((T, r1 - r0), x.dtype)
        run(x, tile, out)
        y[:, r0:r1] = out
    return y


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """ops.attention's semantics (causal, query i at position Tk - Tq + i, H = g·Hkv), each query
    over keys 0 .. its position in tiles of KEY_TILE from key 0. q [H, Tq, hd], k, v [Hkv, Tk, hd]
    -> [H, Tq, hd]. Counted for the meter as ops.attention counts the pairs it computes."""
    H, Tq, hd = q.shape
    Tk = k.shape[1]
    out = np.empty(q.shape, q.dtype)
    K = _k()
    run = K.attention_threads if H * Tq * Tk * hd >= K.PARALLEL_FROM else K.attention_one
    run(q, k, v, out, q.dtype.type(1.0 / math.sqrt(hd)), KEY_TILE)
    count_attention(q, out, Tk)
    return out
