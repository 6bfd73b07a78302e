"""The families' hyper-parameters: `GPT2Config` (and the four published GPT-2 sizes, `GPT2_SIZES`),
`LlamaConfig` (Llama 2/3, SmolLM2, Qwen2, Qwen3), and `ModelConfig`, what every family's config
answers (the caches, the step's plan and the tools read only that)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

from .errors import ConfigError

_DAMAGED = "the file is damaged or not a GGUF file; re-download it"

# Sane maxima, checked before anything is sized by them. The context is the one count no tensor
# bounds (RoPE has no table in the file), so it has its own: 2^24 positions (Llama 4 Scout's 10M fit).
MAX_CONTEXT = 1 << 24
MAX_COUNT = (1 << 63) - 1   # layers, heads, widths, vocabulary: int64 (NumPy's index); each is then
                            # checked against the tensors it describes, before anything loops over it


def whole(value, field: str, source, hi: int = MAX_COUNT) -> int:
    """A count read from a file: an integer from 1 to hi, else one line naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        shown = repr(value)[:40]
        if isinstance(value, int) and len(shown) > 24:
            shown = f"{shown[:12]}... ({len(str(value))} digits)"
        raise ConfigError(f"{source}: {field} = {shown} must be an integer from 1 to {hi:,}; "
                          "is the file damaged or edited by hand?")
    return value


class ModelConfig(Protocol):
    """What the caches, the plan and the tools read of any family's config."""
    n_layer: int             # L: blocks
    n_head: int              # H: query heads
    n_kv_head: int           # Hkv: key/value heads the KV cache holds
    head_dim: int            # hd
    n_embd: int              # d: width of the residual stream
    n_ctx: int               # longest sequence
    vocab_size: int          # V
    eps: float               # the norms' epsilon


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12        # L: transformer blocks
    n_head: int = 12         # H: attention heads per block
    n_embd: int = 768        # d: width of the residual stream
    n_ctx: int = 1024        # longest sequence (the number of learned positions, `n_positions`)
    vocab_size: int = 50257  # V: GPT-2's BPE vocabulary
    ln_eps: float = 1e-5     # layer-norm epsilon

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "n_ctx", "vocab_size"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name == "n_ctx" else MAX_COUNT)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"config n_embd={self.n_embd} is not divisible by n_head={self.n_head}: "
                "every head must get the same width"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Heads of keys and values the KV cache holds: GPT-2 gives every query head its own."""
        return self.n_head

    @property
    def eps(self) -> float:
        """The layer norms' epsilon (ModelConfig's name for `ln_eps`)."""
        return self.ln_eps

    def n_params(self) -> int:
        """Parameters in the checkpoint (the LM head is tied to `wte`, so it adds none)."""
        L, d, V, T = self.n_layer, self.n_embd, self.vocab_size, self.n_ctx
        per_block = 12 * d * d + 13 * d  # c_attn, attn.c_proj, c_fc, mlp.c_proj + biases, 2 layer norms
        return V * d + T * d + L * per_block + 2 * d

    def to_hf(self) -> dict:
        """config.json in the Hugging Face GPT-2 format."""
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_embd": self.n_embd,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,
            "vocab_size": self.vocab_size,
            "layer_norm_epsilon": self.ln_eps,
            "tie_word_embeddings": True,
        }

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "GPT2Config":
        """Read a Hugging Face config.json dict. `n_positions` is the context (newer files have no `n_ctx`)."""
        if not isinstance(cfg, dict):
            raise ConfigError(f"{source}: expected a JSON object, found {type(cfg).__name__}")
        missing = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size") if k not in cfg]
        n_ctx = cfg.get("n_positions", cfg.get("n_ctx"))
        if n_ctx is None:
            missing.append("n_positions")
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a GPT-2 config.json?")
        try:
            eps = float(cfg.get("layer_norm_epsilon", 1e-5))
        except (TypeError, ValueError, OverflowError):     # OverflowError: a 400-digit integer
            eps = math.nan
        if not 0 < eps < math.inf:
            raise ConfigError(f"{source}: layer_norm_epsilon={str(cfg.get('layer_norm_epsilon'))[:40]} "
                              "is not a positive finite number") from None
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ConfigError(f"{source}: activation_function={act!r}; minillm implements GPT-2's tanh GELU (gelu_new)")
        for field in ("n_layer", "n_head", "n_embd", "vocab_size"):
            whole(cfg[field], field, source)
        whole(n_ctx, "n_positions", source, MAX_CONTEXT)
        try:
            return cls(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"], n_ctx=n_ctx,
                       vocab_size=cfg["vocab_size"], ln_eps=eps)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_gguf(cls, md: dict, vocab_size: int, where) -> "GPT2Config":
        """The hyper-parameters from a GGUF's `gpt2.*` keys (vocab_size: the token table's rows)."""
        get, count = _gguf_getter(md, "gpt2", where)
        return _from_gguf(lambda: cls(
            n_layer=count("block_count"), n_head=count("attention.head_count"),
            n_embd=count("embedding_length"), n_ctx=count("context_length", hi=MAX_CONTEXT),
            vocab_size=int(vocab_size), ln_eps=float(get("attention.layer_norm_epsilon", 1e-5))), where)

    def asdict(self) -> dict:
        return asdict(self)


# The four GPT-2 sizes OpenAI released (parameter counts with the tied LM head counted once).
GPT2_SIZES: dict[str, GPT2Config] = {
    "124m": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "355m": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "774m": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "1558m": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
}


# -- the Llama family (models/llama.py): Llama 2/3, SmolLM2, Mistral-shaped, Qwen2, Qwen3 ----------

LLAMA_TYPES = ("llama", "qwen2", "qwen3")   # Hugging Face `model_type`s and GGUF architectures minillm runs



def hf_model_type(cfg, source: str, types, refusal: str) -> str:
    """A Hugging Face config.json's `model_type`, one of `types`; one line otherwise (`refusal` says why)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: expected a JSON object, found {type(cfg).__name__}")
    kind = cfg.get("model_type")
    if kind not in types:
        raise ConfigError(f"{source}: model_type {kind!r} {refusal}")
    return kind

