"""Qwen3.5's config.json and checkpoint (the family is models/qwen35.py): `Qwen35Config`, read and
checked by `from_hf` (`check_state`: a state this machine could hold), `AttentionView` (what a KV
cache of the full layers is sized by), every tensor's name and shape (`manifest`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterator

from ..config import Layout, MAX_CONTEXT, check_positive, hf_model_type, whole
from ..errors import ConfigError
from .deltanet import DeltaNetShape

LINEAR, FULL = "linear_attention", "full_attention"
MODEL_TYPES = ("qwen3_5_text",)


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
        check_positive(self, ("eps", "theta"))

    # -- the layers and their widths --

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    key_dim = property(lambda self: self.deltanet.key_dim)         # Hk·dk: the width of q, and of k
    value_dim = property(lambda self: self.deltanet.value_dim)     # Dv = Hv·dv: the width of v, z and o
    conv_dim = property(lambda self: self.deltanet.conv_dim)       # C: the convolution's channels, q|k|v

    # -- what a sequence keeps --

    @property
    def deltanet(self) -> DeltaNetShape:
        """What its linear layers read (models/deltanet.py)."""
        return DeltaNetShape(self.lin_k_heads, self.lin_v_heads, self.lin_k_dim, self.lin_v_dim, self.conv_kernel,
                             self.eps)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """One linear layer's state: the convolution's window and the delta rule's matrices."""
        return self.deltanet.state_shapes()

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
            return check_state(cls(n_layer=L, n_head=H, n_kv_head=cfg.get("num_key_value_heads") or H, head_dim=head_dim,
                       n_embd=cfg["hidden_size"], n_ctx=cfg.get("max_position_embeddings", 32768),
                       vocab_size=cfg["vocab_size"], ffn=cfg["intermediate_size"], layer_types=tuple(types),
                       lin_k_heads=cfg.get("linear_num_key_heads", 16), lin_v_heads=cfg.get("linear_num_value_heads", 32),
                       lin_k_dim=cfg.get("linear_key_head_dim", 128), lin_v_dim=cfg.get("linear_value_head_dim", 128),
                       conv_kernel=cfg.get("linear_conv_kernel_dim", 4), rotary_dim=int(head_dim * factor),
                       eps=float(cfg.get("rms_norm_eps", 1e-6)),
                       theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1e7))),
                       tied=bool(cfg.get("tie_word_embeddings", False))))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_state(c: Qwen35Config) -> Qwen35Config:
    """A config read from a file whose one sequence's state (`state_bytes`, float32) could be held:
    no larger than the model's own weights (its parameters in float32: published hybrids' states are
    under 1% of their weights; a few kilobytes of linear_*_head_dim can otherwise ask for terabytes)
    and than the machine's memory. Refused before anything is allocated."""
    state, weights, ram = c.state_bytes(4), 4 * c.n_params(), machine_memory()
    if state > weights or (ram is not None and state > ram):
        why = (f"more than the model's {weights:,} bytes of weights" if state > weights
               else f"more than this machine's {ram:,} bytes of memory")
        raise ConfigError(f"one sequence's linear-attention state would take {state:,} bytes ({len(c.linear_layers):,} "
                          f"layers of [{c.lin_v_heads}, {c.lin_k_dim}, {c.lin_v_dim}]), {why}; are the "
                          "linear_* fields the ones for these weights?")
    return c


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
