"""GPT-2, read like the paper.

    x = wte[ids] + wpe[positions]                      # embed tokens and positions
    for each block:
        x = x + attn(ln_1(x))                          # causal self-attention
        x = x + mlp(ln_2(x))                           # 4x wide, tanh GELU
    logits = ln_f(x) @ wte^T                           # the LM head is tied to the embedding

Three ways in, one code path:

    forward(ids)              the whole causal pass, no cache: logits for every position
    prefill(ids)              the same pass over a prompt, filling a KV cache on the way
    decode_step(token, cache) one token at the cache's next position, attending over the cache

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

import numpy as np

from ..measure import meter
from ..models import ops
from ..config import GPT2Config
from ..errors import PromptError
from ..cache.contiguous import KVCache

Block = dict  # one block's parameters, named as in the checkpoint without the "h.{i}." prefix


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


def self_attention(x: np.ndarray, p: Block, n_head: int,
                   cache: KVCache | None, layer: int, pos: int) -> np.ndarray:
    """Multi-head causal self-attention over [T, d]. With a cache, this step's keys and values are
    written at positions pos .. pos+T-1 and the queries attend over every cached position."""
    T = x.shape[0]
    qkv = ops.linear(x, p["attn.c_attn.weight"], p["attn.c_attn.bias"])   # [T, 3d]
    q, k, v = split_heads(qkv, n_head)                                     # [H, T, hd] each
    if cache is None:
        a = ops.attention(q, k, v, from_cache=False)                       # [H, T, hd]
    else:                                                                  # NEW with the cache:
        cache.write(layer, pos, k, v)                                      #   store this step's K, V
        k_all, v_all = cache.read(layer, pos + T)                          #   [H, pos+T, hd] views
        a = ops.attention(q, k_all, v_all, from_cache=True)                #   attend over all of them
    return ops.linear(merge_heads(a), p["attn.c_proj.weight"], p["attn.c_proj.bias"])   # [T, d]


def mlp(x: np.ndarray, p: Block) -> np.ndarray:
    """[T, d] -> [T, 4d] -> GELU -> [T, d]."""
    h = ops.linear(x, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])          # [T, 4d]
    return ops.linear(ops.gelu(h), p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])   # [T, d]


def transformer_block(x: np.ndarray, p: Block, config: GPT2Config,
                      cache: KVCache | None, layer: int, pos: int) -> np.ndarray:
    """Pre-norm residual block. [T, d] -> [T, d]."""
    eps = config.ln_eps
    x = ops.add(x, self_attention(ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], eps),
                                  p, config.n_head, cache, layer, pos))
    x = ops.add(x, mlp(ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], eps), p))
    return x


class GPT2:
    """A GPT-2 model: a config and a dict of parameters in the checkpoint's names and layout."""

    def __init__(self, config: GPT2Config, params: dict[str, np.ndarray], *, name: str = "") -> None:
        self.config = config
        self.params = params
        self.name = name or f"gpt2-{config.n_layer}x{config.n_embd}"
        self.wte_t = np.ascontiguousarray(params["wte.weight"].T)         # [d, V]: the LM head's layout
        self.wte = params["wte.weight"] = self.wte_t.T                    # [V, d]: a view of the same memory
        self.wpe = params["wpe.weight"]                                   # [n_ctx, d]
        self.dtype = self.wte.dtype
        self.blocks: list[Block] = [
            {k[len(f"h.{i}."):]: v for k, v in params.items() if k.startswith(f"h.{i}.")}
            for i in range(config.n_layer)
        ]

    # -- the shared path --------------------------------------------------------------------

    def hidden(self, ids: np.ndarray, cache: KVCache | None = None, pos: int = 0) -> np.ndarray:
        """Embeddings through every block and ln_f: ids [T] at positions pos.. -> [T, d]."""
        x = ops.embedding(self.wte, self.wpe, ids, pos)                   # [T, d]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, self.config, cache, layer, pos)   # [T, d]
        return ops.layer_norm(x, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)

    def check_ids(self, ids, pos: int = 0) -> np.ndarray:
        """Token ids as a 1-D integer array, inside the vocabulary and the context; clear errors otherwise."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.size == 0:
            raise PromptError(f"expected a non-empty list of token ids, got shape {ids.shape}: the prompt is empty")
        if not np.issubdtype(ids.dtype, np.integer):
            raise PromptError(f"token ids must be integers, got dtype {ids.dtype}")
        V, n_ctx = self.config.vocab_size, self.config.n_ctx
        bad = ids[(ids < 0) | (ids >= V)]
        if bad.size:
            raise PromptError(
                f"token id {int(bad[0])} is outside this model's vocabulary of {V} ids (0..{V - 1}); "
                "was the prompt tokenized for another model?"
            )
        if pos + ids.size > n_ctx:
            where = f"after the {pos} already cached, " if pos else ""
            raise PromptError(
                f"{ids.size} tokens do not fit the context of {n_ctx}: {where}at most {n_ctx - pos} fit; "
                "shorten the prompt"
            )
        return ids.astype(np.intp, copy=False)

    # -- the three entry points ---------------------------------------------------------------

    def forward(self, ids, *, last_only: bool = False, kind: str = "forward") -> np.ndarray:
        """The full causal pass, no cache. ids [T] -> logits [T, V] (or [1, V] with last_only, the way
        nanoGPT scores at inference: the LM head on the last position only)."""
        ids = self.check_ids(ids)
        with meter.step(kind, 0, ids.size, attended=ids.size):
            x = self.hidden(ids)                                          # [T, d]
            return ops.lm_head(x[-1:] if last_only else x, self.wte)      # [T, V] or [1, V]

    def new_cache(self) -> KVCache:
        return KVCache(self.config, self.dtype)

    def prefill(self, ids, cache: KVCache | None = None) -> tuple[np.ndarray, KVCache]:
        """The whole prompt in one pass, filling a KV cache. ids [T] -> (logits [V] of the last
        position, the cache holding all T positions)."""
        cache = cache if cache is not None else self.new_cache()
        pos = cache.length
        ids = self.check_ids(ids, pos)
        with meter.step("prefill", pos, ids.size, attended=pos + ids.size):
            x = self.hidden(ids, cache, pos)                              # [T, d]
            cache.length = pos + ids.size
            return ops.lm_head(x[-1:], self.wte)[0], cache                # [V]

    def decode_step(self, token: int, cache: KVCache) -> np.ndarray:
        """One token at the cache's next position; writes its K and V into the cache in place.
        -> logits [V]."""
        pos = cache.length
        if not isinstance(token, (int, np.integer)):
            raise PromptError(f"token {token!r}: a token id must be an integer")
        if not 0 <= token < self.config.vocab_size:
            raise PromptError(f"token id {token} is outside this model's vocabulary of {self.config.vocab_size} ids")
        cache.check_room(1)
        with meter.step("decode", pos, 1, attended=pos + 1):
            x = self.hidden(np.array([token], dtype=np.intp), cache, pos)   # [1, d]
            cache.length = pos + 1
            return ops.lm_head(x, self.wte)[0]                            # [V]

    def n_params(self) -> int:
        return sum(int(v.size) for v in self.params.values())

    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self.params.values())

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({self.name!r}: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.dtype})")
