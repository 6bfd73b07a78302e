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
from . import llama
from .base import RANDOM_SEED
from .blocks import mlp
from .llama import Block, Llama, LlamaConfig, stack_block
from .mixture import dispatch, expected_distinct_experts, expert, experts_mlp, record_route, route, routes  # noqa: F401  (the mixture's ops, named where the family is too)
from .factory import make_weight
from .quant import FORMATS
from .target import Target, cpu_only
from .weights import check_blocks

# Hugging Face model_type -> (the attention it shares with models/llama.py, the layer's prefix for the
# router and the experts, the experts' gate, up and down names)
MOE_TYPES = {
    "mixtral": ("llama", "block_sparse_moe.", ("w1", "w3", "w2")),
    "qwen3_moe": ("qwen3", "mlp.", ("gate_proj", "up_proj", "down_proj")),
}


# -- the config -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """A Llama config (attention, norms, vocabulary; `ffn` is the dense MLP's width) plus the experts."""
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
        dense_mlps = 3 * d * self.ffn + (2 * self.ffn + d) * self.mlp_bias       # in LlamaConfig's count
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
        base = LlamaConfig.from_hf(attention, source)
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
    """Every tensor of the checkpoint, with its shape: the Llama family's table (models/llama.py),
    each sparse layer's dense MLP replaced by its router [E, d] and E experts."""
    d, F = c.n_embd, c.expert_ffn
    for name, shape in llama.iter_expected(c):
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
    """Checkpoint-shaped random weights, seeded (`llama.random_params` on this family's manifest)."""
    return llama.random_params(c, seed, std, dtype, expected=iter_expected)


# -- the model ----------------------------------------------------------------------------------------

class MoE(Llama):
    """A Llama whose sparse layers have a router and E experts instead of one MLP. Built from
    checkpoint tensors (Hugging Face names without `model.`) like `Llama`; `weights="q8_0"` /
    `"q4_0"` / `"q4_1"` quantizes every expert (the router stays float)."""

    CONFIG = MoEConfig
    manifest = staticmethod(iter_expected)

    def __init__(self, config: MoEConfig, tensors: dict, target: Target | None = None, *, name: str = "",
                 eos_ids: tuple[int, ...] = ()) -> None:
        """target: as Llama's. The routing and the grouping of rows by expert are NumPy's (argsort on
        the host), so a mixture runs on the CPU only; its products take the target's kernel set
        (the experts' too), the router kept float."""
        c = config
        target = target or Target.numpy()
        name = name or f"{c.model_type}-{c.n_layer}x{c.n_embd}-{c.n_expert}e"
        if not target.on_cpu:
            raise cpu_only(f"{name}: a mixture of experts (its routing is NumPy's)", target.device,
                           "use --device cpu")
        check_blocks({"expert FFN": c.expert_ffn}, target.weights, name)
        self.router_target = target.with_(weights="float32")                            # the router stays float
        super().__init__(config, tensors, target, name=name, eos_ids=eos_ids)

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

    @property
    def experts(self) -> tuple[int, int]:
        """(E, k): experts per sparse layer, and how many each token uses."""
        return self.config.n_expert, self.config.top_k

    def step_weight_bytes(self, n_tokens: int = 1, distinct=None) -> float:
        """The weight bytes a decode step of n_tokens rows reads when its sparse layers' rows chose
        `distinct` experts each (a list per sparse layer; default: uniform routing's expectation,
        `expected_distinct_experts`, exactly k at one token, so a float past it). `step_weight_bytes` below."""
        c = self.config
        if distinct is None:
            n = expected_distinct_experts(c.n_expert, c.top_k, n_tokens)
            distinct = [c.top_k if n_tokens == 1 else n] * len(c.sparse_layers)
        return step_weight_bytes(c, distinct, n_tokens, self.dtype.itemsize, self.weights)

    def matrices(self, head: bool = True, chosen=None) -> list:
        """The products a step multiplies, each once: attention, dense MLPs, the chosen experts of each
        sparse layer, then the LM head (head=False: not it). Not the router, kept float.
        chosen: per sparse layer, the experts the step's rows chose (the sets a `routes()` record
        holds); default the first k of each, a one-token step (every expert has the same shapes and
        bytes, so which k does not change a count); "all": every expert, what memory holds."""
        c = self.config
        if chosen is None:
            chosen = [range(c.top_k)] * len(c.sparse_layers)
        elif isinstance(chosen, str):                                       # "all"
            chosen = [range(c.n_expert)] * len(c.sparse_layers)
        sets = dict(zip(c.sparse_layers, chosen, strict=True))
        out = []
        for i, p in enumerate(self.blocks):
            out += [p["qkv.weight"], p["o_proj.weight"]]
            if i in sets:
                out += [w for e in sorted(set(sets[i])) for w in expert(p, e).values()]
            else:
                out += [p["gate_up.weight"], p["down_proj.weight"]]
        return out + [self.head_w] if head else out

    def __repr__(self) -> str:
        c = self.config
        return (f"MoE({self.name!r}: {c.model_type}, {c.n_layer} layers ({len(c.sparse_layers)} with "
                f"{c.n_expert} experts, top-{c.top_k}, expert FFN {c.expert_ffn}), {c.n_head} heads / "
                f"{c.n_kv_head} KV heads of {c.head_dim}, width {c.n_embd}, context {c.n_ctx}, vocab "
                f"{c.vocab_size}, {self.n_params():,} params ({c.active_params():,} active), {self.weights})")


