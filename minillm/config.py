"""GPT-2's hyper-parameters: one small frozen dataclass, plus the four published sizes."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import ConfigError


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
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"config {name}={value!r}: must be a positive integer")
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
        try:
            return cls(n_layer=cfg["n_layer"], n_head=cfg["n_head"], n_embd=cfg["n_embd"], n_ctx=n_ctx,
                       vocab_size=cfg["vocab_size"], ln_eps=eps)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def asdict(self) -> dict:
        return asdict(self)


# The four GPT-2 sizes OpenAI released (parameter counts with the tied LM head counted once).
PRESETS: dict[str, GPT2Config] = {
    "124m": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "355m": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "774m": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "1558m": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
}
