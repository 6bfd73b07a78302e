"""Gated DeltaNet (Yang et al., "Gated Delta Networks", 2024): linear attention with a state of fixed
size per sequence, an attention kind a family assembles into its blocks (models/qwen35.py; the next
hybrid family imports this module, not Qwen3.5's). It reads only its own shape (`DeltaNetShape`),
and every operation here reports its bytes and FLOPs to the meter.

The linear layer keeps no keys: it folds them into a state of fixed size, per value head a
[dk, dv] matrix S that maps a key to a value (Yang et al., "Gated Delta Networks", 2024):

    q, k, v = silu(causal_conv(x W_qkv))          # a depthwise convolution over the last K inputs
    q, k = l2_normalize(q) / sqrt(dk), l2_normalize(k)
    g = -exp(A_log) · softplus(x W_a + dt_bias)   # log of the decay, <= 0: how much to forget
    beta = sigmoid(x W_b)                         # write strength, in (0, 1)
    per token t:
        S = exp(g_t) · S                          # forget a little of everything
        S = S + k_t (beta_t (v_t - S^T k_t))^T    # the delta rule: write the part of v_t that S
                                                  # does not already recall for k_t
        o_t = S^T q_t                             # read with the query
    y = rms_norm(o) · silu(x W_z)                 # the output gate, through a gated RMS norm
    out = y W_out

That loop is the recurrent form: a decode step reads S, updates it, writes it back (memory). A
prompt runs the chunked form instead (`delta_rule_chunked`): within a chunk of C tokens, the C
writes are solved at once as one triangular system, so the work becomes matrix products
(compute), and only the state crosses from chunk to chunk. Both give the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import backend, meter
from . import ops
from .blocks import sigmoid

CHUNK = 64                  # tokens per chunk of the chunked form (the reference's default)
PIECE = 16                  # chunks solved at once: bounds the [Hv, chunks, C, C] arrays of a long prompt
L2_EPS = 1e-6               # the L2 norm's epsilon (the reference's, whatever rms_norm_eps is)


@dataclass(frozen=True)
class DeltaNetShape:
    """What a Gated DeltaNet layer reads of a config: its heads, widths and convolution."""
    lin_k_heads: int                  # Hk: key (and query) heads
    lin_v_heads: int                  # Hv: value heads, each with its own [dk, dv] state
    lin_k_dim: int                    # dk
    lin_v_dim: int                    # dv
    conv_kernel: int                  # K: the causal convolution's taps
    eps: float                        # the gated output norm's epsilon

    @property
    def key_dim(self) -> int:
        return self.lin_k_heads * self.lin_k_dim           # Hk·dk: the width of q, and of k

    @property
    def value_dim(self) -> int:
        return self.lin_v_heads * self.lin_v_dim           # Dv = Hv·dv: the width of v, z and o

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim           # C: the convolution's channels, q|k|v

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One layer's state: the convolution's window and the delta rule's matrices."""
        return {"conv": (self.conv_kernel - 1, self.conv_dim),
                "ssm": (self.lin_v_heads, self.lin_k_dim, self.lin_v_dim)}


