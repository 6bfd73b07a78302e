"""The models' operations (GPT-2's, then the Llama family's), one function each. Each one computes,
then reports what it touched to the meter. Weights are multiplied through one interface
(models/weights.py): `w.matmul(x)`, `w.rows(ids)`, `w.counts(T)`; a float and a quantized weight
take the same path here.

Every report is computed from the arrays the operation actually used (`.nbytes`, `.shape`), so the
counters cannot drift from the code. With no meter active the report is skipped entirely:

    m = meter.active()
    if m is not None:
        m.count(...)

FLOP conventions: a multiply-add is 2 FLOPs. Element-wise work counts per element of output:
layer norm 7 (mean, subtract, square, variance, normalise, scale, shift), tanh-GELU 8, softmax 5
(max, subtract, exp, sum, divide), a bias, residual or mask add 1, scaling 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from .. import backend, meter
from .weights import as_weight, matmul  # noqa: F401  (matmul: the BLAS-shaped product, for tools)

GELU_C = math.sqrt(2.0 / math.pi)


def embedding(wte, wpe, ids: np.ndarray, positions=None, scale: float | None = None) -> np.ndarray:
    """Token embeddings, plus position embeddings where the model learns them (GPT-2).
    wte: the token table as a weight (its rows are the embeddings; a plain [V, d] array is taken as
    one); ids [N]; wpe [n_ctx, d] or None (rotary models: positions come later); positions: the rows
    of wpe, an index array [N], a slice (one sequence's consecutive positions: a view, no gather) or
    the first position, an int, the others following it; scale: a factor on every row (Gemma's √d)
    -> x [N, d].

    Reads only the rows it gathers: N rows of wte (quantized: their blocks, widened straight into x)
    and N rows of wpe.
    """
    wte = as_weight(wte, table=True)
    N = ids.shape[0]
    x = wte.rows(ids, None if wpe is None else wpe.dtype)   # [N, d]  gather N rows
    pos = None
    if wpe is not None:
        pos = wpe[positions:positions + N] if np.isscalar(positions) else wpe[positions]   # [N, d]
        x += pos
    if scale is not None:
        x *= scale
    m = meter.active()
    if m is not None:
        c = wte.rows_counts(N)
        m.count("embedding", weights=c["weights"] + (0 if pos is None else pos.nbytes), activations=x.nbytes,
                other=(0 if pos is None else x.size) + (0 if scale is None else x.size), dequant=c["dequant"])
    return x


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float, kernel=None) -> np.ndarray:
    """Normalise each row to mean 0, variance 1, then scale by w and shift by b. [T, d] -> [T, d].
    (float16 rows are normalised in float32, then stored back in float16.)
    kernel: another implementation of the same values (a kernel set's), counted the same."""
    if kernel is not None:
        y = kernel(x, w, b, eps)
    else:
        xp, wide = backend.namespace(x), backend.accumulator(x.dtype)
        inv_d = 1.0 / x.shape[-1]
        mean = backend.row_sum(x, wide)                          # [T, 1]
        mean *= inv_d
        y = x - mean                                             # [T, d]  centred
        var = backend.row_sum(y * y, wide)                       # [T, 1]
        var *= inv_d
        var += eps
        y /= xp.sqrt(var, out=var)                               # [T, d]  unit variance
        y *= w
        y += b
        y = y.astype(x.dtype, copy=False)                        # (float32 and float64: y itself)
    m = meter.active()
    if m is not None:
        m.count("layer_norm", weights=w.nbytes + b.nbytes, activations=x.nbytes + y.nbytes, other=7 * y.size)
    return y


def linear(x: np.ndarray, w, b: np.ndarray | None = None) -> np.ndarray:
    """y = x W (+ b): w a weight (models/weights.py; a plain array is [in, out], as in the GPT-2
    checkpoint). [T, in] -> [T, out]."""
    w = as_weight(w)
    y = w.matmul(x)                                                    # [T, out]
    if b is not None:
        y += b
    m = meter.active()
    if m is not None:
        T = x.shape[0]
        c = w.counts(T, x.itemsize)
        m.count("linear", weights=c["weights"] + (0 if b is None else b.nbytes), activations=x.nbytes + y.nbytes,
                matmul=2 * T * w.n_in * w.n_out, other=0 if b is None else y.size, dequant=c["dequant"],
                scratch=c["scratch"])
    return y


def split_heads(qkv: np.ndarray, n_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, 3d] -> q, k, v, each [H, T, hd] (views, no copy)."""
    T, three_d = qkv.shape
    hd = three_d // (3 * n_head)
    qkv = qkv.reshape(T, 3, n_head, hd).transpose(1, 2, 0, 3)   # [3, H, T, hd]
    return qkv[0], qkv[1], qkv[2]


def merge_heads(a: np.ndarray) -> np.ndarray:
    """[H, T, hd] -> [T, H·hd]: the heads side by side again."""
    H, T, hd = a.shape
    return a.transpose(1, 0, 2).reshape(T, H * hd)


def gelu(x: np.ndarray, kernel=None) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Shape kept.
    kernel: another implementation of the same values (a kernel set's), counted the same."""
    if kernel is not None:
        y = kernel(x)
    else:
        y = x * x
        y *= x
        y *= 0.044715
        y += x
        y *= GELU_C
        backend.namespace(y).tanh(y, out=y)
        y += 1.0
        y *= x
        y *= 0.5
    m = meter.active()
    if m is not None:
        m.count("gelu", activations=x.nbytes + y.nbytes, other=8 * y.size)
    return y


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The residual connection, in place: x += y. [T, d]."""
    x += y
    m = meter.active()
    if m is not None:
        m.count("residual", activations=3 * x.nbytes, other=x.size)
    return x


def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in place (s is a scratch array of scores)."""
    s -= s.max(axis=-1, keepdims=True)
    backend.namespace(s).exp(s, out=s)
    s *= 1.0 / s.sum(axis=-1, keepdims=True)
    return s


def causal_mask(Tq: int, Tk: int, dtype: np.dtype, xp=np) -> np.ndarray:
    """[Tq, Tk]: 0 where query i (at position Tk - Tq + i) may look, -inf at the keys after it
    (made once per shape on xp's device: backend.causal_mask)."""
    return backend.causal_mask(xp, Tq, Tk, np.dtype(dtype))


QUERY_BLOCK = 128  # prefill queries per block: a block attends only to the keys its last query may see


@dataclass(frozen=True, eq=False)
class AttentionSpec:
    """How one attention differs from plain causal attention over every earlier position, each field
    None where it does not (`PLAIN`: all of them). What a family asks of `plan.attend`:

        scale        the scores' scale (None: 1/√hd; latent attention: 1/√(dn + dr))
        value_width  the values' width where narrower than the keys' (latent attention: r of r + dr)
        window       a query at position p attends keys p - window + 1 .. p only (a sliding window)
        sinks        [H]: one logit per query head in the softmax's denominator, with no value (a sink)
        expand       expand(k, v) -> (k, v): what attention takes, made from the positions a cache read
                     (a latent cache's rows decompressed into every head's K and V); the plan's to apply

    A kernel set's attention kernel takes the fields it declares (`KernelSet.attention_accepts`);
    for any other, the set attends with `attention`'s NumPy form here, counted the same way."""
    scale: float | None = None
    value_width: int | None = None
    window: int | None = None
    sinks: object = None
    expand: Callable | None = None

    def __post_init__(self) -> None:
        # Asked once per layer per step (the plan, the kernel set and `attention` each ask): the set
        # is made once, here, rather than from dataclasses.fields at every call (~6 µs each).
        object.__setattr__(self, "_asks", frozenset(f.name for f in fields(self) if getattr(self, f.name) is not None))

    def asks(self) -> frozenset:
        """The options it sets, by name: what a kernel must accept to attend with it."""
        return self._asks


PLAIN = AttentionSpec()


def softmax_with_sinks(s: np.ndarray, sinks: np.ndarray) -> np.ndarray:
    """`softmax` with one more logit per row that takes no value (a sink: gpt-oss's per head), in place:
    s [..., n], sinks broadcast to [..., 1]. A sink of -inf adds exactly 0 to the denominator: the
    result is `softmax`'s, bit for bit."""
    xp = backend.namespace(s)
    top = xp.maximum(s.max(axis=-1, keepdims=True), sinks)
    s -= top
    xp.exp(s, out=s)
    s *= 1.0 / (s.sum(axis=-1, keepdims=True) + xp.exp(sinks - top))
    return s


def window_mask(rows: int, n: int, first: int, dtype, xp=np) -> np.ndarray:
    """[rows, n]: -inf where key j (of the n from the block's first key) fell behind query i's window,
    j < first + i (first: the lowest key the block's first query may see, from that same origin)."""
    j = np.arange(n)[None, :]
    i = np.arange(rows)[:, None]
    return xp.asarray(np.where(j < first + i, -np.inf, 0.0).astype(dtype))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, Tk: int | None = None, kernel=None,
              spec: AttentionSpec = PLAIN) -> np.ndarray:
    """Causal scaled dot-product attention for all heads in one batched product.

    q [H, Tq, hd] are the queries of the Tq newest positions; k, v [Hkv, >= Tk, hd] hold the keys and
    values of all Tk positions so far in their first Tk rows (Tk >= Tq; None: every row, a cache's
    `read_rows` may hold more), so query i sits at absolute position Tk - Tq + i and may look at
    keys 0 .. Tk - Tq + i. Grouped-query attention: H = g·Hkv query heads share
    each key/value head, query heads j·g .. j·g+g-1 reading KV head j (GPT-2: g = 1); the g heads of
    a group are stacked as rows of one product, so each KV head is read once for all of them.
    A decode step (Tq == 1) is one block that needs no mask. A long prefill goes in blocks of
    QUERY_BLOCK queries, each against only the keys its last query may see: the block's
    [rows, keys] scores include a masked triangle, but the keys no query of the block may see are
    never computed (for 512 tokens, 62% of the full T×T matrix).
    Returns [H, Tq, hd_v]. spec (`AttentionSpec`): the values may be narrower than the keys and the
    scale another (latent attention, models/mla.py: 576-wide keys, 512-wide values, 1/√192); a window
    bounds the keys each query sees (and the keys read: a block starts at its first query's first
    key); sinks add one logit per head to each softmax's denominator. `expand` is the plan's.

    Reading k and v is counted by whoever handed them over: a KV cache's `read` as kv_read, the
    pass-through of a cache-less forward as activations.
    kernel: another implementation, (q, k, v, Tk) -> (out, bytes of k and v it copied) (a kernel
    set's: the fused tiles, the batch-invariant order), counted as what it does: no score matrix,
    only the query-key pairs a query may see (`count_tiled_attention`).
    """
    Tk = k.shape[1] if Tk is None else int(Tk)
    if kernel is not None and (spec.asks() - {"expand"} or v.shape[-1] != q.shape[-1]):
        raise ValueError("an attention kernel takes keys and values of one width and the scale 1/√hd, with no "
                         "window or sink (its kernel set attends with NumPy's form otherwise)")
    if kernel is not None:
        out, copied = kernel(q, k, v, Tk)
        count_tiled_attention(q, out, Tk, copied)
        return out
    H, Tq, hd = q.shape
    Hkv = k.shape[0]
    g = H // Hkv                                       # query heads per KV head
    dv = v.shape[-1]
    q = q * (1.0 / math.sqrt(hd) if spec.scale is None else spec.scale)   # [H, Tq, hd]  scaled once, before the product
    xp = backend.namespace(q)
    out = xp.empty((H, Tq, dv), dtype=q.dtype)         # [H, Tq, hd_v]
    q4, out4 = q.reshape(Hkv, g, Tq, hd), out.reshape(Hkv, g, Tq, dv)
    window, sinks = spec.window, None if spec.sinks is None else xp.asarray(spec.sinks, dtype=q.dtype).reshape(Hkv, g, 1, 1)
    scored = 0                                         # query-key pairs computed, per query head
    for r0 in range(0, Tq, QUERY_BLOCK):
        r1 = min(r0 + QUERY_BLOCK, Tq)
        rows = r1 - r0
        keys = Tk - Tq + r1                            # the block's last query sees keys 0 .. keys-1
        lo = 0 if window is None else max(0, Tk - Tq + r0 - window + 1)   # and its first query keys lo ..
        qb = q4[:, :, r0:r1].reshape(Hkv, g * rows, hd)                # [Hkv, g·rows, hd]
        scores = qb @ k[:, lo:keys].transpose(0, 2, 1)                 # [Hkv, g·rows, keys - lo]  QK^T
        n = keys - lo
        masked = scores.reshape(Hkv, g, rows, n)                       # a view: in-place adds
        if rows > 1:
            xp.add(masked, causal_mask(rows, n, scores.dtype, xp), out=masked)
            if window is not None:                                     # the keys behind each query's window
                xp.add(masked, window_mask(rows, n, Tk - Tq + r0 - window + 1 - lo, scores.dtype, xp), out=masked)
        if sinks is None:
            softmax(scores)
        else:
            softmax_with_sinks(masked, sinks)
        if g == 1:                                                     # [H, rows, hd]  weighted sum of values
            xp.matmul(scores, v[:, lo:keys], out=out[:, r0:r1])
        else:
            out4[:, :, r0:r1] = (scores @ v[:, lo:keys]).reshape(Hkv, g, rows, dv)
        scored += rows * n
    m = meter.active()
    if m is not None:
        score_bytes = H * scored * q.itemsize
        m.count("attention",
                activations=2 * q.nbytes + out.nbytes + 2 * score_bytes,
                attention=2 * H * scored * (hd + dv),
                other=q.size + (6 if Tq > 1 else 5) * H * scored + (0 if sinks is None else 5 * H * Tq))
    return out


def head_product(x: np.ndarray, w: np.ndarray, what: str = "head_product", kernel=None) -> np.ndarray:
    """Each head's own small product: x [H, N, a] @ w [H, a, b] -> [H, N, b] (one BLAS call a head;
    latent attention's absorbed query and output, models/mla.py). kernel: a kernel set's (x, w) -> y
    (the batch-invariant set's, each row on its own). Counted like `linear`: w read once, x and the
    output written and read, 2 FLOPs a multiply-add; `what` names the op."""
    y = backend.namespace(x).matmul(x, w) if kernel is None else kernel(x, w)   # [H, N, b]
    m = meter.active()
    if m is not None:
        H, N, a = x.shape
        m.count(what, weights=w.nbytes, activations=x.nbytes + y.nbytes, matmul=2 * H * N * a * w.shape[-1])
    return y


def count_tiled_attention(q: np.ndarray, out: np.ndarray, Tk: int, copied: int = 0) -> None:
    """What a causal attention without a score matrix reports: q [H, Tq, hd] and its output read and
    written once (`copied`: bytes of keys and values copied to rows first), 4·hd FLOPs per causal
    query-key pair, other: q's scaling, 5 per pair (the softmax's max, subtract, exp, sum, normalise)."""
    m = meter.active()
    if m is not None:
        H, Tq, hd = q.shape
        pairs = Tq * (Tk - Tq) + Tq * (Tq + 1) // 2           # query i sees Tk - Tq + i + 1 keys
        m.count("attention", activations=q.nbytes + out.nbytes + copied, attention=4 * H * pairs * hd,
                other=q.size + 5 * H * pairs)


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                     lengths: np.ndarray) -> np.ndarray:
    """Attention for B sequences' one new query each, in one batched product.

    q [H, B, hd]; k, v [Hkv, B, T, hd], every sequence's keys padded to T (H = g·Hkv, as in
    `attention`); mask [B, 1, T], 0 at each sequence's own keys and -inf past them; lengths [B],
    its keys. Returns [H, B, hd].
    Counted as the work of the real keys: the padding is an artefact of the batch layout.
    """
    H, B, hd = q.shape
    Hkv = k.shape[0]
    g = H // Hkv
    q = q * (1.0 / math.sqrt(hd))                                  # [H, B, hd]
    qg = q.reshape(Hkv, g, B, hd).transpose(0, 2, 1, 3)            # [Hkv, B, g, hd]
    scores = qg @ k.transpose(0, 1, 3, 2)                          # [Hkv, B, g, T]
    scores += mask
    softmax(scores)
    out = (scores @ v).transpose(0, 2, 1, 3).reshape(H, B, hd)     # [Hkv, B, g, hd] -> [H, B, hd]
    m = meter.active()
    if m is not None:
        keys = int(lengths.sum())
        m.count("attention", activations=2 * q.nbytes + out.nbytes + 2 * H * keys * q.itemsize,
                attention=4 * H * keys * hd, other=q.size + 5 * H * keys)
    return out


def paged_decode_attention(q: np.ndarray, k_pool: np.ndarray, v_pool: np.ndarray, table: np.ndarray,
                           lengths: np.ndarray, kernel) -> np.ndarray:
    """B sequences' one new query each over their keys in a paged pool, with no gather (a kernel set's
    kernel: minillm/kernels/products.py): what `decode_attention` gives over the gathered, padded and
    masked keys. q [H, B, hd]; k_pool, v_pool [Hkv, blocks, block_size, hd]; table [B, nb] each
    sequence's blocks; lengths [B] its keys -> [H, B, hd].
    Counted: the keys and values of each sequence's own positions, read from the pool (kv_read; no
    copy, no padding), q and the output (activations); FLOPs as `attention`'s, per real key."""
    out = kernel(q, k_pool, v_pool, table, lengths)
    m = meter.active()
    if m is not None:
        H, _, hd = q.shape
        keys = int(np.asarray(lengths).sum())
        m.count("attention", kv_read=2 * k_pool.shape[0] * keys * hd * k_pool.itemsize,
                activations=q.nbytes + out.nbytes, attention=4 * H * keys * hd, other=q.size + 5 * H * keys)
    return out


def lm_head(x: np.ndarray, head) -> np.ndarray:
    """Logits over the vocabulary: x times the head, [T, d] -> [T, V]. A tied head is the token
    embedding (a plain [V, d] array is taken as that table): x @ wte^T.

    Reads all of the head, whatever the number of tokens: the single biggest read of a GPT-2 small
    step. (A float head is kept contiguous [d, V], so it streams like every other [in, out] layer.)
    """
    head = as_weight(head, table=True)
    logits = head.matmul(x)                                                    # [T, V]
    m = meter.active()
    if m is not None:
        T = x.shape[0]
        c = head.counts(T, x.itemsize)
        m.count("lm_head", weights=c["weights"], activations=x.nbytes + logits.nbytes,
                matmul=2 * T * head.n_in * head.n_out, dequant=c["dequant"], scratch=c["scratch"])
    return logits


# -- the Llama family's operations (models/llama.py) --------------------------------------------------
#
# FLOP conventions, as above, per element of output: RMS norm 4 (square, sum, normalise, scale),
# rotary embedding 3 (two products and a sum per rotated coordinate), SwiGLU 6 (sigmoid as halve,
# tanh, add, halve; the product with the gate, then with the up projection).


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float, kernel=None) -> np.ndarray:
    """Root-mean-square norm over the last axis: x / sqrt(mean(x²) + eps) · w. No centring, no shift.
    x [..., n], w [n] -> [..., n] (Llama's norms over d, Qwen3's per-head q/k norms over hd).
    (float16 rows are normalised in float32, then stored back in float16.)
    kernel: another implementation of the same values (a kernel set's), counted the same."""
    if kernel is not None:
        y = kernel(x, w, eps)
    else:
        ms = backend.row_sumsq(x, backend.accumulator(x.dtype))   # [..., 1]  sum of squares, no temporary
        ms *= 1.0 / x.shape[-1]
        ms += eps
        backend.namespace(ms).sqrt(ms, out=ms)
        y = x / ms                                              # [..., n]
        y *= w
        y = y.astype(x.dtype, copy=False)                       # (float32 and float64: y itself)
    m = meter.active()
    if m is not None:
        m.count("rms_norm", weights=w.nbytes, activations=x.nbytes + y.nbytes, other=4 * y.size)
    return y


