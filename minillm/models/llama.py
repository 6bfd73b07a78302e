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
Q4_0 / Q4_1 tensors arrive that way (`weights="native"`), and q|k|v and gate|up are fused by
stacking rows; a float checkpoint is quantized after fusing (`weights="q8_0"`, ...). The embedding
and the tied head are then one quantized `[V, d]` matrix, as llama.cpp keeps `token_embd`.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from functools import partial

from ..config import LlamaConfig
from ..errors import WeightsError
from ..kernels import invariant
from . import ops
from .base import CausalLM
from .ops import merge_heads
from .weights import check_blocks, check_kernels, check_weights, label, make_weight, on_device, stored

Block = dict   # one block's parameters, fused names (see `fuse_block`)
MATRICES = ("qkv.weight", "o_proj.weight", "gate_up.weight", "down_proj.weight")   # a block's products


# -- the checkpoint's tensors ------------------------------------------------------------------------

def iter_expected(c: LlamaConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint of this config (without the `model.` prefix), with
    its shape, one at a time (a check stops at the first missing one: bounded by the file)."""
    d, q, kv, F = c.n_embd, c.n_head * c.head_dim, c.n_kv_head * c.head_dim, c.ffn
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i in range(c.n_layer):
        h = f"layers.{i}."
        yield h + "input_layernorm.weight", (d,)
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield h + f"self_attn.{name}.weight", (rows, d)
            if c.qkv_bias:
                yield h + f"self_attn.{name}.bias", (rows,)
        if c.qk_norm:
            yield h + "self_attn.q_norm.weight", (c.head_dim,)
            yield h + "self_attn.k_norm.weight", (c.head_dim,)
        yield h + "self_attn.o_proj.weight", (d, q)
        if c.o_bias:
            yield h + "self_attn.o_proj.bias", (d,)
        yield h + "post_attention_layernorm.weight", (d,)
        for name, shape in (("gate_proj", (F, d)), ("up_proj", (F, d)), ("down_proj", (d, F))):
            yield h + f"mlp.{name}.weight", shape
            if c.mlp_bias:
                yield h + f"mlp.{name}.bias", (shape[0],)
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


# GGUF's names for the checkpoint's tensors (llama.cpp's), without `.weight` / `.bias`: a block's
# (after `layers.{i}.`, GGUF's `blk.{i}.`), then the others.
GGUF_BLOCK_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GGUF_TOP_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}


def expected_shapes(c: LlamaConfig) -> dict[str, tuple[int, ...]]:
    return dict(iter_expected(c))


def random_params(c: LlamaConfig, seed: int = 0, std: float = 0.02, dtype=np.float32,
                  expected=iter_expected) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights (normal(0, std) matrices and biases, norm gains near 1). Seeded.
    expected: the family's manifest (models/moe.py passes its own)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in expected(c):
        if "norm" in name:
            params[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(dtype)
        else:
            params[name] = (std * rng.standard_normal(shape)).astype(dtype)
    return params


def fuse_block(t: dict[str, np.ndarray], i: int, c: LlamaConfig, dtype, weights: str = "float32",
               device=None, dense_mlp: bool = True, kernels: str = "numpy") -> Block:
    """One block's checkpoint tensors -> the model's: q|k|v and gate|up side by side, [in, out]
    (quantized: [out, in] rows, see the top of this file), on `device` (None: the CPU).
    dense_mlp=False: attention and norms only (a mixture-of-experts layer brings its experts
    instead: models/moe.py)."""
    h = f"layers.{i}."
    a, m = h + "self_attn.", h + "mlp."
    mat = lambda names: make_weight([t[n] for n in names], weights, dtype, rows=True, device=device, kernels=kernels)
    p = {
        "input_layernorm.weight": np.asarray(t[h + "input_layernorm.weight"], dtype=dtype),
        "qkv.weight": mat([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"]),  # [d, (H+2Hkv)·hd]
        "o_proj.weight": mat([a + "o_proj.weight"]),                                        # [H·hd, d]
        "post_attention_layernorm.weight": np.asarray(t[h + "post_attention_layernorm.weight"], dtype=dtype),
    }
    if dense_mlp:
        p["gate_up.weight"] = mat([m + "gate_proj.weight", m + "up_proj.weight"])            # [d, 2F]
        p["down_proj.weight"] = mat([m + "down_proj.weight"])                               # [F, d]
    if c.qkv_bias:
        p["qkv.bias"] = np.concatenate([t[a + f"{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")]).astype(dtype)
    if c.o_bias:
        p["o_proj.bias"] = np.asarray(t[a + "o_proj.bias"], dtype=dtype)
    if c.mlp_bias and dense_mlp:
        p["gate_up.bias"] = np.concatenate([t[m + "gate_proj.bias"], t[m + "up_proj.bias"]]).astype(dtype)
        p["down_proj.bias"] = np.asarray(t[m + "down_proj.bias"], dtype=dtype)
    if c.qk_norm:
        p["q_norm.weight"] = np.asarray(t[a + "q_norm.weight"], dtype=dtype)
        p["k_norm.weight"] = np.asarray(t[a + "k_norm.weight"], dtype=dtype)
    return {k: v if k in MATRICES else on_device(v, device) for k, v in p.items()}


# -- the block, as small functions -------------------------------------------------------------------

def split_qkv(qkv: np.ndarray, H: int, Hkv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, (H + 2·Hkv)·hd] -> q [H, N, hd], k [Hkv, N, hd], v [Hkv, N, hd] (views, no copy)."""
    N = qkv.shape[0]
    heads = qkv.reshape(N, H + 2 * Hkv, -1).transpose(1, 0, 2)     # [H + 2·Hkv, N, hd]
    return heads[:H], heads[H:H + Hkv], heads[H + Hkv:]


def self_attention(x: np.ndarray, p: Block, c: LlamaConfig, cos: np.ndarray, sin: np.ndarray,
                   attend, rope=ops.rope) -> np.ndarray:
    """Grouped-query attention with rotary positions. x [N, d], cos/sin [N, hd/2] -> [N, d].
    `attend(q, k, v)` stores the new keys and values and lets each sequence's queries attend over
    its own positions (the step's plan, models/plan.py). rope: ops.rope, or the fused kernel's."""
    qkv = ops.linear(x, p["qkv.weight"], p.get("qkv.bias"))                 # [N, (H + 2·Hkv)·hd]
    q, k, v = split_qkv(qkv, c.n_head, c.n_kv_head)                         # [H|Hkv, N, hd]
    if c.qk_norm:                                                           # Qwen3: per-head norms
        qk = ops.backend.namespace(q).concatenate([ops.rms_norm(q, p["q_norm.weight"], c.eps),
                                                  ops.rms_norm(k, p["k_norm.weight"], c.eps)])   # [H + Hkv, N, hd]
    else:
        qk = qkv.reshape(qkv.shape[0], -1, c.head_dim)[:, :c.n_head + c.n_kv_head].transpose(1, 0, 2)
    qk = rope(qk, cos, sin)                                                 # q and k turned in one pass
    q, k = qk[:c.n_head], qk[c.n_head:]                                     # [H, N, hd], [Hkv, N, hd]
    a = merge_heads(attend(q, k, v))                                        # [N, H·hd]
    return ops.linear(a, p["o_proj.weight"], p.get("o_proj.bias"))          # [N, d]


def mlp(x: np.ndarray, p: Block, act=ops.swiglu) -> np.ndarray:
    """SwiGLU. [N, d] -> gate|up [N, 2F] -> silu(gate)·up [N, F] -> [N, d]. act: ops.swiglu, or the
    fused kernel's."""
    h = ops.linear(x, p["gate_up.weight"], p.get("gate_up.bias"))           # [N, 2F]
    return ops.linear(act(h), p["down_proj.weight"], p.get("down_proj.bias"))   # [N, d]


def transformer_block(x: np.ndarray, p: Block, c: LlamaConfig, cos, sin, attend, ffn=mlp,
                      norm=ops.rms_norm, rope=ops.rope) -> np.ndarray:
    """Pre-norm residual block. [N, d] -> [N, d]. ffn(x, p): the block's MLP (a mixture of experts
    in models/moe.py); norm and rope: ops', or the fused kernels' (same results, one pass each)."""
    x = ops.add(x, self_attention(norm(x, p["input_layernorm.weight"], c.eps), p, c, cos, sin, attend, rope))
    x = ops.add(x, ffn(norm(x, p["post_attention_layernorm.weight"], c.eps), p))
    return x


# -- the model ----------------------------------------------------------------------------------------

class Llama(CausalLM):
    """A Llama-family model: a config and checkpoint tensors (Hugging Face names without `model.`).
    Shares GPT-2's one way in (`CausalLM.step`) and its special cases: only `run` and `head` differ."""

    MATRICES = MATRICES
    CONFIG = LlamaConfig                       # what a folder's config.json is read into
    manifest = staticmethod(iter_expected)     # every checkpoint tensor with its shape (check_tensors)

    def __init__(self, config: LlamaConfig, tensors: dict[str, np.ndarray], *, name: str = "",
                 dtype=None, eos_ids: tuple[int, ...] = (), weights: str = "float32", device=None,
                 kernels: str = "numpy") -> None:
        """weights: "float32" (quantized tensors of a GGUF are widened), "native" (a GGUF's Q8_0 /
        Q4_0 / Q4_1 tensors kept as they are) or "q8_0" / "q4_0" / "q4_1" (every matrix quantized).
        device: a backend.Device (None: the CPU); every array is moved there once, here.
        kernels: "numpy" (the reference) or "fused" (numba, float32 on the CPU only: models/weights.py)."""
        c = self.config = config
        weights = check_weights(weights)
        dtype = np.dtype(dtype or np.float32)
        self.name = name or f"{c.arch}-{c.n_layer}x{c.n_embd}"
        self.dtype = dtype
        on_cpu = device is None or device.xp is np
        self.kernels = k = check_kernels(kernels) if dtype == np.float32 and on_cpu else "numpy"
        self.eos_ids = tuple(eos_ids)
        self.tokenizer = None                                                             # set by the loader
        check_blocks({"width": c.n_embd, "attention width H·hd": c.n_head * c.head_dim, "FFN": c.ffn},
                     weights, self.name)
        embed = tensors["embed_tokens.weight"]                                            # [V, d]
        self.head_w = make_weight(embed if c.tied else tensors["lm_head.weight"], weights, dtype, rows=True,
                                  device=device, kernels=k)
        self.embed_w = self.head_w if c.tied else make_weight(embed, weights, dtype, rows=True, contiguous=False,
                                                              device=device)
        self.wte = stored(self.embed_w, rows=True)                                        # [V, d]
        self.blocks: list[Block] = [self.block_params(tensors, i, dtype, weights, device)
                                    for i in range(c.n_layer)]
        self.norm = on_device(np.asarray(tensors["norm.weight"], dtype=dtype), device)
        self.params = {"embed_tokens.weight": self.wte, "norm.weight": self.norm}
        if not c.tied:
            self.params["lm_head.weight"] = stored(self.head_w, rows=True)
        for i, p in enumerate(self.blocks):
            self.params.update({f"layers.{i}.{k}": stored(v) for k, v in p.items()})
        self.weights, self.float_matrices = label(self.matrices(head=False), dtype)
        if device is not None:
            self.device = device

    # -- what a subclass changes (models/moe.py): a block's parameters and its MLP --

    def block_params(self, tensors: dict, i: int, dtype, weights: str, device=None) -> Block:
        return fuse_block(tensors, i, self.config, dtype, weights, device, kernels=self.kernels)

    def ffn(self, layer: int, act=ops.swiglu):
        """Block `layer`'s MLP, a function (x [N, d], its parameters) -> [N, d]; act: its SwiGLU."""
        return partial(mlp, act=act)

    def elementwise(self):
        """The blocks' RMS norm, rotation and SwiGLU: ops', or with fused kernels their own (not in
        the batch-invariant mode, which promises ops' results bit for bit)."""
        if self.kernels == "fused" and not invariant.on():
            from ..kernels import elementwise
            return elementwise.rms_norm, elementwise.rope, elementwise.swiglu
        return ops.rms_norm, ops.rope, ops.swiglu

    def gathered(self) -> tuple[str, ...]:
        return () if self.config.tied else ("embed_tokens.weight",)                      # a row of it per step

    def run(self, plan) -> np.ndarray:
        """Embeddings, then every block (not the final norm). plan.ids, plan.positions [N] -> x [N, d]."""
        x = ops.embedding(self.embed_w, None, plan.ids)                            # [N, d]
        c = self.config
        cos, sin = ops.rope_tables(plan.positions, c.head_dim, c.theta, self.dtype)  # [N, hd/2], on its device
        norm, rope, act = self.elementwise()
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, self.config, cos, sin, partial(plan.attend, layer), self.ffn(layer, act),
                                  norm, rope)
        return x

    def head(self, h: np.ndarray) -> np.ndarray:
        """The final RMS norm and the LM head, on the scored rows. h [S, d] -> logits [S, V]."""
        norm = self.elementwise()[0]
        return ops.lm_head(norm(h, self.norm, self.config.eps), self.head_w)

    def __repr__(self) -> str:
        c = self.config
        return (f"Llama({self.name!r}: {c.arch}, {c.n_layer} layers, {c.n_head} heads / {c.n_kv_head} KV "
                f"heads of {c.head_dim}, width {c.n_embd}, FFN {c.ffn}, context {c.n_ctx}, vocab "
                f"{c.vocab_size}, {self.n_params():,} params, {self.weights}"
                + (f", {self.float_matrices} of {len(self.matrices(head=False))} products in "
                   f"{self.dtype.name}" if self.float_matrices else "") + ")")


def check_tensors(tensors: dict, c: LlamaConfig, where: str, expected=iter_expected) -> None:
    """Every tensor the config needs, with its shape; nothing else. One clear line otherwise.
    expected: the family's manifest (models/moe.py passes its own)."""
    for name, shape in expected(c):
        if name not in tensors:
            raise WeightsError(f"{where}: tensor {name} is missing (expected shape {list(shape)}); is the "
                               "checkpoint complete, and the config the one for it?")
        if tuple(tensors[name].shape) != shape:
            raise WeightsError(f"{where}: tensor {name} has shape {list(tensors[name].shape)} but the config "
                               f"needs {list(shape)}; is config.json the one for these weights?")
    want = dict(expected(c))
    extra = sorted(n for n in tensors if n not in want and not n.endswith("rotary_emb.inv_freq"))
    if extra:
        raise WeightsError(f"{where}: unexpected tensor {extra[0]} (and {len(extra) - 1} more) for this "
                           f"{c.n_layer}-layer {c.arch} config")
