"""Qwen3.5 (`qwen3_5_text`): a hybrid of Gated DeltaNet linear attention and full attention.

    x = embed[ids]
    for each block, as `layer_types` lists them (Qwen3.5: three linear, then one full, repeated):
        x = x + linear_attention(rms_norm(x))     or     x = x + gated_attention(rms_norm(x))
        x = x + mlp(rms_norm(x))                  # SwiGLU, as the Llama family's
    logits = rms_norm(x) @ head

The full-attention layer is Qwen3's (per-head q/k RMS norms, grouped queries) with two changes:
the rotation turns only the first `rotary_dim` coordinates of each head (`partial_rotary_factor`
0.25), and the output passes a sigmoid gate computed from x (q_proj is twice the heads' width:
each head's query, then its gate). Its keys and values go to a KV cache that grows with the
context, as everywhere else.

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

What a sequence keeps: K-1 convolution inputs [K-1, C] and Hv matrices [Hv, dk, dv] per linear
layer (its "state", cache/state.py), plus the growing KV of the full layers. Qwen3.5's norms are
zero-centred (x / rms · (1 + w)); the model keeps 1 + w, so ops.rms_norm computes them. The gated
norm of the linear layer is a plain one (w, near 1).

Parameters arrive in the checkpoint's names and layout (Hugging Face [out, in] matrices). A linear
layer's four input products (qkv, z, b, a) are fused into one [d, C + Dv + 2·Hv] product, and a full
layer's q, gate, k and v into one [d, 2·H·hd + 2·Hkv·hd]: each weight read once per step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Iterator

import numpy as np

from .. import backend, meter
from ..cache.state import HybridKVCache, HybridPagedPool
from ..config import Layout, MAX_CONTEXT, hf_model_type, whole
from ..errors import ConfigError
from . import ops
from .base import RANDOM_SEED, CausalLM
from .factory import make_weight
from .llama import Llama, checkpoint_params, mlp
from .ops import merge_heads
from .target import Target, cpu_only
from .weights import check_blocks, label, stored

LINEAR, FULL = "linear_attention", "full_attention"
MODEL_TYPES = ("qwen3_5_text",)
CHUNK = 64                  # tokens per chunk of the chunked form (the reference's default)
PIECE = 16                  # chunks solved at once: bounds the [Hv, chunks, C, C] arrays of a long prompt
L2_EPS = 1e-6               # the L2 norm's epsilon (the reference's, whatever rms_norm_eps is)


# -- the config -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Qwen35Config(Layout):
    n_layer: int              # L: blocks, linear and full
    n_head: int               # H: query heads of the full layers
    n_kv_head: int            # Hkv: their key/value heads
    head_dim: int             # hd
    n_embd: int               # d
    n_ctx: int                # longest sequence (`max_position_embeddings`)
    vocab_size: int           # V
    ffn: int                  # F: the MLP's inner width
    layer_types: tuple        # per block: "linear_attention" or "full_attention"
    lin_k_heads: int          # Hk: key (and query) heads of the linear layers
    lin_v_heads: int          # Hv: value heads (a multiple of Hk: each key head serves Hv/Hk of them)
    lin_k_dim: int            # dk
    lin_v_dim: int            # dv
    conv_kernel: int = 4      # K: the causal convolution's width
    rotary_dim: int = 0       # coordinates of each full-attention head the rotation turns (0: hd/4)
    eps: float = 1e-6         # RMS-norm epsilon
    theta: float = 1e7        # RoPE base
    tied: bool = False        # the LM head is the token embedding
    arch: str = field(default="qwen3_5_text", repr=False)

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "n_ctx", "vocab_size", "ffn",
                     "lin_k_heads", "lin_v_heads", "lin_k_dim", "lin_v_dim", "conv_kernel"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name == "n_ctx" else 1 << 62)
        types = tuple(self.layer_types)
        object.__setattr__(self, "layer_types", types)
        if len(types) != self.n_layer or any(t not in (LINEAR, FULL) for t in types):
            raise ConfigError(f"config layer_types: {self.n_layer} entries, each {LINEAR!r} or {FULL!r}; got "
                              f"{list(types)[:8]}")
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", self.head_dim // 4)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ConfigError(f"config: the rotation turns {self.rotary_dim} of each head's {self.head_dim} "
                              "coordinates; it turns pairs, so an even number from 2 to head_dim")
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"config: {self.n_head} query heads do not split into groups over "
                              f"{self.n_kv_head} key/value heads; num_key_value_heads must divide num_attention_heads")
        if self.lin_v_heads % self.lin_k_heads:
            raise ConfigError(f"config: {self.lin_v_heads} linear value heads do not split over {self.lin_k_heads} "
                              "key heads; linear_num_key_heads must divide linear_num_value_heads")
        for name in ("eps", "theta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"config {name}={value!r}: must be a positive finite number")

    # -- the layers and their widths --

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def key_dim(self) -> int:
        return self.lin_k_heads * self.lin_k_dim           # Hk·dk: the width of q, and of k

    @property
    def value_dim(self) -> int:
        return self.lin_v_heads * self.lin_v_dim           # Dv = Hv·dv: the width of v, z and o

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim           # C: the convolution's channels, q|k|v

    # -- what a sequence keeps --

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One linear layer's state: the convolution's window and the delta rule's matrices."""
        return {"conv": (self.conv_kernel - 1, self.conv_dim),
                "ssm": (self.lin_v_heads, self.lin_k_dim, self.lin_v_dim)}

    def state_bytes(self, itemsize: int = 4) -> int:
        """A sequence's fixed state, every linear layer: L_lin·((K-1)·C + Hv·dk·dv)·b, whatever its length."""
        per_layer = sum(math.prod(s) for s in self.state_shapes().values())
        return len(self.linear_layers) * per_layer * itemsize

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """2·L_full·Hkv·hd·b: what every position costs, in the full-attention layers only."""
        return 2 * len(self.full_layers) * self.n_kv_head * self.head_dim * itemsize

    def attention(self) -> "AttentionView":
        """The config a KV cache of the full layers is sized by: their count as n_layer."""
        return AttentionView(len(self.full_layers), self.n_head, self.n_kv_head, self.head_dim, self.n_embd,
                             self.n_ctx, self.vocab_size, self.eps)

    def n_params(self) -> int:
        """Parameters (the tied head counted once)."""
        d, V, F, H, Hkv, hd = self.n_embd, self.vocab_size, self.ffn, self.n_head, self.n_kv_head, self.head_dim
        Hv, Dv, C, K = self.lin_v_heads, self.value_dim, self.conv_dim, self.conv_kernel
        mlp_norms = 3 * d * F + 2 * d
        full = d * 2 * H * hd + 2 * d * Hkv * hd + H * hd * d + 2 * hd
        linear = d * (C + Dv + 2 * Hv) + C * K + 2 * Hv + self.lin_v_dim + Dv * d
        return (V * d * (1 if self.tied else 2) + d + self.n_layer * mlp_norms
                + len(self.full_layers) * full + len(self.linear_layers) * linear)

    def asdict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "Qwen35Config":
        """Read a Hugging Face config.json of model_type qwen3_5_text: `layer_types` (or
        `full_attention_interval`, every n-th layer full), the `linear_*` widths, and
        `partial_rotary_factor` in `rope_parameters` or at the top level."""
        hf_model_type(cfg, source, MODEL_TYPES, f"is not {' or '.join(MODEL_TYPES)}")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        missing = [k for k in need if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a qwen3_5_text config.json?")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: hidden_act={cfg.get('hidden_act')!r}; minillm implements SwiGLU with silu")
        if cfg.get("attention_bias"):
            raise ConfigError(f"{source}: attention_bias is on; minillm implements Qwen3.5's attention without biases")
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        kind = rope.get("rope_type", "default")
        if kind not in ("default", None):
            raise ConfigError(f"{source}: rope_type {kind!r} is not implemented; minillm runs the default rotary "
                              "embedding only")
        for f in need:
            whole(cfg[f], f, source)
        L, H = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        types = cfg.get("layer_types")
        if types is None:
            n = whole(cfg.get("full_attention_interval", 4), "full_attention_interval", source)
            types = [LINEAR if (i + 1) % n else FULL for i in range(L)]
        if not isinstance(types, list):
            raise ConfigError(f"{source}: layer_types must be a list, one entry per layer")
        try:
            head_dim = whole(cfg.get("head_dim", 256), "head_dim", source)
            factor = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
            if not 0 < factor <= 1:
                raise ConfigError(f"partial_rotary_factor={factor}: must be in (0, 1]")
            return cls(n_layer=L, n_head=H, n_kv_head=cfg.get("num_key_value_heads") or H, head_dim=head_dim,
                       n_embd=cfg["hidden_size"], n_ctx=cfg.get("max_position_embeddings", 32768),
                       vocab_size=cfg["vocab_size"], ffn=cfg["intermediate_size"], layer_types=tuple(types),
                       lin_k_heads=cfg.get("linear_num_key_heads", 16), lin_v_heads=cfg.get("linear_num_value_heads", 32),
                       lin_k_dim=cfg.get("linear_key_head_dim", 128), lin_v_dim=cfg.get("linear_value_head_dim", 128),
                       conv_kernel=cfg.get("linear_conv_kernel_dim", 4), rotary_dim=int(head_dim * factor),
                       eps=float(cfg.get("rms_norm_eps", 1e-6)),
                       theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1e7))),
                       tied=bool(cfg.get("tie_word_embeddings", False)))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