def rope_tables(positions, head_dim: int, theta: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of these positions' angles, [N, hd/2] each: position p turns coordinate pair i by
    p · theta^(-2i/hd). Computed in float64 for the step's N positions (as llama.cpp does), then given
    in the model's dtype: no table sized by the context, so a 10^7-position context costs nothing.
    On the positions' own device (a CUDA graph's replay then reads the positions it is given)."""
    xp = backend.namespace(positions)
    inv_freq = theta ** (-xp.arange(0, head_dim, 2, dtype=xp.float64) / head_dim)   # [hd/2]
    angles = xp.asarray(positions, dtype=xp.float64)[:, None] * inv_freq[None, :]   # [N, hd/2]
    return xp.cos(angles).astype(dtype), xp.sin(angles).astype(dtype)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, kernel=None) -> np.ndarray:
    """Rotary position embedding, the rotate-half convention of transformers' Llama: coordinate i
    pairs with i + hd/2, and the pair turns by its position's angle.
    x [H, N, hd]; cos, sin [N, hd/2] (the rows of these N positions) -> [H, N, hd], a new array.
    kernel: another implementation of the same values (a kernel set's), counted the same."""
    if kernel is not None:
        y = kernel(x, cos, sin)
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]                   # [H, N, hd/2] each
        xp = backend.namespace(x)
        y = xp.empty_like(x)
        y1, y2 = y[..., :half], y[..., half:]                   # views of y's halves (out= writes through them)
        xp.multiply(x1, cos, out=y1)
        xp.subtract(y1, x2 * sin, out=y1)                       # x1·cos − x2·sin
        xp.multiply(x2, cos, out=y2)
        xp.add(y2, x1 * sin, out=y2)                            # x2·cos + x1·sin
    m = meter.active()
    if m is not None:
        m.count("rope", activations=x.nbytes + y.nbytes + cos.nbytes + sin.nbytes, other=3 * y.size)
    return y