# -- closed forms: what a step reads -----------------------------------------------------------------

def step_weight_bytes(c: MoEConfig, distinct, n_tokens: int = 1, itemsize: int = 4, weights: str = "float32"):
    """The weight bytes a step of n_tokens rows reads, from the config alone: every parameter once,
    except the embedding table (its n_tokens rows; a tied table is read whole as the head) and the
    experts no row chose. distinct: per sparse layer (in order), how many distinct experts the step's
    rows chose (k at one token; `expected_distinct_experts` under uniform routing). weights: the
    matrices' format ("float32": itemsize bytes a value; "q8_0" ...: their blocks, router kept float).
    The meter's count of a step equals it (tests/test_moe.py)."""
    b = itemsize
    per = (lambda values: values * b) if weights not in FORMATS else \
        (lambda values: values * FORMATS[weights].block_bytes // 32)      # a matrix of `values` values
    L, d, V, H, Hkv, hd = c.n_layer, c.n_embd, c.vocab_size, c.n_head, c.n_kv_head, c.head_dim
    attention = (per(d * (H + 2 * Hkv) * hd) + per(H * hd * d) + b * (2 * d + 2 * hd * c.qk_norm
                 + (H + 2 * Hkv) * hd * c.qkv_bias + d * c.o_bias))      # q|k|v, o, two norms, q/k norms, biases
    dense = per(3 * d * c.ffn) + b * (2 * c.ffn + d) * c.mlp_bias
    router, one_expert = b * d * c.n_expert, per(c.expert_params())
    distinct = list(distinct)
    if len(distinct) != len(c.sparse_layers):
        raise ValueError(f"distinct: one count per sparse layer ({len(c.sparse_layers)}), got {len(distinct)}")
    blocks = L * attention + (L - len(distinct)) * dense + sum(router + n * one_expert for n in distinct)
    return per(n_tokens * d) + blocks + b * d + per(V * d)                # embedding rows, blocks, norm, head


# -- random presets: a mixture beyond the cache, and the dense model of its active size --------------
#
# The mixture holds ~230 MiB in float32 (7 times a 32 MiB last-level cache), of which a token reads
# under a third; the dense preset has the same attention and an MLP as wide as the k experts a token
# uses, so one token reads the same bytes but the router's (`minillm.load("random-moe-16x2")`).

_ATTENTION = dict(n_layer=8, n_head=8, n_kv_head=2, head_dim=64, n_embd=512, n_ctx=1024, vocab_size=8192,
                  eps=1e-5, theta=1e4, tied=True)
SHAPES: dict[str, LlamaConfig] = {
    "random-moe-16x2": MoEConfig(**_ATTENTION, ffn=256, n_expert=16, top_k=2, expert_ffn=256),
    "random-moe-16x2-dense": LlamaConfig(**_ATTENTION, ffn=2 * 256),
    # random-mla's GQA twin (models/deepseek.py, lesson 18): the same width, layers, heads of the value width, 4 KV
    # heads (g = 4), the same experts with k + 1 routed in place of the shared one, the first block dense:
    # a token reads about the same weights, and its cache holds 2·4·64 = 512 values a layer against 288
    "random-mla-gqa": MoEConfig(n_layer=8, n_head=16, n_kv_head=4, head_dim=64, n_embd=1024, n_ctx=16384,
                                vocab_size=8192, ffn=2816, eps=1e-6, theta=1e4, arch="qwen3", qk_norm=True,
                                tied=False, n_expert=32, top_k=5, expert_ffn=256, norm_topk=True,
                                dense_layers=(0,), model_type="qwen3_moe"),
}


def random(config: LlamaConfig, target: Target | None = None, name: str = "", seed: int = RANDOM_SEED) -> Llama:
    """A seeded model of this shape with random weights (normal(0, 0.02)): an `MoE` for a mixture's
    config, a `Llama` for a dense one (the preset's twin)."""
    if not isinstance(config, MoEConfig):
        return llama.random(config, target, name, seed)
    return MoE(config, random_params(config, seed, 0.02, (target or Target.numpy()).dtype), target, name=name)


CONFIG, MODEL = MoEConfig, MoE          # the family's row reads these (checkpoints/families.py)
