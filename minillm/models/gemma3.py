"""Gemma 3 (270M to 27B, `gemma3_text`): a Llama whose attention slides on five layers of six.

    x = embed[ids] · √d                                  # the embedding scaled by √width
    for each block (kind = layer_types[i]: sliding or full):
        x = x + norm(attn(norm(x), kind))                # a norm before and after attention
        x = x + norm(geglu(norm(x)))                     # and before and after the MLP
    logits = norm(x) @ embed                             # tied (or its own head)

    attn(x, sliding)   grouped-query attention, q and k RMS-normed per head, rotary positions with
                       base 10,000; each query sees only the last `window` positions (512 or 1,024
                       in the releases): a decode step reads at most `window` keys and values
    attn(x, full)      the same over every position, rotary base 1,000,000 (4B and up: its
                       positions divided by a linear factor of 8)
    norm(x)            Gemma's RMS norm, x / sqrt(mean(x²) + eps) · (1 + w): the gain stored as
                       1 + w here, once at load, so every norm is `ops.rms_norm` (a kernel set's)
    geglu(x)           down(gelu_tanh(gate(x)) · up(x)): SwiGLU with the tanh GELU for the SiLU
    queries            scaled by query_pre_attn_scalar^-½ (the head width in 270M/1B, not in 27B)

What the window buys. Only the global layers' KV grows with the context: a 27B model with 62 layers,
52 of them windowed at 1,024, holds 10 layers' KV per token past the window, not 62. The window is
one option of the attention (`ops.AttentionSpec(window=...)`): the plan hands it to the kernel set,
whose kernel takes it or attends with NumPy's form (a header says which). The rest is the pre-norm
decoder's (models/decoder.py): its q|k|v and gate|up stacking, its attention function, its head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np

from ..config import Layout, MAX_CONTEXT, MAX_COUNT, check_heads, check_positive, hf_model_type, whole
from ..errors import ConfigError
from . import ops
from .base import RANDOM_SEED
from .blocks import mlp
from .factory import on_device
from .decoder import Block, Decoder, attention_tensors, self_attention, stack_block
from .target import Target

MODEL_TYPES = ("gemma3_text",)
SLIDING, FULL = "sliding_attention", "full_attention"


# -- the config ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gemma3Config(Layout):
    n_layer: int             # L: blocks
    n_head: int              # H: query heads
    n_kv_head: int           # Hkv: key/value heads
    head_dim: int            # hd (256 in the releases, wider than d / H)
    n_embd: int              # d
    n_ctx: int               # longest sequence
    vocab_size: int          # V
    ffn: int                 # F: the GeGLU's inner width
    layer_types: tuple       # per block: SLIDING or FULL
    window: int = 512        # a sliding layer's query sees this many positions, itself included
    query_scalar: float = 0  # queries scaled by query_scalar^-½ (0: head_dim)
    eps: float = 1e-6
    theta: float = 1e6       # the full layers' rotary base
    local_theta: float = 1e4  # the sliding layers'
    rope_factor: float = 1.0  # the full layers' positions divided by it (linear scaling; 4B and up: 8)
    tied: bool = True

    # what models/decoder.py's stacking and attention ask of a config
    qkv_bias = o_bias = mlp_bias = False
    qk_norm = True
    arch = "gemma3_text"

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "n_ctx", "vocab_size", "ffn", "window"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name in ("n_ctx", "window") else MAX_COUNT)
        check_heads(self)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.n_layer or not set(self.layer_types) <= {SLIDING, FULL}:
            raise ConfigError(f"config layer_types: {self.n_layer} entries, each {SLIDING!r} or {FULL!r}")
        if not self.query_scalar:
            object.__setattr__(self, "query_scalar", self.head_dim)
        check_positive(self, ("eps", "theta", "local_theta", "rope_factor", "query_scalar"))

    # the layout a sequence keeps (config.Layout): K and V in every layer, the sliding ones windowed
    @property
    def window_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == SLIDING)

    @property
    def scale(self) -> float | None:
        """The scores' scale where it is not 1/√hd (None: the plain one)."""
        return None if self.query_scalar == self.head_dim else float(self.query_scalar) ** -0.5

    def n_params(self) -> int:
        L, d, V, F = self.n_layer, self.n_embd, self.vocab_size, self.ffn
        q, kv = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        per_block = d * (q + 2 * kv) + q * d + 3 * d * F + 4 * d + 2 * self.head_dim
        return V * d * (1 if self.tied else 2) + L * per_block + d

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "Gemma3Config":
        """A Hugging Face config.json of model_type gemma3_text, as transformers 4.5x or 5 writes it
        (rope bases in `rope_parameters` keyed by layer type, or `rope_theta` / `rope_local_base_freq`
        / `rope_scaling`; `layer_types`, or the pattern `sliding_window_pattern`)."""
        hf_model_type(cfg, source, MODEL_TYPES, "is not Gemma 3's (gemma3_text)")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        missing = [k for k in need if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a gemma3_text config.json?")
        for field in need:
            whole(cfg[field], field, source)
        for field, why in (("attn_logit_softcapping", "a cap on the scores"),
                           ("final_logit_softcapping", "a cap on the logits")):
            if cfg.get(field) is not None:
                raise ConfigError(f"{source}: {field}={cfg[field]!r}; minillm's Gemma 3 has no {why}")
        if cfg.get("use_bidirectional_attention"):
            raise ConfigError(f"{source}: use_bidirectional_attention is on; minillm runs causal attention only")
        act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ConfigError(f"{source}: hidden_activation={act!r}; minillm implements GeGLU with the tanh GELU")
        L = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if types is None:
            pattern = cfg.get("sliding_window_pattern", cfg.get("_sliding_window_pattern", 6))
            whole(pattern, "sliding_window_pattern", source)
            types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(L)]
        if not isinstance(types, list) or len(types) != L or not set(types) <= {SLIDING, FULL}:
            raise ConfigError(f"{source}: layer_types must list {L} entries, each {SLIDING!r} or {FULL!r}")
        theta, local, factor = _rope(cfg, source)
        whole(cfg.get("max_position_embeddings", 32768), "max_position_embeddings", source, MAX_CONTEXT)
        for field in ("head_dim", "num_key_value_heads", "sliding_window"):
            if cfg.get(field) is not None:
                whole(cfg[field], field, source, MAX_CONTEXT if field == "sliding_window" else MAX_COUNT)
        H = cfg["num_attention_heads"]
        try:
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
            return cls(n_layer=L, n_head=H, n_kv_head=cfg.get("num_key_value_heads") or H, head_dim=head_dim,
                       n_embd=cfg["hidden_size"], n_ctx=cfg.get("max_position_embeddings", 32768),
                       vocab_size=cfg["vocab_size"], ffn=cfg["intermediate_size"], layer_types=tuple(types),
                       window=cfg.get("sliding_window") or 4096,
                       query_scalar=cfg.get("query_pre_attn_scalar") or head_dim,
                       eps=float(cfg.get("rms_norm_eps", 1e-6)), theta=theta, local_theta=local,
                       rope_factor=factor, tied=bool(cfg.get("tie_word_embeddings", True)))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


