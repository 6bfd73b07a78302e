"""GPT-2, read like the paper.

    x = wte[ids] + wpe[positions]                      # embed tokens and positions
    for each block:
        x = x + attn(ln_1(x))                          # causal self-attention
        x = x + mlp(ln_2(x))                           # 4x wide, tanh GELU
    logits = ln_f(x) @ wte^T                           # the LM head is tied to the embedding

One way in, `step`, and three special cases of it:

    step([(ids, cache), ...])  a flattened batch: several sequences, each with its new tokens (a
                               prompt chunk or one decode token) and its own KV cache; the weights
                               are read once for all of them, each attends over its own positions
    forward(ids)               the whole causal pass of one sequence, no cache: logits everywhere
    prefill(ids)               one sequence's prompt in one pass, filling a KV cache on the way
    decode_step(token, cache)  one token at the cache's next position, attending over the cache

The tokens of a step are the rows of one [N, d] matrix: every linear layer multiplies all N at once
(`ops.matmul` shapes the product for the BLAS kernel). Only attention looks at sequences one by one,
because each has its own keys.

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

from dataclasses import dataclass

import numpy as np

from .. import meter
from ..models import ops
from ..models.quant import QuantMatrix
from ..config import GPT2Config
from ..errors import PromptError
from ..cache.contiguous import KVCache, PassKV
from ..cache.paged import DecodeBatch, PagedKVCache

BATCHED_DECODE_KEYS = 128   # up to this many keys per sequence, a decode batch is attended as one gather

Block = dict  # one block's parameters, named as in the checkpoint without the "h.{i}." prefix


@dataclass(frozen=True)
class Span:
    """One sequence's rows in a step: rows r0 .. r0+n-1 are its new tokens at positions pos .. pos+n-1."""
    r0: int
    n: int
    pos: int
    cache: object      # anything with the cache protocol (cache/contiguous.py)


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


def as_spans(x: np.ndarray, spans, pos: int | None) -> list[Span]:
    """The 0.1 calls passed (cache or None, layer, pos) for one sequence: the same as one span."""
    if isinstance(spans, list):
        return spans
    return [Span(0, x.shape[0], pos or 0, spans if spans is not None else PassKV())]


def self_attention(x: np.ndarray, p: Block, n_head: int, spans, layer: int,
                   pos: int | None = None) -> np.ndarray:
    """Multi-head causal self-attention over the rows of x [N, d]. Each sequence's new keys and
    values go into its cache at its positions, and its queries attend over all its cached positions.
    spans: one Span per sequence, or a DecodeBatch (B decode tokens attended as one batch)."""
    qkv = ops.linear(x, p["attn.c_attn.weight"], p["attn.c_attn.bias"])   # [N, 3d]
    q, k, v = split_heads(qkv, n_head)                                     # [H, N, hd] each
    if isinstance(spans, DecodeBatch):                                     # B sequences, one token each
        spans.write(layer, k, v)
        k_all, v_all = spans.read(layer)                                   # [H, B, T, hd]
        a = merge_heads(ops.decode_attention(q, k_all, v_all, spans.mask, spans.lengths))   # [B, d]
        return ops.linear(a, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    spans = as_spans(x, spans, pos)
    if len(spans) == 1:                                                    # one sequence
        a = merge_heads(attend(q, k, v, spans[0], layer))                  # [N, d]
    else:
        a = np.empty_like(x)                                               # [N, d]
        for s in spans:
            rows = slice(s.r0, s.r0 + s.n)
            a[rows] = merge_heads(attend(q[:, rows], k[:, rows], v[:, rows], s, layer))
    return ops.linear(a, p["attn.c_proj.weight"], p["attn.c_proj.bias"])   # [N, d]


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, s: Span, layer: int) -> np.ndarray:
    """One sequence: store its new K, V [H, n, hd], then its queries attend over every position so far."""
    s.cache.write(layer, s.pos, k, v)
    k_all, v_all = s.cache.read(layer, s.pos + s.n)                        # [H, pos+n, hd]
    return ops.attention(q, k_all, v_all)                                  # [H, n, hd]


def mlp(x: np.ndarray, p: Block) -> np.ndarray:
    """[T, d] -> [T, 4d] -> GELU -> [T, d]."""
    h = ops.linear(x, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])          # [T, 4d]
    return ops.linear(ops.gelu(h), p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])   # [T, d]


