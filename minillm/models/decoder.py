"""The pre-norm decoder the Llama family brought, which Mixtral, Qwen3-MoE, Gemma 3 and gpt-oss
build on: its config (`DecoderConfig`), its checkpoint's tensors under Hugging Face's Llama names,
its block as small functions, and its model (`Decoder`, a `CausalLM`). Not a family: the family
modules (models/llama.py, moe.py, gemma3.py, gptoss.py) import it, and models/llama.py's docstring
reads it like the paper (RMSNorm, rotary positions, SwiGLU, grouped queries; q|k|v and gate|up
stacked, `[in, out]`, or quantized `[out, in]` rows).

    DecoderConfig      the shape: layers, heads, widths, and the attention's flavour (`ARCHS`:
                       Llama's, Qwen2's q/k/v biases, Qwen3's per-head q/k norms)
    iter_expected      every checkpoint tensor with its shape (a family's manifest, or its base)
    stack_block        one block's checkpoint tensors -> the model's, made for the target
    self_attention     grouped-query attention with rotary positions, [N, d] -> [N, d]
    transformer_block  the pre-norm residual block: attention, then the block's MLP (`ffn`)
    Decoder            the model: embeddings, blocks, the final norm and head; a subclass changes
                       a block's parameters (`block_params`), its MLP (`ffn`) or `run`
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np

from .. import backend
from ..config import Layout, MAX_CONTEXT, MAX_COUNT, check_heads, check_positive, hf_model_type, hf_rope, whole
from ..errors import ConfigError
from . import ops
from .base import RANDOM_SEED, CausalLM
from .blocks import checkpoint_params, mlp, norm_head
from .kernel_sets import KernelSet
from .ops import merge_heads
from .target import Target
from .factory import make_weight, on_device
from .weights import check_blocks, label, stored

# -- the config ---------------------------------------------------------------------------------------

ARCHS = ("llama", "qwen2", "qwen3")   # the attention's flavours (Hugging Face `model_type`s, GGUF architectures)


@dataclass(frozen=True)
class DecoderConfig(Layout):
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
        check_heads(self, "n_kv_heads must divide n_heads")
        check_positive(self, ("eps", "theta"))
        if self.arch not in ARCHS:
            raise ConfigError(f"config arch={self.arch!r}: minillm runs {', '.join(ARCHS)}")

    def n_params(self) -> int:
        """Parameters (the tied head counted once)."""
        L, d, V, F = self.n_layer, self.n_embd, self.vocab_size, self.ffn
        q, kv = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        per_block = (d * (q + 2 * kv) + q * d + 3 * d * F + 2 * d
                     + (q + 2 * kv) * self.qkv_bias + d * self.o_bias + (2 * F + d) * self.mlp_bias
                     + 2 * self.head_dim * self.qk_norm)
        return V * d * (1 if self.tied else 2) + L * per_block + d

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "DecoderConfig":
        """Read a Hugging Face config.json of model_type llama, qwen2 or qwen3."""
        arch = hf_model_type(cfg, source, ARCHS, f"is not supported; minillm runs gpt2, {', '.join(ARCHS)}")
        need = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
        missing = [k for k in need if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a {arch} config.json?")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act={act!r}; minillm implements SwiGLU with silu")
        if cfg.get("use_sliding_window"):
            raise ConfigError(f"{source}: use_sliding_window is on; minillm implements full attention only")
        theta = hf_rope(cfg, source)[1]                         # the default rotation only (one line otherwise)
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


Block = dict   # one block's parameters, stacked names (see `stack_block`)
MATRICES = ("qkv.weight", "o_proj.weight", "gate_up.weight", "down_proj.weight")   # a block's products


# -- the checkpoint's tensors ------------------------------------------------------------------------

def attention_tensors(h: str, c, *, qkv_bias: bool = False, qk_norm: bool = False,
                      o_bias: bool = False) -> Iterator[tuple[str, tuple[int, ...]]]:
    """One block's grouped-query attention as a Hugging Face checkpoint names it (h: the block's
    prefix, `layers.{i}.`): q, k, v [rows, d] (each with its bias), q/k norms [hd], o [d, H·hd] (its
    bias). Every family with this attention lists it from here (config.ModelConfig's counts)."""
    d, q, kv = c.n_embd, c.n_head * c.head_dim, c.n_kv_head * c.head_dim
    a = h + "self_attn."
    for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        yield a + f"{name}.weight", (rows, d)
        if qkv_bias:
            yield a + f"{name}.bias", (rows,)
    if qk_norm:
        yield a + "q_norm.weight", (c.head_dim,)
        yield a + "k_norm.weight", (c.head_dim,)
    yield a + "o_proj.weight", (d, q)
    if o_bias:
        yield a + "o_proj.bias", (d,)


def iter_expected(c: DecoderConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face checkpoint of this config (without the `model.` prefix), with
    its shape, one at a time (a check stops at the first missing one: bounded by the file)."""
    d, F = c.n_embd, c.ffn
    yield "embed_tokens.weight", (c.vocab_size, d)
    for i in range(c.n_layer):
        h = f"layers.{i}."
        yield h + "input_layernorm.weight", (d,)
        yield from attention_tensors(h, c, qkv_bias=c.qkv_bias, qk_norm=c.qk_norm, o_bias=c.o_bias)
        yield h + "post_attention_layernorm.weight", (d,)
        for name, shape in (("gate_proj", (F, d)), ("up_proj", (F, d)), ("down_proj", (d, F))):
            yield h + f"mlp.{name}.weight", shape
            if c.mlp_bias:
                yield h + f"mlp.{name}.bias", (shape[0],)
    yield "norm.weight", (d,)
    if not c.tied:
        yield "lm_head.weight", (c.vocab_size, d)


def random_params(c: DecoderConfig, seed: int = 0, std: float = 0.02, dtype=np.float32,
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


def random(config: DecoderConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED,
           model=None) -> "Decoder":
    """A seeded model of this shape with random weights (normal(0, 0.02), norm gains near 1), made for
    the target; model: its class (a subclass of `Decoder`: models/llama.py's `Llama`; None: `Decoder`).
    On a GPU the matrices are drawn there (a 7B model's 13 GB drawn by NumPy would take a minute; the
    norms, 1-D, on the host)."""
    target = target or Target.numpy()
    if target.on_cpu:
        params = random_params(config, seed=seed, dtype=target.dtype)
    else:
        rng, host = target.xp.random.default_rng(seed), np.random.default_rng(seed)
        params = {k: (1.0 + 0.1 * host.standard_normal(s)).astype(target.dtype) if "norm" in k
                  else (0.02 * rng.standard_normal(s, dtype=np.float32)).astype(target.dtype)
                  for k, s in iter_expected(config)}
    return (model or Decoder)(config, params, target,
                              name=name or f"random-{config.arch}-{config.n_layer}x{config.n_embd}")


def stack_block(t: dict[str, np.ndarray], i: int, c: DecoderConfig, target: Target, dense_mlp: bool = True) -> Block:
    """One block's checkpoint tensors -> the model's: q|k|v and gate|up stacked side by side, [in, out]
    (quantized: [out, in] rows, see models/llama.py's docstring), made for the target (models/target.py).
    dense_mlp=False: attention and norms only (a mixture-of-experts layer brings its experts
    instead: models/moe.py)."""
    h = f"layers.{i}."
    a, m = h + "self_attn.", h + "mlp."
    dtype = target.dtype
    mat = lambda names: make_weight([t[n] for n in names], target, rows=True)
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
    return {k: v if k in MATRICES else on_device(v, target) for k, v in p.items()}


# -- the block, as small functions -------------------------------------------------------------------

def split_qkv(qkv: np.ndarray, H: int, Hkv: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N, (H + 2·Hkv)·hd] -> q [H, N, hd], k [Hkv, N, hd], v [Hkv, N, hd] (views, no copy)."""
    N = qkv.shape[0]
    heads = qkv.reshape(N, H + 2 * Hkv, -1).transpose(1, 0, 2)     # [H + 2·Hkv, N, hd]
    return heads[:H], heads[H:H + Hkv], heads[H + Hkv:]


def self_attention(x: np.ndarray, p: Block, c: DecoderConfig, cos: np.ndarray, sin: np.ndarray,
                   attend, K: KernelSet) -> np.ndarray:
    """Grouped-query attention with rotary positions. x [N, d], cos/sin [N, hd/2] -> [N, d].
    `attend(q, k, v)` stores the new keys and values and lets each sequence's queries attend over
    its own positions (the step's plan, models/plan.py). K: the model's kernel set (its rotation)."""
    qkv = ops.linear(x, p["qkv.weight"], p.get("qkv.bias"))                 # [N, (H + 2·Hkv)·hd]
    q, k, v = split_qkv(qkv, c.n_head, c.n_kv_head)                         # [H|Hkv, N, hd]
    if c.qk_norm:                                                           # Qwen3: per-head norms
        qk = backend.namespace(q).concatenate([ops.rms_norm(q, p["q_norm.weight"], c.eps),
                                               ops.rms_norm(k, p["k_norm.weight"], c.eps)])   # [H + Hkv, N, hd]
    else:
        qk = qkv.reshape(qkv.shape[0], -1, c.head_dim)[:, :c.n_head + c.n_kv_head].transpose(1, 0, 2)
    qk = K.rope(qk, cos, sin)                                               # q and k turned in one pass
    q, k = qk[:c.n_head], qk[c.n_head:]                                     # [H, N, hd], [Hkv, N, hd]
    a = merge_heads(attend(q, k, v))                                        # [N, H·hd]
    return ops.linear(a, p["o_proj.weight"], p.get("o_proj.bias"))          # [N, d]


def transformer_block(x: np.ndarray, p: Block, c: DecoderConfig, cos, sin, attend, ffn, K: KernelSet) -> np.ndarray:
    """Pre-norm residual block. [N, d] -> [N, d]. ffn(x, p): the block's MLP (a mixture of experts
    in models/moe.py); K: the model's kernel set (its norm and rotation: ops', or one-pass kernels)."""
    x = ops.add(x, self_attention(K.rms_norm(x, p["input_layernorm.weight"], c.eps), p, c, cos, sin, attend, K))
    x = ops.add(x, ffn(K.rms_norm(x, p["post_attention_layernorm.weight"], c.eps), p))
    return x


# -- the model ----------------------------------------------------------------------------------------

class Decoder(CausalLM):
    """A pre-norm decoder: a config and checkpoint tensors (Hugging Face names without `model.`).
    Shares GPT-2's one way in (`CausalLM.step`) and its special cases: only `run` and `head` differ."""

    MATRICES = MATRICES
    CONFIG = DecoderConfig                     # what a folder's config.json is read into
    manifest = staticmethod(iter_expected)     # every checkpoint tensor with its shape (checkpoints/manifest.py)

    def __init__(self, config: DecoderConfig, tensors: dict[str, np.ndarray], target: Target | None = None, *,
                 name: str = "", eos_ids: tuple[int, ...] = ()) -> None:
        """target: what runs where (models/target.py; None: the NumPy reference in float32 on the CPU).
        Its weights: "float32" (quantized tensors of a GGUF are widened), "native" (a GGUF's Q8_0 /
        Q4_0 / Q4_1 tensors kept as they are) or "q8_0" / "q4_0" / "q4_1" (every matrix quantized);
        every array is made for its device and kernel set once, here."""
        c = self.config = config
        target = target or Target.numpy()
        self.use_target(target)
        dtype = self.dtype = target.dtype
        self.name = name or f"{c.arch}-{c.n_layer}x{c.n_embd}"
        self.eos_ids = tuple(eos_ids)
        self.tokenizer = None                                                             # set by the loader
        check_blocks({"width": c.n_embd, "attention width H·hd": c.n_head * c.head_dim, "FFN": c.ffn},
                     target.weights, self.name)
        embed = tensors["embed_tokens.weight"]                                            # [V, d]
        self.head_w = make_weight(embed if c.tied else tensors["lm_head.weight"], target, rows=True)
        self.embed_w = self.head_w if c.tied else make_weight(embed, target, rows=True, contiguous=False)
        self.wte = stored(self.embed_w, rows=True)                                        # [V, d]
        self.blocks: list[Block] = [self.block_params(tensors, i) for i in range(c.n_layer)]
        self.norm = on_device(np.asarray(tensors["norm.weight"], dtype=dtype), target)
        self.params = checkpoint_params(self)
        self.weights, self.float_matrices = label(self.matrices(head=False), dtype)

    # -- what a subclass changes (models/moe.py, ...): a block's parameters and its MLP --

    def block_params(self, tensors: dict, i: int) -> Block:
        return stack_block(tensors, i, self.config, self.target)

    def ffn(self, layer: int):
        """Block `layer`'s MLP, a function (x [N, d], its parameters) -> [N, d], with the kernel set's SwiGLU."""
        return partial(mlp, act=self.kernel_set.swiglu)

    def gathered(self) -> tuple[str, ...]:
        return () if self.config.tied else ("embed_tokens.weight",)                      # a row of it per step

    def run(self, plan) -> np.ndarray:
        """Embeddings, then every block (not the final norm). plan.ids, plan.positions [N] -> x [N, d]."""
        x = ops.embedding(self.embed_w, None, plan.ids)                            # [N, d]
        c = self.config
        cos, sin = ops.rope_tables(plan.positions, c.head_dim, c.theta, self.dtype)  # [N, hd/2], on its device
        compiled = plan.kernels.compiled_block and plan.kernels.compiled_block(self, plan, cos, sin)
        if compiled:                           # the set's blocks in one compiled call: the same kernels, the same bits
            return compiled(x)
        for layer, p in enumerate(self.blocks):
            x = transformer_block(x, p, c, cos, sin, partial(plan.attend, layer), self.ffn(layer), plan.kernels)
        return x

    @property
    def plain_block(self) -> bool:
        """Is every block `transformer_block` with `mlp` exactly (no biases, no per-head norms, this
        class's parameters and MLP): what a kernel set's compiled block (`compiled_block`) computes?"""
        c, cls = self.config, type(self)
        return (not (c.qkv_bias or c.o_bias or c.mlp_bias or c.qk_norm) and cls.run is Decoder.run
                and cls.ffn is Decoder.ffn and cls.block_params is Decoder.block_params)

    head = norm_head                   # the final RMS norm and the LM head (models/blocks.py)

    def __repr__(self) -> str:
        c = self.config
        return (f"{type(self).__name__}({self.name!r}: {c.arch}, {c.n_layer} layers, {c.n_head} heads / {c.n_kv_head} KV "
                f"heads of {c.head_dim}, width {c.n_embd}, FFN {c.ffn}, context {c.n_ctx}, vocab "
                f"{c.vocab_size}, {self.n_params():,} params, {self.weights}"
                + (f", {self.float_matrices} of {len(self.matrices(head=False))} products in "
                   f"{self.dtype.name}" if self.float_matrices else "") + ")")