def _rope(cfg: dict, source: str) -> tuple[float, float, float]:
    """(the full layers' base, the sliding layers' base, the full layers' linear factor) from either
    way transformers writes them; one line for a scaling minillm does not implement."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and FULL in params:
        full, local = params.get(FULL) or {}, params.get(SLIDING) or {}
    else:
        full = {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", 1e6)}
        local = {"rope_theta": cfg.get("rope_local_base_freq", 1e4)}
    for kind, p in ((FULL, full), (SLIDING, local)):
        if not isinstance(p, dict):
            raise ConfigError(f"{source}: the rope parameters of {kind} are not an object")
        rope_type = p.get("rope_type", p.get("type", "default"))
        if rope_type not in ("default", "linear") or (rope_type == "linear" and kind == SLIDING):
            raise ConfigError(f"{source}: rope scaling {rope_type!r} on {kind} is not implemented; minillm runs "
                              "the default rotary embedding (linear on the full layers)")
    factor = full.get("factor", 1.0) if full.get("rope_type", full.get("type")) == "linear" else 1.0
    try:
        return float(full.get("rope_theta", 1e6)), float(local.get("rope_theta", 1e4)), float(factor)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: a rope parameter has the wrong type ({e})") from None


# -- the checkpoint's tensors ------------------------------------------------------------------------

NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def iter_expected(c: Gemma3Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint (without `model.`), with its shape."""
    d, F = c.n_embd, c.ffn
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i in range(c.n_layer):
        h = f"layers.{i}."
        yield from ((h + n + ".weight", (d,)) for n in NORMS)
        yield from attention_tensors(h, c, qk_norm=True)
        for name, shape in (("gate_proj", (F, d)), ("up_proj", (F, d)), ("down_proj", (d, F))):
            yield h + f"mlp.{name}.weight", shape
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