@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int             # L: blocks
    n_head: int              # H: query heads
    n_kv_head: int           # Hkv: key/value heads (H = g·Hkv; 1 is multi-query attention)
    head_dim: int            # hd (not always d / H: Qwen3 sets its own)
    n_embd: int              # d: width of the residual stream
    n_ctx: int               # longest sequence (`max_position_embeddings`)
    vocab_size: int          # V
    ffn: int                 # F: the MLP's inner width (`intermediate_size`)
    eps: float = 1e-5        # RMS-norm epsilon
    theta: float = 10000.0   # RoPE base
    arch: str = "llama"      # llama, qwen2 or qwen3
    qkv_bias: bool = False   # biases on q, k, v (Qwen2; Llama's attention_bias)
    o_bias: bool = False     # a bias on the output projection (Llama's attention_bias)
    mlp_bias: bool = False   # biases on gate, up, down (Llama's mlp_bias)
    qk_norm: bool = False    # per-head RMS norm of q and k before the rotation (Qwen3)
    tied: bool = True        # the LM head is the token embedding

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_kv_head", "head_dim", "n_embd", "n_ctx", "vocab_size", "ffn"):
            whole(getattr(self, name), name, "config", MAX_CONTEXT if name == "n_ctx" else MAX_COUNT)
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"config: {self.n_head} query heads do not split into groups over "
                              f"{self.n_kv_head} key/value heads; n_kv_heads must divide n_heads")
        if self.head_dim % 2:
            raise ConfigError(f"config head_dim={self.head_dim}: the rotary embedding turns pairs, it must be even")
        for name in ("eps", "theta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):
                raise ConfigError(f"config {name}={value!r}: must be a positive finite number")
        if self.arch not in LLAMA_TYPES:
            raise ConfigError(f"config arch={self.arch!r}: minillm runs {', '.join(LLAMA_TYPES)}")

    def n_params(self) -> int:
        """Parameters (the tied head counted once)."""
        L, d, V, F = self.n_layer, self.n_embd, self.vocab_size, self.ffn
        q, kv = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        per_block = (d * (q + 2 * kv) + q * d + 3 * d * F + 2 * d
                     + (q + 2 * kv) * self.qkv_bias + d * self.o_bias + (2 * F + d) * self.mlp_bias
                     + 2 * self.head_dim * self.qk_norm)
        return V * d * (1 if self.tied else 2) + L * per_block + d

    def kv_bytes_per_token(self, itemsize: int = 4) -> int:
        """2·L·Hkv·hd·b: what every position costs in the KV cache."""
        return 2 * self.n_layer * self.n_kv_head * self.head_dim * itemsize

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "LlamaConfig":
        """Read a Hugging Face config.json of model_type llama, qwen2 or qwen3."""
        arch = hf_model_type(cfg, source, LLAMA_TYPES, f"is not supported; minillm runs gpt2, {', '.join(LLAMA_TYPES)}")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        missing = [k for k in need if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a {arch} config.json?")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act={act!r}; minillm implements SwiGLU with silu")
        if cfg.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window is on; minillm implements full attention only")
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        scaling = cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}
        kind = scaling.get("rope_type", scaling.get("type")) or rope.get("rope_type", "default")
        if kind not in ("default", None):
            raise ConfigError(f"{source}: rope scaling {kind!r} is not implemented; minillm runs the "
                              "default rotary embedding only")
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        for field in need:
            whole(cfg[field], field, source)
        H = cfg["num_attention_heads"]
        whole(cfg.get("max_position_embeddings", 2048), "max_position_embeddings", source, MAX_CONTEXT)
        for field in ("head_dim", "num_key_value_heads"):
            if cfg.get(field) is not None:
                whole(cfg[field], field, source)
        try:
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // H
            return cls(
                n_layer=cfg["num_hidden_layers"], n_head=H, n_kv_head=cfg.get("num_key_value_heads") or H,
                head_dim=head_dim, n_embd=cfg["hidden_size"], n_ctx=cfg.get("max_position_embeddings", 2048),
                vocab_size=cfg["vocab_size"], ffn=cfg["intermediate_size"],
                eps=float(cfg.get("rms_norm_eps", 1e-6)), theta=float(theta), arch=arch,
                qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
                o_bias=arch != "qwen2" and bool(cfg.get("attention_bias", False)),
                mlp_bias=bool(cfg.get("mlp_bias", False)), qk_norm=arch == "qwen3",
                tied=bool(cfg.get("tie_word_embeddings", arch != "llama")))
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None

    @classmethod
    def from_gguf(cls, md: dict, where) -> "LlamaConfig":
        """The hyper-parameters from a GGUF's `{arch}.block_count`, ... keys."""
        arch = md.get("general.architecture")
        if arch not in LLAMA_TYPES:
            raise ConfigError(f"{where}: GGUF architecture {arch!r} is not supported; minillm runs "
                              f"{', '.join(LLAMA_TYPES)}")
        scaling = md.get(f"{arch}.rope.scaling.type")
        if scaling not in (None, "none"):
            raise ConfigError(f"{where}: rope scaling {scaling!r} is not implemented; minillm runs the default "
                              "rotary embedding only")

        get, count = _gguf_getter(md, arch, where)

        def build() -> "LlamaConfig":
            H = count("attention.head_count")
            d = count("embedding_length")
            tokens = md.get("tokenizer.ggml.tokens")
            vocab = count("vocab_size", len(tokens) if isinstance(tokens, list) and tokens else None)
            return cls(
                n_layer=count("block_count"), n_head=H, n_kv_head=count("attention.head_count_kv", H),
                head_dim=count("attention.key_length", d // H), n_embd=d,
                n_ctx=count("context_length", hi=MAX_CONTEXT), vocab_size=vocab, ffn=count("feed_forward_length"),
                eps=float(get("attention.layer_norm_rms_epsilon")), theta=float(get("rope.freq_base", 10000.0)),
                arch=arch, qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", tied=True)

        return _from_gguf(build, where)

    def asdict(self) -> dict:
        return asdict(self)


def _gguf_getter(md: dict, arch: str, where):
    """get(key, default) of a GGUF's `{arch}.{key}` metadata; a missing one is one clear line. And
    count(key, default, hi): the same, an integer from 1 to hi (`whole`), else one line naming the key."""
    def get(key, default=None):
        value = md.get(f"{arch}.{key}", default)
        if value is None:
            raise ConfigError(f"{where}: metadata {arch}.{key} is missing; {_DAMAGED}")
        return value

    def count(key, default=None, hi=MAX_COUNT) -> int:
        return whole(get(key, default), f"metadata {arch}.{key}", where, hi)
    return get, count


def _from_gguf(build, where):
    """A config built from GGUF metadata; a value of the wrong type is one clear line naming the file."""
    try:
        return build()
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}" if str(where) not in str(e) else str(e)) from None
    except (TypeError, ValueError, OverflowError, ZeroDivisionError) as e:
        raise ConfigError(f"{where}: a metadata value has the wrong type ({e}); {_DAMAGED}") from None
