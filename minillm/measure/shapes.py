"""Model shapes by name, for the chip calculator: weights and KV bytes per token from the shape, not
only from a parameter count. Grouped-query attention shows up here: Llama-3-8B keeps 8 KV heads of
its 32, so each token costs a quarter of the KV bytes Llama-2-7B's does, at about the same size.

The shapes are the published config.json values of each model (layers, heads, KV heads, head width,
hidden width, MLP width, vocabulary, tied head).
"""

from __future__ import annotations

import difflib

from ..config import LlamaConfig, GPT2_SIZES
from ..errors import MiniLLMError


def _llama(L, H, Hkv, hd, d, F, V, tied=False, ctx=4096, arch="llama") -> LlamaConfig:
    return LlamaConfig(n_layer=L, n_head=H, n_kv_head=Hkv, head_dim=hd, n_embd=d, n_ctx=ctx, vocab_size=V,
                       ffn=F, arch=arch, tied=tied, qkv_bias=arch == "qwen2")


SHAPES: dict[str, LlamaConfig] = {
    "smollm2-135m": _llama(30, 9, 3, 64, 576, 1536, 49152, tied=True, ctx=8192),
    "llama-2-7b": _llama(32, 32, 32, 128, 4096, 11008, 32000),
    "llama-2-13b": _llama(40, 40, 40, 128, 5120, 13824, 32000),
    "llama-3-8b": _llama(32, 32, 8, 128, 4096, 14336, 128256, ctx=8192),
    "llama-3-70b": _llama(80, 64, 8, 128, 8192, 28672, 128256, ctx=8192),
    "mistral-7b": _llama(32, 32, 8, 128, 4096, 14336, 32000, ctx=32768),
    "qwen2.5-7b": _llama(28, 28, 4, 128, 3584, 18944, 152064, ctx=32768, arch="qwen2"),
}


def gpt2_as_shape(c) -> dict:
    return {"n_layer": c.n_layer, "n_kv_head": c.n_head, "head_dim": c.head_dim, "n_params": c.n_params()}


def shape(name: str) -> dict:
    """{n_layer, n_kv_head, head_dim, n_params, n_ctx} of a shape name (gpt2-124m ... or the table above)."""
    key = name.strip().lower()
    if key in SHAPES:
        c = SHAPES[key]
        return {"name": key, "n_layer": c.n_layer, "n_kv_head": c.n_kv_head, "head_dim": c.head_dim,
                "n_head": c.n_head, "n_params": c.n_params(), "n_ctx": c.n_ctx}
    size = key.removeprefix("gpt2-")
    if key.startswith("gpt2-") and size in GPT2_SIZES:
        c = GPT2_SIZES[size]
        return {"name": key, "n_layer": c.n_layer, "n_kv_head": c.n_head, "head_dim": c.head_dim,
                "n_head": c.n_head, "n_params": c.n_params(), "n_ctx": c.n_ctx}
    names = [*SHAPES, *(f"gpt2-{k}" for k in GPT2_SIZES)]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise MiniLLMError(f"unknown shape {name!r}.{hint} Known shapes: {', '.join(names)}")


def kv_bytes_per_token(s: dict, bytes_per_value: float) -> float:
    """K and V, every layer: 2·L·Hkv·hd·b."""
    return 2 * s["n_layer"] * s["n_kv_head"] * s["head_dim"] * bytes_per_value


def decode_step_bytes(s: dict, context: int, bytes_per_value: float) -> dict:
    """One batch-1 decode step at `context` tokens: every weight once, and the whole KV cache."""
    weights = s["n_params"] * bytes_per_value
    kv = context * kv_bytes_per_token(s, bytes_per_value)
    return {"weights": weights, "kv": kv, "total": weights + kv}


def sequences_that_fit(s: dict, context: int, bytes_per_value: float, memory_bytes: float) -> int:
    """The KV limit on batch size: what is left of the memory after the weights, in whole sequences."""
    left = memory_bytes - s["n_params"] * bytes_per_value
    return max(0, int(left // (context * kv_bytes_per_token(s, bytes_per_value))))
