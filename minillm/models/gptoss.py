"""gpt-oss (20B and 120B, `gpt_oss`): a mixture of experts whose attention alternates a window of 128
with every position, and keeps one learned sink per head.

    x = embed[ids]
    for each block (kind = layer_types[i]: sliding or full, alternating):
        x = x + attn(rms_norm(x), kind)                  # biases on q, k, v and o; YaRN rotary positions
        x = x + moe(rms_norm(x))                         # every layer a mixture: E experts, k a token
    logits = rms_norm(x) @ head                          # its own head

    attn: softmax over [scores of the positions a query sees, sink_h]: the sink, one logit per head,
          takes a share of the denominator and gives no value, so a head may attend "nowhere"
          (what keeps a window's softmax from piling onto the first positions it still sees)
    moe:  router logits x @ W + b, the top k of them, a softmax over those k (the same numbers as
          a softmax over all E renormalised over the k: models/moe.py's rule); each expert
          down(swiglu_clamped(x @ gate_up + b)) + b, gate and up stored interleaved (gate_up[..., ::2]
          and [..., 1::2]) and laid out side by side here at load
    swiglu_clamped(g, u) = (clip(u, -7, 7) + 1) · g' · sigmoid(1.702 · g'),  g' = min(g, 7)
    YaRN: the rotation's low frequencies interpolated by `factor`, the high ones kept, a ramp between
          (beta_fast .. beta_slow rotations over the original context), cos and sin scaled by
          0.1·ln(factor) + 1

Released gpt-oss stores its experts in MXFP4: blocks of 32 FP4 (E2M1) values, two to a byte, and
one E8M0 scale byte (a power of two, 2^(s - 127)): 4.25 bits a weight. `mxfp4_dequantize` widens
them at load to the model's floats (not kept packed: a decode step reads the widened experts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np

from ..config import Layout, MAX_CONTEXT, MAX_COUNT, check_heads, check_positive, hf_model_type, whole
from ..errors import ConfigError, WeightsError
from . import ops
from .base import RANDOM_SEED
from .factory import make_weight, on_device
from .decoder import Block, attention_tensors, stack_block, transformer_block
from .mixture import SparseDecoder, experts_mlp
from .target import Target

MODEL_TYPES = ("gpt_oss",)
SLIDING, FULL = "sliding_attention", "full_attention"


# -- the config ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GptOssConfig(Layout):
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    n_embd: int
    n_ctx: int
    vocab_size: int
    expert_ffn: int          # F_e: each expert's inner width (`intermediate_size`)
    n_expert: int            # E (`num_local_experts`)
    top_k: int               # k (`num_experts_per_tok`)
    layer_types: tuple       # per block: SLIDING or FULL
    window: int = 128
    eps: float = 1e-5
    theta: float = 150000.0
    rope_factor: float = 32.0          # YaRN: how much longer than the original context
    rope_original: int = 4096          # the context the rotation was trained at
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    rope_truncate: bool = False        # round the ramp's ends to whole dimensions
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    tied: bool = False

    # what models/decoder.py's stacking and models/mixture.py's layer ask of a config
    qkv_bias = o_bias = True
    mlp_bias = qk_norm = False
    norm_topk = True
    arch = model_type = "gpt_oss"
    dense_layers = ()

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "n_ctx", "vocab_size", "expert_ffn",
                     "n_expert", "top_k", "window", "rope_original"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name in ("n_ctx", "window") else MAX_COUNT)
        check_heads(self)
        if self.top_k > self.n_expert:
            raise ConfigError(f"config: num_experts_per_tok={self.top_k} is more than the {self.n_expert} experts")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.n_layer or not set(self.layer_types) <= {SLIDING, FULL}:
            raise ConfigError(f"config layer_types: {self.n_layer} entries, each {SLIDING!r} or {FULL!r}")
        check_positive(self, ("eps", "theta", "rope_factor", "beta_fast", "beta_slow", "swiglu_limit", "swiglu_alpha"))

    @property
    def ffn(self) -> int:
        return self.expert_ffn

    @property
    def window_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    def is_sparse(self, layer: int) -> bool:
        return True                                     # every block is a mixture

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(range(self.n_layer))

    def expert_params(self) -> int:
        """One expert's parameters: gate|up [d, 2F_e] and down [F_e, d], with their biases."""
        d, F = self.n_embd, self.expert_ffn
        return 3 * d * F + 2 * F + d

    def n_params(self) -> int:
        return sum(math.prod(s) for _, s in iter_expected(self))

    def active_params(self) -> int:
        return self.n_params() - self.n_layer * (self.n_expert - self.top_k) * self.expert_params()

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "GptOssConfig":
        hf_model_type(cfg, source, MODEL_TYPES, "is not gpt-oss's (gpt_oss)")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
                "num_local_experts", "num_experts_per_tok")
        missing = [k for k in need if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a gpt_oss config.json?")
        for field in need:
            whole(cfg[field], field, source)
        L = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or [SLIDING if i % 2 == 0 else FULL for i in range(L)]
        if not isinstance(types, list) or len(types) != L or not set(types) <= {SLIDING, FULL}:
            raise ConfigError(f"{source}: layer_types must list {L} entries, each {SLIDING!r} or {FULL!r}")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{source}: rope_parameters is not an object")
        kind = rope.get("rope_type", rope.get("type"))
        if kind != "yarn":
            raise ConfigError(f"{source}: rope_type {kind!r}; minillm's gpt-oss runs YaRN (rope_type 'yarn')")
        if rope.get("attention_factor") is not None or rope.get("mscale") or rope.get("mscale_all_dim"):
            raise ConfigError(f"{source}: YaRN's attention_factor / mscale are not implemented; minillm scales "
                              "by 0.1·ln(factor) + 1")
        n_ctx = cfg.get("max_position_embeddings", 131072)
        whole(n_ctx, "max_position_embeddings", source, MAX_CONTEXT)
        original = rope.get("original_max_position_embeddings", n_ctx)
        whole(original, "original_max_position_embeddings", source, MAX_CONTEXT)
        for field in ("head_dim", "num_key_value_heads", "sliding_window"):
            if cfg.get(field) is not None:
                whole(cfg[field], field, source, MAX_CONTEXT if field == "sliding_window" else MAX_COUNT)
        H = cfg["num_attention_heads"]
        try:
            return cls(n_layer=L, n_head=H, n_kv_head=cfg.get("num_key_value_heads") or H,
                       head_dim=cfg.get("head_dim") or cfg["hidden_size"] // H, n_embd=cfg["hidden_size"],
                       n_ctx=n_ctx, vocab_size=cfg["vocab_size"], expert_ffn=cfg["intermediate_size"],
                       n_expert=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"], layer_types=tuple(types),
                       window=cfg.get("sliding_window") or 128, eps=float(cfg.get("rms_norm_eps", 1e-5)),
                       theta=float(rope.get("rope_theta", cfg.get("rope_theta", 150000.0))),
                       rope_factor=float(rope.get("factor", 1.0)), rope_original=original,
                       beta_fast=float(rope.get("beta_fast") or 32.0), beta_slow=float(rope.get("beta_slow") or 1.0),
                       rope_truncate=bool(rope.get("truncate", True)),
                       swiglu_limit=float(cfg.get("swiglu_limit", 7.0)), swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
                       tied=bool(cfg.get("tie_word_embeddings", False)))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


# -- the checkpoint's tensors ------------------------------------------------------------------------

def iter_expected(c: GptOssConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face float checkpoint (without `model.`), with its shape."""
    d, F, E = c.n_embd, c.expert_ffn, c.n_expert
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i in range(c.n_layer):
        h = f"layers.{i}."
        yield h + "input_layernorm.weight", (d,)
        yield from attention_tensors(h, c, qkv_bias=True, o_bias=True)
        yield h + "self_attn.sinks", (c.n_head,)
        yield h + "post_attention_layernorm.weight", (d,)
        yield h + "mlp.router.weight", (E, d)
        yield h + "mlp.router.bias", (E,)
        yield h + "mlp.experts.gate_up_proj", (E, d, 2 * F)
        yield h + "mlp.experts.gate_up_proj_bias", (E, 2 * F)
        yield h + "mlp.experts.down_proj", (E, F, d)
        yield h + "mlp.experts.down_proj_bias", (E, d)
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


# MXFP4 (the OCP microscaling format): E2M1 values by their 4-bit code (sign, 2 exponent bits, 1 mantissa bit)
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 as gpt-oss stores it, widened: blocks [..., G, 16] uint8 (32 FP4 codes a block, the low
    nibble first), scales [..., G] uint8 (E8M0: the block's values times 2^(s - 127)) -> [..., G·32]
    float32, exact (every value is a small binary fraction times a power of two)."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8 or blocks.shape[-1] != 16 \
            or blocks.shape[:-1] != scales.shape:
        raise WeightsError(f"MXFP4: blocks {blocks.shape} {blocks.dtype} and scales {scales.shape} {scales.dtype} "
                           "do not pair (blocks [..., G, 16] uint8, scales [..., G] uint8)")
    out = np.empty(blocks.shape[:-1] + (32,), dtype=np.float32)       # [..., G, 32]
    out[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    out[..., 1::2] = FP4_VALUES[blocks >> 4]
    out = np.ldexp(out, scales.astype(np.int32)[..., None] - 127)
    return out.reshape(blocks.shape[:-2] + (blocks.shape[-2] * 32,))


def unpack_mxfp4(tensors: dict) -> dict:
    """A checkpoint's MXFP4 experts (`*_blocks` / `*_scales`, [E, out, G, 16] / [E, out, G]) as the
    float layout of `iter_expected` ([E, in, out]); other tensors as they are."""
    out = {}
    for name, a in tensors.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name.removesuffix("_blocks")
            scales = tensors.get(base + "_scales")
            if scales is None:
                raise WeightsError(f"{name}: MXFP4 blocks without their scales ({base}_scales)")
            out[base] = np.ascontiguousarray(np.swapaxes(mxfp4_dequantize(a, scales), -1, -2))
        else:
            out[name] = a
    return out


# -- the block ------------------------------------------------------------------------------------------

def yarn_tables(positions, c: GptOssConfig, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of YaRN's angles for these positions, [N, hd/2] each, scaled by its attention
    factor 0.1·ln(factor) + 1 (as transformers computes them)."""
    hd, base, f = c.head_dim, c.theta, c.rope_factor
    dim = lambda rotations: hd * math.log(c.rope_original / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim(c.beta_fast), dim(c.beta_slow)
    if c.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    ramp = np.clip((np.arange(hd // 2, dtype=np.float64) - low) / ((high - low) or 0.001), 0, 1)   # [hd/2]
    pos_freqs = base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    extrapolate = 1 - ramp                                       # 1: keep the frequency, 0: divide it by f
    inv_freq = (1 / (f * pos_freqs)) * (1 - extrapolate) + (1 / pos_freqs) * extrapolate
    scale = 0.1 * math.log(f) + 1.0 if f > 1 else 1.0
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]   # [N, hd/2]
    return (np.cos(angles) * scale).astype(dtype), (np.sin(angles) * scale).astype(dtype)


def attention_spec(c: GptOssConfig, kind: str, sinks) -> ops.AttentionSpec:
    """A layer's attention: its sinks [H], and its window when it slides."""
    return ops.AttentionSpec(window=c.window if kind == SLIDING else None, sinks=sinks)


# -- the model ----------------------------------------------------------------------------------------

class GptOss(SparseDecoder):
    """A gpt-oss model: the decoder's attention (models/decoder.py) with biases and a sink per head, a
    window on its sliding layers, YaRN positions; every block a mixture (models/mixture.py's routing,
    dispatch and `SparseDecoder`) of experts with biases and the clamped SwiGLU."""

    CONFIG = GptOssConfig
    manifest = staticmethod(iter_expected)
    PACKED = ("_blocks", "_scales")           # MXFP4 experts, as released
    unpack = staticmethod(lambda tensors: unpack_mxfp4(tensors))

    def __init__(self, config: GptOssConfig, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = ()) -> None:
        super().__init__(config, unpack_mxfp4(tensors), target,
                         name=name or f"gpt-oss-{config.n_layer}x{config.n_embd}-{config.n_expert}e", eos_ids=eos_ids)
        self.specs = [attention_spec(config, kind, p["sinks"]) for kind, p in zip(config.layer_types, self.blocks)]
        self.ATTENTION_ASKS = frozenset().union(*(s.asks() for s in self.specs))   # what its layers ask

    def block_params(self, tensors: dict, i: int) -> Block:
        """Attention (q|k|v and o with biases) and norms as Llama's, the sinks [H], the router [d, E]
        with its bias, and per expert gate|up [d, 2F_e] (gate then up, from their interleaving) and
        down [F_e, d], each with its bias."""
        c, dtype, h = self.config, self.dtype, f"layers.{i}."
        vec = lambda a: on_device(np.asarray(a, dtype=dtype), self.target)
        p = stack_block(tensors, i, c, self.target, dense_mlp=False)
        p["sinks"] = vec(tensors[h + "self_attn.sinks"])
        p["router.weight"] = make_weight(tensors[h + "mlp.router.weight"], self.router_target, rows=True)
        p["router.bias"] = vec(tensors[h + "mlp.router.bias"])
        x = h + "mlp.experts."
        gate_up, gate_up_b = tensors[x + "gate_up_proj"], tensors[x + "gate_up_proj_bias"]     # [E, d, 2F], [E, 2F]
        down, down_b = tensors[x + "down_proj"], tensors[x + "down_proj_bias"]                  # [E, F, d], [E, d]
        for e in range(c.n_expert):
            w = np.asarray(gate_up[e])
            p[f"experts.{e}.gate_up.weight"] = make_weight([w[:, 0::2].T, w[:, 1::2].T], self.target, rows=True)
            p[f"experts.{e}.gate_up.bias"] = vec(np.concatenate([gate_up_b[e][0::2], gate_up_b[e][1::2]]))
            p[f"experts.{e}.down_proj.weight"] = make_weight(np.asarray(down[e]).T, self.target, rows=True)
            p[f"experts.{e}.down_proj.bias"] = vec(down_b[e])
        return p

    def ffn(self, layer: int):
        c = self.config
        return partial(experts_mlp, c=c, act=partial(ops.clamped_swiglu, limit=c.swiglu_limit, alpha=c.swiglu_alpha))

    def run(self, plan) -> np.ndarray:
        """Embeddings, then every block. plan.ids, plan.positions [N] -> x [N, d]."""
        c, K = self.config, plan.kernels
        x = ops.embedding(self.embed_w, None, plan.ids)                                # [N, d]
        cos, sin = (self.xp.asarray(t) for t in yarn_tables(plan.positions, c, self.dtype))   # [N, hd/2]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, c, cos, sin, partial(plan.attend, layer, spec=self.specs[layer]),
                                  self.ffn(layer), K)
        return x

    def __repr__(self) -> str:
        c = self.config
        return (f"GptOss({self.name!r}: {c.n_layer} layers ({len(c.window_layers)} sliding, window {c.window}), "
                f"{c.n_expert} experts top-{c.top_k} of FFN {c.expert_ffn}, {c.n_head} heads / {c.n_kv_head} KV "
                f"heads of {c.head_dim}, width {c.n_embd}, context {c.n_ctx}, vocab {c.vocab_size}, "
                f"{self.n_params():,} params ({c.active_params():,} active), {self.weights})")


# -- presets --------------------------------------------------------------------------------------------

def _alternating(L: int) -> tuple:
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(L))


RELEASED: dict[str, GptOssConfig] = {      # published config.json values
    "gpt-oss-20b": GptOssConfig(n_layer=24, n_head=64, n_kv_head=8, head_dim=64, n_embd=2880, n_ctx=131072,
                                vocab_size=201088, expert_ffn=2880, n_expert=32, top_k=4, layer_types=_alternating(24)),
    "gpt-oss-120b": GptOssConfig(n_layer=36, n_head=64, n_kv_head=8, head_dim=64, n_embd=2880, n_ctx=131072,
                                 vocab_size=201088, expert_ffn=2880, n_expert=128, top_k=4,
                                 layer_types=_alternating(36)),
}

SHAPES: dict[str, GptOssConfig] = {
    "random-gptoss": GptOssConfig(n_layer=4, n_head=8, n_kv_head=2, head_dim=32, n_embd=256, n_ctx=16384,
                                  vocab_size=4096, expert_ffn=256, n_expert=8, top_k=2, layer_types=_alternating(4),
                                  window=64, rope_original=4096, rope_factor=4.0),
}


def random_params(c: GptOssConfig, seed: int = 0, std: float = 0.02, dtype=np.float32) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights, seeded (norm gains near 1, sinks near 0)."""
    rng = np.random.default_rng(seed)
    return {name: ((1.0 + 0.1 * rng.standard_normal(shape)) if "norm" in name else
                   std * rng.standard_normal(shape)).astype(dtype) for name, shape in iter_expected(c)}


def random(config: GptOssConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> GptOss:
    return GptOss(config, random_params(config, seed, 0.02, np.float32), target, name=name)


CONFIG, MODEL = GptOssConfig, GptOss        # the family's row reads these (checkpoints/families.py)
