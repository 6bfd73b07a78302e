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

import hashlib
from functools import partial
from typing import Iterator

import numpy as np

from .. import backend
from ..config import GPT2Config
from . import ops
from .base import CausalLM
from .ops import merge_heads, split_heads
from .quant import QuantMatrix
from .weights import check_blocks, check_kernels, check_weights, label, make_weight, on_device, stored

Block = dict  # one block's parameters, named as in the checkpoint without the "h.{i}." prefix
EOT = 50256   # <|endoftext|> in GPT-2's vocabulary


# -- the checkpoint's tensors ------------------------------------------------------------------------

def iter_expected(c: GPT2Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor a GPT-2 checkpoint holds, with its shape ([in, out] for the linear layers), one at a
    time: checking a file against a config stops at the first one missing, so a config claiming 10**7
    layers costs no more than the file's own tensors."""
    d = c.n_embd
    yield from {"wte.weight": (c.vocab_size, d), "wpe.weight": (c.n_ctx, d)}.items()
    for i in range(c.n_layer):
        h = f"h.{i}."
        yield from {
            h + "ln_1.weight": (d,), h + "ln_1.bias": (d,),
            h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
            h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
            h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (d, 4 * d), h + "mlp.c_fc.bias": (4 * d,),
            h + "mlp.c_proj.weight": (4 * d, d), h + "mlp.c_proj.bias": (d,),
        }.items()
    yield from {"ln_f.weight": (d,), "ln_f.bias": (d,)}.items()


def expected_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 checkpoint holds, with its shape."""
    return dict(iter_expected(c))


def random_params(config: GPT2Config, seed: int = 0, std: float = 0.02, dtype=np.float32,
                  residual_std: float | None = None) -> dict[str, np.ndarray]:
    """GPT-2-shaped random weights: normal(0, std) matrices, zero biases, unit layer-norm gains. Seeded.
    residual_std: the std of the two projections into the residual stream (`attn.c_proj`, `mlp.c_proj`),
    if not `std` (GPT-2 trains from std/sqrt(2L) there: `training.model.init_params`)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in expected_shapes(config).items():
        if name.endswith(".bias"):
            params[name] = np.zeros(shape, dtype=dtype)
        elif ".ln_" in name or name.startswith("ln_"):
            params[name] = np.ones(shape, dtype=dtype)
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            w *= residual_std if residual_std is not None and name.endswith("c_proj.weight") else std
            params[name] = w.astype(dtype, copy=False)
    return params


# GGUF's names for GPT-2's tensors (llama.cpp's MODEL_ARCH.GPT2), without `.weight` / `.bias`:
# a block's (after `h.{i}.`, GGUF's `blk.{i}.`), then the others.
GGUF_BLOCK_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
                    "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
GGUF_TOP_NAMES = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm"}


def dequantize_params(params: dict) -> dict:
    """The float parameters a quantized GPT-2 computes with (its quantization undone, up to the
    rounding it did): linear weights back to [in, out], wte to [V, d]; float ones as they are."""
    out = {}
    for name, w in params.items():
        if isinstance(w, QuantMatrix):
            out[name] = w.dequantize() if name == "wte.weight" else np.ascontiguousarray(w.dequantize().T)
        else:
            out[name] = w
    return out


# -- the block, as small functions -------------------------------------------------------------------

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

    MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")   # its products
    OWN_TOKENIZER = False                 # GPT-2's byte-pair tokenizer is built in (minillm.tokenizer())

    def __init__(self, config: GPT2Config, params: dict[str, np.ndarray], *, name: str = "",
                 weights: str = "float32", device=None, kernels: str = "numpy") -> None:
        """weights: "float32" (floats in the parameters' dtype; quantized ones widened), "native"
        (quantized matrices kept as given, e.g. a GGUF's), or "q8_0" / "q4_0" / "q4_1": every
        product and the token embedding (also the tied head) quantized; wpe, biases and norms stay
        float (GGUF keeps 1-D tensors in F32; wpe is read a few rows per step, never as a whole).
        device: a backend.Device (None: the CPU); every array is moved there once, here.
        kernels: "numpy" (the reference) or "fused" (numba, float32 on the CPU only: models/weights.py)."""
        weights = check_weights(weights)
        self.config = config
        made = {"wte.weight", *(f"h.{i}.{k}" for i in range(config.n_layer) for k in self.MATRICES)}   # make_weight's
        params = {k: v if k in made else on_device(v, device) for k, v in params.items()}   # the caller's dict stays
        self.params = params
        self.name = name or f"gpt2-{config.n_layer}x{config.n_embd}"
        self.wpe = params["wpe.weight"]                                   # [n_ctx, d]
        self.dtype = self.wpe.dtype
        on_cpu = device is None or device.xp is np
        self.kernels = check_kernels(kernels) if self.dtype == np.float32 and on_cpu else "numpy"
        check_blocks({"width": config.n_embd}, weights, self.name)
        self.eos_ids = (EOT,) if config.vocab_size > EOT else ()
        # the tied embedding: one [d, V] array, the LM head's layout; wte its [V, d] view (or GGUF rows)
        self.embed_w = self.head_w = make_weight(params["wte.weight"], weights, self.dtype, rows=True, device=device,
                                                 kernels=self.kernels)
        self.wte = params["wte.weight"] = stored(self.head_w, rows=True)   # [V, d]
        self.blocks: list[Block] = []
        for i in range(config.n_layer):
            h = f"h.{i}."
            p = {k[len(h):]: v for k, v in params.items() if k.startswith(h)}
            for k in self.MATRICES:
                p[k] = make_weight(p[k], weights, self.dtype, device=device, kernels=self.kernels)
                params[h + k] = stored(p[k])
            self.blocks.append(p)
        self.weights, self.float_matrices = label(self.matrices(head=False), self.dtype)
        if device is not None:
            self.device = device

    def gathered(self) -> tuple[str, ...]:
        return ("wpe.weight",)                                            # a step reads a row of it

    def fingerprint(self) -> str:
        """As every model's (models/base.py), and the position table too."""
        wpe = np.ascontiguousarray(backend.to_host(self.wpe))
        return super().fingerprint() + ":" + hashlib.sha256(wpe.tobytes()).hexdigest()

    def run(self, plan) -> np.ndarray:
        """Token and position embeddings, then every block. -> x [N, d]."""
        c = self.config
        x = ops.embedding(self.embed_w, self.wpe, plan.ids, plan.rows_of_positions)  # [N, d]
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, c.n_head, c.ln_eps, partial(plan.attend, layer))   # [N, d]
        return x

    def head(self, h: np.ndarray) -> np.ndarray:
        """ln_f, then the LM head tied to the embedding. [S, d] -> logits [S, V]."""
        h = ops.layer_norm(h, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)
        return ops.lm_head(h, self.head_w)                                          # [S, V]

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({self.name!r}: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.dtype})")
