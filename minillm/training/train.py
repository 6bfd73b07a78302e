"""Train a GPT-2 from scratch in NumPy, with every backward pass written by hand.

Each operation is a pair of small functions, forward and backward side by side (as in llm.c):

    y, cache = op_forward(x, ...)        # also returns what the backward will need
    dx, ...  = op_backward(dy, cache)    # dL/dx (and dL/dweights) from dL/dy

Shapes use B (batch), T (time), d (width), H (heads), hd (head width = d/H), V (vocabulary),
N = B*T (rows). Everything runs in float32 (the tests run the same functions in float64 to check the
gradients against finite differences), so constants are Python floats, which NumPy never lets widen a
float32 array (a `np.float64` scalar would).

Where the time goes: with GPT-2's vocabulary (V = 50,257) the LM head `logits = x @ wte.T` and the
cross-entropy dominate. A batch of N = 2,048 tokens makes a [2048, 50257] float32 logits array
(412 MB) and a gradient as big. So the head and the loss are fused and run over row chunks in one
reused buffer: logits -> softmax in place -> dlogits in place -> dx and dwte, and the full logits never
exist at once. Measured on this 2-core machine (N = 2,048, d = 128): the plain pair below, which allocates
fresh [N, V] arrays, takes 1.86 s; the fused head 0.81 s with 128-row chunks, 0.72 s with 256, 0.65 s
with 512 or 1,024, 0.66 s with all 2,048 rows at once. Its ~79 GFLOP then run at ~120 GFLOP/s, close to
the matmul peak: the head is compute-bound, and 512 rows (a 103 MB buffer) is the default. A whole
training step of the 4-layer, width-128 model runs at ~1,800-1,950 tokens/s (~1,600 with dropout).

Data and the held-out loss: the text is tokenized with GPT-2's BPE; the first 90% of the *tokens*
train, the last 10% are held out. Training draws random windows of n_ctx+1 tokens (inputs and their
next-token targets). The held-out loss is the mean cross-entropy (nats/token) of predicting every held-out token
but the first, read in non-overlapping windows of n_ctx inputs: window j feeds tokens
[j*n_ctx, (j+1)*n_ctx) and predicts [j*n_ctx+1, (j+1)*n_ctx+1); the last window is shorter. Each
token sees only the context inside its own window (between 0 and n_ctx-1 tokens before it).
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..checkpoints.checkpoint import load_checkpoint, save_checkpoint  # HF layout; each file written atomically
from ..config import GPT2Config
from ..errors import MiniLLMError
from ..data import BundledText  # the default --data: the bundled text

DEFAULT_DATA_SPLIT = 0.9  # first 90% of the tokens train, the last 10% are held out


class DataError(MiniLLMError):
    """A training text that is missing, unreadable or too short."""


# =================================================================================== the operations
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

GELU_C = math.sqrt(2.0 / math.pi)  # a Python float: keeps float32 arrays float32


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


def causal_bias(T, dtype):
    """[T, T]: 0 on and below the diagonal, -inf above (a query never sees later keys)."""
    return np.triu(np.full((T, T), -np.inf, dtype=dtype), k=1)  # np.tri would be float64


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
    att += causal_bias(T, att.dtype)
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


# ====================================================================================== the model


def init_params(config: GPT2Config, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: weights N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)),
    biases 0, layer-norm weights 1. Named like the Hugging Face checkpoint (no `transformer.` prefix)."""
    rng = np.random.default_rng(seed)
    V, T, d, L = config.vocab_size, config.n_ctx, config.n_embd, config.n_layer

    def normal(shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(dtype)

    p = {"wte.weight": normal((V, d)), "wpe.weight": normal((T, d))}
    for i in range(L):
        h = f"h.{i}."
        p[h + "ln_1.weight"], p[h + "ln_1.bias"] = np.ones(d, dtype), np.zeros(d, dtype)
        p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"] = normal((d, 3 * d)), np.zeros(3 * d, dtype)
        p[h + "attn.c_proj.weight"] = normal((d, d), 0.02 / math.sqrt(2 * L))
        p[h + "attn.c_proj.bias"] = np.zeros(d, dtype)
        p[h + "ln_2.weight"], p[h + "ln_2.bias"] = np.ones(d, dtype), np.zeros(d, dtype)
        p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"] = normal((d, 4 * d)), np.zeros(4 * d, dtype)
        p[h + "mlp.c_proj.weight"] = normal((4 * d, d), 0.02 / math.sqrt(2 * L))
        p[h + "mlp.c_proj.bias"] = np.zeros(d, dtype)
    p["ln_f.weight"], p["ln_f.bias"] = np.ones(d, dtype), np.zeros(d, dtype)
    return p


def block_forward(x, p, h, config, dropout=0.0, rng=None):
    """One transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)). x [B, T, d] -> [B, T, d]."""
    eps = config.ln_eps
    a, ln1 = layernorm_forward(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)             # [B, T, d]
    qkv, fc_attn = linear_forward(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"])  # [B, T, 3d]
    y, att = attention_forward(qkv, config.n_head, dropout, rng)                             # [B, T, d]
    o, proj_attn = linear_forward(y, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])  # [B, T, d]
    o, drop1 = dropout_forward(o, dropout, rng)
    x = x + o                                                                                 # [B, T, d]
    m, ln2 = layernorm_forward(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)             # [B, T, d]
    f, fc = linear_forward(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"])              # [B, T, 4d]
    g, gelu = gelu_forward(f)                                                                 # [B, T, 4d]
    o, proj = linear_forward(g, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])        # [B, T, d]
    o, drop2 = dropout_forward(o, dropout, rng)
    x = x + o                                                                                 # [B, T, d]
    return x, (ln1, fc_attn, att, proj_attn, drop1, ln2, fc, gelu, proj, drop2)


def block_backward(dx, cache, h, grads):
    """dx [B, T, d] -> dx [B, T, d]; adds this block's parameter gradients to `grads`."""
    ln1, fc_attn, att, proj_attn, drop1, ln2, fc, gelu, proj, drop2 = cache
    # second residual branch: x = x + drop(mlp(ln_2(x)))
    do = dropout_backward(dx, drop2)
    dg, grads[h + "mlp.c_proj.weight"], grads[h + "mlp.c_proj.bias"] = linear_backward(do, proj)
    df = gelu_backward(dg, gelu)
    dm, grads[h + "mlp.c_fc.weight"], grads[h + "mlp.c_fc.bias"] = linear_backward(df, fc)
    dln, grads[h + "ln_2.weight"], grads[h + "ln_2.bias"] = layernorm_backward(dm, ln2)
    dx = dx + dln                                   # the residual passes dx through unchanged
    # first residual branch: x = x + drop(attn(ln_1(x)))
    do = dropout_backward(dx, drop1)
    dy, grads[h + "attn.c_proj.weight"], grads[h + "attn.c_proj.bias"] = linear_backward(do, proj_attn)
    dqkv = attention_backward(dy, att)
    da, grads[h + "attn.c_attn.weight"], grads[h + "attn.c_attn.bias"] = linear_backward(dqkv, fc_attn)
    dln, grads[h + "ln_1.weight"], grads[h + "ln_1.bias"] = layernorm_backward(da, ln1)
    return dx + dln


def forward(params, config, idx, targets, dropout=0.0, rng=None, need_grad=True, chunk=512):
    """Mean next-token loss of idx [B, T] against targets [B, T], and what `backward` needs.

    The fused head computes the loss's gradient with respect to the final hidden state during the
    forward (its logits are never kept), so the cache holds that gradient, not the logits.
    With need_grad=False: (sum of per-token losses, None), used by `evaluate`.
    """
    B, T = idx.shape
    if T > config.n_ctx:
        raise MiniLLMError(f"sequence of {T} tokens is longer than the model's context ({config.n_ctx})")
    x, emb = embedding_forward(params["wte.weight"], params["wpe.weight"], idx)          # [B, T, d]
    x, drop0 = dropout_forward(x, dropout, rng)
    blocks = []
    for i in range(config.n_layer):
        x, c = block_forward(x, params, f"h.{i}.", config, dropout, rng)                 # [B, T, d]
        blocks.append(c)
    xf, lnf = layernorm_forward(x, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    d = config.n_embd
    loss, dxf, dwte_head = lm_head_cross_entropy(xf.reshape(-1, d), params["wte.weight"],  # [N, d] x [V, d]
                                                 targets.reshape(-1), chunk, need_grad)
    if not need_grad:
        return loss, None
    return loss, (emb, drop0, blocks, lnf, dxf.reshape(B, T, d), dwte_head)


def backward(params, config, cache):
    """The gradient of the loss with respect to every parameter: a dict named like `params`."""
    emb, drop0, blocks, lnf, dxf, dwte_head = cache
    grads = {}
    dx, grads["ln_f.weight"], grads["ln_f.bias"] = layernorm_backward(dxf, lnf)
    for i in reversed(range(config.n_layer)):
        dx = block_backward(dx, blocks[i], f"h.{i}.", grads)
    dx = dropout_backward(dx, drop0)
    dwte_emb, grads["wpe.weight"] = embedding_backward(dx, emb, params["wte.weight"].shape,
                                                       params["wpe.weight"].shape)
    grads["wte.weight"] = dwte_head + dwte_emb      # tied: wte is both the embedding and the LM head
    return grads


def loss_and_grads(params, config, idx, targets, dropout=0.0, rng=None, chunk=512):
    loss, cache = forward(params, config, idx, targets, dropout, rng, True, chunk)
    return loss, backward(params, config, cache)


# ================================================================================== the optimiser


def decays(name: str, array: np.ndarray) -> bool:
    """Weight decay applies to the 2-D weights (matrices and embeddings), never to biases or layer norms."""
    return array.ndim == 2


class AdamW:
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)."""

    def __init__(self, params, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8):
        self.wd, self.b1, self.b2, self.eps = float(weight_decay), float(betas[0]), float(betas[1]), float(eps)
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, params, grads, lr):
        self.t += 1
        lr = float(lr)
        c1 = 1.0 - self.b1 ** self.t                 # bias corrections: m and v start at 0
        c2 = 1.0 - self.b2 ** self.t
        for k, p in params.items():
            g, m, v = grads[k], self.m[k], self.v[k]
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * (g * g)
            if self.wd and decays(k, p):
                p *= 1.0 - lr * self.wd              # decoupled: shrink the weight, not the gradient
            p -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)


def clip_grad_norm(grads, max_norm):
    """Scale all gradients together so that their global L2 norm is at most max_norm; return the norm."""
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


def lr_at(progress, step, lr, warmup_steps, min_ratio=0.1):
    """Linear warm-up over the first warmup_steps, then cosine from lr down to min_ratio*lr at progress 1."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(max(progress, 0.0), 1.0)
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ========================================================================================== data


def load_tokens(text_path) -> np.ndarray:
    """The text at text_path as GPT-2 token ids (int32)."""
    from ..tokenizer import tokenizer

    path = Path(text_path)
    if not path.is_file():
        raise DataError(f"{path}: text file not found; pass --data with the path of a UTF-8 text file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read as UTF-8 text ({e})") from None
    return np.asarray(tokenizer().encode_ordinary(text), dtype=np.int32)


def split_tokens(tokens, n_ctx, source="text"):
    """(train, heldout): the first 90% of the tokens and the last 10%. Checks there is enough of each."""
    cut = int(len(tokens) * DEFAULT_DATA_SPLIT)
    train, heldout = tokens[:cut], tokens[cut:]
    if len(train) < n_ctx + 1:
        raise DataError(f"{source}: {len(tokens)} tokens is too short: its first 90% ({len(train)}) must hold "
                        f"one training window of {n_ctx + 1} tokens; use a longer text or a smaller --context")
    if len(heldout) < 2:
        raise DataError(f"{source}: {len(tokens)} tokens leave fewer than 2 held-out tokens; use a longer text")
    return train, heldout


def get_batch(tokens, batch, n_ctx, rng):
    """batch random windows of n_ctx+1 tokens: inputs [B, T] and the next-token targets [B, T]."""
    starts = rng.integers(0, len(tokens) - n_ctx, size=batch)
    windows = np.stack([tokens[s:s + n_ctx + 1] for s in starts]).astype(np.int64)  # [B, T+1]
    return windows[:, :-1], windows[:, 1:]


def evaluate(params, config: GPT2Config, tokens, batch=8, chunk=512) -> float:
    """Mean cross-entropy (nats/token) of predicting tokens[1:], in non-overlapping windows of n_ctx inputs.

    Window j feeds tokens[j*n_ctx : (j+1)*n_ctx] and is scored on the next tokens; the final window is
    shorter. No dropout. This is the held-out loss when `tokens` is the last 10%.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    if len(tokens) < 2:
        raise DataError(f"need at least 2 tokens to evaluate, got {len(tokens)}")
    T = config.n_ctx
    n_full = (len(tokens) - 1) // T
    total, count = 0.0, 0
    for b0 in range(0, n_full, batch):                                        # full windows, batched
        b1 = min(b0 + batch, n_full)
        idx = np.stack([tokens[j * T:(j + 1) * T] for j in range(b0, b1)])      # [b, T]
        tgt = np.stack([tokens[j * T + 1:(j + 1) * T + 1] for j in range(b0, b1)])
        s, _ = forward(params, config, idx, tgt, need_grad=False, chunk=chunk)
        total, count = total + s, count + idx.size
    rest = len(tokens) - 1 - n_full * T                                        # the shorter last window
    if rest:
        start = n_full * T
        s, _ = forward(params, config, tokens[None, start:start + rest], tokens[None, start + 1:start + rest + 1],
                       need_grad=False, chunk=chunk)
        total, count = total + s, count + rest
    return total / count


# ================================================================================ held-out loss


def heldout_loss(text_path, model) -> float:
    """Held-out loss (nats/token) on the last 10% of the tokens of text_path (see `evaluate`).

    model: a checkpoint directory (model.safetensors + config.json), or a (params, config) pair in either order.
    """
    if isinstance(model, (str, os.PathLike)):
        config, params = load_checkpoint(model)
    else:
        a, b = model
        params, config = (b, a) if isinstance(a, GPT2Config) else (a, b)
    tokens = load_tokens(text_path)
    cut = int(len(tokens) * DEFAULT_DATA_SPLIT)
    heldout = tokens[cut:]
    if len(heldout) < 2:
        raise DataError(f"{text_path}: {len(tokens)} tokens leave fewer than 2 held-out tokens")
    return evaluate(params, config, heldout)


# ==================================================================================== the training loop


def train(data, out=None, layers=4, heads=4, width=128, context=256, batch=8, steps=None, minutes=None,
          lr=3e-3, weight_decay=0.1, dropout=0.0, seed=1337, eval_every=200, warmup=100, clip=1.0,
          chunk=512, log=print, progress=True, dtype="float16") -> dict:
    """Train on the text at `data`; keep the checkpoint with the best held-out loss in `out`. Returns a summary."""
    if steps is None and minutes is None:
        steps = 1000
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_ctx=context)
    tokens = load_tokens(data)
    train_tok, heldout = split_tokens(tokens, context, str(data))
    rng = np.random.default_rng(seed)
    params = init_params(config, seed)
    opt = AdamW(params, weight_decay)
    budget = minutes * 60.0 if minutes is not None else None
    log(f"data {data}: {len(tokens):,} tokens ({len(train_tok):,} train, {len(heldout):,} held out); "
        f"model {config.n_params():,} parameters (L={layers} H={heads} d={width} ctx={context}); "
        f"batch {batch}x{context}, lr {lr}, weight decay {weight_decay}, dropout {dropout}, seed {seed}")

    best = {"heldout": math.inf, "step": 0}
    history = []
    t0 = time.perf_counter()
    step, seen, ema = 0, 0, None

    def checkpoint_eval(step, train_loss):
        te = time.perf_counter()
        val = evaluate(params, config, heldout, chunk=chunk)
        history.append((step, time.perf_counter() - t0, train_loss, val))
        msg = (f"step {step:6d}  {(time.perf_counter() - t0) / 60:6.1f} min  tokens {seen:,}  "
               f"train {train_loss:.4f}  held-out {val:.4f}")
        if val < best["heldout"]:
            best.update(heldout=val, step=step, train=train_loss, tokens=seen, minutes=(time.perf_counter() - t0) / 60)
            if out is not None:
                save_checkpoint(out, params, config, dtype=dtype, metadata={
                    "step": str(step), "heldout_loss": f"{val:.4f}", "train_loss": f"{train_loss:.4f}",
                    "tokens_seen": str(seen), "seed": str(seed), "data": Path(data).name})
                msg += "  (saved)"
        log(msg + f"  [eval {time.perf_counter() - te:.1f}s]")
        return val

    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        bar = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                       TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  lr {task.fields[lr]}"),
                       TimeElapsedColumn(), TimeRemainingColumn())
        task = bar.add_task("train", total=budget if budget else steps, loss="-", tps="-", lr="-")
        bar.start()
    try:
        while True:
            elapsed = time.perf_counter() - t0
            if (steps is not None and step >= steps) or (budget is not None and elapsed >= budget):
                break
            progress_frac = step / steps if steps is not None else elapsed / budget
            if steps is not None and budget is not None:
                progress_frac = max(progress_frac, elapsed / budget)
            ts = time.perf_counter()
            x, y = get_batch(train_tok, batch, context, rng)
            loss, grads = loss_and_grads(params, config, x, y, dropout, rng if dropout > 0 else None, chunk)
            norm = clip_grad_norm(grads, clip)
            rate = lr_at(progress_frac, step, lr, warmup)
            opt.step(params, grads, rate)
            step += 1
            seen += x.size
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            tps = x.size / (time.perf_counter() - ts)
            if bar is not None:
                bar.update(task, completed=(time.perf_counter() - t0) if budget else step,
                           loss=f"{ema:.3f}", tps=f"{tps:,.0f}", lr=f"{rate:.2e}")
            if step % 50 == 0:
                log(f"step {step:6d}  loss {ema:.4f}  grad norm {norm:.2f}  lr {rate:.2e}  {tps:,.0f} tok/s")
            if eval_every and step % eval_every == 0:
                checkpoint_eval(step, ema)
    finally:
        if bar is not None:
            bar.stop()
    if not history or history[-1][0] != step:
        checkpoint_eval(step, ema if ema is not None else float("nan"))
    wall = time.perf_counter() - t0
    # the train loss without dropout, measured like the held-out one, on the first len(heldout) train tokens
    train_eval = evaluate(params, config, train_tok[:len(heldout)], chunk=chunk)
    summary = {"steps": step, "tokens_seen": seen, "wall_s": wall, "final_train": ema, "train_eval": train_eval,
               "final_heldout": history[-1][3], "best": best, "config": config, "history": history}
    log(f"done: {step} steps, {seen:,} tokens in {wall / 60:.1f} min ({seen / wall:,.0f} tok/s overall); "
        f"final train {ema:.4f} (no dropout, first {len(heldout):,} train tokens: {train_eval:.4f}) "
        f"held-out {history[-1][3]:.4f}; best held-out {best['heldout']:.4f} at step "
        f"{best['step']}" + (f", saved in {out}" if out is not None else ""))
    return summary


# ========================================================================================== the CLI


def add_arguments(parser) -> None:
    parser.add_argument("--data", default=BundledText(), help="UTF-8 text to train on (first 90%% of its tokens train; default: the bundled tinyshakespeare)")
    parser.add_argument("--out", default=None, help="directory for the best checkpoint (model.safetensors + config.json)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default 1000 if no --minutes)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="wall-clock budget; with --steps too, stop at whichever comes first")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (warm-up, then cosine to 10%%)")
    parser.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout on embeddings, attention and residuals")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-every", type=int, default=200, help="steps between held-out evaluations")
    parser.add_argument("--chunk", type=int, default=512, help="rows per chunk of the fused LM head + loss")


def run(args) -> int:
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 150)  # log lines unwrapped in a file
    for name in ("layers", "heads", "width", "context", "batch", "eval_every", "chunk"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "eval_every" else 1):
            raise MiniLLMError(f"--{name.replace('_', '-')}={v}: must be positive")
    if args.steps is not None and args.steps < 1:
        raise MiniLLMError(f"--steps={args.steps}: must be at least 1")
    if args.minutes is not None and args.minutes <= 0:
        raise MiniLLMError(f"--minutes={args.minutes}: must be positive")
    if not 0.0 <= args.dropout < 1.0:
        raise MiniLLMError(f"--dropout={args.dropout}: must be in [0, 1)")
    train(args.data, out=args.out, layers=args.layers, heads=args.heads, width=args.width, context=args.context,
          batch=args.batch, steps=args.steps, minutes=args.minutes, lr=args.lr, weight_decay=args.weight_decay,
          dropout=args.dropout, seed=args.seed, eval_every=args.eval_every, warmup=args.warmup,
          chunk=args.chunk, log=console.log)
    return 0


def add_eval_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="model directory (default: the bundled model)")
    parser.add_argument("--data", default=BundledText(), help="the text whose last 10%% of tokens is scored (default: the bundled tinyshakespeare)")


def run_eval(args) -> int:
    from ..paths import package_weights_dir

    model = args.model if args.model is not None else package_weights_dir()
    loss = heldout_loss(args.data, model)
    print(f"held-out loss {loss:.4f} nats/token (perplexity {math.exp(loss):.1f}) on the last 10% of {args.data}")
    return 0
