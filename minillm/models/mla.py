"""Multi-head latent attention (MLA: DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3, 2412.19437), an
attention kind a family assembles into its blocks (models/deepseek.py; the next MLA family imports
this module, not DeepSeek's). It reads only its own shape (`MLAShape`).

Each token's keys and values come out of one small latent vector, and
that latent (with one rotary key all heads share) is all the KV cache keeps:

    q              = q_b(rms_norm(q_a(x)))             # [H, dn + dr]: low rank (q_lora_rank), or
                                                       # q_proj(x) when q_lora_rank is null
    q_nope, q_rope = q[:, :dn], q[:, dn:]              # [H, dn], [H, dr]
    c, k_rope      = kv_a(x)[:r], kv_a(x)[r:]          # [r] the latent, [dr] one rotary key for all heads
    c              = rms_norm(c)
    q_rope, k_rope = rope(q_rope), rope(k_rope)
    row            = [c | k_rope]                      # [r + dr]: what the cache holds, a token a layer
                                                       # (512 + 64 = 576 values at DeepSeek-V3's shape)

and then attention, two ways that compute the same numbers:

    decompressed   k_nope_h, v_h = W_UK_h c, W_UV_h c  # kv_b: every head's key [dn] and value [dv]
                   k_h = [k_nope_h | k_rope]           # the rotary part shared by all heads
                   o_h = softmax(q_h · k_h / √(dn + dr)) v_h
    absorbed       q_lat_h = W_UK_hᵀ q_nope_h          # [r]: the query moved into the latent, since
                                                       # q_nope · (W_UK c) = (W_UKᵀ q_nope) · c
                   o_lat_h = softmax([q_lat_h | q_rope_h] · row / √(dn + dr)) c      # [r]
                   o_h = W_UV_h o_lat_h                # [dv]: the value projection applied once, after
    out = o_proj([o_1 | ... | o_H])

Decompressed is the definition, and how a prompt runs (a prefill's T tokens multiply kv_b once each,
compute-bound anyway). Absorbed is how serving engines decode (FlashMLA, FlashInfer's MLA kernels):
H query heads attend over ONE key/value head of r + dr values (multi-query attention whose values
are the keys' first r entries), and kv_b is multiplied by the H queries instead of by every cached
token, so a decode step's attention does about 2·H·(2r + dr) FLOPs per (r + dr)·b bytes of KV read:
≈ 1.9·H per byte in bf16, against GQA's ≈ g.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from . import ops
from .options import Option


@dataclass(frozen=True)
class MLAShape:
    """What latent attention reads of a config: its heads and widths."""
    n_head: int                       # H
    kv_lora_rank: int                 # r: the latent the cache keeps
    qk_nope_head_dim: int             # dn: a head's key part with no rotation
    qk_rope_head_dim: int             # dr: the rotary key all heads share
    v_head_dim: int                   # dv
    q_lora_rank: int | None           # the query's low rank (None: q_proj directly)
    eps: float                        # the latent's and the low-rank query's RMS norms

    @property
    def qk_head_dim(self) -> int:
        """dn + dr: a head's query and key as attention scores them."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def scale(self) -> float:
        """Attention's scale, 1/√(dn + dr), either way (absorbed too: not 1/√ of the r + dr it multiplies)."""
        return self.qk_head_dim ** -0.5

    @property
    def head_dim(self) -> int:
        """The cache's row: r + dr values."""
        return self.kv_lora_rank + self.qk_rope_head_dim


MLA_DECODE = ("absorbed", "decompressed")
MLA_OPTION = Option(
    "mla_decode", MLA_DECODE,
    "latent attention (a DeepSeek-V3-family model): how a decode step attends: absorbed (the default: kv_b "
    "folded into the query and the output, attention over the cached latent, as serving engines decode) or "
    "decompressed (every head's K and V rebuilt from the latent each step, as prompts are)",
    "latent attention (a DeepSeek-V3-family model has)")


def query(xq: np.ndarray, p: dict, c: MLAShape, K) -> np.ndarray:
    """The queries, every head. xq [N, r_q] (q_a's output, low rank) or [N, H·(dn+dr)] (q_proj's, the
    direct path) -> [H, N, dn + dr]."""
    if c.q_lora_rank is not None:
        xq = ops.linear(K.rms_norm(xq, p["q_a_layernorm.weight"], c.eps), p["q_b_proj.weight"])   # [N, H·(dn+dr)]
    N = xq.shape[0]
    return xq.reshape(N, c.n_head, c.qk_head_dim).transpose(1, 0, 2)                 # [H, N, dn + dr]