def transformer_block(x: np.ndarray, p: Block, config: GPT2Config, spans: list[Span], layer: int,
                      pos: int | None = None) -> np.ndarray:
    """Pre-norm residual block. [N, d] -> [N, d]."""
    if not isinstance(spans, DecodeBatch):
        spans = as_spans(x, spans, pos)
    eps = config.ln_eps
    x = ops.add(x, self_attention(ops.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], eps),
                                  p, config.n_head, spans, layer))
    x = ops.add(x, mlp(ops.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], eps), p))
    return x


class GPT2:
    """A GPT-2 model: a config and a dict of parameters in the checkpoint's names and layout."""

    def __init__(self, config: GPT2Config, params: dict[str, np.ndarray], *, name: str = "") -> None:
        self.config = config
        self.params = params
        self.name = name or f"gpt2-{config.n_layer}x{config.n_embd}"
        if isinstance(params["wte.weight"], QuantMatrix):                 # quantized [V, d] rows, as GGUF's
            self.wte, self.wte_t = params["wte.weight"], None             # token_embd: embedding and head
        else:
            self.wte_t = np.ascontiguousarray(params["wte.weight"].T)     # [d, V]: the LM head's layout
            self.wte = params["wte.weight"] = self.wte_t.T                # [V, d]: a view of the same memory
        self.wpe = params["wpe.weight"]                                   # [n_ctx, d]
        self.dtype = self.wpe.dtype
        self.weights = next((v.fmt.name for v in params.values() if isinstance(v, QuantMatrix)), self.dtype.name)
        self.blocks: list[Block] = [
            {k[len(f"h.{i}."):]: v for k, v in params.items() if k.startswith(f"h.{i}.")}
            for i in range(config.n_layer)
        ]

    # -- checks -----------------------------------------------------------------------------------

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

    # -- the one way in ---------------------------------------------------------------------------

    def step(self, batch, *, scores="last", kind: str | None = None) -> list:
        """Run a flattened batch through the model once.

        batch: [(ids, cache), ...], one entry per sequence: its new token ids [n_i] (a prompt, a
        prompt chunk, or one decode token) and its KV cache, which holds its earlier positions and
        receives these. The n_i tokens of all sequences are the rows of one matrix: every weight is
        read once for the whole step. Each sequence's caches advance by n_i.

        scores: "last" (default) gives each sequence the logits of its last new position, [V];
        "all" gives [n_i, V], every new position (speculative decoding verifies k drafts with them);
        None gives None (a prompt chunk whose end is not reached yet). A list sets it per sequence.
        kind: what the meter calls this step (default: "decode", "prefill" or "mixed", from its
        shape; speculative decoding names its steps "draft" and "verify").
        Returns one entry per sequence, in order.
        """
        return self._step(batch, scores, kind=kind)

    def _step(self, batch, scores, kind: str | None) -> list:
        if not batch:
            raise PromptError("a step needs at least one sequence")
        wants = [scores] * len(batch) if scores is None or isinstance(scores, str) else list(scores)
        if len(wants) != len(batch) or any(w not in ("last", "all", None) for w in wants):
            raise ValueError(f"scores={scores!r}: 'last', 'all', None, or one of those per sequence")
        caches = [cache for _, cache in batch]
        if len({id(c) for c in caches}) != len(caches):
            raise PromptError("the same KV cache appears twice in one step: each sequence needs its own")
        chunks = [self.check_ids(ids, cache.length) for ids, cache in batch]
        for ids, cache in zip(chunks, caches):
            cache.reserve(ids.size)
        spans, r0 = [], 0
        for ids, cache in zip(chunks, caches):
            spans.append(Span(r0, ids.size, cache.length, cache))
            r0 += ids.size
        N = r0
        if len(spans) == 1:
            ids, positions = chunks[0], spans[0].pos
        else:
            ids = np.concatenate(chunks)
            positions = np.concatenate([np.arange(s.pos, s.pos + s.n) for s in spans])
        if kind is None:
            decode = all(s.n == 1 and s.pos > 0 for s in spans)
            kind = "decode" if decode else "prefill" if all(s.n > 1 or s.pos == 0 for s in spans) else "mixed"
        with meter.step(kind, spans[0].pos, N, attended=max(s.pos + s.n for s in spans),
                        seqs=[(s.pos, s.n) for s in spans]):
            x = ops.embedding(self.wte, self.wpe, ids, positions)                     # [N, d]
            attn = self.decode_batch(spans) or spans
            for layer, p in enumerate(self.blocks):
                x = transformer_block(x, p, self.config, attn, layer)                 # [N, d]
            for s in spans:
                s.cache.advance(s.n)
            return self.head(x, spans, wants)

    @staticmethod
    def decode_batch(spans: list[Span]) -> DecodeBatch | None:
        """B > 1 decode tokens in one paged pool, none with more than BATCHED_DECODE_KEYS keys: one
        gather per layer beats B separate reads (see cache/paged.py)."""
        if len(spans) < 2 or any(s.n != 1 or not isinstance(s.cache, PagedKVCache) for s in spans):
            return None
        pool = spans[0].cache.pool
        if any(s.cache.pool is not pool for s in spans) or max(s.pos for s in spans) >= BATCHED_DECODE_KEYS:
            return None
        return DecodeBatch(pool, [s.cache for s in spans])

    def head(self, x: np.ndarray, spans: list[Span], wants: list) -> list:
        """ln_f and the LM head on the rows that are scored only. x [N, d] -> logits per sequence."""
        rows = []
        for s, w in zip(spans, wants):
            if w == "last":
                rows.append(s.r0 + s.n - 1)
            elif w == "all":
                rows.extend(range(s.r0, s.r0 + s.n))
        if not rows:
            return [None] * len(spans)
        h = x[rows] if len(rows) < x.shape[0] else x                          # [S, d]
        h = ops.layer_norm(h, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)
        logits = ops.lm_head(h, self.wte)                                     # [S, V]
        out, i = [], 0
        for s, w in zip(spans, wants):
            if w is None:
                out.append(None)
            elif w == "last":
                out.append(logits[i])
                i += 1
            else:
                out.append(logits[i:i + s.n])
                i += s.n
        return out

    def hidden(self, ids, cache=None, pos: int = 0) -> np.ndarray:
        """Embeddings through every block and ln_f for one sequence: ids [T] at positions pos.. -> [T, d].
        With a cache, keys and values are written at those positions (the cache does not advance)."""
        ids = np.asarray(ids, dtype=np.intp)
        spans = [Span(0, ids.size, pos, cache if cache is not None else PassKV())]
        x = ops.embedding(self.wte, self.wpe, ids, pos)                           # [T, d]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, self.config, spans, layer)                # [T, d]
        return ops.layer_norm(x, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)

    # -- the three special cases --------------------------------------------------------------------

    def forward(self, ids, *, last_only: bool = False) -> np.ndarray:
        """The full causal pass, no cache. ids [T] -> logits [T, V] (or [1, V] with last_only, the way
        nanoGPT scores at inference: the LM head on the last position only)."""
        ids = self.check_ids(ids)
        (logits,) = self._step([(ids, PassKV())], "last" if last_only else "all", kind="forward")
        return logits[None] if last_only else logits

    def new_cache(self) -> KVCache:
        return KVCache(self.config, self.dtype)

    def prefill(self, ids, cache=None) -> tuple[np.ndarray, KVCache]:
        """The whole prompt in one pass, filling a KV cache. ids [T] -> (logits [V] of the last
        position, the cache holding all T positions). With a cache that already holds positions,
        the prompt continues after them (a chunk of a longer prompt)."""
        cache = cache if cache is not None else self.new_cache()
        (logits,) = self._step([(ids, cache)], "last", kind="prefill")
        return logits, cache

    def decode_step(self, token: int, cache) -> np.ndarray:
        """One token at the cache's next position; writes its K and V into the cache in place.
        -> logits [V]."""
        if not isinstance(token, (int, np.integer)):
            raise PromptError(f"token {token!r}: a token id must be an integer")
        if not 0 <= token < self.config.vocab_size:
            raise PromptError(f"token id {token} is outside this model's vocabulary of {self.config.vocab_size} ids")
        cache.reserve(1)
        (logits,) = self._step([(np.array([token], dtype=np.intp), cache)], "last", kind="decode")
        return logits

    def n_params(self) -> int:
        return sum(int(v.size) for v in self.params.values())

    def nbytes(self) -> int:
        return sum(int(v.nbytes) for v in self.params.values())

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({self.name!r}: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.dtype})")
