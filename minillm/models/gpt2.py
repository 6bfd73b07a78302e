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

import math
from dataclasses import dataclass
import hashlib
from functools import partial
from typing import Iterator

import numpy as np

from .. import backend
from ..config import Layout, MAX_CONTEXT, MAX_COUNT, whole
from ..errors import ConfigError
from . import ops
from .base import RANDOM_SEED, CausalLM
from .ops import merge_heads, split_heads
from .quant import QuantMatrix
from .target import Target
from .factory import make_weight, on_device
from .weights import check_blocks, label, stored

# -- the config ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPT2Config(Layout):
    n_layer: int = 12        # L: transformer blocks
    n_head: int = 12         # H: attention heads per block
    n_embd: int = 768        # d: width of the residual stream
    n_ctx: int = 1024        # longest sequence (the number of learned positions, `n_positions`)
    vocab_size: int = 50257  # V: GPT-2's BPE vocabulary
    ln_eps: float = 1e-5     # layer-norm epsilon
    tied = True              # (a class attribute) its LM head is the token table

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


# The four GPT-2 sizes OpenAI released (parameter counts with the tied LM head counted once).
GPT2_SIZES: dict[str, GPT2Config] = {
    "124m": GPT2Config(n_layer=12, n_head=12, n_embd=768),
    "355m": GPT2Config(n_layer=24, n_head=16, n_embd=1024),
    "774m": GPT2Config(n_layer=36, n_head=20, n_embd=1280),
    "1558m": GPT2Config(n_layer=48, n_head=25, n_embd=1600),
}


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


# -- random weights and the presets: one table (`minillm.load("random-124m")`) --------------------------

TINY = GPT2Config(n_layer=2, n_head=2, n_embd=64, n_ctx=256, vocab_size=50257)   # for when no model is installed
SHAPES: dict[str, GPT2Config] = {**{f"random-{k}": c for k, c in GPT2_SIZES.items()}, "random-tiny": TINY}


def random(config: GPT2Config, target=None, name: str = "", seed: int = RANDOM_SEED) -> "GPT2":
    """A seeded GPT-2 of this shape with random weights (std 0.02), made for the target."""
    target = target or Target.numpy()
    return GPT2(config, random_params(config, seed=seed, std=0.02, dtype=target.dtype), target, name=name)


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


def mlp(x: np.ndarray, p: Block, K: KernelSet) -> np.ndarray:
    """[T, d] -> [T, 4d] -> GELU -> [T, d]."""
    h = ops.linear(x, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])          # [T, 4d]
    return ops.linear(K.gelu(h), p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])   # [T, d]


def transformer_block(x: np.ndarray, p: Block, n_head: int, eps: float, attend, K: KernelSet) -> np.ndarray:
    """Pre-norm residual block. [N, d] -> [N, d]. K: the kernel set's norm and GELU (models/kernel_sets.py)."""
    x = ops.add(x, self_attention(K.layer_norm(x, p["ln_1.weight"], p["ln_1.bias"], eps), p, n_head, attend))
    x = ops.add(x, mlp(K.layer_norm(x, p["ln_2.weight"], p["ln_2.bias"], eps), p, K))
    return x


class GPT2(CausalLM):
    """A GPT-2 model: a config and a dict of parameters in the checkpoint's names and layout."""

    MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")   # its products
    OWN_TOKENIZER = False                 # GPT-2's byte-pair tokenizer is built in (minillm.tokenizer())

    def __init__(self, config: GPT2Config, params: dict[str, np.ndarray], target: Target | None = None, *,
                 name: str = "") -> None:
        """target: what runs where (models/target.py; None: the NumPy reference on the CPU, in the
        parameters' dtype). Its weights: "float32" (floats in its dtype; quantized ones widened),
        "native" (quantized matrices kept as given, e.g. a GGUF's), or "q8_0" / "q4_0" / "q4_1": every
        product and the token embedding (also the tied head) quantized; wpe, biases and norms stay
        float (GGUF keeps 1-D tensors in F32; wpe is read a few rows per step, never as a whole).
        Every array is made for its device and kernel set once, here."""
        target = target or Target.numpy(params["wpe.weight"].dtype)
        self.use_target(target)
        self.config = config
        made = {"wte.weight", *(f"h.{i}.{k}" for i in range(config.n_layer) for k in self.MATRICES)}   # make_weight's
        params = {k: v if k in made else on_device(np.asarray(v, dtype=target.dtype), target)   # the caller's
                  for k, v in params.items()}                                                 # dict stays
        self.params = params
        self.name = name or f"gpt2-{config.n_layer}x{config.n_embd}"
        self.wpe = params["wpe.weight"]                                   # [n_ctx, d]
        self.dtype = target.dtype
        check_blocks({"width": config.n_embd}, target.weights, self.name)
        self.eos_ids = (EOT,) if config.vocab_size > EOT else ()
        # the tied embedding: one [d, V] array, the LM head's layout; wte its [V, d] view (or GGUF rows)
        self.embed_w = self.head_w = make_weight(params["wte.weight"], target, rows=True)
        self.wte = params["wte.weight"] = stored(self.head_w, rows=True)   # [V, d]
        self.blocks: list[Block] = []
        for i in range(config.n_layer):
            h = f"h.{i}."
            p = {k[len(h):]: v for k, v in params.items() if k.startswith(h)}
            for k in self.MATRICES:
                p[k] = make_weight(p[k], target)
                params[h + k] = stored(p[k])
            self.blocks.append(p)
        self.weights, self.float_matrices = label(self.matrices(head=False), self.dtype)

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
            x = transformer_block(x, p, c.n_head, c.ln_eps, partial(plan.attend, layer), plan.kernels)   # [N, d]
        return x

    def head(self, h: np.ndarray) -> np.ndarray:
        """ln_f, then the LM head tied to the embedding. [S, d] -> logits [S, V]."""
        h = self.kernel_set.layer_norm(h, self.params["ln_f.weight"], self.params["ln_f.bias"], self.config.ln_eps)
        return ops.lm_head(h, self.head_w)                                          # [S, V]

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT2({self.name!r}: {c.n_layer} layers, {c.n_head} heads, width {c.n_embd}, "
                f"context {c.n_ctx}, vocab {c.vocab_size}, {self.n_params():,} params, {self.dtype})")


CONFIG, MODEL = GPT2Config, GPT2          # the family's row reads these (checkpoints/families.py)