def project(x: np.ndarray, p: dict, c: MLAShape, K) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Everything attention takes from x: x [N, d] -> q [H, N, dn + dr], the latent c [N, r] (normed),
    the rotary key [1, N, dr] (not turned yet). Low rank: q_a and kv_a side by side, one product
    [d, r_q + r + dr] (both read x; vLLM fuses them too). Direct: q_proj [d, H·(dn + dr)], then kv_a."""
    if c.q_lora_rank is not None:
        a = ops.linear(x, p["qa_kva.weight"], p.get("qa_kva.bias"))        # [N, r_q + r + dr]
        q, kv = query(a[:, :c.q_lora_rank], p, c, K), a[:, c.q_lora_rank:]
    else:
        q = query(ops.linear(x, p["q_proj.weight"]), p, c, K)                # [H, N, dn + dr]
        kv = ops.linear(x, p["kv_a.weight"], p.get("kv_a.bias"))             # [N, r + dr]
    r = c.kv_lora_rank
    latent = K.rms_norm(kv[:, :r], p["kv_a_layernorm.weight"], c.eps)       # [N, r]
    return q, latent, kv[None, :, r:]                                       # ..., [1, N, dr]


def decompress(rows: np.ndarray, values: np.ndarray, p: dict, c: MLAShape) -> tuple[np.ndarray, np.ndarray]:
    """Every head's key and value rebuilt from cached rows: kv_b on each row's latent, and the shared
    rotary key beside every head's. rows [1, T, r + dr] (values: their first r columns, unused: the
    latent is read from the rows) -> k [H, T, dn + dr], v [H, T, dv]. The attention it feeds reads
    these T·H·(dn + dr + dv) values instead of the T·(r + dr) cached: what absorbing saves."""
    T, r, dn = rows.shape[1], c.kv_lora_rank, c.qk_nope_head_dim
    kv = ops.linear(rows[0, :, :r], p["kv_b.weight"])                       # [T, H·(dn + dv)]
    kv = kv.reshape(T, c.n_head, dn + c.v_head_dim).transpose(1, 0, 2)      # [H, T, dn + dv]
    k = np.empty((c.n_head, T, c.qk_head_dim), dtype=kv.dtype)              # [H, T, dn + dr]
    k[:, :, :dn] = kv[:, :, :dn]
    k[:, :, dn:] = rows[:, :, r:]                                           # one rotary key for every head
    return k, kv[:, :, dn:]


def absorbed(attend, q: np.ndarray, row: np.ndarray, p: dict, c: MLAShape, K=None) -> np.ndarray:
    """Attention inside the latent: each head's query moved into it (W_UKᵀ q_nope, since q_nope ·
    (W_UK c) = (W_UKᵀ q_nope) · c), H query heads over ONE key/value head of r + dr values whose first
    r are the values too, and each head's latent output taken to its value space after (W_UV o_lat).
    q [H, N, dn + dr] (rotated), row [1, N, r + dr] the new rows -> [H, N, dv].
    attend(q, k, v, spec) stores the new rows and attends over all of them (the step's plan); K: the
    kernel set (its per-head products; None: NumPy's)."""
    dn, r = c.qk_nope_head_dim, c.kv_lora_rank
    head_product = ops.head_product if K is None else K.head_product
    q_lat = head_product(q[:, :, :dn], p["w_uk"], "mla_absorb_q")                   # [H, N, r]
    q_row = np.concatenate([q_lat, q[:, :, dn:]], axis=-1)                           # [H, N, r + dr]
    o_lat = attend(q_row, row, row[:, :, :r], ops.AttentionSpec(scale=c.scale, value_width=r))   # [H, N, r]
    return head_product(o_lat, p["w_uv_t"], "mla_absorb_o")                         # [H, N, dv]


def decompressed(attend, q: np.ndarray, row: np.ndarray, p: dict, c: MLAShape, K=None) -> np.ndarray:
    """The definition: every head's K and V rebuilt from all the cached rows (`decompress`), then
    attention. q [H, N, dn + dr] (rotated), row [1, N, r + dr] the new rows -> [H, N, dv]."""
    spec = ops.AttentionSpec(scale=c.scale, value_width=c.v_head_dim, expand=partial(decompress, p=p, c=c))
    return attend(q, row, row[:, :, :c.kv_lora_rank], spec)


WAYS = {"absorbed": absorbed, "decompressed": decompressed}


def whole_sequence(q: np.ndarray, k: np.ndarray, v: np.ndarray, spec: ops.AttentionSpec = ops.PLAIN) -> np.ndarray:
    """An `attend` with no cache: the rows given are all there is (k and v: every position so far)."""
    if spec.expand is not None:
        k, v = spec.expand(k, v)
    return ops.attention(q, k, v, spec=spec)


def mla(x: np.ndarray, p: dict, c: MLAShape, cos: np.ndarray, sin: np.ndarray, attend, way, K) -> np.ndarray:
    """Multi-head latent attention. x [N, d], cos/sin [N, dr/2] -> [N, d]. way: `absorbed` or
    `decompressed`, attending with attend(q, k, v, spec) (the step's plan)."""
    q, latent, k_rope = project(x, p, c, K)                                 # [H, N, dn+dr], [N, r], [1, N, dr]
    dn = c.qk_nope_head_dim
    turned = K.rope(np.concatenate([q[:, :, dn:], k_rope]), cos, sin)      # [H + 1, N, dr]: q's and k's rotary parts
    q = np.concatenate([q[:, :, :dn], turned[:-1]], axis=-1)                # [H, N, dn + dr]
    row = np.concatenate([latent[None], turned[-1:]], axis=-1)              # [1, N, r + dr]: what the cache keeps
    o = way(attend, q, row, p, c, K)                                        # [H, N, dv]
    return ops.linear(ops.merge_heads(o), p["o_proj.weight"], p.get("o_proj.bias"))   # [N, d]
