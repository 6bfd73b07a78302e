"""GPT-2, read like the paper.

    x = wte[ids] + wpe[positions]                      # embed tokens and positions
    for each block:
        x = x + attn(ln_1(x))                          # causal self-attention
        x = x + mlp(ln_2(x))                           # 4x wide, tanh GELU
    logits = ln_f(x) @ wte^T                           # the LM head is tied to the embedding

The model is `run` (embeddings and every block) and `head` (ln_f and the LM head); the way in,
`step`, and its special cases `forward`, `prefill` and `decode_step` are shared with every
architecture (models/base.py). The tokens of a step are the rows of one [N, d] matrix: every linear
layer multiplies all N at once (`ops.matmul` shapes the product for the BLAS kernel). Only
attention looks at sequences apart, because each has its own keys: the step's plan (`attend`)
knows how.

Parameters keep the Hugging Face checkpoint's names (`h.0.attn.c_attn.weight`, ...) and its
`[in, out]` layout, so `y = x @ W + b` as in the checkpoint, with no copy at load. `minillm bench`
measures both layouts: on a 2-core EPYC with one thread, [in, out] took 26 ms per pass over GPT-2
small's blocks and [out, in] 36 ms; with two threads they were within the machine's noise.
The one weight stored otherwise is the tied embedding: the checkpoint has wte as [V, d], but the LM
head multiplies by wte^T, so the model keeps one contiguous [d, V] array and `wte` is its transposed
view. The LM head then streams [in, out] like every other layer (about 25% faster than [V, d] here),
and the embedding gathers its d values per token from the same array: one copy of the weights.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..config import GPT2Config
from . import ops
from .base import CausalLM

Block = dict  # one block's parameters, named as in the checkpoint without the "h.{i}." prefix
EOT = 50256   # <|endoftext|> in GPT-2's vocabulary


def split_heads(qkv: np.ndarray, n_head: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[T, 3d] -> q, k, v, each [H, T, hd] (views, no copy)."""
    T, three_d = qkv.shape
    hd = three_d // (3 * n_head)
    qkv = qkv.reshape(T, 3, n_head, hd).transpose(1, 2, 0, 3)   # [3, H, T, hd]
    return qkv[0], qkv[1], qkv[2]


def merge_heads(a: np.ndarray) -> np.ndarray:
    """[H, T, hd] -> [T, d]: the heads side by side again."""
    H, T, hd = a.shape
    return a.transpose(1, 0, 2).reshape(T, H * hd)


def self_attention(x: np.ndarray, p: Block, n_head: int, attend) -> np.ndarray:
    """Multi-head causal self-attention over the rows of x [N, d]. `attend(q, k, v)` stores the new
    keys and values and lets each sequence's queries attend over its own positions."""
    qkv = ops.linear(x, p["attn.c_attn.weight"], p["attn.c_attn.bias"])   # [N, 3d]
    q, k, v = split_heads(qkv, n_head)                                     # [H, N, hd] each
    a = merge_heads(attend(q, k, v))                                       # [N, d]
    return ops.linear(a, p["attn.c_proj.weight"], p["attn.c_proj.bias"])   # [N, d]


def mlp(x: np.ndarray, p: Block) -> np.ndarray:
    """[T, d] -> [T, 4d] -> GELU -> [T, d]."""
    h = ops.linear(x, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])          # [T, 4d]
    return ops.linear(ops.gelu(h), p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])   # [T, d]


def transformer_block(x: np.ndarray, p: Block, n_head: int, eps: float, attend) -> np.ndarray:
    """Pre-norm residual block. [N, d] -> [N, d]."""
    x = ops.add(x, self_attention(ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], eps), p, n_head, attend))
    x = ops.add(x, mlp(ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], eps), p))
    return x


class GPT2(CausalLM):
    """A GPT-2 model: a config and a dict of parameters in the checkpoint's names and layout."""

    def __init__(self, config: GPT2Config, params: dict[str, np.ndarray], *, name: str = "") -> None:
        self.config = config
        self.params = params = dict(params)                                # the caller's dict stays as it was
        self.name = name or f"gpt2-{config.n_layer}x{config.n_embd}"
        self.wte_t = np.ascontiguousarray(params["wte.weight"].T)         # [d, V]: the LM head's layout
        self.wte = params["wte.weight"] = self.wte_t.T                    # [V, d]: a view of the same memory
        self.wpe = params["wpe.weight"]                                   # [n_ctx, d]
        self.dtype = self.wte.dtype
        self.eos_ids = (EOT,) if config.vocab_size > EOT else ()
        self.blocks: list[Block] = [
            {k[len(f"h.{i}."):]: v for k, v in params.items() if k.startswith(f"h.{i}.")}
            for i in range(config.n_layer)
        ]

    def run(self, plan) -> np.ndarray:
        """Token and position embeddings, then every block. -> x [N, d]."""
        c = self.config
        x = ops.embedding(self.wte, self.wpe, plan.ids, plan.rows_of_positions)     # [N, d]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, c.n_head, c.ln_eps, partial(plan.attend, layer))   # [N, d]
        return x

    def head(self, h: np.ndarray) -> np.ndarray:
        """ln_f, then the LM head tied to the embedding. [S, d] -> logits [S, V]."""
        h = ops.layer_norm(h, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)
        return ops.lm_head(h, self.wte)                                             # [S, V]

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({self.name!r}: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.dtype})")
