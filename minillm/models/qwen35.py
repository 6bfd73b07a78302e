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

The linear layer is Gated DeltaNet, an attention kind of its own (models/deltanet.py: the
convolution, the gated delta rule in its recurrent and chunked forms, `DeltaNetShape`); it keeps
no keys, only a state of fixed size per sequence, which the step's plan offers it (`plan.states`).
The config.json and the checkpoint's tensors are read in models/qwen35_config.py.

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
from functools import partial

import numpy as np

from .. import backend
from ..cache.state import HybridKVCache, HybridPagedPool
from . import ops
from .base import RANDOM_SEED, CausalLM
from .qwen35_config import FULL, LINEAR, Qwen35Config, manifest
from .qwen35_config import MODEL_TYPES, AttentionView, check_state  # noqa: F401  (the row and tests read them here)
from .deltanet import CHUNK, chunked_flops, linear_attention
from .factory import make_weight
from .blocks import checkpoint_params, mlp, norm_head, output_gate
from .ops import merge_heads
from .target import Target, cpu_only
from .weights import check_blocks, label, stored

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
        self.linear = c.deltanet                 # what its linear layers read (models/deltanet.py)

    MATRICES_OF = {LINEAR: ("in_proj.weight", "out_proj.weight", "gate_up.weight", "down_proj.weight"),
                   FULL: ("qgkv.weight", "o_proj.weight", "gate_up.weight", "down_proj.weight")}

    def matrices(self, head: bool = True, chosen=None) -> list:
        mats = [p[k] for p, kind in zip(self.blocks, self.config.layer_types) for k in self.MATRICES_OF[kind]]
        return mats + [self.head_w] if head else mats

    def gathered(self) -> tuple[str, ...]:
        return () if self.config.tied else ("embed_tokens.weight",)

    head = norm_head                   # the final RMS norm and the LM head (models/blocks.py)

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
                h = linear_attention(h, p, self.linear, plan.states(self.state_index[layer]), self.chunk)
            else:
                h = gated_attention(h, p, c, cos, sin, partial(plan.attend, self.kv_index[layer]), K.rope)
            x = ops.add(x, h)
            x = ops.add(x, mlp(K.rms_norm(x, p["post_attention_layernorm.weight"], c.eps), p, K.swiglu))
        return x

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


def prefill_flops(c: Qwen35Config, T: int, chunk: int = CHUNK) -> dict[str, int]:
    """A prefill of T tokens by the config alone (lesson 19, linear-time prefill): "products", 2 FLOPs a
    weight a token (the embedding a lookup, the head on the last row only; norms' and the convolution's
    few weights included: the meter's `matmul` is within 1% of it); "attention", the full layers'
    causal q·k and p·v, 4·H·hd a query-key pair over T(T+1)/2 pairs (what a fused kernel computes;
    NumPy's prefill scores whole blocks, a little more); "linear", the linear layers' chunked delta
    rule (`deltanet.chunked_flops`, exactly what `delta_rule_chunked` reports)."""
    d, V = c.n_embd, c.vocab_size
    body = c.n_params() - V * d * (1 if c.tied else 2)
    return {"products": 2 * T * body + 2 * V * d,
            "attention": len(c.full_layers) * 4 * c.n_head * c.head_dim * (T * (T + 1) // 2),
            "linear": len(c.linear_layers) * chunked_flops(c.lin_v_heads, T, c.lin_k_dim, c.lin_v_dim, chunk)}


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
