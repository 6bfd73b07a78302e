"""The operations of training, each a pair of small functions, forward and backward side by side (as in llm.c):

    y, cache = op_forward(x, ...)        # also returns what the backward will need
    dx, ...  = op_backward(dy, cache)    # dL/dx (and dL/dweights) from dL/dy

Shapes use B (batch), T (time), d (width), H (heads), hd (head width = d/H), V (vocabulary),
N = B*T (rows). Everything runs in float32 (the tests run the same functions in float64 to check the
gradients against finite differences), so constants are Python floats, which NumPy never lets widen a
float32 array (a `np.float64` scalar would). GELU's constant and the causal mask are the engine's own
(`minillm.models.ops`), so training and inference compute the same function.

Where the time goes: with GPT-2's vocabulary (V = 50,257) the LM head `logits = x @ wte.T` and the
cross-entropy dominate. A batch of N = 2,048 tokens makes a [2048, 50257] float32 logits array
(412 MB) and a gradient as big. So the head and the loss are fused and run over row chunks in one
reused buffer: logits -> softmax in place -> dlogits in place -> dx and dwte, and the full logits never
exist at once. Measured on this 2-core machine (N = 2,048, d = 128): the plain pair below, which allocates
fresh [N, V] arrays, takes 1.86 s; the fused head 0.81 s with 128-row chunks, 0.72 s with 256, 0.65 s
with 512 or 1,024, 0.66 s with all 2,048 rows at once. Its ~79 GFLOP then run at ~120 GFLOP/s, close to
the matmul peak: the head is compute-bound, and 512 rows (a 103 MB buffer) is the default.
"""

from __future__ import annotations

import math

import numpy as np

from ..models.ops import GELU_C, causal_mask


# ------------------------------------------------------------------------------------- embeddings


def embedding_forward(wte, wpe, idx):
    """Token plus position embedding. idx [B, T] ints -> x [B, T, d]."""
    T = idx.shape[1]
    x = wte[idx] + wpe[:T]  # [B, T, d] + [T, d]
    return x, idx


def embedding_backward(dx, idx, wte_shape, wpe_shape):
    """dx [B, T, d] -> (dwte [V, d], dwpe [n_ctx, d]). Each row gathered gets its gradient added back."""
    B, T, d = dx.shape
    dwte = np.zeros(wte_shape, dtype=dx.dtype)
    np.add.at(dwte, idx.reshape(-1), dx.reshape(-1, d))  # a token may occur many times: add, not assign
    dwpe = np.zeros(wpe_shape, dtype=dx.dtype)
    dwpe[:T] = dx.sum(axis=0)  # [T, d]
    return dwte, dwpe


# ------------------------------------------------------------------------------------- layer norm


def layernorm_forward(x, w, b, eps=1e-5):
    """Normalise each row of x [..., d] to mean 0, variance 1, then scale by w and shift by b."""
    mean = x.mean(axis=-1, keepdims=True)           # [..., 1]
    xc = x - mean                                   # [..., d]
    var = (xc * xc).mean(axis=-1, keepdims=True)    # [..., 1] (biased variance, as GPT-2)
    rstd = 1.0 / np.sqrt(var + eps)                 # [..., 1]
    xhat = xc * rstd                                # [..., d]
    y = xhat * w + b                                # [..., d]
    return y, (xhat, rstd, w)