def swiglu(gate_up: np.ndarray, kernel=None) -> np.ndarray:
    """The SwiGLU gate: silu(gate) · up, where silu(g) = g·sigmoid(g) = g·(1 + tanh(g/2))/2 (the
    tanh form never overflows, so no floating-point state to switch per call).
    gate_up [N, 2F] (the gate and up projections side by side, one product) -> [N, F].
    kernel: another implementation of the same values (a kernel set's), counted the same."""
    if kernel is not None:
        y = kernel(gate_up)
    else:
        F = gate_up.shape[-1] // 2
        gate, up = gate_up[:, :F], gate_up[:, F:]               # [N, F] each
        y = gate * 0.5
        backend.namespace(y).tanh(y, out=y)
        y += 1.0
        y *= 0.5                                                # sigmoid(gate)
        y *= gate
        y *= up
    m = meter.active()
    if m is not None:
        m.count("swiglu", activations=gate_up.nbytes + y.nbytes, other=6 * y.size)
    return y


def geglu(gate_up: np.ndarray) -> np.ndarray:
    """The GeGLU gate (Gemma): gelu_tanh(gate) · up, with `gelu` (counted there, 8 an element).
    gate_up [N, 2F] (the gate and up projections side by side, one product) -> [N, F].
    Counted here: the product with up (1 an element)."""
    F = gate_up.shape[-1] // 2
    y = gelu(gate_up[:, :F])                                    # [N, F], a new array
    y *= gate_up[:, F:]
    m = meter.active()
    if m is not None:
        m.count("geglu", activations=gate_up.nbytes // 2 + 2 * y.nbytes, other=y.size)
    return y


def clamped_swiglu(gate_up: np.ndarray, limit: float, alpha: float) -> np.ndarray:
    """gpt-oss's SwiGLU: (clip(up, -limit, limit) + 1) · g · sigmoid(alpha · g), g = min(gate, limit),
    the sigmoid in its tanh form (as `swiglu`). gate_up [N, 2F] (gate, then up) -> [N, F].
    Counted 9 an element: two clips, the scaled sigmoid's four, the products and the + 1."""
    F = gate_up.shape[-1] // 2
    xp = backend.namespace(gate_up)
    g = xp.minimum(gate_up[:, :F], limit)                       # [N, F]
    y = g * (0.5 * alpha)
    xp.tanh(y, out=y)
    y += 1.0
    y *= 0.5                                                    # sigmoid(alpha · g)
    y *= g
    y *= xp.clip(gate_up[:, F:], -limit, limit) + 1.0
    m = meter.active()
    if m is not None:
        m.count("swiglu", activations=gate_up.nbytes + y.nbytes, other=9 * y.size)
    return y