def gains(tensors: dict, dtype) -> dict:
    """The checkpoint's tensors with every RMS norm's w replaced by its gain 1 + w (in float32, as
    transformers adds it; widened to the model's dtype after)."""
    return {k: (1.0 + np.asarray(v, dtype=np.float32)).astype(dtype) if k.endswith("norm.weight") else v
            for k, v in tensors.items()}


# -- the block ------------------------------------------------------------------------------------------

def geglu_mlp(x: np.ndarray, p: Block) -> np.ndarray:
    """GeGLU. [N, d] -> gate|up [N, 2F] -> gelu_tanh(gate)·up [N, F] -> [N, d]."""
    return mlp(x, p, act=ops.geglu)


def gemma_block(x: np.ndarray, p: Block, c: Gemma3Config, cos, sin, attend, K) -> np.ndarray:
    """Four norms a block: before and after attention, before and after the MLP. [N, d] -> [N, d]."""
    h = self_attention(K.rms_norm(x, p["input_layernorm.weight"], c.eps), p, c, cos, sin, attend, K)
    x = ops.add(x, K.rms_norm(h, p["post_attention_layernorm.weight"], c.eps))
    h = geglu_mlp(K.rms_norm(x, p["pre_feedforward_layernorm.weight"], c.eps), p)
    return ops.add(x, K.rms_norm(h, p["post_feedforward_layernorm.weight"], c.eps))


def attention_spec(c: Gemma3Config, kind: str) -> ops.AttentionSpec:
    """What a layer of this kind asks of attention: its scale (where not 1/√hd) and, sliding, its window."""
    return ops.AttentionSpec(scale=c.scale, window=c.window if kind == SLIDING else None)


# -- the model ----------------------------------------------------------------------------------------