def causal_conv(x: np.ndarray, window: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The depthwise causal convolution with SiLU: each channel mixes its own last K inputs.
    x [n, C] the new inputs; window [K-1, C] the K-1 inputs before them (zeros at a sequence's
    start); w [K, C] the taps, oldest first -> (silu(y) [n, C], the new window [K-1, C]).
    Counted: 2·K + 5 FLOPs an output (K multiply-adds, the SiLU)."""
    K, n = w.shape[0], x.shape[0]
    xp = backend.namespace(x)
    xx = xp.concatenate([window, x])                                        # [K-1+n, C]
    y = xx[0:n] * w[0]                                                      # [n, C]
    for j in range(1, K):
        y += xx[j:j + n] * w[j]
    y *= sigmoid(y)                                                         # SiLU
    m = meter.active()
    if m is not None:
        m.count("causal_conv", weights=w.nbytes, activations=xx.nbytes + 2 * y.nbytes, other=(2 * K + 5) * y.size)
    return y, xx[n:].copy()


def l2_normalize(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
    """x / sqrt(sum(x²) + eps) over the last axis. [..., n] -> [..., n], a new array. 4 FLOPs an element."""
    y = x / backend.namespace(x).sqrt(backend.row_sumsq(x) + eps)
    m = meter.active()
    if m is not None:
        m.count("l2_norm", activations=x.nbytes + y.nbytes, other=4 * y.size)
    return y


def decay_and_strength(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray):
    """Per token and value head: g = -exp(A_log)·softplus(a + dt_bias), the log of how much of the
    state survives (<= 0), and beta = sigmoid(b), how strongly the token writes.
    a, b [n, Hv]; A_log, dt_bias [Hv] -> g [n, Hv], beta [n, Hv]."""
    xp = backend.namespace(a)
    g = -xp.exp(A_log) * xp.logaddexp(0.0, a + dt_bias)                      # softplus(t) = log(1 + e^t)
    beta = sigmoid(b)
    m = meter.active()
    if m is not None:
        m.count("decay", weights=A_log.nbytes + dt_bias.nbytes, activations=a.nbytes + b.nbytes + g.nbytes + beta.nbytes,
                other=5 * g.size + 4 * beta.size)
    return g, beta


def delta_rule_recurrent(q, k, v, g, beta, S):
    """The gated delta rule, one token after another: what a decode step runs.
    q, k [H, n, dk]; v [H, n, dv]; g, beta [H, n]; S [H, dk, dv] the state before the first token
    -> (o [H, n, dv], the state after the last). Counted: per head and token, 7·dk·dv FLOPs (decay,
    recall k^T S, write k δ^T, read q^T S) and 3·dv for the correction."""
    xp = backend.namespace(q)
    H, n, dv = v.shape
    o = xp.empty_like(v)                                                    # [H, n, dv]
    for t in range(n):
        S = S * xp.exp(g[:, t])[:, None, None]                              # forget: exp(g_t)·S
        recall = (k[:, t, None, :] @ S)[:, 0]                               # [H, dv]: S^T k_t
        delta = (v[:, t] - recall) * beta[:, t, None]                       # [H, dv]: what to correct
        S = S + k[:, t, :, None] * delta[:, None, :]                        # S += k_t δ^T
        o[:, t] = (q[:, t, None, :] @ S)[:, 0]                              # [H, dv]: S^T q_t
    m = meter.active()
    if m is not None:
        dk = k.shape[-1]
        m.count("delta_rule", activations=q.nbytes + k.nbytes + v.nbytes + g.nbytes + beta.nbytes + o.nbytes
                + 2 * (2 * n - 1) * S.nbytes, attention=H * n * (7 * dk * dv + 3 * dv))
    return o, S


RULES = ("delta", "additive")


def recall_errors(n: int, dk: int, dv: int, rule: str, heads: int = 8, seed: int = 0) -> np.ndarray:
    """What a fixed state forgets (lesson 19): write n random (key, value) pairs into a [dk, dv] state
    that starts at zero, then read every key back with the final state. `rule` "delta": the delta rule
    as the layer runs it (`delta_rule_recurrent`, no decay, write strength 1); "additive": plain linear
    attention, S += k vᵀ, which piles every write on the others. Keys unit length, as the layer
    normalizes them; `heads` independent states, seeded. -> [heads, n] relative errors
    ||Sᵀk_i − v_i|| / ||v_i||, in the order written (0 = recalled exactly; 1 = as far off as reading
    nothing)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, not {rule!r}")
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((heads, n, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)                          # [H, n, dk]
    v = rng.standard_normal((heads, n, dv)).astype(np.float32)              # [H, n, dv]
    S = np.zeros((heads, dk, dv), dtype=np.float32)                         # [H, dk, dv]
    if rule == "delta":
        g, beta = np.zeros((heads, n), np.float32), np.ones((heads, n), np.float32)
        _, S = delta_rule_recurrent(k, k, v, g, beta, S)
    else:
        S = S + np.swapaxes(k, -1, -2) @ v                                  # Σ_i k_i v_iᵀ
    got = k @ S                                                             # [H, n, dv]: Sᵀk_i
    return np.linalg.norm(got - v, axis=-1) / np.linalg.norm(v, axis=-1)


def ut_inverse(A: np.ndarray) -> np.ndarray:
    """(I + A)^-1 for A [..., C, C] strictly lower triangular, by forward substitution: row i of
    the inverse is e_i minus what rows 0..i-1 already account for. A new [..., C, C], lower
    triangular with ones on its diagonal."""
    xp = backend.namespace(A)
    C = A.shape[-1]
    T = xp.zeros_like(A)
    T[..., range(C), range(C)] = 1.0
    for i in range(1, C):
        T[..., i, :i] = -(A[..., i, None, :i] @ T[..., :i, :i])[..., 0, :]
    return T


def delta_rule_chunked(q, k, v, g, beta, S, chunk: int = CHUNK):
    """The gated delta rule over chunks of `chunk` tokens: what a prompt runs. Same arguments and
    result as `delta_rule_recurrent`.

    Within a chunk, with G_i the sum of g over its tokens 0..i and D_ij = exp(G_i - G_j) (j <= i, else 0),
    the value token i writes is u_i = beta_i (v_i - S_{i-1}^T k_i); unrolling S_{i-1} over the chunk's
    earlier writes gives one unit lower-triangular system for all of them at once:

        (I + A) U = beta·v - (beta·exp(G)·k) S,     A_ij = beta_i (k_i·k_j) D_ij   (j < i)

    so with T = (I + A)^-1: U = T (beta·v) - T (beta·exp(G)·k) S. Then the chunk's outputs and the
    state after it are matrix products:

        O = (exp(G)·q) S + ((q k^T) ⊙ D) U             [C, dv]
        S = exp(G_C)·S + (exp(G_C - G)·k)^T U          [dk, dv]

    T, A and q k^T do not depend on the state: every chunk's are computed at once, then a short
    scan carries S from chunk to chunk. Counted: the products' FLOPs as `attention`."""
    xp = backend.namespace(q)
    H, n, dk = k.shape
    dv = v.shape[-1]
    o = xp.empty_like(v)
    flops = 0
    for s0 in range(0, n, chunk * PIECE):                                   # a long prompt, a piece at a time
        s1 = min(n, s0 + chunk * PIECE)
        o[:, s0:s1], S, f = _chunks(q[:, s0:s1], k[:, s0:s1], v[:, s0:s1], g[:, s0:s1], beta[:, s0:s1], S, chunk)
        flops += f
    m = meter.active()
    if m is not None:
        m.count("delta_rule", activations=q.nbytes + k.nbytes + v.nbytes + g.nbytes + beta.nbytes + o.nbytes
                + 2 * S.nbytes, attention=flops)
    return o, S


def _chunks(q, k, v, g, beta, S, C):
    """`delta_rule_chunked` on at most PIECE chunks: (o [H, n, dv], S, FLOPs of the products)."""
    xp = backend.namespace(q)
    H, n, dk = k.shape
    dv = v.shape[-1]
    nc = -(-n // C)
    pad = nc * C - n                                         # zeros: k = 0 and beta = 0 write nothing
    if pad:
        widen = lambda a: xp.concatenate([a, xp.zeros(a.shape[:1] + (pad,) + a.shape[2:], a.dtype)], axis=1)
        q, k, v, g, beta = map(widen, (q, k, v, g, beta))
    q, k = q.reshape(H, nc, C, dk), k.reshape(H, nc, C, dk)                 # [H, nc, C, dk]
    v = v.reshape(H, nc, C, dv)                                             # [H, nc, C, dv]
    g, beta = g.reshape(H, nc, C), beta.reshape(H, nc, C)                   # [H, nc, C]
    G = xp.cumsum(g, axis=-1)                                               # log-decay since the chunk's start
    lower = xp.tril(xp.ones((C, C), dtype=bool))
    D = xp.exp(xp.where(lower, G[..., :, None] - G[..., None, :], -xp.inf))  # [H, nc, C, C], 0 above the diagonal
    kb = k * beta[..., None]                                                # [H, nc, C, dk]
    A = xp.tril((kb @ k.swapaxes(-1, -2)) * D, -1)                          # [H, nc, C, C], strictly lower
    T = ut_inverse(A)
    U = T @ (v * beta[..., None])                                           # [H, nc, C, dv]
    W = T @ (kb * xp.exp(G)[..., None])                                     # [H, nc, C, dk]
    QK = (q @ k.swapaxes(-1, -2)) * D                                       # [H, nc, C, C], with the diagonal
    qd = q * xp.exp(G)[..., None]                                           # queries read the decayed state
    kd = k * xp.exp(G[..., -1:] - G)[..., None]                             # keys decayed to the chunk's end
    last = xp.exp(G[..., -1])                                               # [H, nc]
    o = xp.empty_like(v)                                                    # [H, nc, C, dv]
    for i in range(nc):
        u = U[:, i] - W[:, i] @ S                                           # [H, C, dv]: the chunk's writes
        o[:, i] = qd[:, i] @ S + QK[:, i] @ u
        S = S * last[:, i, None, None] + kd[:, i].swapaxes(-1, -2) @ u      # [H, dk, dv]
    return o.reshape(H, nc * C, dv)[:, :n], S, chunked_flops(H, n, dk, dv, C)


def chunked_flops(H: int, n: int, dk: int, dv: int, C: int = CHUNK) -> int:
    """The chunked form's products over n tokens (what `delta_rule_chunked` counts as `attention`): per
    head and chunk of C, A, q kᵀ, T, U and W, then the scan's three state products and the in-chunk
    read. Linear in n: 6·C·dk + 4·C·dv + 2·C²/3 + 6·dk·dv a token and head, where full attention
    pays 2·t·(dk + dv) at position t."""
    nc = -(-n // C)
    return H * nc * (2 * C * C * dk * 2 + C ** 3 // 3 * 2 + 2 * C * C * dv + 2 * C * C * dk    # A, qk^T, T, U, W
                     + 2 * C * dk * dv * 3 + 2 * C * C * dv)                                     # the scan


def delta_rule(q, k, v, g, beta, S, chunk: int = CHUNK):
    """One token: the recurrent form; more: the chunked form (a prompt, a prompt's chunk)."""
    if q.shape[1] == 1:
        return delta_rule_recurrent(q, k, v, g, beta, S)
    return delta_rule_chunked(q, k, v, g, beta, S, chunk)


def linear_heads(mixed: np.ndarray, c: DeltaNetShape) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The convolution's output [n, C] -> q, k [Hv, n, dk] (L2-normalised, q scaled by 1/sqrt(dk);
    each of the Hk key heads repeated for its Hv/Hk value heads) and v [Hv, n, dv]."""
    n, Kd, r = mixed.shape[0], c.key_dim, c.lin_v_heads // c.lin_k_heads
    xp = backend.namespace(mixed)
    q = l2_normalize(mixed[:, :Kd].reshape(n, c.lin_k_heads, c.lin_k_dim))  # [n, Hk, dk]
    q *= 1.0 / math.sqrt(c.lin_k_dim)
    k = l2_normalize(mixed[:, Kd:2 * Kd].reshape(n, c.lin_k_heads, c.lin_k_dim))
    if r > 1:
        q, k = xp.repeat(q, r, axis=1), xp.repeat(k, r, axis=1)             # [n, Hv, dk]
    v = mixed[:, 2 * Kd:].reshape(n, c.lin_v_heads, c.lin_v_dim)            # [n, Hv, dv]
    return q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)


def gated_rms_norm(o: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """rms_norm(o)·w·silu(z) per head. o, z [N, Hv, dv]; w [dv] -> [N, Hv, dv]. The SiLU and product
    counted at 5 FLOPs an element."""
    y = ops.rms_norm(o, w, eps)
    y *= z * sigmoid(z)
    m = meter.active()
    if m is not None:
        m.count("output_gate", activations=2 * y.nbytes + z.nbytes, other=5 * y.size)
    return y


def linear_attention(x: np.ndarray, p: dict, c: DeltaNetShape, sequences, chunk: int = CHUNK) -> np.ndarray:
    """Gated DeltaNet. x [N, d] -> [N, d]. sequences: (rows, state) per sequence of the step, its rows
    a slice of x and its state a (read, write) pair for this layer, or None (a pass with no cache:
    the state starts at zeros and is not kept). One product for all rows; then each sequence's
    convolution and delta rule over its own state."""
    N, C, Dv, Hv = x.shape[0], c.conv_dim, c.value_dim, c.lin_v_heads
    xp = backend.namespace(x)
    y = ops.linear(x, p["in_proj.weight"])                                  # [N, C + Dv + 2·Hv]
    qkv, z, b, a = y[:, :C], y[:, C:C + Dv], y[:, C + Dv:C + Dv + Hv], y[:, C + Dv + Hv:]
    g, beta = decay_and_strength(a, b, p["A_log"], p["dt_bias"])           # [N, Hv] each
    o = xp.empty((N, Hv, c.lin_v_dim), dtype=x.dtype)                      # [N, Hv, dv]
    for rows, state in sequences:
        if state is None:
            window = xp.zeros((c.conv_kernel - 1, C), dtype=x.dtype)
            S = xp.zeros(c.state_shapes()["ssm"], dtype=x.dtype)
        else:
            window, S = state.read()                                        # [K-1, C], [Hv, dk, dv]
        mixed, window = causal_conv(qkv[rows], window, p["conv.weight"])    # [n, C]
        q, k, v = linear_heads(mixed, c)
        out, S = delta_rule(q, k, v, g[rows].T, beta[rows].T, S, chunk)     # [Hv, n, dv]
        if state is not None:
            state.write(window, S)
        o[rows] = out.transpose(1, 0, 2)
    o = gated_rms_norm(o, z.reshape(N, Hv, c.lin_v_dim), p["norm.weight"], c.eps)
    return ops.linear(o.reshape(N, Dv), p["out_proj.weight"])               # [N, d]