@dataclass(frozen=True)
class AttentionView(Layout):
    """What a KV cache reads of a config (config.ModelConfig), for a hybrid's full layers only."""
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ctx: int
    vocab_size: int
    eps: float


# -- the checkpoint's tensors -----------------------------------------------------------------------

def manifest(c: Qwen35Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint of this config (without the `model.` prefix), with
    its shape, one at a time."""
    d, F, H, Hkv, hd = c.n_embd, c.ffn, c.n_head, c.n_kv_head, c.head_dim
    Hv, Dv, C, K = c.lin_v_heads, c.value_dim, c.conv_dim, c.conv_kernel
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i, kind in enumerate(c.layer_types):
        h = f"layers.{i}."
        yield h + "input_layernorm.weight", (d,)
        if kind == LINEAR:
            a = h + "linear_attn."
            yield a + "in_proj_qkv.weight", (C, d)
            yield a + "in_proj_z.weight", (Dv, d)
            yield a + "in_proj_b.weight", (Hv, d)
            yield a + "in_proj_a.weight", (Hv, d)
            yield a + "conv1d.weight", (C, 1, K)
            yield a + "A_log", (Hv,)
            yield a + "dt_bias", (Hv,)
            yield a + "norm.weight", (c.lin_v_dim,)
            yield a + "out_proj.weight", (d, Dv)
        else:
            a = h + "self_attn."
            yield a + "q_proj.weight", (2 * H * hd, d)
            yield a + "k_proj.weight", (Hkv * hd, d)
            yield a + "v_proj.weight", (Hkv * hd, d)
            yield a + "q_norm.weight", (hd,)
            yield a + "k_norm.weight", (hd,)
            yield a + "o_proj.weight", (d, H * hd)
        yield h + "post_attention_layernorm.weight", (d,)
        yield h + "mlp.gate_proj.weight", (F, d)
        yield h + "mlp.up_proj.weight", (F, d)
        yield h + "mlp.down_proj.weight", (d, F)
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


GGUF_NAMES = None           # no GGUF reader for this family yet


def random_params(c: Qwen35Config, seed: int = 0, std: float = 0.02, dtype=np.float32) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights, seeded: normal(0, std) matrices, zero-centred norm weights
    near 0 (gains near 1), the gated norm's near 1, A_log = log of uniform(1, 16) (decays from
    exp(-softplus(.)) down), dt_bias near 0 and convolution taps of scale 1/sqrt(K)."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in manifest(c):
        if name.endswith("linear_attn.norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif "norm" in name:
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith("conv1d.weight"):
            a = rng.standard_normal(shape) / math.sqrt(c.conv_kernel)
        else:
            a = std * rng.standard_normal(shape)
        p[name] = a.astype(dtype)
    return p


# -- the full-attention layer, as small functions ----------------------------------------------------

def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) as (1 + tanh(x/2)) / 2: never overflows. A new array, x's shape."""
    y = x * 0.5
    backend.namespace(y).tanh(y, out=y)
    y += 1.0
    y *= 0.5
    return y


def partial_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, rope=ops.rope) -> np.ndarray:
    """The rotation on the first rd coordinates of each head only (rd = 2·cos.shape[-1]); the rest
    pass through. x [H, N, hd], cos/sin [N, rd/2] -> [H, N, hd], a new array. rope: ops.rope, or a
    kernel set's (K.rope)."""
    rd = 2 * cos.shape[-1]
    xp = backend.namespace(x)
    y = xp.empty_like(x)
    y[..., :rd] = rope(xp.ascontiguousarray(x[..., :rd]), cos, sin)   # rotate-half within the rd coordinates
    y[..., rd:] = x[..., rd:]
    return y