class Gemma3(Decoder):
    """A Gemma 3 model: the decoder's stacked weights and attention (models/decoder.py), Gemma's norms,
    GeGLU, scaled embedding and per-layer attention (`attention_spec`). Its norms' gains are 1 + w
    (`gains`)."""

    CONFIG = Gemma3Config
    manifest = staticmethod(iter_expected)

    def __init__(self, config: Gemma3Config, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = ()) -> None:
        target = target or Target.numpy()
        super().__init__(config, gains(tensors, target.dtype), target,
                         name=name or f"gemma3-{config.n_layer}x{config.n_embd}", eos_ids=eos_ids)
        self.specs = [attention_spec(config, kind) for kind in config.layer_types]
        self.ATTENTION_ASKS = frozenset().union(*(s.asks() for s in self.specs))   # what its layers ask
        self.embed_scale = float(np.asarray(math.sqrt(config.n_embd), dtype=self.dtype))   # as transformers rounds it

    def block_params(self, tensors: dict, i: int) -> Block:
        p = stack_block(tensors, i, self.config, self.target)
        for n in NORMS[2:]:
            p[f"{n}.weight"] = on_device(np.asarray(tensors[f"layers.{i}.{n}.weight"], dtype=self.dtype), self.target)
        return p

    def run(self, plan) -> np.ndarray:
        """Scaled embeddings, then every block. plan.ids, plan.positions [N] -> x [N, d]."""
        c, K = self.config, plan.kernels
        x = ops.embedding(self.embed_w, None, plan.ids, scale=self.embed_scale)          # [N, d]
        tables = {SLIDING: ops.rope_tables(plan.positions, c.head_dim, c.local_theta, self.dtype),
                  FULL: ops.rope_tables(plan.positions / c.rope_factor if c.rope_factor != 1 else plan.positions,
                                        c.head_dim, c.theta, self.dtype)}                # [N, hd/2] each
        for layer, (p, kind) in enumerate(zip(self.blocks, c.layer_types)):
            cos, sin = tables[kind]
            x = gemma_block(x, p, c, cos, sin, partial(plan.attend, layer, spec=self.specs[layer]), K)
        return x

    def __repr__(self) -> str:
        c = self.config
        return (f"Gemma3({self.name!r}: {c.n_layer} layers ({len(c.window_layers)} sliding, window {c.window}), "
                f"{c.n_head} heads / {c.n_kv_head} KV heads of {c.head_dim}, width {c.n_embd}, FFN {c.ffn}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.weights})")


# -- presets: the released shapes, and a random pair at a shape that decodes in milliseconds -----------

def _pattern(L: int, every: int = 6) -> tuple:
    return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(L))


RELEASED: dict[str, Gemma3Config] = {       # published config.json values
    "gemma-3-270m": Gemma3Config(n_layer=18, n_head=4, n_kv_head=1, head_dim=256, n_embd=640, n_ctx=32768,
                                 vocab_size=262144, ffn=2048, layer_types=_pattern(18), window=512,
                                 query_scalar=256),
    "gemma-3-1b": Gemma3Config(n_layer=26, n_head=4, n_kv_head=1, head_dim=256, n_embd=1152, n_ctx=32768,
                               vocab_size=262144, ffn=6912, layer_types=_pattern(26), window=512,
                               query_scalar=256),
    "gemma-3-27b": Gemma3Config(n_layer=62, n_head=32, n_kv_head=16, head_dim=128, n_embd=5376, n_ctx=131072,
                                vocab_size=262208, ffn=21504, layer_types=_pattern(62), window=1024,
                                query_scalar=168, rope_factor=8.0),
}

_SMALL = dict(n_layer=6, n_head=4, n_kv_head=1, head_dim=64, n_embd=256, n_ctx=32768, vocab_size=4096, ffn=768,
              window=64)
SHAPES: dict[str, Gemma3Config] = {
    "random-gemma3": Gemma3Config(**_SMALL, layer_types=_pattern(6)),
    "random-gemma3-global": Gemma3Config(**_SMALL, layer_types=(FULL,) * 6),     # its all-global twin
}


def random_params(c: Gemma3Config, seed: int = 0, std: float = 0.02, dtype=np.float32) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights, seeded (norm weights near 0: gains near 1)."""
    rng = np.random.default_rng(seed)
    return {name: ((0.1 if "norm" in name else std) * rng.standard_normal(shape)).astype(dtype)
            for name, shape in iter_expected(c)}


def random(config: Gemma3Config, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> Gemma3:
    """A model of this config with seeded random weights, made for the target."""
    return Gemma3(config, random_params(config, seed, 0.02, np.float32), target, name=name)


CONFIG, MODEL = Gemma3Config, Gemma3        # the family's row reads these (checkpoints/families.py)
