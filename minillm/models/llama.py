"""The Llama family (Llama 2/3, SmolLM2, Qwen2, Qwen3), read like the paper.

    x = embed[ids]                                       # no position embedding: RoPE turns q and k
    for each block:
        x = x + attn(rms_norm(x))                        # grouped-query attention, rotary positions
        x = x + mlp(rms_norm(x))                         # SwiGLU: down(silu(gate(x)) · up(x))
    logits = rms_norm(x) @ head                          # tied to embed, or its own matrix

What changed since GPT-2, and what each change costs:

    RMSNorm            x / sqrt(mean(x²) + eps) · w: no mean, no bias
    rotary embedding   position p turns each (i, i + hd/2) pair of q and k by p·θ^(-2i/hd), so
                       q·k depends only on the distance between positions (no learned table)
    SwiGLU             three matrices [d, F], [d, F], [F, d] instead of two
    grouped queries    H query heads share Hkv key/value heads, g = H / Hkv each: the KV cache
                       holds Hkv heads, 2·L·Hkv·hd·b bytes per token instead of 2·L·d·b
    Qwen2              biases on q, k and v
    Qwen3              an RMS norm on every head of q and k, before the rotation

Parameters arrive in the checkpoint's names and layout (Hugging Face `[out, in]` matrices). The model
keeps each block's q, k and v side by side in one `[d, (H + 2·Hkv)·hd]` matrix, and gate and up in
one `[d, 2F]`, all `[in, out]` like GPT-2's: one product per group instead of three or two, and
every weight still read once per step. The tied head keeps one contiguous `[d, V]` array and the
embedding is its transposed view, as in GPT-2.

Quantized weights (models/quant.py) stay `[out, in]` rows, as GGUF stores them: a GGUF's own Q8_0 /
Q4_0 / Q4_1 tensors arrive that way (`weights="native"`), and q|k|v and gate|up are stacked
row after row; a float checkpoint is quantized after stacking (`weights="q8_0"`, ...). The embedding
and the tied head are then one quantized `[V, d]` matrix, as llama.cpp keeps `token_embd`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import RANDOM_SEED
from .decoder import ARCHS, Decoder, DecoderConfig, iter_expected, random as random_decoder
from .decoder import (MATRICES, Block, random_params, self_attention, split_qkv,  # noqa: F401  (the decoder's
                      stack_block, transformer_block)                             # parts, still named here)
from .target import Target

# -- the config ---------------------------------------------------------------------------------------

LLAMA_TYPES = ARCHS   # Hugging Face `model_type`s and GGUF architectures this family reads: the decoder's flavours


@dataclass(frozen=True)
class LlamaConfig(DecoderConfig):
    """A Llama, Qwen2 or Qwen3 shape: models/decoder.py's fields and checks; `from_hf` reads a
    config.json of model_type llama, qwen2 or qwen3."""


# -- the checkpoint's tensors: models/decoder.py's `iter_expected` (Hugging Face's Llama names) ---------

# GGUF's names for the checkpoint's tensors (llama.cpp's), without `.weight` / `.bias`: a block's
# (after `layers.{i}.`, GGUF's `blk.{i}.`), then the others.
GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GGUF_TOP_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}


SHAPES: dict[str, LlamaConfig] = {}          # no random presets of its own (models/moe.py has a dense twin)


# -- the model ----------------------------------------------------------------------------------------

class Llama(Decoder):
    """A Llama-family model: models/decoder.py's pre-norm decoder, read from a Llama, Qwen2 or Qwen3
    checkpoint (Hugging Face names without `model.`, or a GGUF's)."""

    CONFIG = LlamaConfig                       # what a folder's config.json is read into
    manifest = staticmethod(iter_expected)     # every checkpoint tensor with its shape (checkpoints/manifest.py)


def random(config: LlamaConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> Llama:
    """A seeded Llama-family model of this shape with random weights (models/decoder.py's `random`)."""
    return random_decoder(config, target, name, seed, model=Llama)


CONFIG, MODEL = LlamaConfig, Llama          # the family's row reads these (checkpoints/families.py)
