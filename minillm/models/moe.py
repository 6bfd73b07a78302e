"""Mixture of experts (Mixtral, Qwen3-MoE): a Llama whose MLP is E experts, of which each token uses k.

    x = embed[ids]
    for each block:
        x = x + attn(rms_norm(x))                          # the Llama family's attention, unchanged
        x = x + moe(rms_norm(x))                           # or a dense MLP (`is_sparse(layer)`)
    logits = rms_norm(x) @ head

    moe(x):                                                # x [N, d]
        p = softmax(x @ router)                            # [N, E]: how much each expert suits each row
        top = the k largest of each row of p               # [N, k] experts, [N, k] weights
        weights = top / sum(top)                           # Mixtral always; Qwen3-MoE if norm_topk_prob
        y[n] = Σ_j weights[n, j] · expert_{top[n, j]}(x[n])    # each expert a SwiGLU MLP of width F_e

Mixtral's "softmax over the chosen k" and Qwen3-MoE's "softmax over all, top-k, renormalised" are
the same numbers (a softmax over k logits is their share of the softmax over all E): one rule here,
the renormalisation switched by `norm_topk`. Qwen3-MoE without `norm_topk_prob` keeps the shares of
the softmax over all E (they sum to less than 1). Top-k is taken on the probabilities in the model's
dtype, as transformers does; a tie goes to the lower expert id.

What it costs. Memory holds all E experts of every sparse layer (the *total* parameters); a token
reads only its k (the *active* ones). A step of N rows reads every expert chosen by at least one
row, once: `experts_mlp` groups the rows by expert and multiplies each expert's weights once for
all its rows (as serving engines' fused MoE kernels do), so the meter counts the router, and the
union of the chosen experts (`step_weight_bytes` is its closed form). Under uniform routing a step
of B tokens reads E·(1 − (1 − k/E)^B) experts per layer (`expected_distinct_experts`), each of them
serving about B·k/E rows where a dense MLP serves B: the FLOPs per weight byte a batch of B buys a
dense model, a mixture buys at about E/k times that batch.

The experts are made like every product weight (`factory.make_weight`, the target's kernel set) and
multiplied by `ops.linear`; the router stays float, as llama.cpp keeps `ffn_gate_inp` (small, and it
picks the experts). The family's row in checkpoints/families.py reads Hugging Face folders of both kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterator

import numpy as np

from ..config import hf_model_type
from ..errors import ConfigError
from . import decoder
from .base import RANDOM_SEED
from .blocks import mlp
from .decoder import Block, Decoder, DecoderConfig, stack_block
from .mixture import dispatch, expected_distinct_experts, expert, experts_mlp, record_route, route, routes  # noqa: F401  (the mixture's ops, named where the family is too)
from .mixture import SparseDecoder, step_weight_bytes  # noqa: F401  (its closed form, named here too)
from .factory import make_weight
from .target import Target

# Hugging Face model_type -> (the attention's flavour, models/decoder.py's, the layer's prefix for the
# router and the experts, the experts' gate, up and down names)
MOE_TYPES = {
    "mixtral": ("llama", "block_sparse_moe.", ("w1", "w3", "w2")),
    "qwen3_moe": ("qwen3", "mlp.", ("gate_proj", "up_proj", "down_proj")),
}


# -- the config -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoEConfig(DecoderConfig):
    """A decoder's config (models/decoder.py: attention, norms, vocabulary; `ffn` is the dense MLP's
    width) plus the experts."""
    n_expert: int = 8                 # E: experts per sparse layer
    top_k: int = 2                    # k: experts each token uses
    expert_ffn: int = 0               # F_e: each expert's inner width (0: `ffn`)
    norm_topk: bool = True            # renormalise the k chosen probabilities (Mixtral: always)
    sparse_step: int = 1              # layer i is sparse when (i + 1) % sparse_step == 0 ...
    dense_layers: tuple = ()          # ... and i is not one of these (Qwen3-MoE's mlp_only_layers)
    model_type: str = "mixtral"       # mixtral or qwen3_moe: the checkpoint's tensor names

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.expert_ffn:
            object.__setattr__(self, "expert_ffn", self.ffn)
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))
        for name in ("n_expert", "top_k", "expert_ffn", "sparse_step"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"config {name}={value!r}: must be a positive integer")
        if self.top_k > self.n_expert:
            raise ConfigError(f"config: each token uses top_k={self.top_k} experts but a layer has only "
                              f"{self.n_expert}; num_experts_per_tok must be at most the number of experts")
        if any(not isinstance(i, int) or not 0 <= i < self.n_layer for i in self.dense_layers):
            raise ConfigError(f"config mlp_only_layers={list(self.dense_layers)}: layers are 0..{self.n_layer - 1}")
        if self.model_type not in MOE_TYPES:
            raise ConfigError(f"config model_type={self.model_type!r}: minillm runs {', '.join(MOE_TYPES)}")

    def is_sparse(self, layer: int) -> bool:
        """Does block `layer` have experts (else a dense MLP of width `ffn`)? As transformers decides."""
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0

    @property
    def sparse_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layer) if self.is_sparse(i))

    def expert_params(self) -> int:
        """One expert's parameters: gate and up [d, F_e], down [F_e, d]."""
        return 3 * self.n_embd * self.expert_ffn

    def n_params(self) -> int:
        """Every parameter (the total, what memory holds; the tied head counted once)."""
        S, d = len(self.sparse_layers), self.n_embd
        dense_mlps = 3 * d * self.ffn + (2 * self.ffn + d) * self.mlp_bias       # in DecoderConfig's count
        return super().n_params() - S * dense_mlps + S * (d * self.n_expert + self.n_expert * self.expert_params())

    def active_params(self) -> int:
        """The parameters one token's step multiplies by: every sparse layer's router and k experts
        instead of all E (the embedding table counted whole, like `n_params`)."""
        return self.n_params() - len(self.sparse_layers) * (self.n_expert - self.top_k) * self.expert_params()

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "MoEConfig":
        """Read a Hugging Face config.json of model_type mixtral or qwen3_moe: the expert count as
        `num_local_experts` or `num_experts`, the RoPE base at the top level or in `rope_parameters`."""
        kind = hf_model_type(cfg, source, MOE_TYPES, f"is not a mixture of experts minillm runs ({', '.join(MOE_TYPES)})")
        E = cfg.get("num_local_experts", cfg.get("num_experts"))
        missing = [k for k, v in (("num_local_experts", E), ("num_experts_per_tok", cfg.get("num_experts_per_tok")))
                   if v is None]
        if kind == "qwen3_moe" and "moe_intermediate_size" not in cfg:
            missing.append("moe_intermediate_size")
        if missing:
            raise ConfigError(f"{source}: missing {', '.join(missing)}; is this a {kind} config.json?")
        window, n_ctx = cfg.get("sliding_window"), cfg.get("max_position_embeddings", 2048)
        if kind == "mixtral" and window is not None and window < n_ctx:
            raise ConfigError(f"{source}: sliding_window={window} is shorter than the context {n_ctx}; "
                              "minillm implements full attention only")
        attention = {**cfg, "model_type": MOE_TYPES[kind][0],
                     "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}
        base = DecoderConfig.from_hf(attention, source)
        try:
            return cls(**base.asdict(), n_expert=E, top_k=cfg["num_experts_per_tok"],
                       expert_ffn=cfg["moe_intermediate_size"] if kind == "qwen3_moe" else base.ffn,
                       norm_topk=True if kind == "mixtral" else bool(cfg.get("norm_topk_prob", False)),
                       sparse_step=cfg.get("decoder_sparse_step", 1) if kind == "qwen3_moe" else 1,
                       dense_layers=tuple(cfg.get("mlp_only_layers") or ()) if kind == "qwen3_moe" else (),
                       model_type=kind)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        except TypeError as e:
            raise ConfigError(f"{source}: a field has the wrong type ({e}); re-download the checkpoint") from None


# -- the checkpoint's tensors -----------------------------------------------------------------------

def expert_names(c: MoEConfig, layer: int, e: int) -> tuple[str, str, str]:
    """Expert e's gate, up and down tensors in block `layer` (without the `model.` prefix)."""
    _, prefix, names = MOE_TYPES[c.model_type]
    return tuple(f"layers.{layer}.{prefix}experts.{e}.{n}.weight" for n in names)


def router_name(c: MoEConfig, layer: int) -> str:
    return f"layers.{layer}.{MOE_TYPES[c.model_type][1]}gate.weight"


def iter_expected(c: MoEConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint, with its shape: the decoder's table (models/decoder.py),
    each sparse layer's dense MLP replaced by its router [E, d] and E experts."""
    d, F = c.n_embd, c.expert_ffn
    for name, shape in decoder.iter_expected(c):
        parts = name.split(".")                        # layers.{i}.mlp.gate_proj.weight
        if parts[0] == "layers" and parts[2] == "mlp" and c.is_sparse(int(parts[1])):
            if parts[3] == "gate_proj" and parts[4] == "weight":
                i = int(parts[1])
                yield router_name(c, i), (c.n_expert, d)
                for e in range(c.n_expert):
                    gate, up, down = expert_names(c, i, e)
                    yield from ((gate, (F, d)), (up, (F, d)), (down, (d, F)))
            continue
        yield name, shape


def random_params(c: MoEConfig, seed: int = 0, std: float = 0.02, dtype=np.float32) -> dict[str, np.ndarray]:
    """Checkpoint-shaped random weights, seeded (`decoder.random_params` on this family's manifest)."""
    return decoder.random_params(c, seed, std, dtype, expected=iter_expected)


# -- the model ----------------------------------------------------------------------------------------

class MoE(SparseDecoder):
    """A Llama whose sparse layers have a router and E experts instead of one MLP (models/mixture.py's
    `SparseDecoder`: CPU only, the router float). Built from checkpoint tensors (Hugging Face names
    without `model.`) like `Llama`; `weights="q8_0"` / `"q4_0"` / `"q4_1"` quantizes every expert."""

    CONFIG = MoEConfig
    manifest = staticmethod(iter_expected)

    def block_params(self, tensors: dict, i: int) -> Block:
        """Attention and norms as Llama's; then a dense MLP, or the router [d, E] and per expert
        its gate|up [d, 2F_e] and down [F_e, d] (`experts.{e}.gate_up.weight`, ...)."""
        c = self.config
        if not c.is_sparse(i):
            return stack_block(tensors, i, c, self.target)
        p = stack_block(tensors, i, c, self.target, dense_mlp=False)
        p["router.weight"] = make_weight(tensors[router_name(c, i)], self.router_target, rows=True)   # [d, E], float
        for e in range(c.n_expert):
            gate, up, down = (tensors[n] for n in expert_names(c, i, e))
            p[f"experts.{e}.gate_up.weight"] = make_weight([gate, up], self.target, rows=True)       # [d, 2F_e]
            p[f"experts.{e}.down_proj.weight"] = make_weight(down, self.target, rows=True)           # [F_e, d]
        return p

    def ffn(self, layer: int):
        act = self.kernel_set.swiglu
        return partial(experts_mlp, c=self.config, act=act) if self.config.is_sparse(layer) else partial(mlp, act=act)

    def __repr__(self) -> str:
        c = self.config
        return (f"MoE({self.name!r}: {c.model_type}, {c.n_layer} layers ({len(c.sparse_layers)} with "
                f"{c.n_expert} experts, top-{c.top_k}, expert FFN {c.expert_ffn}), {c.n_head} heads / "
                f"{c.n_kv_head} KV heads of {c.head_dim}, width {c.n_embd}, context {c.n_ctx}, vocab "
                f"{c.vocab_size}, {self.n_params():,} params ({c.active_params():,} active), {self.weights})")


# -- random presets: a mixture beyond the cache, and the dense model of its active size --------------
#
# The mixture holds ~230 MiB in float32 (7 times a 32 MiB last-level cache), of which a token reads
# under a third; the dense preset has the same attention and an MLP as wide as the k experts a token
# uses, so one token reads the same bytes but the router's (`minillm.load("random-moe-16x2")`).

_ATTENTION = dict(n_layer=8, n_head=8, n_kv_head=2, head_dim=64, n_embd=512, n_ctx=1024, vocab_size=8192,
                  eps=1e-5, theta=1e4, tied=True)
SHAPES: dict[str, DecoderConfig] = {
    "random-moe-16x2": MoEConfig(**_ATTENTION, ffn=256, n_expert=16, top_k=2, expert_ffn=256),
    "random-moe-16x2-dense": DecoderConfig(**_ATTENTION, ffn=2 * 256),
    # random-mla's GQA twin (models/deepseek.py, lesson 18): the same width, layers, heads of the value width, 4 KV
    # heads (g = 4), the same experts with k + 1 routed in place of the shared one, the first block dense:
    # a token reads about the same weights, and its cache holds 2·4·64 = 512 values a layer against 288
    "random-mla-gqa": MoEConfig(n_layer=8, n_head=16, n_kv_head=4, head_dim=64, n_embd=1024, n_ctx=16384,
                                vocab_size=8192, ffn=2816, eps=1e-6, theta=1e4, arch="qwen3", qk_norm=True,
                                tied=False, n_expert=32, top_k=5, expert_ffn=256, norm_topk=True,
                                dense_layers=(0,), model_type="qwen3_moe"),
}


def random(config: DecoderConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> Decoder:
    """A seeded model of this shape with random weights (normal(0, 0.02)): an `MoE` for a mixture's
    config, a dense `Decoder` (models/decoder.py: a Llama's) for a dense one (the preset's twin)."""
    if not isinstance(config, MoEConfig):
        return decoder.random(config, target, name, seed)
    return MoE(config, random_params(config, seed, 0.02, (target or Target.numpy()).dtype), target, name=name)


CONFIG, MODEL = MoEConfig, MoE          # the family's row reads these (checkpoints/families.py)