def layernorm_backward(dy, cache):
    """dy [..., d] -> (dx, dw [d], db [d])."""
    xhat, rstd, w = cache
    d = xhat.shape[-1]
    dw = (dy * xhat).reshape(-1, d).sum(axis=0)     # [d]
    db = dy.reshape(-1, d).sum(axis=0)              # [d]
    dxhat = dy * w                                  # [..., d]
    # xhat depends on every element of its row through the mean and the variance: subtract both paths
    dx = rstd * (dxhat
                 - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, dw, db


# ----------------------------------------------------------------------------------------- linear


def linear_forward(x, w, b):
    """y = x @ W + b with W stored [in, out] (GPT-2's Conv1D). x [..., in] -> y [..., out]."""
    x2 = x.reshape(-1, x.shape[-1])                 # [N, in]: one big matmul, not B small ones
    y = x2 @ w + b                                  # [N, out]
    return y.reshape(*x.shape[:-1], w.shape[1]), (x2, w)


def linear_backward(dy, cache):
    """dy [..., out] -> (dx [..., in], dW [in, out], db [out])."""
    x2, w = cache
    dy2 = dy.reshape(-1, w.shape[1])                # [N, out]
    dx = dy2 @ w.T                                  # [N, in]
    dw = x2.T @ dy2                                 # [in, out]
    db = dy2.sum(axis=0)                            # [out]
    return dx.reshape(*dy.shape[:-1], w.shape[0]), dw, db


# ------------------------------------------------------------------------------------------- GELU

def gelu_forward(x):
    """GPT-2's tanh GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    t = np.tanh(GELU_C * (x + 0.044715 * x * x * x))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dy, cache):
    """d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), with t the tanh."""
    x, t = cache
    dgelu = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * x * x)
    return dy * dgelu


# ---------------------------------------------------------------------------------------- dropout


def dropout_forward(x, p, rng):
    """Zero each element with probability p, scale the rest by 1/(1-p). p = 0: the identity."""
    if p <= 0.0 or rng is None:
        return x, None
    mask = (rng.random(x.shape, dtype=np.float32) >= p).astype(x.dtype)  # bool * float would be float64
    mask *= 1.0 / (1.0 - p)
    return x * mask, mask


def dropout_backward(dy, mask):
    return dy if mask is None else dy * mask


# ------------------------------------------------------------------------------ causal attention


def attention_forward(qkv, n_head, p_drop=0.0, rng=None):
    """Causal multi-head self-attention on c_attn's output. qkv [B, T, 3d] -> y [B, T, d].

    The heads are batched: q, k, v are [B, H, T, hd] views and one matmul serves every head.
    """
    B, T, three_d = qkv.shape
    d = three_d // 3
    hd = d // n_head
    q, k, v = qkv.reshape(B, T, 3, n_head, hd).transpose(2, 0, 3, 1, 4)  # each [B, H, T, hd]
    att = q @ k.swapaxes(-1, -2)                    # [B, H, T, T] scores
    att *= 1.0 / math.sqrt(hd)
    att += causal_mask(T, T, att.dtype)               # -inf above the diagonal: no later keys
    att -= att.max(axis=-1, keepdims=True)          # softmax over the keys, in place
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)          # [B, H, T, T] probabilities
    att_d, mask = dropout_forward(att, p_drop, rng)
    y = att_d @ v                                   # [B, H, T, hd]
    y = y.transpose(0, 2, 1, 3).reshape(B, T, d)    # heads side by side again: [B, T, d]
    return y, (q, k, v, att, att_d, mask, n_head)


def attention_backward(dy, cache):
    """dy [B, T, d] -> dqkv [B, T, 3d]."""
    q, k, v, att, att_d, mask, n_head = cache
    B, H, T, hd = q.shape
    dy = dy.reshape(B, T, H, hd).transpose(0, 2, 1, 3)     # [B, H, T, hd]
    dqkv = np.empty((3, B, H, T, hd), dtype=dy.dtype)
    np.matmul(att_d.swapaxes(-1, -2), dy, out=dqkv[2])     # dv = att^T dy           [B, H, T, hd]
    datt = dropout_backward(dy @ v.swapaxes(-1, -2), mask)  # datt = dy v^T          [B, H, T, T]
    # softmax backward, row by row: ds = p * (dp - sum(dp * p))
    datt -= (datt * att).sum(axis=-1, keepdims=True)
    datt *= att                                            # masked entries have p = 0: no gradient
    datt *= 1.0 / math.sqrt(hd)                            # through the 1/sqrt(hd) scale
    np.matmul(datt, k, out=dqkv[0])                        # dq = ds k               [B, H, T, hd]
    np.matmul(datt.swapaxes(-1, -2), q, out=dqkv[1])       # dk = ds^T q             [B, H, T, hd]
    return dqkv.transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * H * hd)  # [B, T, 3, H, hd] -> [B, T, 3d]


# ------------------------------------------------------------- LM head and cross-entropy (plain)
# These two are the textbook pair, kept for reading and for the gradient tests. Training uses the fused,
# chunked `lm_head_cross_entropy` below, which computes the same numbers without the full logits.


def lm_head_forward(x, wte):
    """The LM head tied to the token embedding: logits = x @ wte.T. x [N, d] -> [N, V]."""
    return x @ wte.T, (x, wte)


def lm_head_backward(dlogits, cache):
    """dlogits [N, V] -> (dx [N, d], dwte [V, d])."""
    x, wte = cache
    return dlogits @ wte, dlogits.T @ x


def cross_entropy_forward(logits, targets):
    """Mean over rows of -log softmax(logits)[target]. logits [N, V], targets [N] -> scalar."""
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m                                               # [N, V], max 0: exp cannot overflow
    logsum = np.log(np.exp(z).sum(axis=-1))                      # [N]
    rows = np.arange(len(targets))
    loss = float(np.mean(logsum - z[rows, targets]))
    return loss, (z, logsum, targets)


def cross_entropy_backward(cache):
    """d(mean loss)/dlogits = (softmax - onehot(target)) / N."""
    z, logsum, targets = cache
    N = len(targets)
    dlogits = np.exp(z - logsum[:, None])                        # the softmax
    dlogits[np.arange(N), targets] -= 1.0
    return dlogits / N


# ---------------------------------------------------------- LM head and cross-entropy (fused, chunked)

_WORKSPACE: dict = {}


def _workspace(name, shape, dtype):
    """A buffer reused from call to call, so the big [rows, V] logits are not re-allocated every step."""
    buf = _WORKSPACE.get(name)
    if buf is None or buf.shape != shape or buf.dtype != dtype:
        buf = _WORKSPACE[name] = np.empty(shape, dtype=dtype)
    return buf


def lm_head_cross_entropy(x, wte, targets, chunk=512, need_grad=True):
    """Forward *and* backward of logits = x @ wte.T followed by the mean cross-entropy, chunk rows at a time.

    x [N, d], wte [V, d], targets [N] -> (loss, dx [N, d], dwte [V, d]); with need_grad=False only the
    sum of the per-row losses is returned (loss, None, None), loss then being the *sum*, for averaging
    across calls. Each chunk: logits [C, V] in one reused buffer -> softmax in place -> turned in
    place into dlogits = (softmax - onehot) / N -> dx rows and a share of dwte.
    """
    N, d = x.shape
    V = wte.shape[0]
    C = min(chunk, N)
    buf = _workspace("logits", (C, V), x.dtype)
    dx = np.empty_like(x) if need_grad else None
    dwte = np.zeros_like(wte) if need_grad else None
    part = _workspace("dwte_part", wte.shape, x.dtype) if need_grad else None
    total = 0.0
    for r0 in range(0, N, C):
        r1 = min(r0 + C, N)
        n = r1 - r0
        xc, tc = x[r0:r1], targets[r0:r1]
        logits = buf[:n]
        np.matmul(xc, wte.T, out=logits)                       # [n, V]
        m = logits.max(axis=1, keepdims=True)                  # [n, 1]
        target_logit = logits[np.arange(n), tc]                # [n] (a copy, taken before exp)
        logits -= m
        np.exp(logits, out=logits)                             # unnormalised probabilities
        s = logits.sum(axis=1, keepdims=True)                  # [n, 1]
        total += float(np.sum(np.log(s[:, 0]) + m[:, 0] - target_logit))
        if not need_grad:
            continue
        logits *= 1.0 / (s * N)                                # softmax / N
        logits[np.arange(n), tc] -= 1.0 / N                    # - onehot / N: now dlogits [n, V]
        np.matmul(logits, wte, out=dx[r0:r1])                  # dx = dlogits @ wte      [n, d]
        np.matmul(logits.T, xc, out=part)                      # dwte += dlogits^T @ x  [V, d]
        dwte += part
    if not need_grad:
        return total, None, None
    return total / N, dx, dwte