def output_gate(a: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """a · sigmoid(gate), in place. a, gate [N, H·hd]. Counted: 5 FLOPs an element (the sigmoid's
    4, the product)."""
    a *= sigmoid(gate)
    m = meter.active()
    if m is not None:
        m.count("output_gate", activations=2 * a.nbytes + gate.nbytes, other=5 * a.size)
    return a


def gated_attention(x: np.ndarray, p: dict, c: Qwen35Config, cos, sin, attend, rope=ops.rope) -> np.ndarray:
    """Qwen3.5's full attention. x [N, d] -> [N, d]. `attend(q, k, v)` stores the new keys and values
    and lets each sequence's queries attend over its own positions (the step's plan); rope: the
    kernel set's rotation."""
    N, H, Hkv, hd = x.shape[0], c.n_head, c.n_kv_head, c.head_dim
    y = ops.linear(x, p["qgkv.weight"])                                     # [N, 2·H·hd + 2·Hkv·hd]
    q = y[:, :H * hd].reshape(N, H, hd).transpose(1, 0, 2)                  # [H, N, hd]
    gate = y[:, H * hd:2 * H * hd]                                          # [N, H·hd]
    kv = y[:, 2 * H * hd:].reshape(N, 2 * Hkv, hd).transpose(1, 0, 2)       # [2·Hkv, N, hd]
    q = partial_rope(ops.rms_norm(q, p["q_norm.weight"], c.eps), cos, sin, rope)   # per-head norm, then the turn
    k = partial_rope(ops.rms_norm(kv[:Hkv], p["k_norm.weight"], c.eps), cos, sin, rope)
    a = merge_heads(attend(q, k, kv[Hkv:]))                                 # [N, H·hd]
    return ops.linear(output_gate(a, gate), p["o_proj.weight"])             # [N, d]


# -- the linear-attention layer (Gated DeltaNet), as small functions ----------------------------------

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
    flops = H * nc * (2 * C * C * dk * 2 + C ** 3 // 3 * 2 + 2 * C * C * dv + 2 * C * C * dk    # A, qk^T, T, U, W
                      + 2 * C * dk * dv * 3 + 2 * C * C * dv)                                     # the scan
    return o.reshape(H, nc * C, dv)[:, :n], S, flops


def delta_rule(q, k, v, g, beta, S, chunk: int = CHUNK):
    """One token: the recurrent form; more: the chunked form (a prompt, a prompt's chunk)."""
    if q.shape[1] == 1:
        return delta_rule_recurrent(q, k, v, g, beta, S)
    return delta_rule_chunked(q, k, v, g, beta, S, chunk)


def linear_heads(mixed: np.ndarray, c: Qwen35Config) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def linear_attention(x: np.ndarray, p: dict, c: Qwen35Config, sequences, chunk: int = CHUNK) -> np.ndarray:
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


# -- the model ----------------------------------------------------------------------------------------

class Qwen35(CausalLM):
    """A Qwen3.5 model: a config and checkpoint tensors (Hugging Face names without `model.`)."""

    CONFIG = Qwen35Config
    POOL = HybridPagedPool          # its paged pool: KV blocks for the full layers, states paid in blocks
    manifest = staticmethod(manifest)
    chunk = CHUNK                   # tokens per chunk of the linear layers' chunked form

    def __init__(self, config: Qwen35Config, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = ()) -> None:
        """target: what runs where (models/target.py; None: the NumPy reference in float32 on the CPU).
        The products are made for its weights' format and kernel set; the linear layers' convolution
        and delta rule are NumPy's (this module's). The CPU only for now."""
        c = self.config = config
        target = target or Target.numpy()
        self.name = name or f"qwen3.5-{c.n_layer}x{c.n_embd}"
        if not target.on_cpu:
            raise cpu_only(f"{self.name}: Qwen3.5's linear attention (its delta rule is NumPy's)", target.device,
                           "use --device cpu")
        self.use_target(target)
        dtype = self.dtype = target.dtype
        self.eos_ids = tuple(eos_ids)
        self.tokenizer = None
        check_blocks({"width": c.n_embd, "attention width H·hd": c.n_head * c.head_dim, "value width": c.value_dim,
                      "FFN": c.ffn}, target.weights, self.name)
        mat = lambda parts: make_weight(parts, target, rows=True)
        vec = lambda a: np.asarray(a, dtype=dtype)
        gain = lambda a: (1.0 + np.asarray(a, dtype=np.float64)).astype(dtype)      # zero-centred norms: 1 + w
        embed = tensors["embed_tokens.weight"]
        self.head_w = mat(embed if c.tied else tensors["lm_head.weight"])
        self.embed_w = self.head_w if c.tied else make_weight(embed, target, rows=True, contiguous=False)
        self.wte = stored(self.embed_w, rows=True)
        self.blocks = []
        for i, kind in enumerate(c.layer_types):
            h = f"layers.{i}."
            p = {"input_layernorm.weight": gain(tensors[h + "input_layernorm.weight"])}
            if kind == LINEAR:
                a = h + "linear_attn."
                p["in_proj.weight"] = mat([tensors[a + n + ".weight"] for n in ("in_proj_qkv", "in_proj_z",
                                                                                 "in_proj_b", "in_proj_a")])
                p["conv.weight"] = np.ascontiguousarray(np.asarray(tensors[a + "conv1d.weight"])[:, 0].T, dtype=dtype)
                p["A_log"], p["dt_bias"] = vec(tensors[a + "A_log"]), vec(tensors[a + "dt_bias"])
                p["norm.weight"] = vec(tensors[a + "norm.weight"])
                p["out_proj.weight"] = mat(tensors[a + "out_proj.weight"])
            else:
                a = h + "self_attn."
                qg = np.asarray(tensors[a + "q_proj.weight"]).reshape(c.n_head, 2, c.head_dim, c.n_embd)
                p["qgkv.weight"] = mat([qg[:, 0].reshape(-1, c.n_embd), qg[:, 1].reshape(-1, c.n_embd),
                                        tensors[a + "k_proj.weight"], tensors[a + "v_proj.weight"]])
                p["q_norm.weight"] = gain(tensors[a + "q_norm.weight"])
                p["k_norm.weight"] = gain(tensors[a + "k_norm.weight"])
                p["o_proj.weight"] = mat(tensors[a + "o_proj.weight"])
            p["post_attention_layernorm.weight"] = gain(tensors[h + "post_attention_layernorm.weight"])
            p["gate_up.weight"] = mat([tensors[h + "mlp.gate_proj.weight"], tensors[h + "mlp.up_proj.weight"]])
            p["down_proj.weight"] = mat(tensors[h + "mlp.down_proj.weight"])
            self.blocks.append(p)
        self.norm = gain(tensors["norm.weight"])
        self.params = checkpoint_params(self)
        self.weights, self.float_matrices = label(self.matrices(head=False), dtype)
        self.kv_index = {layer: j for j, layer in enumerate(c.full_layers)}      # block -> its KV layer
        self.state_index = {layer: j for j, layer in enumerate(c.linear_layers)}  # block -> its state slot's layer

    MATRICES_OF = {LINEAR: ("in_proj.weight", "out_proj.weight", "gate_up.weight", "down_proj.weight"),
                   FULL: ("qgkv.weight", "o_proj.weight", "gate_up.weight", "down_proj.weight")}

    def matrices(self, head: bool = True, chosen=None) -> list:
        mats = [p[k] for p, kind in zip(self.blocks, self.config.layer_types) for k in self.MATRICES_OF[kind]]
        return mats + [self.head_w] if head else mats

    def gathered(self) -> tuple[str, ...]:
        return () if self.config.tied else ("embed_tokens.weight",)

    def new_cache(self) -> HybridKVCache:
        c = self.config
        return HybridKVCache(c, self.dtype, xp=self.xp)

    def run(self, plan) -> np.ndarray:
        """Embeddings, then every block (not the final norm). plan.ids, plan.positions [N] -> x [N, d]."""
        c, K = self.config, plan.kernels
        x = ops.embedding(self.embed_w, None, plan.ids)                              # [N, d]
        cos, sin = ops.rope_tables(plan.positions, c.rotary_dim, c.theta, self.dtype)  # [N, rd/2]
        for layer, (p, kind) in enumerate(zip(self.blocks, c.layer_types)):
            h = K.rms_norm(x, p["input_layernorm.weight"], c.eps)
            if kind == LINEAR:
                h = linear_attention(h, p, c, plan.states(self.state_index[layer]), self.chunk)
            else:
                h = gated_attention(h, p, c, cos, sin, partial(plan.attend, self.kv_index[layer]), K.rope)
            x = ops.add(x, h)
            x = ops.add(x, mlp(K.rms_norm(x, p["post_attention_layernorm.weight"], c.eps), p, K.swiglu))
        return x

    head = Llama.head                  # the final RMS norm and the LM head, as the Llama family's

    def __repr__(self) -> str:
        c = self.config
        return (f"Qwen35({self.name!r}: {len(c.linear_layers)} linear + {len(c.full_layers)} full layers of "
                f"{c.n_layer}, width {c.n_embd}, {c.n_head} heads / {c.n_kv_head} KV heads of {c.head_dim}, linear "
                f"{c.lin_k_heads} key / {c.lin_v_heads} value heads of {c.lin_k_dim} / {c.lin_v_dim}, conv "
                f"{c.conv_kernel}, FFN {c.ffn}, context {c.n_ctx}, vocab {c.vocab_size}, "
                f"{self.n_params():,} params, {self.weights})")


# -- closed forms: what a decode step moves --------------------------------------------------------------

def decode_step_bytes(c: Qwen35Config, context: int, itemsize: int = 4) -> dict[str, int]:
    """A batch-1 decode step at position `context` (that many positions cached before it), by the
    config alone: every weight once (an untied embedding: its one row; a tied one: the head, plus
    the row), the full layers' KV of context + 1 positions read and of one written, and each linear
    layer's state read once and written once, whatever the context. The meter's count equals it
    (tests/test_qwen35.py)."""
    b, d = itemsize, c.n_embd
    weights = (c.n_params() + (d if c.tied else -(c.vocab_size - 1) * d)) * b
    kv, state = c.kv_bytes_per_token(b), c.state_bytes(b)
    return {"weights": weights, "kv_read": (context + 1) * kv + state, "kv_write": kv + state,
            "kv": (context + 2) * kv, "state": 2 * state}


def crossover_context(a: Qwen35Config, b: Qwen35Config, itemsize: int = 4) -> int | None:
    """The smallest context at which a decode step of `a` moves fewer bytes (weights, KV, state) than
    one of `b`; None if it never does (its KV grows as fast or faster, and it starts heavier)."""
    fa, fb = decode_step_bytes(a, 0, itemsize), decode_step_bytes(b, 0, itemsize)
    start = lambda f: f["weights"] + f["kv_read"] + f["kv_write"]
    gap = start(fa) - start(fb)                          # bytes a moves beyond b at context 0
    slope = b.kv_bytes_per_token(itemsize) - a.kv_bytes_per_token(itemsize)   # per position, b gains
    if gap < 0:
        return 0
    return None if slope <= 0 else gap // slope + 1


# -- random presets: a hybrid, and the all-attention model of the same width and depth -----------------
#
# Eight blocks of width 512, Qwen3.5's pattern (three linear layers, then a full one); the other preset
# has a full layer in every block. Both are ~110 MB of float32 weights, beyond this machine's 32 MiB
# last-level cache, so a decode step streams them: what grows with the context is what differs.

_WIDTH = dict(n_layer=8, n_head=8, n_kv_head=2, head_dim=64, n_embd=512, n_ctx=32768, vocab_size=8192, ffn=1536,
              lin_k_heads=4, lin_v_heads=8, lin_k_dim=64, lin_v_dim=64, conv_kernel=4, rotary_dim=16, theta=1e7)
SHAPES: dict[str, Qwen35Config] = {
    "random-hybrid": Qwen35Config(**_WIDTH, layer_types=(LINEAR, LINEAR, LINEAR, FULL) * 2),
    "random-hybrid-full": Qwen35Config(**_WIDTH, layer_types=(FULL,) * 8),
}


def random(config: Qwen35Config, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> Qwen35:
    """A model of this config with seeded random weights (`random_params`, std 0.02), made for the target."""
    return Qwen35(config, random_params(config, seed, 0.02, np.float32), target, name=name)


CONFIG, MODEL = Qwen35Config, Qwen35       # the family's row reads these (checkpoints/families.py)
