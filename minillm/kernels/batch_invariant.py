"""Batch-invariant kernels: a row's result bit-identical whatever other rows share its step (the
idea of Thinking Machines' "Defeating nondeterminism in LLM inference" and of SGLang's and vLLM's
batch-invariant modes). The batch-invariant kernel set (models/kernel_sets.py,
`--kernels batch-invariant`) computes with them.

Why the default kernels are not: BLAS sums a [B, d] @ [d, out] product in an order that depends on
B (other kernels, other blocking: a row's sum is split and added up differently), and attention
runs a prompt's queries in blocks whose key range depends on how the prompt was split into chunks.
So in float32 a sequence's logits in a batch differ from its logits alone in the last bits, and
now and then a token does.

    matmul(x, a)               x [T, in] @ a [in, out] (C-contiguous), each output a sum over the
                               input in index order (_batch_invariant.py): the same for 1 row or 500
    attention(q, k, v, Tk)     each query over exactly its keys, in tiles anchored at key 0
    head_products(x, w)        each head's small product [H, N, a] @ [H, a, b], each row on its own

The rest of a step already computes each row on its own: NumPy's reductions over a contiguous last
axis (the norms, the softmax of sampling) sum each row in an order fixed by its length, and the
element-wise functions (GELU's tanh, SwiGLU, RoPE) give each element the same result wherever it
sits. The set also attends every sequence over its own cache (no batched gather).
Needs numba, like every kernel here.
"""

from __future__ import annotations

import math

import numpy as np

from . import _batch_invariant as K
from . import checks

KEY_TILE = 64        # attention: keys per tile, from key 0


def matmul(x: np.ndarray, a: np.ndarray) -> np.ndarray:
    """x [T, n_in] @ a [n_in, n_out] -> [T, n_out], each output summed over the input in index order:
    a row's result never depends on the other rows. a C-contiguous, of x's dtype."""
    if not (a.flags.c_contiguous and a.dtype == x.dtype and a.ndim == 2 and x.ndim == 2 and x.shape[1] == a.shape[0]):
        raise ValueError(f"fixed-order product: x {x.shape} {x.dtype} needs a C-contiguous [{x.shape[-1]}, out] "
                         f"matrix of {x.dtype}; got {a.shape} {a.dtype}")
    x = np.ascontiguousarray(x)
    y = np.empty((x.shape[0], a.shape[1]), x.dtype)
    run = K.matmul_threads if x.shape[0] * a.shape[0] * a.shape[1] >= K.PARALLEL_FROM else K.matmul_one
    run(x, a, y)
    return y


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, Tk: int | None = None) -> tuple[np.ndarray, int]:
    """ops.attention's semantics (causal, query i at position Tk - Tq + i, H = g·Hkv), each query
    over keys 0 .. its position in tiles of KEY_TILE from key 0. q [H, Tq, hd], k, v [Hkv, >= Tk, hd]
    (the first Tk rows attended) -> (out [H, Tq, hd], 0 bytes copied)."""
    Tk = checks.attention(q, k, v, Tk)
    H, Tq, hd = q.shape
    k, v = k[:, :Tk], v[:, :Tk]
    out = np.empty(q.shape, q.dtype)
    run = K.attention_threads if H * Tq * Tk * hd >= K.PARALLEL_FROM else K.attention_one
    run(q, k, v, out, q.dtype.type(1.0 / math.sqrt(hd)), KEY_TILE)
    return out, 0


def head_products(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [H, N, a] @ w [H, a, b] -> [H, N, b], each of the N rows multiplied on its own: a row's
    result never depends on the others (a [H, N, a] product's order depends on N)."""
    return np.concatenate([np.matmul(x[:, i:i + 1], w) for i in range(x.shape[1])], axis=1)
